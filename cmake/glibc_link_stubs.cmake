# Link stubs of an older glibc (FASTRANK_GLIBC, e.g. 2.28), for a module that loads on that glibc
# and every later one, though this machine's glibc is newer (CMakeLists.txt, "How the modules are
# linked"; docs/developing.md, "Source distribution and wheels").
#
# A reference to a glibc function is bound at link time to the newest version of it that the
# libraries linked against define: against glibc 2.36, exp@GLIBC_2.29, pthread_once@GLIBC_2.34
# (glibc 2.34 moved libpthread, libdl and librt into libc), which glibc 2.28 lacks. zig (the
# `ziglang` package) ships the symbol lists of every glibc release and makes stubs of one
# (libc.so.6, libm.so.6, libpthread.so.0, libdl.so.2, librt.so.1, ld-linux: names and versions,
# no code). Linked against those, every reference, ours and those of the static archives linked
# in (libstdc++.a, libcudart_static.a), gets the version that release has, and a function that
# moved to libc since is needed from the library that held it then. The compiler stays GCC: zig
# only makes the stubs.
#
# Sets FASTRANK_GLIBC_LINK_DIR: a directory to search before the system's library directories,
# with libc.so (a linker script, as glibc's own: the libc stub, this system's libc_nonshared.a,
# and the other stubs as needed), libm.so, libpthread.so, libdl.so and librt.so.
if(NOT FASTRANK_ZIG OR NOT EXISTS "${FASTRANK_ZIG}")
  message(FATAL_ERROR "FASTRANK_GLIBC=${FASTRANK_GLIBC} needs zig to make that glibc's link stubs: "
                      "pip install ziglang (FASTRANK_ZIG: '${FASTRANK_ZIG}')")
endif()
set(_dir ${CMAKE_BINARY_DIR}/glibc-${FASTRANK_GLIBC})
set(_cache ${_dir}/zig-cache)
file(GLOB _libc ${_cache}/o/*/libc.so.6)
list(LENGTH _libc _n)
if(NOT _n EQUAL 1)   # none made yet (or sets of two zig versions): make them afresh
  file(REMOVE_RECURSE ${_cache})
  file(WRITE ${_dir}/probe.c "int fastrank_glibc_probe(void) { return 0; }\n")
  # linking a probe library against every library of the set makes zig write the stubs into
  # its cache (this build's own, so one set is there)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env ZIG_GLOBAL_CACHE_DIR=${_cache} ZIG_LOCAL_CACHE_DIR=${_cache}
            ${FASTRANK_ZIG} cc -target ${CMAKE_SYSTEM_PROCESSOR}-linux-gnu.${FASTRANK_GLIBC}
            -O2 -fno-sanitize=all -shared -o ${_dir}/probe.so ${_dir}/probe.c -lc -lm -lpthread -ldl -lrt
    RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  file(GLOB _libc ${_cache}/o/*/libc.so.6)
  list(LENGTH _libc _n)
  if(NOT _rc EQUAL 0 OR NOT _n EQUAL 1)
    message(FATAL_ERROR "zig made no glibc ${FASTRANK_GLIBC} link stubs (exit ${_rc}, ${_n} libc.so.6 in ${_cache}):\n${_err}")
  endif()
endif()
get_filename_component(_stubs ${_libc} DIRECTORY)
execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libc_nonshared.a
                OUTPUT_VARIABLE _nonshared OUTPUT_STRIP_TRAILING_WHITESPACE)
set(FASTRANK_GLIBC_LINK_DIR ${_dir}/lib)
file(MAKE_DIRECTORY ${FASTRANK_GLIBC_LINK_DIR})
# the other stubs (libm, libpthread, libdl, librt, ld-linux, ...) as needed, as glibc's own
# libc.so names ld-linux; libc_nonshared.a: atexit, pthread_atfork, __stack_chk_fail_local
# (which call functions glibc 2.2.5 has)
file(GLOB _others ${_stubs}/lib*.so.*)
list(REMOVE_ITEM _others ${_libc})
string(REPLACE ";" " " _others "${_others}")
file(WRITE ${FASTRANK_GLIBC_LINK_DIR}/libc.so
"/* glibc ${FASTRANK_GLIBC} link stubs made by zig (cmake/glibc_link_stubs.cmake) */
GROUP ( ${_libc} ${_nonshared} AS_NEEDED ( ${_others} ) )
")
foreach(_lib m.so.6 pthread.so.0 dl.so.2 rt.so.1)
  string(REGEX REPLACE "\\.so\\..*" ".so" _link lib${_lib})
  file(CREATE_LINK ${_stubs}/lib${_lib} ${FASTRANK_GLIBC_LINK_DIR}/${_link} SYMBOLIC)
endforeach()
message(STATUS "fastrank: linking against the symbols of glibc ${FASTRANK_GLIBC} (${_stubs})")
