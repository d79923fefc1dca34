# Which library may link which (docs/onnx-backend-layout.md): the ONNX model
# library (libcaf_serving/onnx) and the CUDA backend must never link the ONNX
# CPU backend (libcaf_serving/onnx_cpu), directly or through another library.
#
#   caf_serving_forbid_link(TARGET t FORBIDDEN lib... [WHY text])
#
# checks once every target is defined (at the end of the top-level
# CMakeLists.txt) and stops the configuration with the chain that links one.

# The targets `target` links, with the chain that leads to each, appended to
# the caller's `seen` and `chains`.
function(_caf_serving_link_closure target chain)
  foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
    get_target_property(libs ${target} ${prop})
    if(NOT libs)
      continue()
    endif()
    foreach(lib IN LISTS libs)
      # $<LINK_ONLY:x> (a static library's private dependency) links x all the same.
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
      if(lib MATCHES "^\\$<" OR NOT TARGET ${lib})
        continue()
      endif()
      get_target_property(aliased ${lib} ALIASED_TARGET)
      if(aliased)
        set(lib ${aliased})
      endif()
      if(lib IN_LIST seen)
        continue()
      endif()
      list(APPEND seen ${lib})
      list(APPEND chains "${chain} -> ${lib}")
      _caf_serving_link_closure(${lib} "${chain} -> ${lib}")
    endforeach()
  endforeach()
  set(seen ${seen} PARENT_SCOPE)
  set(chains ${chains} PARENT_SCOPE)
endfunction()

function(_caf_serving_check_forbidden target forbidden why)
  if(NOT TARGET ${target})
    return()
  endif()
  set(seen "")
  set(chains "")
  _caf_serving_link_closure(${target} ${target})
  foreach(f IN LISTS forbidden)
    foreach(c IN LISTS chains)
      if(c MATCHES " -> ${f}$")
        message(FATAL_ERROR "${target} links ${f} (${c}), which it must not: ${why}")
      endif()
    endforeach()
  endforeach()
endfunction()

function(caf_serving_forbid_link)
  cmake_parse_arguments(F "" "TARGET;WHY" "FORBIDDEN" ${ARGN})
  # EVAL: the deferred call gets the values now, not the names.
  cmake_language(EVAL CODE "cmake_language(DEFER DIRECTORY [[${CMAKE_SOURCE_DIR}]] CALL \
_caf_serving_check_forbidden [[${F_TARGET}]] [[${F_FORBIDDEN}]] [[${F_WHY}]])")
endfunction()

# Which library may include which headers, even through other headers:
#
#   caf_serving_forbid_include(TEST name TARGET t HEADERS header... [WHY text])
#
# adds the CTest `name`, which preprocesses every source of `t` with its include
# directories and fails, naming the chain of includes, when one of them reaches
# a header whose path contains one of `headers` (e.g. schemas/serving.capnp.h,
# or /caf/ for every header of CAF).
function(caf_serving_forbid_include)
  cmake_parse_arguments(F "" "TEST;TARGET;WHY" "HEADERS" ${ARGN})
  get_target_property(sources ${F_TARGET} SOURCES)
  get_target_property(dir ${F_TARGET} SOURCE_DIR)
  set(paths "")
  foreach(s IN LISTS sources)
    cmake_path(ABSOLUTE_PATH s BASE_DIRECTORY ${dir} OUTPUT_VARIABLE p)
    list(APPEND paths ${p})
  endforeach()
  # Lists travel joined with '|': add_test would split them at ';'.
  list(JOIN paths "|" joined)
  list(JOIN F_HEADERS "|" headers)
  string(REPLACE ";" "," why "${F_WHY}")
  add_test(NAME ${F_TEST}
           COMMAND ${CMAKE_COMMAND} -DCOMPILER=${CMAKE_CXX_COMPILER}
                   "-DINCLUDES=$<JOIN:$<TARGET_PROPERTY:${F_TARGET},INCLUDE_DIRECTORIES>,|>"
                   "-DDEFINES=$<JOIN:$<TARGET_PROPERTY:${F_TARGET},COMPILE_DEFINITIONS>,|>"
                   "-DSOURCES=${joined}" "-DHEADERS=${headers}" "-DTARGET=${F_TARGET}"
                   "-DWHY=${why}" -P ${CMAKE_SOURCE_DIR}/cmake/caf_serving_check_includes.cmake)
  set_tests_properties(${F_TEST} PROPERTIES TIMEOUT 60)
endfunction()
