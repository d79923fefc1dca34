# The operator registry is the only dispatch (docs/onnx-backend-layout.md): no
# source of the model (libcaf_serving/onnx) or of a backend (onnx_cpu, cuda)
# picks an operator's implementation by comparing its name with a string.
#
#   cmake -DROOT=<libcaf_serving> -P CafServingOpDispatch.cmake
#
# fails with every offending line (file:line: text) where
#  - an operator file (onnx/ops*.cpp, onnx/ops*.hpp: the entries' shape
#    inference and reference kernels) compares an operator's name at all: an
#    entry's functions are its operator's own, and what operators share is a
#    helper that takes what differs as an argument;
#  - any other source chains comparisons of the handled node's name (`op`,
#    `n.op`, `nd.op`, `node.op` == "..." or a name's constant, `quant_add_op`):
#    an `else if` on it, two `if`
#    statements in a row on it, or a conditional expression choosing by it
#    twice (`op == "A" ? a : op == "B" ? b : c`). Such a chain is a table (a
#    std::map, or the entries of a kernel_table). One test of the name (a
#    special case), and a pass matching a pattern over neighbouring nodes
#    (`g.nodes[p].op == "Mul"`), are not a dispatch and are left alone.
# Unit tests and their helpers (*.test.cpp, *testing.hpp) are not checked.
# cmake/op_dispatch_cases/ holds sources of each kind, and of what is left
# alone; onnx.op_dispatch_cases.test checks that this script tells them apart.

if(NOT ROOT)
  message(FATAL_ERROR "CafServingOpDispatch.cmake needs -DROOT=<libcaf_serving>")
endif()

get_filename_component(ROOT "${ROOT}" ABSOLUTE)
file(GLOB_RECURSE sources
     ${ROOT}/onnx/*.cpp ${ROOT}/onnx/*.hpp
     ${ROOT}/onnx_cpu/*.cpp ${ROOT}/onnx_cpu/*.hpp
     ${ROOT}/cuda/*.cpp ${ROOT}/cuda/*.hpp ${ROOT}/cuda/*.cu ${ROOT}/cuda/*.cuh)
list(FILTER sources EXCLUDE REGEX "(\\.test\\.cpp|testing\\.hpp)$")

# Any comparison of an operator's name: `op == x`, `n.op != "..."`, ...
set(any_name_test "(^|[^A-Za-z0-9_])op [!=]= |\\.op [!=]= ")
# The handled node's name compared with a string or a name's constant.
set(a_name "(\"|[a-z_]*_op([^A-Za-z0-9_]|$))")
set(own_name_test "(^|[^A-Za-z0-9_.])((n|nd|node)\\.)?op == ${a_name}")
# ... twice in one conditional expression.
set(conditional_chain "${own_name_test}.*\\?.*op == ${a_name}")

set(offences "")
foreach(file IN LISTS sources)
  file(RELATIVE_PATH shown ${ROOT} ${file})
  set(operator_file FALSE)
  if(shown MATCHES "^onnx/ops[a-z_]*\\.(cpp|hpp)$")
    set(operator_file TRUE)
  endif()
  # One list element per line: semicolons and brackets, which CMake's lists
  # read as separators and groupings, stand in as words.
  file(READ ${file} content)
  string(REPLACE ";" "<semicolon>" content "${content}")
  string(REPLACE "[" "<bracket>" content "${content}")
  string(REPLACE "]" "<end-bracket>" content "${content}")
  string(REPLACE "\\" "<backslash>" content "${content}")
  string(REPLACE "\n" ";" lines "${content}")
  set(number 0)
  set(chain_indent -1) # indentation of the last `if` on the node's name, -1: none open
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    if(NOT line MATCHES "[^ ]")
      continue()
    endif()
    set(indent 0)
    if(line MATCHES "^( +)")
      string(LENGTH "${CMAKE_MATCH_1}" indent)
    endif()
    string(STRIP "${line}" text)
    if(operator_file AND line MATCHES "${any_name_test}")
      list(APPEND offences
           "${shown}:${number}: an operator's name compared in an operator file: ${text}")
      continue()
    endif()
    if(line MATCHES "${conditional_chain}")
      list(APPEND offences
           "${shown}:${number}: a conditional chain on the operator's name: ${text}")
      continue()
    endif()
    if(line MATCHES "${own_name_test}")
      if(text MATCHES "^(} )?else if \\(")
        list(APPEND offences "${shown}:${number}: an else-if on the operator's name: ${text}")
        continue()
      endif()
      if(text MATCHES "^if \\(")
        if(chain_indent EQUAL indent)
          list(APPEND offences "${shown}:${number}: a second if on the operator's name: ${text}")
        endif()
        set(chain_indent ${indent})
        continue()
      endif()
    endif()
    # A statement at the chain's depth or above ends it; its bodies and closing
    # braces do not.
    if(chain_indent GREATER_EQUAL 0 AND NOT text MATCHES "^}"
       AND NOT indent GREATER chain_indent)
      set(chain_indent -1)
    endif()
  endforeach()
endforeach()

if(offences)
  list(LENGTH offences count)
  string(REPLACE ";" "\n" listed "${offences}")
  string(REPLACE "<semicolon>" ";" listed "${listed}")
  string(REPLACE "<bracket>" "[" listed "${listed}")
  string(REPLACE "<end-bracket>" "]" listed "${listed}")
  string(REPLACE "<backslash>" "\\" listed "${listed}")
  message("${listed}")
  message(FATAL_ERROR "${count} dispatch(es) on operator names outside the operator registry's "
                      "tables: give the operator its entry instead (docs/onnx-backend-layout.md)")
endif()
