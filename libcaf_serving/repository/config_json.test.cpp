#include "repository/config_json.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::repository;

namespace {

/// Parses `json` with simdjson's DOM API; a parse failure fails the test.
simdjson::dom::element parse(simdjson::dom::parser& parser,
                             const std::string& json) {
  auto doc = parser.parse(json);
  REQUIRE_MESSAGE(doc.error() == simdjson::SUCCESS,
                  "invalid JSON: " << json);
  return doc.value();
}

std::string str(simdjson::dom::element e) {
  std::string_view v;
  REQUIRE(e.get(v) == simdjson::SUCCESS);
  return std::string{v};
}

int64_t num(simdjson::dom::element e) {
  int64_t v = 0;
  REQUIRE(e.get(v) == simdjson::SUCCESS);
  return v;
}

bool boolean(simdjson::dom::element e) {
  bool v = false;
  REQUIRE(e.get(v) == simdjson::SUCCESS);
  return v;
}

simdjson::dom::element at(simdjson::dom::element e, std::string_view key) {
  simdjson::dom::element out;
  REQUIRE_MESSAGE(e[key].get(out) == simdjson::SUCCESS, "no key " << key);
  return out;
}

simdjson::dom::element at(simdjson::dom::element e, size_t index) {
  simdjson::dom::element out;
  REQUIRE_MESSAGE(e.at(index).get(out) == simdjson::SUCCESS,
                  "no index " << index);
  return out;
}

size_t length(simdjson::dom::element e) {
  simdjson::dom::array a;
  REQUIRE(e.get(a) == simdjson::SUCCESS);
  return a.size();
}

model_config simple_config() {
  model_config c;
  c.name = "simple";
  c.backend = "builtin";
  c.max_batch_size = 8;
  c.inputs = {{"INPUT0", datatype::int32, {16}},
              {"INPUT1", datatype::bytes, {-1, 3}}};
  c.outputs = {{"OUTPUT0", datatype::fp32, {16}}};
  c.parameters["function"] = "add_sub";
  return c;
}

} // namespace

TEST_CASE("config JSON has Triton's shape") {
  auto c = simple_config();
  c.dynamic_batching_enabled = true;
  c.dynamic_batching.preferred_batch_sizes = {4, 8};
  c.dynamic_batching.max_queue_delay_us = 100;
  c.dynamic_batching.priority_levels = 2;
  c.dynamic_batching.default_priority_level = 1;
  c.dynamic_batching.default_queue_policy.max_queue_size = 32;
  c.dynamic_batching.priority_queue_policy[2].action = timeout_action::delay;
  c.dynamic_batching.priority_queue_policy[2].default_timeout_us = 7000;
  c.instance_groups = {{"simple_0", 2, instance_kind::gpu, {0, 1}}};

  parsed_model_config parsed;
  parsed.config = c;
  parsed.label_filenames["OUTPUT0"] = "labels.txt";
  auto json = model_config_json(parsed);
  simdjson::dom::parser parser;
  auto doc = parse(parser, json);

  CHECK(str(at(doc, "name")) == "simple");
  CHECK(str(at(doc, "platform")).empty()); // defaults are printed, as Triton does
  CHECK(str(at(doc, "backend")) == "builtin");
  CHECK(num(at(doc, "max_batch_size")) == 8);
  CHECK(num(at(at(at(doc, "version_policy"), "latest"), "num_versions")) == 1);

  auto inputs = at(doc, "input");
  REQUIRE(length(inputs) == 2);
  CHECK(str(at(at(inputs, 0), "name")) == "INPUT0");
  CHECK(str(at(at(inputs, 0), "data_type")) == "TYPE_INT32");
  // int64 prints as a string in proto JSON; Triton writes dims back as
  // numbers, and so does the engine.
  CHECK(num(at(at(at(inputs, 0), "dims"), 0)) == 16);
  CHECK(str(at(at(inputs, 1), "data_type")) == "TYPE_STRING");
  CHECK(num(at(at(at(inputs, 1), "dims"), 0)) == -1);
  CHECK(num(at(at(at(inputs, 1), "dims"), 1)) == 3);

  auto output = at(at(doc, "output"), 0);
  CHECK(str(at(output, "data_type")) == "TYPE_FP32");
  CHECK(str(at(output, "label_filename")) == "labels.txt");

  auto db = at(doc, "dynamic_batching");
  CHECK(num(at(at(db, "preferred_batch_size"), 1)) == 8);
  CHECK(num(at(db, "max_queue_delay_microseconds")) == 100);
  CHECK_FALSE(boolean(at(db, "preserve_ordering")));
  CHECK(num(at(db, "priority_levels")) == 2);
  CHECK(num(at(db, "default_priority_level")) == 1);
  auto dq = at(db, "default_queue_policy");
  CHECK(str(at(dq, "timeout_action")) == "REJECT");
  CHECK(num(at(dq, "max_queue_size")) == 32);
  auto level2 = at(at(db, "priority_queue_policy"), "2");
  CHECK(str(at(level2, "timeout_action")) == "DELAY");
  CHECK(num(at(level2, "default_timeout_microseconds")) == 7000);

  auto group = at(at(doc, "instance_group"), 0);
  CHECK(str(at(group, "name")) == "simple_0");
  CHECK(str(at(group, "kind")) == "KIND_GPU");
  CHECK(num(at(group, "count")) == 2);
  CHECK(num(at(at(group, "gpus"), 1)) == 1);

  CHECK(str(at(at(at(doc, "parameters"), "function"), "string_value"))
        == "add_sub");
}

TEST_CASE("config JSON without dynamic batching omits the block") {
  auto c = simple_config();
  c.specific_versions = {1, 3};
  auto json = model_config_json(c);
  simdjson::dom::parser parser;
  auto doc = parse(parser, json);
  simdjson::dom::element ignored;
  CHECK(doc["dynamic_batching"].get(ignored) == simdjson::NO_SUCH_FIELD);
  auto versions = at(at(at(doc, "version_policy"), "specific"), "versions");
  REQUIRE(length(versions) == 2);
  CHECK(num(at(versions, 1)) == 3);
}

TEST_CASE("metadata JSON has KServe's shape with the batch dimension first") {
  auto c = simple_config();
  auto json = model_metadata_json(c, {1, 2});
  simdjson::dom::parser parser;
  auto doc = parse(parser, json);
  CHECK(str(at(doc, "name")) == "simple");
  CHECK(str(at(at(doc, "versions"), 0)) == "1");
  CHECK(str(at(at(doc, "versions"), 1)) == "2");
  CHECK(str(at(doc, "platform")) == "builtin"); // backend when no platform
  auto inputs = at(doc, "inputs");
  REQUIRE(length(inputs) == 2);
  CHECK(str(at(at(inputs, 0), "name")) == "INPUT0");
  CHECK(str(at(at(inputs, 0), "datatype")) == "INT32");
  auto shape0 = at(at(inputs, 0), "shape");
  REQUIRE(length(shape0) == 2);
  CHECK(num(at(shape0, 0)) == -1);
  CHECK(num(at(shape0, 1)) == 16);
  CHECK(str(at(at(inputs, 1), "datatype")) == "BYTES");
  auto shape1 = at(at(inputs, 1), "shape");
  REQUIRE(length(shape1) == 3);
  CHECK(num(at(shape1, 1)) == -1);
  CHECK(num(at(shape1, 2)) == 3);
  auto out = at(at(doc, "outputs"), 0);
  CHECK(str(at(out, "datatype")) == "FP32");

  c.max_batch_size = 0;
  c.platform = "onnxruntime_onnx";
  auto unbatched = parse(parser, model_metadata_json(c, {4}));
  CHECK(str(at(unbatched, "platform")) == "onnxruntime_onnx");
  auto shape = at(at(at(unbatched, "inputs"), 0), "shape");
  REQUIRE(length(shape) == 1);
  CHECK(num(at(shape, 0)) == 16);
}

TEST_CASE("strings are escaped") {
  std::string out;
  append_json_string(out, "a\"b\\c\nd\te\x01" "f\xc3\xa9");
  CHECK(out == "\"a\\\"b\\\\c\\nd\\te\\u0001f\xc3\xa9\"");

  auto c = simple_config();
  c.name = "we\"ird\\name\n";
  c.inputs[0].name = "in\x1f";
  simdjson::dom::parser parser;
  auto meta = parse(parser, model_metadata_json(c, {1}));
  CHECK(str(at(meta, "name")) == c.name);
  CHECK(str(at(at(at(meta, "inputs"), 0), "name")) == c.inputs[0].name);
  simdjson::dom::parser parser2;
  auto cfg = parse(parser2, model_config_json(c));
  CHECK(str(at(cfg, "name")) == c.name);
}

TEST_CASE("a name that is not UTF-8 is written as valid JSON (fuzz: config_pbtxt)") {
  // config.pbtxt may hold any bytes through "\xff" escapes, and ONNX tensor
  // names are not checked either; protobuf's JSON printer passes them through.
  auto c = simple_config();
  c.platform = "onnx\xC1\xB7";
  c.inputs[0].name = "IN\xFF";
  c.parameters["k\x81"] = "v\xCF";
  simdjson::dom::parser parser;
  auto doc = parse(parser, model_config_json(c));
  CHECK(str(at(doc, "platform")) == "onnx\xEF\xBF\xBD\xEF\xBF\xBD");
  // Whatever the printer makes of a lone 0xFF, the name stays readable.
  CHECK(str(at(at(at(doc, "input"), 0), "name")).rfind("IN", 0) == 0);
}

TEST_CASE("config JSON shows response_cache when the model enables it") {
  auto c = simple_config();
  simdjson::dom::parser parser;
  simdjson::dom::element ignored;
  CHECK(parse(parser, model_config_json(c))["response_cache"].get(ignored)
        == simdjson::NO_SUCH_FIELD);
  c.response_cache_enabled = true;
  auto doc = parse(parser, model_config_json(c));
  CHECK(boolean(at(at(doc, "response_cache"), "enable")));
}

TEST_CASE("/config shows reshape, format, optional and the fields the engine ignores") {
  auto parsed = parse_model_config_full(R"(
name: "densenet"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ]
          reshape { shape: [ 1, 3, 224, 224 ] } optional: true } ]
output [ { name: "fc6_1" data_type: TYPE_FP32 dims: [ 1000 ] reshape { shape: [ 1, 1000, 1, 1 ] }
           label_filename: "labels.txt" } ]
instance_group [ { kind: KIND_CPU count: 2 rate_limiter { priority: 3 } } ]
optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }
default_model_filename: "net.onnx"
response_cache { enable: true }
)",
                                        {"densenet", "config.pbtxt", false});
  REQUIRE_MESSAGE(parsed.ok(), (parsed.ok() ? "" : parsed.error().message));
  simdjson::dom::parser parser;
  auto body = model_config_json(*parsed);
  auto doc = parse(parser, body);
  auto input = at(at(doc, "input"), 0);
  CHECK(str(at(input, "format")) == "FORMAT_NCHW");
  CHECK(boolean(at(input, "optional")));
  CHECK(length(at(at(input, "reshape"), "shape")) == 4);
  CHECK(num(at(at(at(input, "reshape"), "shape"), 0)) == 1);
  auto output = at(at(doc, "output"), 0);
  CHECK(num(at(at(at(output, "reshape"), "shape"), 1)) == 1000);
  CHECK(str(at(output, "label_filename")) == "labels.txt");
  CHECK(str(at(doc, "default_model_filename")) == "net.onnx");
  CHECK(boolean(at(at(doc, "response_cache"), "enable")));
  // Accepted and ignored, but shown as written, as Triton shows them.
  CHECK(num(at(at(at(at(doc, "instance_group"), 0), "rate_limiter"), "priority")) == 3);
  CHECK(num(at(at(at(doc, "instance_group"), 0), "count")) == 2);
  auto accel = at(at(at(doc, "optimization"), "execution_accelerators"),
                  "cpu_execution_accelerator");
  CHECK(str(at(at(accel, 0), "name")) == "openvino");
}
