# Checks one CPU level's self-contained object (CMakeLists.txt, "One definition rule across
# levels"): run by the build right after the object is made, so a module whose levels could
# share code is never linked.
#   cmake -DNM=nm -DOBJDUMP=objdump -DOBJECT=fastrank_cpu_avx2.o -DSYMBOL=<mangled> -P check_cpu_level.cmake
# 1. its only global or weak symbol is the level's registration function SYMBOL: nothing else
#    of the level (kernels, std:: and pybind11 template instances, inline functions) can be
#    bound to from outside it, nor replace another level's copy;
# 2. no COMDAT group is left (the final link would keep one copy per group across levels);
# 3. no static initialiser (.init_array / .ctors): no code of a level runs when the module
#    is loaded, before the CPU has been asked whether it can run that level.
execute_process(COMMAND ${NM} -g --defined-only ${OBJECT} OUTPUT_VARIABLE _syms RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${OBJECT}")
endif()
string(REGEX REPLACE "\n$" "" _syms "${_syms}")
string(REPLACE "\n" ";" _syms "${_syms}")
set(_others "")
foreach(_line IN LISTS _syms)
  if(NOT _line MATCHES " ${SYMBOL}$")
    list(APPEND _others "${_line}")
  endif()
endforeach()
list(LENGTH _syms _n)
if(_others OR NOT _n EQUAL 1)
  string(REPLACE ";" "\n  " _others "${_others}")
  message(FATAL_ERROR "${OBJECT}: global or weak symbols other than ${SYMBOL} (${_n} in all):\n  ${_others}")
endif()
execute_process(COMMAND ${OBJDUMP} -h ${OBJECT} OUTPUT_VARIABLE _sections RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${OBJDUMP} failed on ${OBJECT}")
endif()
if(_sections MATCHES "[ \t](\\.group|\\.init_array|\\.ctors|\\.preinit_array)")
  message(FATAL_ERROR "${OBJECT} holds a ${CMAKE_MATCH_1} section (see cmake/check_cpu_level.cmake)")
endif()
