# Structural rules about source files, checked by CTest: like a layering rule
# (CafServingLayering.cmake), a rule about how the code is laid out is a
# failing test, not a wish.
#
#   caf_serving_source_rule(NAME name FILES glob... [MAX_LINES n]
#                           [FORBID regex...] [REQUIRE regex...] WHY text)
#
# adds the CTest entry `name`. It fails, naming each file and what it broke,
# when a file matching one of the globs (relative to the source root) has more
# than MAX_LINES lines, matches a FORBID regex anywhere, or matches no REQUIRE
# regex of the list (each must match). The globs are expanded when the test
# runs, so a file added later is checked too; a rule whose globs match no file
# fails. Regexes are CMake's and may not contain ';'.

set(_caf_serving_source_rule_check ${CMAKE_CURRENT_LIST_DIR}/source_rule_check.cmake)

function(caf_serving_source_rule)
  cmake_parse_arguments(R "" "NAME;MAX_LINES;WHY" "FILES;FORBID;REQUIRE" ${ARGN})
  if(NOT R_NAME OR NOT R_FILES OR NOT R_WHY)
    message(FATAL_ERROR "caf_serving_source_rule needs NAME, FILES and WHY")
  endif()
  set(script ${CMAKE_CURRENT_BINARY_DIR}/${R_NAME}.cmake)
  file(WRITE ${script}
       "set(rule_name [==[${R_NAME}]==])\n"
       "set(root [==[${CMAKE_SOURCE_DIR}]==])\n"
       "set(globs [==[${R_FILES}]==])\n"
       "set(max_lines [==[${R_MAX_LINES}]==])\n"
       "set(forbid [==[${R_FORBID}]==])\n"
       "set(require [==[${R_REQUIRE}]==])\n"
       "set(why [==[${R_WHY}]==])\n"
       "include([==[${_caf_serving_source_rule_check}]==])\n")
  add_test(NAME ${R_NAME} COMMAND ${CMAKE_COMMAND} -P ${script})
  set_tests_properties(${R_NAME} PROPERTIES TIMEOUT 30 LABELS rule)
endfunction()
