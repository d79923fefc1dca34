# Find module for the C++ Actor Framework as Debian 12 packages it (libcaf-dev 0.17):
# no CMake config and no pkg-config file ship with it.
#
# Provides CAF_FOUND, CAF_VERSION and the imported targets CAF::core, CAF::io and
# CAF::openssl (the names newer CAF releases export themselves).

find_path(CAF_INCLUDE_DIR caf/config.hpp)
find_library(CAF_CORE_LIBRARY caf_core)
find_library(CAF_IO_LIBRARY caf_io)
find_library(CAF_OPENSSL_LIBRARY caf_openssl)

if(CAF_INCLUDE_DIR)
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" caf_version_line
       REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CAF_VERSION ([0-9]+).*" "\\1" caf_version_number
         "${caf_version_line}")
  math(EXPR caf_major "${caf_version_number} / 10000")
  math(EXPR caf_minor "(${caf_version_number} / 100) % 100")
  math(EXPR caf_patch "${caf_version_number} % 100")
  set(CAF_VERSION "${caf_major}.${caf_minor}.${caf_patch}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY
  VERSION_VAR CAF_VERSION)

if(CAF_FOUND)
  find_package(Threads REQUIRED)
  foreach(component core io openssl)
    string(TOUPPER "${component}" upper)
    if(CAF_${upper}_LIBRARY AND NOT TARGET CAF::${component})
      add_library(CAF::${component} UNKNOWN IMPORTED)
      set_target_properties(CAF::${component} PROPERTIES
        IMPORTED_LOCATION "${CAF_${upper}_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES Threads::Threads)
    endif()
  endforeach()
  set_property(TARGET CAF::io APPEND PROPERTY INTERFACE_LINK_LIBRARIES CAF::core)
  if(TARGET CAF::openssl)
    set_property(TARGET CAF::openssl APPEND PROPERTY INTERFACE_LINK_LIBRARIES CAF::io)
  endif()
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY)
