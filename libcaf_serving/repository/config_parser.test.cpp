#include "repository/config_parser.hpp"
#include "repository/config_proto.hpp"

#include <google/protobuf/util/json_util.h>

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

using namespace caf_serving;
using namespace caf_serving::repository;

namespace {

parse_context ctx_for(std::string model) {
  return parse_context{model, "/repo/" + model + "/config.pbtxt", false};
}

/// A valid config to which a test appends or in which it replaces one line.
const std::string base_config = R"(name: "foo"
backend: "builtin"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
)";

std::string error_of(const std::string& text,
                     const parse_context& ctx = ctx_for("foo")) {
  auto r = parse_model_config(text, ctx);
  REQUIRE_MESSAGE(!r, "expected an error for:\n" << text);
  CHECK(r.error().status == status_code::bad_request);
  return r.error().message;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("a full config converts field by field") {
  auto text = std::string{R"(
name: "foo"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 32
input [
  { name: "x" data_type: TYPE_FP16 dims: [ 3, -1, 224 ] },
  { name: "ids" data_type: TYPE_INT64 dims: [ 1 ] }
]
output [
  { name: "probs" data_type: TYPE_FP32 dims: [ 1000 ] label_filename: "labels.txt" },
  { name: "text" data_type: TYPE_STRING dims: [ 1 ] }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 250
  preserve_ordering: true
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000
                         allow_timeout_override: true max_queue_size: 64 }
  priority_queue_policy { key: 1 value: { max_queue_size: 16 } }
}
instance_group [
  { kind: KIND_GPU count: 2 gpus: [ 0, 1 ] },
  { name: "cpu_pool" kind: KIND_CPU }
]
version_policy: { specific: { versions: [ 3, 1 ] } }
parameters { key: "function" value: { string_value: "add_sub" } }
)"};
  auto r = parse_model_config_full(text, ctx_for("foo"));
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  const auto& c = r->config;
  CHECK(c.name == "foo");
  CHECK(c.platform == "onnxruntime_onnx");
  CHECK(c.backend == "onnxruntime");
  CHECK(c.max_batch_size == 32);
  REQUIRE(c.inputs.size() == 2);
  CHECK(c.inputs[0].name == "x");
  CHECK(c.inputs[0].dtype == datatype::fp16);
  CHECK(c.inputs[0].dims == std::vector<int64_t>{3, -1, 224});
  CHECK(c.inputs[1].dtype == datatype::int64);
  REQUIRE(c.outputs.size() == 2);
  CHECK(c.outputs[1].dtype == datatype::bytes);
  CHECK(r->label_filenames.at("probs") == "labels.txt");
  CHECK(r->label_filenames.count("text") == 0);

  CHECK(c.dynamic_batching_enabled);
  const auto& db = c.dynamic_batching;
  CHECK(db.preferred_batch_sizes == std::vector<int>{4, 8});
  CHECK(db.max_queue_delay_us == 250);
  CHECK(db.preserve_ordering);
  CHECK(db.priority_levels == 3);
  CHECK(db.default_priority_level == 2);
  CHECK(db.default_queue_policy.action == timeout_action::delay);
  CHECK(db.default_queue_policy.default_timeout_us == 5000);
  CHECK(db.default_queue_policy.allow_timeout_override);
  CHECK(db.default_queue_policy.max_queue_size == 64);
  REQUIRE(db.priority_queue_policy.count(1) == 1);
  CHECK(db.priority_queue_policy.at(1).max_queue_size == 16);
  CHECK(db.priority_queue_policy.at(1).action == timeout_action::reject);

  REQUIRE(c.instance_groups.size() == 2);
  CHECK(c.instance_groups[0].name == "foo_0");
  CHECK(c.instance_groups[0].kind == instance_kind::gpu);
  CHECK(c.instance_groups[0].count == 2);
  CHECK(c.instance_groups[0].gpus == std::vector<int>{0, 1});
  CHECK(c.instance_groups[1].name == "cpu_pool");
  CHECK(c.instance_groups[1].kind == instance_kind::cpu);
  CHECK(c.instance_groups[1].count == 1); // unset count means 1

  CHECK(r->versions.kind == version_policy_kind::specific);
  CHECK(r->versions.versions == std::vector<int64_t>{1, 3});
  CHECK(c.specific_versions == std::vector<int64_t>{1, 3});
  CHECK(c.parameters.at("function") == "add_sub");
}

TEST_CASE("defaults: name from the directory, latest version, no batching") {
  auto text = std::string{R"(
backend: "builtin"
input [ { name: "a" data_type: TYPE_BOOL dims: [ 1 ] } ]
output [ { name: "b" data_type: TYPE_BF16 dims: [ 2, 2 ] } ]
)"};
  auto r = parse_model_config_full(text, ctx_for("dir_name"));
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(r->config.name == "dir_name");
  CHECK(r->config.max_batch_size == 0);
  CHECK_FALSE(r->config.dynamic_batching_enabled);
  CHECK(r->config.instance_groups.empty());
  CHECK(r->config.outputs[0].dtype == datatype::bf16);
  CHECK(r->versions.kind == version_policy_kind::latest);
  CHECK(r->versions.num_versions == 1);
  CHECK(r->config.specific_versions.empty());

  auto latest = parse_model_config_full(
    text + "version_policy { latest { num_versions: 2 } }", ctx_for("d"));
  REQUIRE(latest.ok());
  CHECK(latest->versions.num_versions == 2);
  auto all = parse_model_config_full(text + "version_policy { all { } }",
                                     ctx_for("d"));
  REQUIRE(all.ok());
  CHECK(all->versions.kind == version_policy_kind::all);
}

TEST_CASE("a misspelled field names the field, the line and the fix") {
  auto text = base_config + "\n\nmax_batch_sise: 4\n";
  auto msg = error_of(text);
  CHECK(contains(msg, "model 'foo': /repo/foo/config.pbtxt line 8"));
  CHECK(contains(msg, "unknown field 'max_batch_sise' in ModelConfig"));
  CHECK(contains(msg, "did you mean 'max_batch_size'?"));
  CHECK(contains(msg, "supported fields of ModelConfig: name, platform"));
}

TEST_CASE("a misspelled nested field names its message") {
  auto text = std::string{R"(name: "foo"
backend: "builtin"
input [ { name: "INPUT0" data_type: TYPE_FP32 dim: [ 16 ] } ]
)"};
  auto msg = error_of(text);
  CHECK(contains(msg, "line 3"));
  CHECK(contains(msg, "unknown field 'dim' in ModelInput"));
  CHECK(contains(msg, "did you mean 'dims'?"));
}

TEST_CASE("every field of Triton's ModelConfig parses; backend-only ones are listed as ignored") {
  // Every message and field of Triton 2.51's model_config.proto that a model
  // the engine can serve may carry, with a value set.
  auto text = std::string{R"(
name: "foo"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
runtime: "libtriton_onnxruntime.so"
version_policy: { latest: { num_versions: 2 } }
max_batch_size: 8
input [ { name: "img" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 4, 4 ]
          reshape: { shape: [ 3, 16 ] } is_shape_tensor: false allow_ragged_batch: false
          optional: true is_non_linear_format_io: false } ]
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 10 ] reshape: { shape: [ 10, 1 ] }
           label_filename: "labels.txt" is_shape_tensor: false is_non_linear_format_io: false } ]
optimization {
  graph { level: 1 }
  priority: PRIORITY_MAX
  cuda { graphs: true busy_wait_events: true output_copy_stream: true
         graph_spec [ { batch_size: 4 input { key: "img" value: { dim: [ 3, 4, 4 ] } }
                        graph_lower_bound { batch_size: 1
                                            input { key: "img" value: { dim: [ 3, 4, 4 ] } } } } ] }
  execution_accelerators {
    gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ]
    cpu_execution_accelerator [ { name: "openvino" } ]
  }
  input_pinned_memory { enable: false }
  output_pinned_memory { enable: false }
  gather_kernel_buffer_threshold: 2
  eager_batching: true
}
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 100 }
instance_group [ { name: "g" kind: KIND_CPU count: 2
                   rate_limiter { resources [ { name: "R1" global: true count: 2 } ] priority: 1 }
                   secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ]
                   profile: [ "0" ] passive: true host_policy: "numa0" } ]
default_model_filename: "classifier.onnx"
cc_model_filenames { key: "7.5" value: "model_75.plan" }
metric_tags { key: "team" value: "vision" }
parameters { key: "winograd" value: { string_value: "false" } }
model_warmup [ { name: "w" batch_size: 2 count: 3
                 inputs { key: "img" value: { data_type: TYPE_FP32 dims: [ 3, 4, 4 ] random_data: true } } } ]
model_operations { op_library_filename: [ "libcustom.so" ] }
model_transaction_policy { decoupled: false }
model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx" value: "x" } } ] }
response_cache { enable: true }
model_metrics { metric_control [ { metric_identifier { family: "nv_inference_request_duration" }
                                   histogram_options { buckets: [ 0.1, 1.0 ] } } ] }
)"};
  auto r = parse_model_config_full(text, ctx_for("foo"));
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
  const auto& cfg = r->config;
  REQUIRE(cfg.inputs.size() == 1);
  CHECK(cfg.inputs[0].format == tensor_format::nchw);
  CHECK(cfg.inputs[0].dims == std::vector<int64_t>{3, 4, 4});
  REQUIRE(cfg.inputs[0].reshape.has_value());
  CHECK(*cfg.inputs[0].reshape == std::vector<int64_t>{3, 16});
  CHECK(cfg.inputs[0].model_dims() == std::vector<int64_t>{3, 16});
  CHECK(cfg.inputs[0].optional);
  REQUIRE(cfg.outputs[0].reshape.has_value());
  CHECK(*cfg.outputs[0].reshape == std::vector<int64_t>{10, 1});
  CHECK(cfg.default_model_filename == "classifier.onnx");
  CHECK(cfg.response_cache_enabled);
  CHECK(r->versions.num_versions == 2);
  CHECK(cfg.warmup.at(0).count == 3);
  CHECK(cfg.instance_groups.at(0).count == 2);
  CHECK(r->ignored_fields
        == std::vector<std::string>{"cc_model_filenames", "instance_group.host_policy",
                                    "instance_group.passive", "instance_group.profile",
                                    "instance_group.rate_limiter",
                                    "instance_group.secondary_devices", "metric_tags",
                                    "model_metrics", "model_operations",
                                    "model_repository_agents", "optimization.cuda",
                                    "optimization.eager_batching",
                                    "optimization.execution_accelerators",
                                    "optimization.gather_kernel_buffer_threshold",
                                    "optimization.graph", "optimization.input_pinned_memory",
                                    "optimization.output_pinned_memory",
                                    "optimization.priority", "runtime"});
}

TEST_CASE("a config without backend-only fields ignores nothing") {
  auto r = parse_model_config_full(base_config, ctx_for("foo"));
  REQUIRE(r.ok());
  CHECK(r->ignored_fields.empty());
  CHECK_FALSE(r->config.response_cache_enabled);
  CHECK(r->config.default_model_filename.empty());
  CHECK_FALSE(r->config.inputs[0].reshape.has_value());
  CHECK(r->config.inputs[0].format == tensor_format::none);
}

TEST_CASE("Triton fields that would change results are load errors naming the field") {
  struct refused {
    std::string text;
    std::string expect;
  };
  std::vector<refused> cases{
    {"sequence_batching { }\n",
     "field 'sequence_batching' of Triton's ModelConfig is not supported by caf-serving"},
    {"ensemble_scheduling { step [ { model_name: \"a\" model_version: -1 } ] }\n",
     "field 'ensemble_scheduling' of Triton's ModelConfig is not supported by caf-serving"},
    {"batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: \"n\" data_type: TYPE_FP32 "
     "source_input: \"INPUT0\" } ]\n",
     "field 'batch_input' of Triton's ModelConfig is not supported by caf-serving"},
    {"batch_output [ { target_name: \"OUTPUT0\" source_input: \"INPUT0\" } ]\n",
     "field 'batch_output' of Triton's ModelConfig is not supported by caf-serving"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    auto msg = error_of(base_config + c.text);
    CHECK(contains(msg, c.expect));
    CHECK(contains(msg, "remove it"));
  }
  auto shape_tensor = error_of(R"(backend: "builtin"
input [ { name: "x" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]
output [ { name: "y" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]
)");
  CHECK(contains(shape_tensor, "input 'x' sets is_shape_tensor: shape tensors are only "
                               "supported for TensorRT platform"));
  CHECK(contains(shape_tensor, "output 'y' sets is_shape_tensor"));
  auto ragged = error_of(R"(backend: "builtin"
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
)");
  CHECK(contains(ragged, "input 'x' sets allow_ragged_batch, which is not supported"));
  auto non_linear = error_of(R"(backend: "builtin"
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] is_non_linear_format_io: true } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
)");
  CHECK(contains(non_linear, "Non-linear IO format is only supported for the TensorRT platform"));
  // decoupled: true is kept for the model manager, which serves it for
  // generative decoders only.
  auto decoupled = parse_model_config(
    base_config + "model_transaction_policy { decoupled: true }\n", ctx_for("foo"));
  REQUIRE(decoupled);
  CHECK(decoupled->decoupled);
  // decoupled: false is the engine's own behaviour.
  CHECK(parse_model_config(base_config + "model_transaction_policy { decoupled: false }\n",
                           ctx_for("foo")).ok());
}

TEST_CASE("reshape follows Triton's rules") {
  auto with = [](const std::string& mbs, const std::string& input) {
    return "backend: \"builtin\"\nmax_batch_size: " + mbs + "\ninput [ " + input
           + " ]\noutput [ { name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n";
  };
  auto ok = [](const std::string& text) {
    auto r = parse_model_config(text, ctx_for("foo"));
    CHECK_MESSAGE(r.ok(), text << (r.ok() ? "" : r.error().message));
    return r.ok() ? *r->inputs[0].reshape : std::vector<int64_t>{99};
  };
  CHECK(ok(with("0", R"({ name: "x" data_type: TYPE_FP32 dims: [ 3, 224, 224 ]
                          reshape: { shape: [ 1, 3, 224, 224 ] } })"))
        == std::vector<int64_t>{1, 3, 224, 224});
  // Runs between variable dimensions match: 2*4 = 8 and 6 = 1*6.
  CHECK(ok(with("4", R"({ name: "x" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ]
                          reshape: { shape: [ 8, -1, 1, 6 ] } })"))
        == std::vector<int64_t>{8, -1, 1, 6});
  // A scalar per batch row, as Triton's auto-complete writes it.
  CHECK(ok(with("4", R"({ name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } })"))
        .empty());

  auto size = error_of(with("0", R"({ name: "x" data_type: TYPE_FP32 dims: [ 3, 4 ]
                                      reshape: { shape: [ 13 ] } })"));
  CHECK(contains(size, "input 'x' has different size for dims and reshape"));
  auto runs = error_of(with("4", R"({ name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ]
                                      reshape: { shape: [ 4, -1 ] } })"));
  CHECK(contains(runs, "has different size for dims and reshape"));
  auto zero = error_of(with("4", R"({ name: "x" data_type: TYPE_FP32 dims: [ 4 ]
                                      reshape: { shape: [ 0, 4 ] } })"));
  CHECK(contains(zero, "reshape dimensions must be integer >= 1, or -1"));
  auto scalar = error_of(with("0", R"({ name: "x" data_type: TYPE_FP32 dims: [ 1 ]
                                        reshape: { shape: [ ] } })"));
  CHECK(contains(scalar, "cannot have empty reshape for non-batching model as scalar tensors "
                         "are not supported"));
}

TEST_CASE("a dimension of 0 or below -1 is Triton's error") {
  for (const char* dims : {"[ 0 ]", "[ 4, 0 ]", "[ -2 ]"}) {
    CAPTURE(dims);
    auto msg = error_of(std::string(R"(name: "foo"
backend: "builtin"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: )") + dims + R"( } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
)");
    CHECK(contains(msg, "dimension must be integer >= 1, or -1 to indicate a variable-size "
                        "dimension"));
    CHECK(contains(msg, "INPUT0"));
  }
}

TEST_CASE("format NCHW/NHWC needs three dims, as Triton checks") {
  auto text = [](const std::string& format, const std::string& dims) {
    return "backend: \"builtin\"\nmax_batch_size: 4\ninput [ { name: \"x\" data_type: TYPE_FP32 "
           "format: " + format + " dims: " + dims
           + " } ]\noutput [ { name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n";
  };
  auto nhwc = parse_model_config(text("FORMAT_NHWC", "[ 224, 224, 3 ]"), ctx_for("foo"));
  REQUIRE(nhwc.ok());
  CHECK(nhwc->inputs[0].format == tensor_format::nhwc);
  CHECK(parse_model_config(text("FORMAT_NONE", "[ 5 ]"), ctx_for("foo")).ok());
  auto msg = error_of(text("FORMAT_NCHW", "[ 3, 224 ]"));
  CHECK(contains(msg, "model input NHWC/NCHW require 3 dims"));
  auto bad = error_of(text("FORMAT_NCWH", "[ 3, 224, 224 ]"));
  CHECK(contains(bad, "unknown value 'FORMAT_NCWH' for field 'format'"));
  CHECK(contains(bad, "FORMAT_NCHW"));
}

TEST_CASE("default_model_filename stays inside the version directory") {
  auto r = parse_model_config(base_config + "default_model_filename: \"net.onnx\"\n",
                              ctx_for("foo"));
  REQUIRE(r.ok());
  CHECK(r->default_model_filename == "net.onnx");
  for (std::string bad : {"../other/model.onnx", "/etc/passwd", "..", "a/../../b"}) {
    CAPTURE(bad);
    auto msg = error_of(base_config + "default_model_filename: \"" + bad + "\"\n");
    CHECK(contains(msg, "does not name a file inside the version directory"));
  }
}

TEST_CASE("an unknown TYPE_ name lists the valid ones") {
  auto msg = error_of(R"(backend: "builtin"
input [ { name: "x" data_type: TYPE_FP33 dims: [ 4 ] } ]
)");
  CHECK(contains(msg, "line 2"));
  CHECK(contains(msg, "unknown value 'TYPE_FP33' for field 'data_type'"));
  CHECK(contains(msg, "TYPE_FP32"));
  CHECK_FALSE(contains(msg, "TYPE_INVALID"));

  auto kind = error_of(base_config + "instance_group [ { kind: KIND_TPU } ]");
  CHECK(contains(kind, "unknown value 'KIND_TPU' for field 'kind'"));
  CHECK(contains(kind, "KIND_CPU"));
}

TEST_CASE("semantic errors say what is wrong and how to fix it") {
  struct check_case {
    std::string what;
    std::string text;
    std::string expected;
  };
  const std::string io = R"(
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
)";
  const check_case cases[] = {
    {"name contradicts the directory",
     "name: \"bar\" backend: \"builtin\"" + io,
     "name is 'bar' but the model directory is 'foo'"},
    {"no backend", io, "neither backend nor platform is set"},
    {"negative max_batch_size",
     "backend: \"b\" max_batch_size: -1" + io,
     "max_batch_size is -1; use 0 for a model without a batch dimension"},
    {"no input",
     "backend: \"b\" output [ { name: \"o\" data_type: TYPE_FP32 dims: [1] } ]",
     "no input is declared"},
    {"no output",
     "backend: \"b\" input [ { name: \"i\" data_type: TYPE_FP32 dims: [1] } ]",
     "no output is declared"},
    {"missing data_type",
     "backend: \"b\" input [ { name: \"i\" dims: [1] } ]"
     " output [ { name: \"o\" data_type: TYPE_FP32 dims: [1] } ]",
     "input 'i' has no data_type"},
    {"empty dims",
     "backend: \"b\" input [ { name: \"i\" data_type: TYPE_FP32 } ]"
     " output [ { name: \"o\" data_type: TYPE_FP32 dims: [1] } ]",
     "input 'i' has no dims"},
    {"dims below -1",
     "backend: \"b\" input [ { name: \"i\" data_type: TYPE_FP32 dims: [4, -2] } ]"
     " output [ { name: \"o\" data_type: TYPE_FP32 dims: [1] } ]",
     "input 'i' has dims [4,-2]: dimension must be integer >= 1, or -1"},
    {"duplicate input names",
     "backend: \"b\" input [ { name: \"i\" data_type: TYPE_FP32 dims: [1] },"
     " { name: \"i\" data_type: TYPE_FP32 dims: [1] } ]"
     " output [ { name: \"o\" data_type: TYPE_FP32 dims: [1] } ]",
     "input name 'i' appears more than once"},
    {"unnamed output",
     "backend: \"b\" input [ { name: \"i\" data_type: TYPE_FP32 dims: [1] } ]"
     " output [ { data_type: TYPE_FP32 dims: [1] } ]",
     "output #1 has no name"},
    {"preferred size above max_batch_size",
     "backend: \"b\" max_batch_size: 8" + io
       + "dynamic_batching { preferred_batch_size: [ 4, 16 ] }",
     "preferred_batch_size 16 is larger than max_batch_size 8"},
    {"preferred size zero",
     "backend: \"b\" max_batch_size: 8" + io
       + "dynamic_batching { preferred_batch_size: [ 0 ] }",
     "preferred_batch_size 0 is not a batch size"},
    {"dynamic batching without batching",
     "backend: \"b\"" + io + "dynamic_batching { }",
     "dynamic_batching needs batching, but max_batch_size is 0"},
    {"default priority above the levels",
     "backend: \"b\" max_batch_size: 8" + io
       + "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "default_priority_level 3 is outside [1, 2]"},
    {"default priority 0 with levels",
     "backend: \"b\" max_batch_size: 8" + io
       + "dynamic_batching { priority_levels: 2 }",
     "default_priority_level 0 is outside [1, 2]"},
    {"default priority without levels",
     "backend: \"b\" max_batch_size: 8" + io
       + "dynamic_batching { default_priority_level: 1 }",
     "default_priority_level is 1 but priority_levels is 0"},
    {"queue policy for a missing level",
     "backend: \"b\" max_batch_size: 8" + io
       + "dynamic_batching { priority_levels: 2 default_priority_level: 1"
         " priority_queue_policy { key: 5 value: { } } }",
     "priority_queue_policy names level 5, but the levels are 1 to 2"},
    {"instance count zero",
     "backend: \"b\"" + io + "instance_group [ { count: 0 kind: KIND_CPU } ]",
     "instance_group 'foo_0' has count 0"},
    {"gpus on a CPU group",
     "backend: \"b\"" + io + "instance_group [ { kind: KIND_CPU gpus: [0] } ]",
     "lists gpus but its kind is KIND_CPU"},
    {"latest zero versions",
     "backend: \"b\"" + io + "version_policy { latest { num_versions: 0 } }",
     "num_versions 0"},
    {"specific without versions",
     "backend: \"b\"" + io + "version_policy { specific { } }",
     "version_policy specific lists no versions"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    auto msg = error_of(c.text);
    CHECK_MESSAGE(contains(msg, c.expected), msg);
    CHECK_MESSAGE(contains(msg, "model 'foo': /repo/foo/config.pbtxt"), msg);
  }
}

TEST_CASE("all problems of one file are reported together") {
  auto msg = error_of(R"(backend: "b" max_batch_size: -2
input [ { name: "i" data_type: TYPE_FP32 } ]
)");
  CHECK(contains(msg, "3 problems:"));
  CHECK(contains(msg, "\n  - max_batch_size is -2"));
  CHECK(contains(msg, "\n  - input 'i' has no dims"));
  CHECK(contains(msg, "\n  - no output is declared"));
}

TEST_CASE("allow_missing_io accepts a config that a loader completes") {
  parse_context ctx{"auto", "/repo/auto/config.pbtxt", true};
  auto r = parse_model_config("max_batch_size: 4", ctx);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(r->name == "auto");
  CHECK(r->inputs.empty());
  auto empty = parse_model_config("", ctx);
  REQUIRE(empty.ok());
  CHECK(empty->name == "auto");
  // Errors in what is given still count.
  CHECK_FALSE(parse_model_config("max_batch_size: -1", ctx).ok());
}

TEST_CASE("a config without directory must name itself") {
  parse_context ctx{"", "inline", false};
  auto msg = error_of("backend: \"b\"\n"
                      "input [ { name: \"i\" data_type: TYPE_FP32 dims: [1] } ]\n"
                      "output [ { name: \"o\" data_type: TYPE_FP32 dims: [1] } ]",
                      ctx);
  CHECK(contains(msg, "the config has no name"));
  auto named = parse_model_config(base_config, ctx);
  REQUIRE(named.ok());
  CHECK(named->name == "foo");
}

TEST_CASE("the example models parse") {
  const std::string dir = CAF_SERVING_EXAMPLES_DIR;
  for (const char* name : {"simple", "identity_fp32", "simple_string", "simple_identity"}) {
    CAPTURE(name);
    std::ifstream in{dir + "/" + name + "/config.pbtxt"};
    REQUIRE(in);
    std::stringstream text;
    text << in.rdbuf();
    auto r = parse_model_config(text.str(),
                                {name, dir + "/" + name + "/config.pbtxt"});
    REQUIRE_MESSAGE(r.ok(), r.error().message);
    CHECK(r->name == name);
    CHECK(r->backend == "builtin");
    CHECK(r->max_batch_size > 0);
    CHECK(r->parameters.count("function") == 1);
  }
}

TEST_CASE("model_warmup parses as Triton writes it") {
  auto cfg = parse_model_config(base_config + R"(model_warmup [
  {
    name: "zeros"
    batch_size: 4
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
    count: 3
  },
  {
    name: "from files"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "in0.bin" } }
  },
  {
    name: "random"
    batch_size: 8
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } }
  }
]
)", ctx_for("foo"));
  REQUIRE_MESSAGE(cfg, cfg.error().message);
  REQUIRE(cfg->warmup.size() == 3);
  const auto& zeros = cfg->warmup[0];
  CHECK(zeros.name == "zeros");
  CHECK(zeros.batch_size == 4);
  CHECK(zeros.count == 3);
  REQUIRE(zeros.inputs.size() == 1);
  CHECK(zeros.inputs[0].name == "INPUT0");
  CHECK(zeros.inputs[0].dtype == datatype::fp32);
  CHECK(zeros.inputs[0].dims == std::vector<int64_t>{16});
  CHECK(zeros.inputs[0].data == warmup_data::zero);
  const auto& files = cfg->warmup[1];
  CHECK(files.count == 1); // not set: once, as in Triton
  REQUIRE(files.inputs.size() == 1);
  CHECK(files.inputs[0].data == warmup_data::file);
  CHECK(files.inputs[0].file == "in0.bin");
  CHECK(cfg->warmup[2].inputs.at(0).data == warmup_data::random);
}

TEST_CASE("a bad model_warmup sample says what to write") {
  struct bad_case {
    const char* sample;
    const char* says;
  };
  for (auto c : {
         bad_case{R"(name: "w" batch_size: 0 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } })",
                  "model_warmup 'w' has batch_size 0; set batch_size: 1 or more"},
         bad_case{R"(name: "w" batch_size: 9 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } })",
                  "model_warmup 'w' has batch_size 9, more than max_batch_size 8"},
         bad_case{R"(name: "w" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] } })",
                  "model_warmup 'w' input 'INPUT0' has no data; set zero_data: true, "
                  "random_data: true or input_data_file"},
         bad_case{R"(name: "w" batch_size: 1 inputs { key: "INPUT0" value: { dims: [ 16 ] zero_data: true } })",
                  "model_warmup 'w' input 'INPUT0' has no data_type"},
         bad_case{R"(name: "w" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "../secret" } })",
                  "a file name inside the model's warmup/ folder"},
         bad_case{R"(name: "w" batch_size: 1)", "model_warmup 'w' has no inputs"},
         bad_case{R"(batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } })",
                  "model_warmup #1 has no name"}}) {
    CAPTURE(c.sample);
    auto msg = error_of(base_config + "model_warmup [ { " + c.sample + " } ]\n");
    CHECK(contains(msg, c.says));
  }
}

TEST_CASE("response_cache parses as Triton writes it; absent means off") {
  auto on = parse_model_config(base_config + "response_cache { enable: true }\n", ctx_for("foo"));
  REQUIRE_MESSAGE(on, on.error().message);
  CHECK(on->response_cache_enabled);
  auto off = parse_model_config(base_config + "response_cache { enable: false }\n",
                                ctx_for("foo"));
  REQUIRE_MESSAGE(off, off.error().message);
  CHECK_FALSE(off->response_cache_enabled);
  auto absent = parse_model_config(base_config, ctx_for("foo"));
  REQUIRE_MESSAGE(absent, absent.error().message);
  CHECK_FALSE(absent->response_cache_enabled);
  auto typo = error_of(base_config + "response_cache { enabled: true }\n");
  CHECK(contains(typo, "unknown field 'enabled' in ModelResponseCache"));
}

TEST_CASE("Triton's JSON form of a config converts through the same schema and checks") {
  // As Triton prints it (GET .../config, int64 as strings) and as a load
  // request's "config" parameter carries it.
  auto json = std::string{R"({
    "name": "foo", "platform": "onnxruntime_onnx", "max_batch_size": 16,
    "input": [ { "name": "x", "data_type": "TYPE_FP32", "format": "FORMAT_NHWC",
                 "dims": [ "4", "4", "3" ], "reshape": { "shape": [ "48" ] } } ],
    "output": [ { "name": "y", "data_type": "TYPE_FP32", "dims": [ 10 ] } ],
    "optimization": { "input_pinned_memory": { "enable": true } },
    "response_cache": { "enable": true },
    "model_transaction_policy": { "decoupled": false }
  })"};
  config::ModelConfig proto;
  REQUIRE(google::protobuf::util::JsonStringToMessage(json, &proto).ok());
  auto r = convert_model_config(proto, ctx_for("foo"));
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
  CHECK(r->config.max_batch_size == 16);
  CHECK(r->config.inputs[0].format == tensor_format::nhwc);
  CHECK(*r->config.inputs[0].reshape == std::vector<int64_t>{48});
  CHECK(r->config.response_cache_enabled);
  CHECK(r->ignored_fields == std::vector<std::string>{"optimization.input_pinned_memory"});

  config::ModelConfig decoupled;
  REQUIRE(google::protobuf::util::JsonStringToMessage(
            R"({"backend": "builtin", "input": [ { "name": "a", "data_type": "TYPE_FP32",
                 "dims": [ 1 ] } ], "output": [ { "name": "b", "data_type": "TYPE_FP32",
                 "dims": [ 1 ] } ], "model_transaction_policy": { "decoupled": true } })",
            &decoupled)
            .ok());
  // decoupled: true converts; the model manager serves it for generative
  // decoders only and refuses it for a builtin model at load.
  auto kept = convert_model_config(decoupled, ctx_for("foo"));
  REQUIRE(kept.ok());
  CHECK(kept->config.decoupled);
  // A misspelled key is refused by the JSON parser itself, naming it.
  config::ModelConfig typo;
  auto status = google::protobuf::util::JsonStringToMessage(R"({"max_batch_sise": 4})", &typo);
  CHECK_FALSE(status.ok());
  CHECK(contains(status.ToString(), "max_batch_sise"));
}

TEST_CASE("a JSON config (Triton's load parameter) converts as config.pbtxt does") {
  parse_context ctx{"foo", "the 'config' load parameter", true};
  // int64 and int32 fields may be quoted in protobuf's JSON mapping; enum
  // names in any case, as Triton parses them.
  auto parsed = parse_model_config_json(
    R"({"backend":"builtin","max_batch_size":"16",
        "input":[{"name":"INPUT0","data_type":"type_fp32","dims":["4"]}],
        "output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4]}],
        "dynamic_batching":{"preferred_batch_size":[4,8]},
        "version_policy":{"specific":{"versions":[2]}},
        "parameters":{"function":{"string_value":"identity"}}})",
    ctx);
  REQUIRE_MESSAGE(parsed, (parsed ? "" : parsed.error().message));
  const auto& cfg = parsed->config;
  CHECK(cfg.name == "foo");
  CHECK(cfg.max_batch_size == 16);
  REQUIRE(cfg.inputs.size() == 1);
  CHECK(cfg.inputs[0].dtype == datatype::fp32);
  CHECK(cfg.inputs[0].dims == std::vector<int64_t>{4});
  CHECK(cfg.dynamic_batching.preferred_batch_sizes == std::vector<int>{4, 8});
  CHECK(parsed->versions.kind == version_policy_kind::specific);
  CHECK(parsed->versions.versions == std::vector<int64_t>{2});
  CHECK(cfg.parameters.at("function") == "identity");

  // Only max_batch_size (the client example's override), for a model whose
  // loader completes the rest from its file.
  auto small = parse_model_config_json(R"({"max_batch_size":"16"})", ctx);
  REQUIRE(small);
  CHECK(small->config.max_batch_size == 16);
}

TEST_CASE("a JSON config that does not fit the schema is Triton's 'Invalid config override'") {
  parse_context ctx{"foo", "the 'config' load parameter", true};
  for (const char* json : {R"("parameters": {"config": {{"max_batch_size": "16"}}})",
                           R"({"max_batch_sise": 16})", R"({"max_batch_size": "many"})",
                           R"([1, 2])"}) {
    auto r = parse_model_config_json(json, ctx);
    REQUIRE_MESSAGE(!r, json);
    CHECK(r.error().status == status_code::bad_request);
    CHECK_MESSAGE(contains(r.error().message, "Invalid config override: "), r.error().message);
    CHECK(contains(r.error().message, "the 'config' load parameter"));
  }
  // What parses but cannot work is refused with the same message as in a file.
  auto r = parse_model_config_json(
    R"({"backend":"builtin","max_batch_size":4,"dynamic_batching":{"preferred_batch_size":[8]}})",
    ctx);
  REQUIRE(!r);
  CHECK_MESSAGE(contains(r.error().message, "preferred_batch_size 8 is larger than max_batch_size 4"),
                r.error().message);
  // A name that contradicts the model being loaded.
  r = parse_model_config_json(R"({"name":"bar","backend":"builtin"})", ctx);
  REQUIRE(!r);
  CHECK(contains(r.error().message, "name is 'bar' but the model directory is 'foo'"));
}

TEST_CASE("a JSON config over a builtin model's config.pbtxt keeps what it leaves out") {
  parse_context ctx{"foo", "the 'config' load parameter", true};
  auto with_params = base_config
                     + "parameters { key: \"function\" value: { string_value: \"identity\" } }\n";
  auto over = parse_model_config_json_over(R"({"max_batch_size":"16"})", with_params, ctx);
  REQUIRE_MESSAGE(over, over.error().message);
  CHECK(over->config.max_batch_size == 16);
  CHECK(over->config.backend == "builtin");
  REQUIRE(over->config.inputs.size() == 1);
  CHECK(over->config.inputs[0].name == "INPUT0");
  CHECK(over->config.parameters.at("function") == "identity");

  // A list the JSON sets replaces the file's list.
  over = parse_model_config_json_over(
    R"({"input":[{"name":"X","data_type":"TYPE_INT32","dims":[2]}]})", with_params, ctx);
  REQUIRE(over);
  REQUIRE(over->config.inputs.size() == 1);
  CHECK(over->config.inputs[0].name == "X");

  // Naming a backend, or a file that is not builtin: the JSON alone (Triton's rule).
  over = parse_model_config_json_over(R"({"backend":"onnxruntime","max_batch_size":4})",
                                      with_params, ctx);
  REQUIRE(over);
  CHECK(over->config.inputs.empty());
  auto onnx_file = std::string("platform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n"
                               "dynamic_batching { }\n");
  over = parse_model_config_json_over(R"({"max_batch_size":4})", onnx_file, ctx);
  REQUIRE(over);
  CHECK(over->config.platform.empty());
  CHECK_FALSE(over->config.dynamic_batching_enabled);
  // Errors are those of the JSON.
  auto bad = parse_model_config_json_over(R"({"max_batch_sise":4})", with_params, ctx);
  REQUIRE(!bad);
  CHECK(contains(bad.error().message, "Invalid config override: "));
}
