// __libc_single_threaded, defined in the module itself, as 0 (CMakeLists.txt, "How the modules
// are linked").
//
// libstdc++ of GCC 11 and later reads this glibc variable (glibc 2.32+) wherever glibc's headers
// declare it (ext/atomicity.h: while it is non-zero, a reference count, of a std::shared_ptr or a
// std::locale, is updated without an atomic instruction), in the module's code and in the parts
// of libstdc++.a linked into it. glibc 2.28 lacks it, and a module reading glibc's would not load
// there; this hidden definition binds every reference within the module to it instead. 0 reads
// "other threads may run": every such update is atomic, what libstdc++ did before GCC 11 in a
// process with threads (as every process that has loaded torch).
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
