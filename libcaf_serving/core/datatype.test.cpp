#include "core/datatype.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;

TEST_CASE("KServe and config names round-trip for every datatype") {
  for (int i = 0; i <= static_cast<int>(datatype::bytes); ++i) {
    auto t = static_cast<datatype>(i);
    CHECK(datatype_from_kserve(to_string(t)) == t);
    CHECK(datatype_from_config(to_config_string(t)) == t);
  }
}

TEST_CASE("unknown names and element sizes") {
  CHECK_FALSE(datatype_from_kserve("FLOAT32").has_value());
  CHECK_FALSE(datatype_from_config("FP32").has_value());
  CHECK(element_size(datatype::fp32) == 4);
  CHECK(element_size(datatype::bf16) == 2);
  CHECK(element_size(datatype::bytes) == 0);
  CHECK(to_config_string(datatype::bytes) == "TYPE_STRING");
}
