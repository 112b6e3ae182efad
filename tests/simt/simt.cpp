// simt.cpp: the SIMT emulator's runtime (see simt.h for what it emulates and checks).
//
// Memory plan: one fiber per thread of the running block (256 KiB stacks from mmap with a
// guard page below, reused from block to block); `__shared__` variables are
// statics in the section simt_shared, found with their owners in the module's ELF symbol
// table; nothing else is allocated per launch. Blocks run one at a time on the calling OS
// thread; a mutex serialises launches from different threads (the bindings release the GIL).
//
// Control from Python (ctypes on the module file; the module's Python API stays exactly
// fastrank._C_cuda's): simt_configure(order, seed, poison_byte, dry_run), simt_log_size(),
// simt_log_entry(i, buf, len), simt_log_clear().
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define SIMT_ASAN 1
#else
#define SIMT_ASAN 0
#endif

namespace simt {
namespace {

constexpr int kMaxThreads = 1024;
constexpr size_t kMaxStaticShared = 48 * 1024;
constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarp = 32;

// ---- errors ---------------------------------------------------------------------------------
struct ErrorState {
  cudaError_t last = cudaSuccess;
  std::string message;  // the emulator's explanation of the last failed launch
};
ErrorState& errors() {
  static ErrorState e;
  return e;
}

int fail(cudaError_t code, const std::string& what) {
  errors().last = code;
  errors().message = "simt: " + what;
  return static_cast<int>(code);
}

// ---- configuration and the launch log ---------------------------------------------------------
struct Config {
  int order = 0;        // 0 forward, 1 reversed, 2 shuffled by seed (threads and blocks)
  uint64_t seed = 0;
  int poison = 0xff;    // the byte every shared variable holds when a block starts
  int dry_run = 0;      // check and log launches without running them
};
Config& config() {
  static Config c;
  return c;
}
std::vector<std::string>& launch_log() {
  static std::vector<std::string> log;
  return log;
}

// ---- the module's symbols: kernel names and their shared variables -----------------------------
struct SharedVar {
  uintptr_t addr;
  size_t size;
  std::string owner;  // the mangled name of the function that declares it ("" if unknown)
  bool guard;
};
struct Symbols {
  bool loaded = false;
  std::string error;
  uintptr_t section_begin = 0, section_end = 0;
  std::map<uintptr_t, std::string> functions;  // address -> mangled name
  std::vector<SharedVar> shared;
};

// The unqualified name of a mangled function (or, from `local`, of the function enclosing a
// local entity "_ZZ<encoding>E<name>"): "_ZN8fastrank4cuda12_GLOBAL__N_113forward_tilesIfEEv..."
// -> "forward_tiles". Source names are <length><identifier>; template arguments follow the
// last one.
std::string unqualified(const std::string& mangled, size_t pos) {
  if (mangled.compare(pos, 1, "L") == 0) ++pos;
  const bool nested = mangled.compare(pos, 1, "N") == 0;
  if (nested) {
    ++pos;
    while (pos < mangled.size() && (mangled[pos] == 'r' || mangled[pos] == 'V' || mangled[pos] == 'K')) ++pos;
  }
  std::string last;
  while (pos < mangled.size() && std::isdigit(static_cast<unsigned char>(mangled[pos]))) {
    size_t len = 0;
    while (pos < mangled.size() && std::isdigit(static_cast<unsigned char>(mangled[pos])))
      len = len * 10 + static_cast<size_t>(mangled[pos++] - '0');
    last = mangled.substr(pos, len);
    pos += len;
    if (!nested) break;
  }
  return last;
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? std::string(d) : mangled;
  std::free(d);
  return out;
}

void load_symbols(Symbols& S) {
  S.loaded = true;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&load_symbols), &info) == 0 || info.dli_fname == nullptr) {
    S.error = "dladdr found no module";
    return;
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  const int fd = open(info.dli_fname, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    S.error = std::string("cannot read ") + info.dli_fname;
    if (fd >= 0) close(fd);
    return;
  }
  void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    S.error = "mmap of the module failed";
    return;
  }
  const auto* bytes = static_cast<const unsigned char*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(bytes);
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(bytes + eh->e_shoff);
  const char* shnames = reinterpret_cast<const char*>(bytes + sh[eh->e_shstrndx].sh_offset);
  int shared_index = -1;
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (std::strcmp(shnames + sh[i].sh_name, "simt_shared") == 0) {
      shared_index = i;
      S.section_begin = base + sh[i].sh_addr;
      S.section_end = S.section_begin + sh[i].sh_size;
    }
  }
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB) continue;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(bytes + sh[i].sh_offset);
    const char* names = reinterpret_cast<const char*>(bytes + sh[sh[i].sh_link].sh_offset);
    const size_t count = sh[i].sh_size / sizeof(Elf64_Sym);
    for (size_t k = 0; k < count; ++k) {
      const Elf64_Sym& s = syms[k];
      const int type = ELF64_ST_TYPE(s.st_info);
      const std::string name = names + s.st_name;
      if (name.empty()) continue;
      if (type == STT_FUNC && s.st_value != 0) {
        S.functions[base + s.st_value] = name;
      } else if (type == STT_OBJECT && shared_index >= 0 && s.st_shndx == shared_index) {
        SharedVar v{base + s.st_value, static_cast<size_t>(s.st_size), "", name.find("simt_guard_") != std::string::npos};
        // the owner: the function whose local entity this is ("_ZZ" + encoding + "E" + name)
        if (name.compare(0, 3, "_ZZ") == 0) v.owner = name;
        S.shared.push_back(v);
      }
    }
  }
  munmap(map, static_cast<size_t>(st.st_size));
  // duplicates (a symbol listed twice) would be poisoned twice: harmless, but keep one
  std::sort(S.shared.begin(), S.shared.end(), [](const SharedVar& a, const SharedVar& b) { return a.addr < b.addr; });
  S.shared.erase(std::unique(S.shared.begin(), S.shared.end(),
                             [](const SharedVar& a, const SharedVar& b) { return a.addr == b.addr; }),
                 S.shared.end());
}

Symbols& symbols() {
  static Symbols S;
  if (!S.loaded) load_symbols(S);
  return S;
}

// ---- launch bounds, registered by the code build.py generates ---------------------------------
struct Bounds {
  int max_threads;
  std::string where;
  std::string conflict;
};
std::map<std::string, Bounds>& bounds() {
  static std::map<std::string, Bounds> b;
  return b;
}

// ---- what the emulator knows of a kernel ---------------------------------------------------------
struct KernelInfo {
  std::string mangled, name, pretty;
  int max_threads = kMaxThreads;
  std::string bounds_conflict;
  size_t static_shared = 0;
  std::vector<const SharedVar*> own;     // its shared variables (guards included)
  std::vector<const SharedVar*> common;  // shared variables of __device__ helpers, no kernel's
};

// Shared variables no kernel owns (declared in a __device__ helper): every block may use them.
bool owned_by_a_kernel(const SharedVar& v) {
  if (v.owner.empty()) return false;
  return bounds().count(unqualified(v.owner, 3)) != 0;
}

KernelInfo& kernel_info(const void* kernel) {
  static std::map<const void*, KernelInfo> cache;
  auto it = cache.find(kernel);
  if (it != cache.end()) return it->second;
  KernelInfo& K = cache[kernel];
  Symbols& S = symbols();
  auto f = S.functions.find(reinterpret_cast<uintptr_t>(kernel));
  if (f == S.functions.end()) {
    K.pretty = K.name = "<unknown kernel>";
    return K;
  }
  K.mangled = f->second;
  K.name = unqualified(K.mangled, 2);
  K.pretty = demangle(K.mangled);
  const auto b = bounds().find(K.name);
  if (b != bounds().end()) {
    K.max_threads = b->second.max_threads;
    K.bounds_conflict = b->second.conflict;
  }
  const std::string prefix = "_ZZ" + K.mangled.substr(2) + "E";
  for (const SharedVar& v : S.shared)
    if (!v.guard && !owned_by_a_kernel(v)) K.common.push_back(&v);
  for (const SharedVar& v : S.shared) {
    if (v.owner.compare(0, prefix.size(), prefix) != 0) continue;
    K.own.push_back(&v);
    if (!v.guard) K.static_shared += v.size;
  }
  return K;
}

// ---- fibers ------------------------------------------------------------------------------------
// A fiber switch is the emulator's inner loop: every __syncthreads() and warp collective is a
// round trip per thread. On x86-64 it is the few instructions below (the callee-saved registers
// and the floating-point control words on the old stack, the stack pointer swapped). ucontext's
// swapcontext, the fallback elsewhere, costs two sigprocmask system calls a switch, and under
// AddressSanitizer its interceptor clears the shadow of the whole target stack (32 KiB) at every
// switch, which also erased the redzones of the frames live on it.
#if defined(__x86_64__)
extern "C" void simt_switch_stack(void** save_sp, void* to_sp);
asm(R"(
  .text
  .p2align 4
  .globl simt_switch_stack
  .hidden simt_switch_stack
  .type simt_switch_stack, @function
simt_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size simt_switch_stack, .-simt_switch_stack
)");

struct Context {
  void* sp = nullptr;
};

// A context that starts entry() on [stack, stack + size): the frame simt_switch_stack pops
// (control words, six registers), then entry's address for its `ret`, then a null return address,
// so entry begins with the stack aligned as after a call.
void make_context(Context& c, void* stack, size_t size, void (*entry)()) {
  auto* top = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15));
  uint32_t control[2];
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
  *--top = 0;                                   // entry's return address: it never returns
  *--top = reinterpret_cast<uint64_t>(entry);   // popped by the `ret`
  for (int i = 0; i < 6; ++i) *--top = 0;       // rbp, rbx, r12-r15
  *--top = uint64_t(control[0]) | uint64_t(control[1] & 0xffff) << 32;
  c.sp = top;
}
void swap_context(Context& from, const Context& to) { simt_switch_stack(&from.sp, to.sp); }
[[noreturn]] void jump_context(const Context& to) {
  void* discard;
  simt_switch_stack(&discard, to.sp);
  __builtin_unreachable();
}
#else
struct Context {
  ucontext_t uc;
};
void make_context(Context& c, void* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void swap_context(Context& from, const Context& to) { swapcontext(&from.uc, &to.uc); }
[[noreturn]] void jump_context(const Context& to) {
  setcontext(&to.uc);
  __builtin_unreachable();
}
#endif

enum class State { kRunnable, kBarrier, kWarp, kDone };

struct Thread {
  Context ctx;
  void* stack = nullptr;  // the usable stack (a guard page lies below it)
  bool started = false;
  State state = State::kRunnable;
  uint3 idx{0, 0, 0};
  int linear = 0;
  // the pending barrier or collective
  Site site{nullptr, 0};
  BarrierOp bop = BarrierOp::kSync;
  WarpOp wop = WarpOp::kSyncWarp;
  unsigned mask = 0;
  uint64_t value = 0, result = 0;
  int arg = 0, width = 32;
};

struct Run {
  Body body;
  const KernelInfo* kernel = nullptr;
  dim3 grid, block;
  uint3 block_idx{0, 0, 0};
  int n_threads = 0;
  std::vector<Thread> threads;
  Thread* current = nullptr;
  Context scheduler;
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_size = 0;
  std::string failure;  // set by a thread or the scheduler: the launch fails
};
Run* g_run = nullptr;

void* new_stack() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  mprotect(p, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
  return static_cast<char*>(p) + page;
}

// The fiber stacks, reused by every launch. `clean`: every fiber that ran on them returned, so
// the frames below its two outermost ones (fiber_main, switch_to_scheduler, at the top) have
// returned too and left no redzone poisoned; a failed launch leaves fibers stopped mid-kernel,
// and the next launch unpoisons their stacks whole.
struct StackPool {
  std::vector<void*> stacks;
  bool clean = true;
};
StackPool& stack_pool() {
  static StackPool pool;
  return pool;
}
constexpr size_t kStackTopBytes = 16 * 1024;  // holds the outermost frames of a fiber that returned

void switch_to_scheduler(Thread* t, bool dying) {
#if SIMT_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake, g_run->scheduler_stack, g_run->scheduler_stack_size);
#endif
  if (dying) jump_context(g_run->scheduler);
  swap_context(t->ctx, g_run->scheduler);
#if SIMT_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void fiber_main() {
  Run* r = g_run;
  Thread* t = r->current;
#if SIMT_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &r->scheduler_stack, &r->scheduler_stack_size);
#endif
  r->body.invoke(r->body.state);
  t->state = State::kDone;
  switch_to_scheduler(t, true);
}

void resume(Run& r, Thread& t) {
  if (!t.started) {
    t.started = true;
#if SIMT_ASAN
    // left-over redzones of the outermost frames of the fiber that ran here last
    __asan_unpoison_memory_region(static_cast<char*>(t.stack) + kStackBytes - kStackTopBytes, kStackTopBytes);
#endif
    make_context(t.ctx, t.stack, kStackBytes, fiber_main);
  }
  r.current = &t;
#if SIMT_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, t.stack, kStackBytes);
#endif
  swap_context(r.scheduler, t.ctx);
#if SIMT_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  r.current = nullptr;
}

std::string where(const Site& s) { return std::string(s.file ? s.file : "?") + ":" + std::to_string(s.line); }

std::string thread_name(const Thread& t) {
  std::ostringstream o;
  o << "thread (" << t.idx.x << "," << t.idx.y << "," << t.idx.z << ")";
  return o.str();
}

std::string state_name(const Thread& t) {
  switch (t.state) {
    case State::kRunnable: return "runnable";
    case State::kDone: return "returned";
    case State::kBarrier: return "waits at __syncthreads() " + where(t.site);
    case State::kWarp: return "waits at a warp collective " + where(t.site);
  }
  return "?";
}

// ---- resolving barriers and collectives -----------------------------------------------------------
uint64_t shuffle_source(const Thread& t, int lane, bool* own) {
  const int w = t.width;
  const int seg = lane & ~(w - 1);
  int src = lane;
  switch (t.wop) {
    case WarpOp::kShflIdx: src = seg + (t.arg & (w - 1)); break;
    case WarpOp::kShflUp: src = (lane - seg) < t.arg ? lane : lane - t.arg; break;
    case WarpOp::kShflDown: src = (lane - seg) + t.arg >= w ? lane : lane + t.arg; break;
    case WarpOp::kShflXor: src = lane ^ t.arg; if ((src & ~(w - 1)) > seg || src >= kWarp) src = lane; break;
    default: break;
  }
  *own = src == lane;
  return static_cast<uint64_t>(src);
}

// Completes the warp collectives whose lanes have all arrived. Returns whether any did;
// sets r.failure on a mismatch that can never complete.
bool resolve_warps(Run& r) {
  bool progressed = false;
  const int n = r.n_threads;
  for (int w0 = 0; w0 < n; w0 += kWarp) {
    const int lanes = std::min(kWarp, n - w0);
    for (int l = 0; l < lanes; ++l) {
      Thread& t = r.threads[w0 + l];
      if (t.state != State::kWarp) continue;
      if (!(t.mask >> l & 1u)) {
        r.failure = thread_name(t) + " calls a warp collective at " + where(t.site) + " with mask 0x" +
                    [&] { char b[16]; std::snprintf(b, sizeof b, "%08x", t.mask); return std::string(b); }() +
                    " that does not include its own lane " + std::to_string(l);
        return false;
      }
      if (lanes < kWarp && (t.mask >> lanes) != 0) {
        r.failure = thread_name(t) + ": the warp collective at " + where(t.site) +
                    " names lanes that do not exist (the block has " + std::to_string(n) + " threads)";
        return false;
      }
      if (t.width < 1 || t.width > kWarp || (t.width & (t.width - 1)) != 0) {
        r.failure = thread_name(t) + ": shuffle width " + std::to_string(t.width) + " at " + where(t.site) +
                    " is not a power of two in [1, 32]";
        return false;
      }
      // all lanes of the mask waiting at this very collective?
      bool complete = true;
      for (int k = 0; k < lanes; ++k) {
        if (!(t.mask >> k & 1u)) continue;
        const Thread& u = r.threads[w0 + k];
        if (u.state != State::kWarp || u.site.line != t.site.line || u.site.file != t.site.file || u.mask != t.mask ||
            u.wop != t.wop) {
          complete = false;
          break;
        }
      }
      if (!complete) continue;
      // compute every lane's result from the values deposited
      uint64_t ballot = 0;
      for (int k = 0; k < lanes; ++k)
        if ((t.mask >> k & 1u) && r.threads[w0 + k].value != 0) ballot |= uint64_t(1) << k;
      for (int k = 0; k < lanes; ++k) {
        if (!(t.mask >> k & 1u)) continue;
        Thread& u = r.threads[w0 + k];
        switch (u.wop) {
          case WarpOp::kBallot: u.result = ballot; break;
          case WarpOp::kAny: u.result = ballot != 0; break;
          case WarpOp::kAll: u.result = ballot == (t.mask & (lanes == kWarp ? 0xffffffffu : ((1u << lanes) - 1))); break;
          case WarpOp::kSyncWarp: u.result = 0; break;
          default: {
            bool own = false;
            const int src = static_cast<int>(shuffle_source(u, k, &own));
            if (!own && (src >= lanes || !(t.mask >> src & 1u))) {
              r.failure = thread_name(u) + " shuffles from lane " + std::to_string(src) + " at " + where(u.site) +
                          ", which is not in the mask";
              return false;
            }
            u.result = r.threads[w0 + src].value;
          }
        }
      }
      for (int k = 0; k < lanes; ++k)
        if (t.mask >> k & 1u) r.threads[w0 + k].state = State::kRunnable;
      progressed = true;
    }
  }
  return progressed;
}

// No thread can run and no collective completes: the block is done, passes a barrier, or fails.
bool resolve_barrier(Run& r, bool* done) {
  const Thread* at = nullptr;
  const Thread* returned = nullptr;
  const Thread* other = nullptr;
  for (const Thread& t : r.threads) {
    if (t.state == State::kDone) {
      if (!returned) returned = &t;
    } else if (t.state == State::kBarrier) {
      if (!at) at = &t;
      else if (t.site.line != at->site.line || t.site.file != at->site.file) other = &t;
    } else {
      if (!other) other = &t;
    }
  }
  if (at == nullptr && other == nullptr) {
    *done = true;
    return true;
  }
  if (other != nullptr && other->state == State::kWarp) {  // a collective some lane never reaches
    const int w0 = other->linear / kWarp * kWarp;
    for (int k = 0; k < kWarp && w0 + k < r.n_threads; ++k) {
      const Thread& u = r.threads[static_cast<size_t>(w0 + k)];
      if (!(other->mask >> k & 1u) || (u.state == State::kWarp && u.site.line == other->site.line &&
                                        u.site.file == other->site.file && u.mask == other->mask))
        continue;
      char mask[16];
      std::snprintf(mask, sizeof mask, "%08x", other->mask);
      r.failure = "warp collective at " + where(other->site) + " with mask 0x" + mask + ": " +
                  thread_name(*other) + " waits there, but lane " + std::to_string(k) + ", " + thread_name(u) +
                  ", " + state_name(u);
      return false;
    }
  }
  if (other != nullptr || returned != nullptr) {
    const Thread* b = other != nullptr ? other : returned;
    r.failure = "divergent __syncthreads() in block (" + std::to_string(r.block_idx.x) + "," +
                std::to_string(r.block_idx.y) + "," + std::to_string(r.block_idx.z) + "): " +
                (at ? thread_name(*at) + " " + state_name(*at) : std::string("no thread waits at a barrier")) +
                ", but " + thread_name(*b) + " " + state_name(*b);
    return false;
  }
  // every thread at the same barrier: release it (with the reduction of the predicate)
  int count = 0, all = 1, any = 0;
  for (const Thread& t : r.threads) {
    count += static_cast<int>(t.value != 0);
    all &= static_cast<int>(t.value != 0);
    any |= static_cast<int>(t.value != 0);
  }
  for (Thread& t : r.threads) {
    switch (t.bop) {
      case BarrierOp::kCount: t.result = static_cast<uint64_t>(count); break;
      case BarrierOp::kAnd: t.result = static_cast<uint64_t>(all); break;
      case BarrierOp::kOr: t.result = static_cast<uint64_t>(any); break;
      default: t.result = 0;
    }
    t.state = State::kRunnable;
  }
  return true;
}

std::vector<int> schedule_order(int n, uint64_t salt) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (config().order == 1) {
    std::reverse(order.begin(), order.end());
  } else if (config().order == 2) {
    std::mt19937_64 rng(config().seed * 0x9e3779b97f4a7c15ull + salt);
    std::shuffle(order.begin(), order.end(), rng);
  }
  return order;
}

void poison_shared(const KernelInfo& K, bool asan_protect) {
  Symbols& S = symbols();
#if SIMT_ASAN
  if (asan_protect && S.section_end > S.section_begin)
    __asan_poison_memory_region(reinterpret_cast<void*>(S.section_begin), S.section_end - S.section_begin);
#endif
  (void)asan_protect;
  auto fill = [](const SharedVar& v) {
#if SIMT_ASAN
    __asan_unpoison_memory_region(reinterpret_cast<void*>(v.addr), v.size);
#endif
    std::memset(reinterpret_cast<void*>(v.addr), config().poison, v.size);
  };
  for (const SharedVar* v : K.own)
    if (!v->guard) fill(*v);
  for (const SharedVar* v : K.common) fill(*v);
#if SIMT_ASAN
  for (const SharedVar* v : K.own)  // guards stay poisoned: an overflow into one is reported
    if (v->guard) __asan_poison_memory_region(reinterpret_cast<void*>(v->addr), v->size);
#endif
}

bool run_block(Run& r, const uint3& b) {
  r.block_idx = b;
  poison_shared(*r.kernel, false);
  for (int i = 0; i < r.n_threads; ++i) {
    Thread& t = r.threads[static_cast<size_t>(i)];
    t.started = false;
    t.state = State::kRunnable;
  }
  const std::vector<int> order =
      schedule_order(r.n_threads, (uint64_t(b.z) * 65536 + b.y) * 2147483648ull + b.x);
  for (;;) {
    bool ran = false;
    for (int i : order) {
      Thread& t = r.threads[static_cast<size_t>(i)];
      if (t.state != State::kRunnable) continue;
      resume(r, t);
      ran = true;
      if (!r.failure.empty()) return false;
    }
    if (ran) continue;
    if (resolve_warps(r)) continue;
    if (!r.failure.empty()) return false;
    bool done = false;
    if (!resolve_barrier(r, &done)) return false;
    if (done) return true;
  }
}

std::string shape(const dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

}  // namespace

// ---- the device API ---------------------------------------------------------------------------
const uint3& thread_idx() { return g_run->current->idx; }
const uint3& block_idx() { return g_run->block_idx; }
const dim3& block_dim() { return g_run->block; }
const dim3& grid_dim() { return g_run->grid; }

int barrier(Site site, BarrierOp op, int predicate) {
  Thread* t = g_run->current;
  t->state = State::kBarrier;
  t->site = site;
  t->bop = op;
  t->value = static_cast<uint64_t>(predicate);
  switch_to_scheduler(t, false);
  return static_cast<int>(t->result);
}

uint64_t warp_collective(Site site, WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  Thread* t = g_run->current;
  t->state = State::kWarp;
  t->site = site;
  t->wop = op;
  t->mask = mask;
  t->value = value;
  t->arg = arg;
  t->width = width;
  switch_to_scheduler(t, false);
  return t->result;
}

bool register_bounds(const char* kernel, int max_threads, const char* file, int line) {
  const std::string where = std::string(file) + ":" + std::to_string(line);
  auto& b = bounds();
  auto it = b.find(kernel);
  if (it == b.end()) {
    b[kernel] = Bounds{max_threads, where, ""};
  } else if (it->second.max_threads != max_threads) {
    it->second.conflict = "two kernels named " + std::string(kernel) + " declare different __launch_bounds__ (" +
                          it->second.where + " and " + where + "): give them distinct names";
  }
  return true;
}

int run_launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, Body body) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  (void)stream;  // every launch runs now, in order: one stream
  KernelInfo& K = kernel_info(kernel);
  const int64_t threads = int64_t(block.x) * block.y * block.z;
  const int64_t blocks = int64_t(grid.x) * grid.y * grid.z;
  {
    std::ostringstream o;
    o << K.name << " grid=" << grid.x << "," << grid.y << "," << grid.z << " block=" << block.x << "," << block.y
      << "," << block.z << " shared=" << K.static_shared;
    launch_log().push_back(o.str());
  }
  const std::string who = K.pretty + " <<<" + shape(grid) + ", " + shape(block) + ">>>: ";
  if (!symbols().error.empty()) return fail(cudaErrorLaunchFailure, "cannot read the module's symbols: " + symbols().error);
  if (!K.bounds_conflict.empty()) return fail(cudaErrorInvalidDeviceFunction, K.bounds_conflict);
  if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    return fail(cudaErrorInvalidConfiguration, who + "a grid or block dimension is 0");
  if (block.x > 1024 || block.y > 1024 || block.z > 64 || threads > kMaxThreads)
    return fail(cudaErrorInvalidConfiguration, who + "more than 1024 threads a block (or a block dimension past its limit)");
  if (grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    return fail(cudaErrorInvalidConfiguration, who + "gridDim.y and gridDim.z are at most 65535, gridDim.x at most 2^31 - 1");
  if (threads > K.max_threads)
    return fail(cudaErrorLaunchOutOfResources, who + std::to_string(threads) + " threads a block, more than the kernel's "
                "__launch_bounds__(" + std::to_string(K.max_threads) + ")");
  if (K.static_shared > kMaxStaticShared)
    return fail(cudaErrorInvalidConfiguration, who + std::to_string(K.static_shared) +
                " bytes of static shared memory, more than 48 KiB (ptxas refuses such a kernel)");
  if (shared_bytes != 0)
    return fail(cudaErrorInvalidConfiguration, who + "dynamic shared memory is not emulated");
  if (config().dry_run || blocks == 0) return 0;

  Run r;
  r.body = body;
  r.kernel = &K;
  r.grid = grid;
  r.block = block;
  r.n_threads = static_cast<int>(threads);
  r.threads.resize(static_cast<size_t>(threads));
  StackPool& pool = stack_pool();
  while (pool.stacks.size() < static_cast<size_t>(threads)) {
    void* s = new_stack();
    if (s == nullptr) return fail(cudaErrorMemoryAllocation, "cannot allocate fiber stacks");
    pool.stacks.push_back(s);
  }
#if SIMT_ASAN
  if (!pool.clean)
    for (void* s : pool.stacks) __asan_unpoison_memory_region(s, kStackBytes);
#endif
  pool.clean = true;
  for (int i = 0; i < r.n_threads; ++i) {
    Thread& t = r.threads[static_cast<size_t>(i)];
    t.stack = pool.stacks[static_cast<size_t>(i)];
    t.linear = i;
    t.idx = uint3{static_cast<unsigned>(i % block.x), static_cast<unsigned>(i / block.x % block.y),
                  static_cast<unsigned>(i / (block.x * block.y))};
  }
  poison_shared(K, true);
  Run* saved = g_run;
  g_run = &r;
  const std::vector<int> order = schedule_order(static_cast<int>(blocks), 0x5157ull);
  bool ok = true;
  for (int lb : order) {
    const uint3 b{static_cast<unsigned>(lb % grid.x), static_cast<unsigned>(lb / grid.x % grid.y),
                  static_cast<unsigned>(lb / (int64_t(grid.x) * grid.y))};
    if (!run_block(r, b)) {
      ok = false;
      break;
    }
  }
  g_run = saved;
  if (!ok) {
    pool.clean = false;  // fibers stopped mid-kernel: their frames' redzones are still poisoned
    return fail(cudaErrorLaunchFailure, who + r.failure);
  }
  return 0;
}

}  // namespace simt

// ---- the CUDA runtime API, as far as the kernels' entry points use it ---------------------------
cudaError_t cudaGetLastError() {
  const cudaError_t e = simt::errors().last;
  simt::errors().last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return simt::errors().last; }
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    default: break;
  }
  // the emulator's own explanation of the failure it just reported
  thread_local std::string message;
  message = simt::errors().message.empty() ? "error " + std::to_string(static_cast<int>(error))
                                           : simt::errors().message;
  return message.c_str();
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 0;  // not a CUDA runtime: the emulator
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

// ---- approximations: the special-function unit's documented error ----------------------------------
namespace simt {
namespace {
struct ApproxMode {
  int mode = 1;
  uint64_t seed = 0x9e3779b97f4a7c15ull;
};
ApproxMode& approx_mode() {
  static ApproxMode m = [] {
    ApproxMode a;
    if (const char* e = std::getenv("FASTRANK_SIMT_APPROX")) a.mode = std::atoi(e);
    return a;
  }();
  return m;
}

uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float flush(float x) { return std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; }

// the correctly rounded `exact` moved by an offset in [-ulps, ulps] units in the last place (the
// mode's choice); zeros, infinities and NaN stay as they are
float perturb(double exact, uint32_t op, uint64_t in_bits, int ulps) {
  float r = static_cast<float>(exact);
  const ApproxMode& m = approx_mode();
  if (m.mode == 0 || ulps <= 0 || r == 0.0f || !std::isfinite(r)) return r;
  int64_t k = 0;
  if (m.mode == 2) k = ulps;
  else if (m.mode == 3) k = -ulps;
  else k = static_cast<int64_t>(mix(m.seed ^ mix(in_bits * 0x100000001b3ull + op)) % uint64_t(2 * ulps + 1)) - ulps;
  uint32_t b;
  std::memcpy(&b, &r, 4);
  const uint32_t mag = b & 0x7fffffffu, sign = b & 0x80000000u;
  int64_t nm = static_cast<int64_t>(mag) + k;  // ulps of the magnitude: stays finite and >= 0 below
  if (nm < 0) nm = 0;
  if (nm > 0x7f7fffff) nm = 0x7f7fffff;
  b = sign | static_cast<uint32_t>(nm);
  std::memcpy(&r, &b, 4);
  return r;
}
uint64_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
}  // namespace

float ex2_approx(float x) { return flush(perturb(std::exp2(static_cast<double>(flush(x))), 1, bits(x), 2)); }
float rcp_approx(float x) { return flush(perturb(1.0 / static_cast<double>(flush(x)), 2, bits(x), 2)); }
float expf_approx(float x) {
  return perturb(std::exp(static_cast<double>(x)), 3, bits(x), 2 + static_cast<int>(std::floor(std::fabs(1.173 * x))));
}
float fdividef_approx(float a, float b) {
  return perturb(static_cast<double>(a) / static_cast<double>(b), 4, bits(a) << 32 | bits(b), 2);
}
}  // namespace simt

// ---- control from Python (ctypes) -----------------------------------------------------------------
extern "C" {
__attribute__((visibility("default"))) void simt_configure(int order, unsigned long long seed, int poison, int dry_run) {
  simt::config() = simt::Config{order, seed, poison & 0xff, dry_run};
}
__attribute__((visibility("default"))) int simt_log_size() { return static_cast<int>(simt::launch_log().size()); }
__attribute__((visibility("default"))) int simt_log_entry(int i, char* buf, int len) {
  const auto& log = simt::launch_log();
  if (i < 0 || i >= static_cast<int>(log.size()) || len <= 0) return -1;
  std::snprintf(buf, static_cast<size_t>(len), "%s", log[static_cast<size_t>(i)].c_str());
  return static_cast<int>(log[static_cast<size_t>(i)].size());
}
__attribute__((visibility("default"))) void simt_log_clear() { simt::launch_log().clear(); }
// The approximations' mode (simt.h: 0 exact, 1 hashed within the bound, 2 +bound, 3 -bound) and seed.
__attribute__((visibility("default"))) void simt_approx(int mode, unsigned long long seed) {
  simt::approx_mode() = simt::ApproxMode{mode, seed};
}
}
