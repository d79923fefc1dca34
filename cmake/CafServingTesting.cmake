# One CTest entry per test file, each with a timeout (STYLE.md).
#
#   caf_serving_add_test(NAME name SOURCES a.test.cpp LIBS lib... [LABELS l...]
#                        [TIMEOUT seconds] [ARGS arg...])
#
# ARGS are passed to the test binary by CTest (a doctest filter, for example).
# A test that cannot run here exits 77, which CTest reports as skipped, not passed.
#
# The test file is a doctest file; doctest's main is compiled in through
# DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN so no test needs a main of its own.
function(caf_serving_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
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
endfunction()
