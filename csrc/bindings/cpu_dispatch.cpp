// fastrank._C_cpu: runtime CPU dispatch between the instruction-set levels compiled into
// this module (CMakeLists.txt: the kernels and csrc/bindings/cpu.cpp once per level, each
// level a self-contained object). Nothing of a level runs until load() asks for it, and
// load() refuses a level this CPU (and its operating system) cannot run, so a module
// holding AVX-512 code imports and works on a CPU without it. fastrank/_native.py picks
// the level once, at import.
//   levels()          the compiled levels, lowest first, e.g. ["baseline", "avx2", "avx512"]
//   supported(level)  whether this CPU can run it
//   load(level)       the level's submodule (fastrank._C_cpu.<level>) with the kernels
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "fastrank_cpu_levels.h"  // generated: FASTRANK_FOR_EACH_CPU_LEVEL(X)

namespace py = pybind11;

#define FASTRANK_DECLARE_LEVEL(level) \
  namespace fastrank_##level { void register_kernels(py::module_& m); }
FASTRANK_FOR_EACH_CPU_LEVEL(FASTRANK_DECLARE_LEVEL)
#undef FASTRANK_DECLARE_LEVEL

namespace {

// Whether this CPU, with the state its operating system saves, runs code of `level`.
// GCC's and Clang's __builtin_cpu_supports read cpuid and, for AVX and AVX-512, XGETBV
// (an OS that does not save the ymm / zmm registers makes the features unusable).
bool cpu_supports(const std::string& level) {
  if (level == "baseline" || level == "native") return true;  // native: built on this machine
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  if (level == "avx2") return __builtin_cpu_supports("x86-64-v3");
  if (level == "avx512") return __builtin_cpu_supports("x86-64-v4");
#else
  if (level == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
           __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("movbe");
  if (level == "avx512")
    return cpu_supports("avx2") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
#endif
#endif
  return false;
}

const std::vector<std::string>& compiled_levels() {
#define FASTRANK_NAME_LEVEL(level) #level,
  static const std::vector<std::string> levels = {FASTRANK_FOR_EACH_CPU_LEVEL(FASTRANK_NAME_LEVEL)};
#undef FASTRANK_NAME_LEVEL
  return levels;
}

void register_level(const std::string& level, py::module_& sub) {
#define FASTRANK_REGISTER_LEVEL(name) \
  if (level == #name) return fastrank_##name::register_kernels(sub);
  FASTRANK_FOR_EACH_CPU_LEVEL(FASTRANK_REGISTER_LEVEL)
#undef FASTRANK_REGISTER_LEVEL
}

}  // namespace

PYBIND11_MODULE(_C_cpu, m) {
  m.doc() = "fastrank CPU kernels (C++17 + OpenMP), one submodule per instruction-set level; no libtorch";
  m.def("levels", [] { return compiled_levels(); }, "the compiled CPU levels, lowest first");
  m.def("supported", [](const std::string& level) {
    for (const auto& l : compiled_levels())
      if (l == level) return cpu_supports(level);
    return false;
  }, "whether this CPU can run a compiled level");
  py::module_ self = m;
  m.def("load", [self](const std::string& level) mutable -> py::object {
    bool compiled = false;
    for (const auto& l : compiled_levels()) compiled = compiled || l == level;
    if (!compiled) throw py::value_error("fastrank: CPU level '" + level + "' is not compiled into this module");
    if (!cpu_supports(level))
      throw py::value_error("fastrank: this CPU cannot run CPU level '" + level + "'");
    if (py::hasattr(self, level.c_str())) return self.attr(level.c_str());
    py::module_ sub = self.def_submodule(level.c_str(), ("fastrank CPU kernels, level " + level).c_str());
    register_level(level, sub);
    return std::move(sub);
  }, "the submodule of a level's kernels (ValueError if not compiled or not supported by this CPU)");
}
