/// Triton's classification extension as the post-processor computes it
/// (classification.cpp): the top k of each row, ties by index, NaN last,
/// labels where there are, integers and floats printed as the codec prints
/// them, and BYTES or BOOL refused.

#include "postprocess/classification.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::postprocess;

namespace {

template <class T>
std::string raw_bytes(std::initializer_list<T> values) {
  std::string s(values.size() * sizeof(T), '\0');
  std::memcpy(s.data(), values.begin(), s.size());
  return s;
}

std::vector<std::string> split_bytes(std::string_view data) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos + 4 <= data.size()) {
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);
    out.emplace_back(data.substr(pos + 4, len));
    pos += 4 + len;
  }
  CHECK(pos == data.size());
  return out;
}

} // namespace

TEST_CASE("classification: Triton's example, with and without labels") {
  std::string data = raw_bytes<float>({1.1f, 3.3f, 0.5f, 2.4f});
  classify_input in;
  in.dtype = datatype::fp32;
  in.shape = {4};
  in.data = data;
  in.k = 2;
  auto c = classify(in);
  REQUIRE(c.ok());
  CHECK(c->shape == std::vector<int64_t>{2});
  CHECK(split_bytes(c->data) == std::vector<std::string>{"3.3:1", "2.4:3"});

  std::vector<std::string> labels{"zero", "one", "two"}; // index 3 has no label
  in.labels = &labels;
  c = classify(in);
  REQUIRE(c.ok());
  CHECK(split_bytes(c->data) == std::vector<std::string>{"3.3:1:one", "2.4:3"});
}

TEST_CASE("classification: batched rows, ties, k past the class count, integers") {
  std::string data = raw_bytes<int32_t>({5, 9, 9, 1, /* row 2 */ -3, -1, -2, -7});
  classify_input in;
  in.dtype = datatype::int32;
  in.shape = {2, 4};
  in.data = data;
  in.k = 3;
  in.batch = batch_dimension::present;
  auto c = classify(in);
  REQUIRE(c.ok());
  CHECK(c->shape == std::vector<int64_t>{2, 3});
  CHECK(split_bytes(c->data)
        == std::vector<std::string>{"9:1", "9:2", "5:0", "-1:1", "-2:2", "-3:0"});

  in.k = 10;
  c = classify(in);
  REQUIRE(c.ok());
  CHECK(c->shape == std::vector<int64_t>{2, 4});

  std::string nan_data = raw_bytes<float>({std::nanf(""), 0.5f});
  classify_input nan_in;
  nan_in.dtype = datatype::fp32;
  nan_in.shape = {2};
  nan_in.data = nan_data;
  nan_in.k = 2;
  c = classify(nan_in);
  REQUIRE(c.ok());
  CHECK(split_bytes(c->data) == std::vector<std::string>{"0.5:1", "nan:0"});
}

TEST_CASE("classification refuses BYTES and BOOL") {
  std::string data("\x01\x00\x00\x00" "a", 5); // one BYTES element
  classify_input in;
  in.dtype = datatype::bytes;
  in.shape = {1};
  in.data = data;
  auto c = classify(in);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().status == status_code::bad_request);
  CHECK(c.error().message.find("needs a numeric output") != std::string::npos);
  std::string flags("\x01\x00", 2);
  in.dtype = datatype::bool_;
  in.shape = {2};
  in.data = flags;
  c = classify(in);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().message.find("datatype BOOL") != std::string::npos);
}
