# One CTest entry per test file, each with a timeout (STYLE.md).
#
#   caf_serving_add_test(NAME name SOURCES a.test.cpp LIBS lib... [LABELS l...]
#                        [TIMEOUT seconds] [ARGS arg...] [ISA_LEVELS])
#
# ARGS are passed to the test binary by CTest (a doctest filter, for example).
# A test that cannot run here exits 77, which CTest reports as skipped, not passed.
#
# The test file is a doctest file; doctest's main is compiled in through
# DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN so no test needs a main of its own.
function(caf_serving_add_test)
  cmake_parse_arguments(T "ISA_LEVELS" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE doctest::doctest ${T_LIBS})
  target_compile_definitions(${T_NAME} PRIVATE DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77)
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
  if(T_ISA_LEVELS)
    caf_serving_add_isa_levels(${T_NAME} $<TARGET_FILE:${T_NAME}> ${T_ARGS})
  endif()
endfunction()

# caf_serving_add_isa_levels(name command...): the test `name`, defined just
# before in the same directory, once more at each x86 level below the best
# (issue 32): name@avx2 and name@avx512_core run `command` with
# ONEDNN_MAX_CPU_ISA set, which caps oneDNN and the engine's own kernels
# alike (kernels/cpu/cpu_isa.hpp), and at AVX2 with OpenBLAS's Haswell
# kernels. A machine with AVX-512, VNNI and AMX thus runs what an AVX2-only
# machine (no VNNI: the exact int8 path, 8-channel blocks) and an AVX-512
# machine without VNNI run. On a machine below a level, that entry runs at
# the machine's own. Each runs in a folder of its own, so that tests writing
# files to their working directory do not meet.
function(caf_serving_add_isa_levels name)
  get_test_property(${name} TIMEOUT timeout)
  get_test_property(${name} LABELS labels)
  if(NOT labels)
    set(labels "")
  endif()
  foreach(level AVX2 AVX512_CORE)
    string(TOLOWER ${level} suffix)
    set(dir ${CMAKE_CURRENT_BINARY_DIR}/isa_${suffix})
    file(MAKE_DIRECTORY ${dir})
    add_test(NAME ${name}@${suffix} COMMAND ${ARGN} WORKING_DIRECTORY ${dir})
    set(env ONEDNN_MAX_CPU_ISA=${level})
    if(level STREQUAL "AVX2")
      list(APPEND env OPENBLAS_CORETYPE=Haswell)
    endif()
    set_tests_properties(${name}@${suffix} PROPERTIES ENVIRONMENT "${env}" TIMEOUT ${timeout}
                         SKIP_RETURN_CODE 77 LABELS "${labels};isa")
  endforeach()
endfunction()
