// The one binder of the kernel entry points, shared by cpu.cpp and cuda.cpp.
//
//   bind(m, "smooth_ndcg_forward", &fastrank::cpu::smooth_ndcg_forward);
//
// makes a Python function that takes the entry point's parameter struct (fastrank/params.h
// and the op's header) as positional values, field by field IN DECLARATION ORDER (a base
// class's fields first, where a struct derives from one), each field consuming its values:
//   Lists          dtype code, n, m, direction, reduction (any aggregate: its fields in turn;
//   MatIn, MaskIn  pointer, s0, s1                          so the struct's declaration is
//   VecIn          pointer, stride                          the one list of its arguments)
//   DType (enum)   its int code
//   double         a float (or an int); bool: an int (0 or not); int, int64_t: an int
//   any pointer    an address as an int (Tensor.data_ptr(), 0 for null); a `const double*`
//                  also takes a list of floats, copied to host memory that lives for the call
// A wrong number of values raises a TypeError naming the entry point. The GIL is released
// while the entry point runs. Its return value reaches Python through Result<R>: none for
// void, a bool for bool; a module whose entry points return something else (cuda.cpp: an
// error code) specializes Result for it before its first bind.
//
// The fields are found without naming them: an aggregate's elements (bases and members)
// are counted by brace-initialisation detection, then the struct is built by aggregate
// initialisation from that many converters, each turning into the type of its element (in
// order: a braced list is evaluated left to right) by reading that type's Python values.
// Thin by design: no checks beyond the value types; Python (fastrank/ops/) has validated
// everything and allocated every output.
//
// The names of the fields (FASTRANK_FIELDS after each struct, params.h; checked against the
// declaration at compile time, their count here) go to the module's FIELDS dict, entry point ->
// the names in order: the Python side of an op declares the fields it fills, by name, and that
// declaration fails unless they are these (src/fastrank/ops/_launch.py, kernel).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace fastrank {
namespace bindings {
namespace py = pybind11;

// How an entry point's return value reaches Python (the name: for error messages).
template <typename R> struct Result;
template <> struct Result<bool> {
  static py::object to_python(bool ok, const char*) { return py::bool_(ok); }
};

namespace detail {

template <typename T>
constexpr bool kLeaf = std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_pointer_v<T>;

// Counting an aggregate's elements: P{e_1, ..., e_N} compiles for N up to the count.
struct AnyElement {
  template <typename T> operator T() const;  // never defined: unevaluated only
};
template <typename P, typename Seq, typename = void> struct Initializable : std::false_type {};
template <typename P, std::size_t... I>
struct Initializable<P, std::index_sequence<I...>, std::void_t<decltype(P{(void(I), AnyElement{})...})>>
    : std::true_type {};
template <typename P, std::size_t N = 0> constexpr std::size_t element_count() {
  if constexpr (Initializable<P, std::make_index_sequence<N + 1>>::value) return element_count<P, N + 1>();
  else return N;
}

// Builds P from converters, each turning into its element's type through Source::take<T>.
template <typename Source> struct Element {
  Source* src;
  template <typename T> constexpr operator T() const { return src->template take<T>(); }
};
template <typename P, typename Source, std::size_t... I>
constexpr P build(Source& src, std::index_sequence<I...>) {
  return P{(void(I), Element<Source>{&src})...};
}
template <typename P, typename Source> constexpr P build(Source& src) {
  static_assert(std::is_aggregate_v<P>, "a parameter struct's field must be a number, enum, pointer or aggregate");
  return build<P>(src, std::make_index_sequence<element_count<P>()>{});
}

// The number of Python values P takes (a compile-time run of the same construction).
struct Counter {
  int n = 0;
  template <typename T> constexpr T take() {
    if constexpr (kLeaf<T>) {
      ++n;
      return T{};
    } else {
      return build<T>(*this);
    }
  }
};
template <typename P> constexpr int arity() {
  Counter c;
  build<P>(c);
  return c.n;
}

// The Python values of one call, read in order.
class Values {
 public:
  Values(const char* entry, PyObject* const* items) : entry_(entry), items_(items) {}

  template <typename T> T take() {
    if constexpr (!kLeaf<T>) {
      return build<T>(*this);
    } else {
      PyObject* o = items_[i_++];
      if constexpr (std::is_same_v<T, bool>) {
        const long v = PyLong_AsLong(o);
        if (v == -1 && PyErr_Occurred()) fail();
        return v != 0;
      } else if constexpr (std::is_floating_point_v<T>) {
        const double v = PyFloat_AsDouble(o);
        if (v == -1.0 && PyErr_Occurred()) fail();
        return static_cast<T>(v);
      } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
        const long long v = PyLong_AsLongLong(o);
        if (v == -1 && PyErr_Occurred()) fail();
        return static_cast<T>(v);
      } else {
        if constexpr (std::is_same_v<T, const double*>) {
          if (!PyLong_Check(o)) return hold_doubles(o);
        }
        void* p = PyLong_AsVoidPtr(o);
        if (p == nullptr && PyErr_Occurred()) fail();
        return static_cast<T>(p);
      }
    }
  }

 private:
  // The Python error just raised, as a TypeError naming the entry point and the value.
  [[noreturn]] void fail() {
    py::error_already_set e;
    throw py::type_error(std::string(entry_) + "(): value " + std::to_string(i_) + ": " + e.what());
  }
  const double* hold_doubles(PyObject* o) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(o);
    std::vector<double> v(seq.size());
    for (std::size_t k = 0; k < v.size(); ++k) {
      v[k] = PyFloat_AsDouble(seq[k].ptr());
      if (v[k] == -1.0 && PyErr_Occurred()) fail();
    }
    held_.push_back(std::move(v));  // a moved vector keeps its buffer
    return held_.back().data();
  }

  const char* entry_;
  PyObject* const* items_;
  int i_ = 0;
  std::vector<std::vector<double>> held_;  // lists given for `const double*` fields
};

}  // namespace detail

// Binds `fn` as m.<name>: P's fields from the positional values, the GIL released around fn.
template <typename P, typename R> void bind(py::module_& m, const char* name, R (*fn)(const P&)) {
  constexpr int kValues = detail::arity<P>();
  static_assert(field_count(static_cast<const P*>(nullptr)) == static_cast<int>(detail::element_count<P>()),
                "the struct's FASTRANK_FIELDS do not name each of its fields");
  const std::vector<std::string> fields = fields_of(static_cast<const P*>(nullptr));
  if (!py::hasattr(m, "FIELDS")) m.attr("FIELDS") = py::dict();
  py::tuple names(fields.size());
  for (std::size_t i = 0; i < fields.size(); ++i) names[i] = py::str(fields[i]);
  py::dict(m.attr("FIELDS"))[name] = names;
  std::string doc = std::to_string(kValues) + " positional values: the fields of the entry point's parameter struct (";
  for (std::size_t i = 0; i < fields.size(); ++i) doc += (i ? ", " : "") + fields[i];
  doc += "), in declaration order";
  m.def(
      name,
      [name, fn](py::args args) -> py::object {
        const auto got = PyTuple_GET_SIZE(args.ptr());
        if (got != kValues)
          throw py::type_error(std::string(name) + "() takes " + std::to_string(kValues) + " positional values (" +
                               "its parameter struct's fields), got " + std::to_string(got));
        detail::Values values(name, &PyTuple_GET_ITEM(args.ptr(), 0));
        const P p = values.template take<P>();
        if constexpr (std::is_void_v<R>) {
          {
            py::gil_scoped_release nogil;
            fn(p);
          }
          return py::none();
        } else {
          R r;
          {
            py::gil_scoped_release nogil;
            r = fn(p);
          }
          return Result<R>::to_python(r, name);
        }
      },
      doc.c_str());
}

}  // namespace bindings
}  // namespace fastrank
