#include "ingress/validate.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include <sys/mman.h>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

model_config make_model() {
  model_config m;
  m.name = "resnet";
  m.max_batch_size = 8;
  m.inputs = {{"INPUT0", datatype::int32, {4}}, {"x", datatype::fp32, {3, -1}}};
  m.outputs = {{"OUTPUT0", datatype::fp32, {10}}, {"NAMES", datatype::bytes, {1}}};
  return m;
}

infer_input make_input(std::string name, datatype t, std::vector<int64_t> shape) {
  infer_input in;
  in.name = std::move(name);
  in.dtype = t;
  in.shape = std::move(shape);
  uint64_t n = 1;
  for (auto d : in.shape)
    n *= static_cast<uint64_t>(d);
  in.owned.assign(n * element_size(t), '\0');
  in.data = in.owned;
  return in;
}

infer_request good_request() {
  infer_request r;
  r.inputs.push_back(make_input("INPUT0", datatype::int32, {2, 4}));
  r.inputs.push_back(make_input("x", datatype::fp32, {2, 3, 5}));
  r.outputs.push_back({"OUTPUT0", false, 3});
  return r;
}

void check_error(const result<validated_request>& r, std::string_view substring) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::bad_request);
  INFO(r.error().message);
  CHECK(r.error().message.find(substring) != std::string::npos);
}

std::string bytes_elements(std::initializer_list<std::string_view> elements) {
  std::string s;
  for (auto e : elements) {
    auto len = static_cast<uint32_t>(e.size());
    char buf[4];
    std::memcpy(buf, &len, 4);
    s.append(buf, 4);
    s += e;
  }
  return s;
}

} // namespace

TEST_CASE("a well-formed request passes and reports its batch size") {
  auto r = validate(good_request(), make_model());
  REQUIRE(r.ok());
  CHECK(r->batch_size == 2);
}

TEST_CASE("missing, unknown and repeated inputs") {
  auto model = make_model();
  auto missing = good_request();
  missing.inputs.pop_back();
  check_error(validate(missing, model),
              "expected 2 inputs but got 1 inputs for model 'resnet'. Got input(s) ['INPUT0'], "
              "but missing required input(s) ['x']. Please provide all required input(s).");

  auto unknown = good_request();
  unknown.inputs.push_back(make_input("y", datatype::fp32, {2, 3}));
  check_error(validate(unknown, model),
              "unexpected inference input 'y' for model 'resnet'; the model's inputs are "
              "'INPUT0', 'x'");

  auto twice = good_request();
  twice.inputs.push_back(make_input("x", datatype::fp32, {2, 3, 5}));
  check_error(validate(twice, model), "input 'x' already exists in request");
}

TEST_CASE("wrong datatype names both types") {
  auto r = good_request();
  r.inputs[0] = make_input("INPUT0", datatype::fp32, {2, 4});
  check_error(validate(r, make_model()),
              "inference input 'INPUT0' data-type is 'FP32', but model 'resnet' expects "
              "'INT32'");
}

TEST_CASE("wrong rank or fixed dimension names both shapes") {
  model_config m;
  m.name = "img";
  m.max_batch_size = 4;
  m.inputs = {{"x", datatype::fp32, {3, 224, 224}}};
  infer_request r;
  r.inputs.push_back(make_input("x", datatype::fp32, {1, 3, 224}));
  check_error(validate(r, m), "unexpected shape for input 'x' for model 'img'. Expected "
                              "[-1,3,224,224], got [1,3,224]. The model batches");

  r.inputs[0] = make_input("x", datatype::fp32, {1, 3, 224, 225});
  check_error(validate(r, m), "unexpected shape for input 'x' for model 'img'. Expected "
                              "[-1,3,224,224], got [1,3,224,225].");
}

TEST_CASE("batch dimension: within max_batch_size, at least 1, equal across inputs") {
  auto model = make_model();
  auto big = good_request();
  big.inputs[0] = make_input("INPUT0", datatype::int32, {9, 4});
  big.inputs[1] = make_input("x", datatype::fp32, {9, 3, 5});
  check_error(validate(big, model),
              "inference request batch-size must be <= 8 for 'resnet': input 'INPUT0' has "
              "batch size 9 (shape [9,4])");

  auto zero = good_request();
  zero.inputs[0] = make_input("INPUT0", datatype::int32, {0, 4});
  check_error(validate(zero, model), "input 'INPUT0' has batch size 0");

  auto disagree = good_request();
  disagree.inputs[1] = make_input("x", datatype::fp32, {3, 3, 5});
  check_error(validate(disagree, model),
              "input 'x' batch size does not match other inputs for 'resnet': input 'INPUT0' "
              "has 2 but input 'x' has 3");
}

TEST_CASE("a model without batching takes its dims exactly") {
  model_config m;
  m.name = "plain";
  m.inputs = {{"a", datatype::int64, {2, 2}}};
  m.outputs = {{"b", datatype::int64, {2}}};
  infer_request r;
  r.inputs.push_back(make_input("a", datatype::int64, {2, 2}));
  auto ok = validate(r, m);
  REQUIRE(ok.ok());
  CHECK(ok->batch_size == 1);
  r.inputs[0] = make_input("a", datatype::int64, {1, 2, 2});
  check_error(validate(r, m), "unexpected shape for input 'a' for model 'plain'. Expected "
                              "[2,2], got [1,2,2].");
}

TEST_CASE("byte size must match the element count") {
  auto r = good_request();
  r.inputs[0].owned.resize(31);
  r.inputs[0].data = r.inputs[0].owned;
  check_error(validate(r, make_model()),
              "input byte size mismatch for input 'INPUT0' for model 'resnet'. Expected 32, got "
              "31: shape [2,4] of INT32 needs 32 bytes");
}

TEST_CASE("absurd shapes: negative, overflowing, over the limit") {
  model_config m;
  m.name = "v";
  m.inputs = {{"v", datatype::fp32, {-1, -1, -1}}};
  infer_request r;
  infer_input in;
  in.name = "v";
  in.dtype = datatype::fp32;
  in.shape = {2, -3, 4};
  r.inputs.push_back(in);
  check_error(validate(r, m), "input 'v' has shape [2,-3,4] with a negative dimension");

  r.inputs[0].shape = {INT64_MAX, INT64_MAX, 4};
  check_error(validate(r, m), "causes total element count to exceed maximum size of "
                              "9223372036854775807");
  r.inputs[0].shape = {1LL << 40, 1LL << 20, 1};
  check_error(validate(r, m), "more than the limit of");

  r.inputs[0].shape = {1 << 20, 1 << 20, 1};
  request_limits small;
  small.max_elements = 1000;
  check_error(validate(r, m, small), "more than the limit of 1000 elements");

  // A zero dimension makes an empty tensor even when the others would overflow.
  r.inputs[0].shape = {INT64_MAX, 0, INT64_MAX};
  r.inputs[0].data = {};
  CHECK(validate(r, m).ok());
}

TEST_CASE("checked_element_count") {
  CHECK(*checked_element_count({}, 10, "t") == 1);
  CHECK(*checked_element_count({2, 3}, 10, "t") == 6);
  CHECK_FALSE(checked_element_count({2, 6}, 10, "t").ok());
  CHECK_FALSE(checked_element_count({1LL << 40, 1LL << 40}, UINT64_MAX, "t").ok());
  CHECK(*checked_element_count({1LL << 40, 0, 1LL << 40}, 10, "t") == 0);
}

TEST_CASE("BYTES inputs: well-formed elements, count matching the shape") {
  model_config m;
  m.name = "text";
  m.max_batch_size = 4;
  m.inputs = {{"s", datatype::bytes, {2}}};
  infer_request r;
  infer_input in;
  in.name = "s";
  in.dtype = datatype::bytes;
  in.shape = {1, 2};
  in.owned = bytes_elements({"hello", ""});
  in.data = in.owned;
  r.inputs.push_back(in);
  CHECK(validate(r, m).ok());

  r.inputs[0].owned = bytes_elements({"hello"});
  r.inputs[0].data = r.inputs[0].owned;
  check_error(validate(r, m), "expected 2 string elements for inference input 's' for model "
                              "'text', got 1");

  r.inputs[0].owned = bytes_elements({"hello", "world"});
  r.inputs[0].owned.pop_back();
  r.inputs[0].data = r.inputs[0].owned;
  check_error(validate(r, m), "input 's' has BYTES element 1 of length 5 but only 4 bytes");

  r.inputs[0].owned = bytes_elements({"hello"}) + "\x01\x00";
  r.inputs[0].data = r.inputs[0].owned;
  check_error(validate(r, m), "partial 4-byte length");
}

TEST_CASE("requested outputs: known, not repeated, classification only on numbers") {
  auto model = make_model();
  auto unknown = good_request();
  unknown.outputs.push_back({"PROBS", false, 0});
  check_error(validate(unknown, model),
              "unexpected inference output 'PROBS' for model 'resnet'; the model's outputs are "
              "'OUTPUT0', 'NAMES'");

  auto twice = good_request();
  twice.outputs.push_back({"OUTPUT0", true, 0});
  check_error(validate(twice, model), "output 'OUTPUT0' already exists in request");

  auto classify_bytes = good_request();
  classify_bytes.outputs.push_back({"NAMES", false, 2});
  check_error(validate(classify_bytes, model),
              "requested output 'NAMES' asks for classification, but its datatype BYTES");

  auto plain_bytes = good_request();
  plain_bytes.outputs.push_back({"NAMES", true, 0});
  CHECK(validate(plain_bytes, model).ok());
}

TEST_CASE("priority must be one of the model's levels") {
  auto model = make_model();
  model.dynamic_batching.priority_levels = 3;
  auto r = good_request();
  r.priority = 3;
  CHECK(validate(r, model).ok());
  r.priority = 4;
  check_error(validate(r, model), "priority 4 is not a level of model 'resnet'");
}

TEST_CASE("a tensor past what a Cap'n Proto Data field holds is a 413 that says so") {
  // 2^27 + 16 FP32 values (512 MiB + 64 bytes), in untouched anonymous pages:
  // validation reads only the size.
  const size_t bytes = (size_t{1} << 29) + 64;
  void* pages = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(pages != MAP_FAILED);
  infer_request r = good_request();
  r.inputs[1].shape = {1, 3, static_cast<int64_t>(bytes / 4 / 3)};
  r.inputs[1].owned.clear();
  r.inputs[1].data = std::string_view(static_cast<const char*>(pages), bytes / 12 * 12);
  r.inputs[0].shape = {1, 4};
  r.inputs[0].owned.assign(16, '\0');
  r.inputs[0].data = r.inputs[0].owned;
  request_limits limits;
  limits.max_elements = uint64_t{1} << 30;
  auto v = validate(r, make_model(), limits);
  munmap(pages, bytes);
  REQUIRE_FALSE(v.ok());
  CHECK(v.error().status == status_code::payload_too_large);
  CHECK(v.error().message.find("input 'x'") != std::string::npos);
  CHECK(v.error().message.find("512 MiB") != std::string::npos);
}

TEST_CASE("an optional input left out is refused with the reason, and validated when sent") {
  auto model = make_model();
  model.inputs[1].optional = true;
  auto without = good_request();
  without.inputs.pop_back();
  check_error(validate(without, model),
              "missing input 'x' for model 'resnet': the model config marks it optional, but "
              "this engine runs the model only with every input");
  CHECK(validate(good_request(), model).ok());
}

TEST_CASE("requests are checked against dims, not reshape") {
  auto model = make_model();
  model.inputs[0].reshape = std::vector<int64_t>{2, 2};
  CHECK(validate(good_request(), model).ok());
  auto model_shape = good_request();
  model_shape.inputs[0] = make_input("INPUT0", datatype::int32, {2, 2, 2});
  check_error(validate(model_shape, model), "Expected [-1,4], got [2,2,2]");
}
