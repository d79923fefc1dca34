/// Triton's model configuration as the server carries it out: reshape and
/// format on the densenet_small example (Triton's densenet_onnx layout, what
/// tritonclient's image_client.py needs), auto-complete of an ONNX model that
/// has no config.pbtxt, default_model_filename, reshape with batching checked
/// against ONNX Runtime's reference outputs, fields accepted and logged once as
/// ignored, and fields refused at load.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

using namespace caf_serving::server_test;

namespace {

std::string read_binary(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot read " << path.string());
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

fs::path onnx_fixtures() {
  return fs::path(CAF_SERVING_EXAMPLE_MODELS) / ".." / ".." / "tests" / "onnx" / "fixtures";
}

/// op_gemm's reference: ONNX Runtime's y for x, at batch 2 ([2,6] -> [2,5]).
struct gemm_reference {
  std::vector<float> x = from_bytes<float>(read_binary(onnx_fixtures() / "reference" / "op_gemm"
                                                       / "input_x.bin"));
  std::vector<float> y = from_bytes<float>(read_binary(onnx_fixtures() / "reference" / "op_gemm"
                                                       / "output_y.bin"));
};

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(std::fabs(got[i] - want[i]) <= 1e-4f * (1.0f + std::fabs(want[i])),
                  "element " << i << ": " << got[i] << " vs " << want[i]);
}

/// The model's lines of the server log: how often `text` appears.
size_t occurrences(const std::string& log, const std::string& text) {
  size_t n = 0;
  for (auto at = log.find(text); at != std::string::npos; at = log.find(text, at + 1))
    ++n;
  return n;
}

/// Model directories written for one test, handed to test_server, which
/// copies them into its repository before the server starts.
struct staged_models {
  temp_repository dir;
  std::vector<fs::path> models;
  void write(const std::string& model, const fs::path& relative, std::string_view content) {
    dir.write_file(fs::path(model) / relative, content);
    auto path = dir.path() / model;
    if (std::find(models.begin(), models.end(), path) == models.end())
      models.push_back(path);
  }
};

/// A [3,224,224] image with values that vary over channels, rows and columns.
std::vector<float> test_image() {
  std::vector<float> image(3 * 224 * 224);
  for (size_t i = 0; i < image.size(); ++i)
    image[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;
  return image;
}

/// POSTs `image` to densenet_small as binary data with `rest` appended to the
/// request JSON; the response is expected to be JSON.
http_response infer_image(http_client& http, const std::vector<float>& image,
                          const std::vector<int64_t>& shape, const std::string& rest = "") {
  auto raw = to_bytes(image);
  auto json = infer_body({binary_input_json("data_0", "FP32", shape, raw.size())}, rest);
  return http.post("/v2/models/densenet_small/infer", json + raw,
                   {{"Inference-Header-Content-Length", std::to_string(json.size())}});
}

} // namespace

TEST_CASE("densenet_small: format and reshape as Triton's densenet_onnx, classification "
          "with labels") {
  test_server server({example_model("densenet_small")});
  auto http = server.client();

  // Metadata and config show the client's dims; the config keeps format,
  // reshape and label_filename as image_client.py reads them.
  auto meta = json_document::parse(http.get("/v2/models/densenet_small").body);
  CHECK(json_ints(meta.at("/inputs/0/shape")) == std::vector<int64_t>{3, 224, 224});
  CHECK(json_ints(meta.at("/outputs/0/shape")) == std::vector<int64_t>{1000});
  auto config = json_document::parse(http.get("/v2/models/densenet_small/config").body);
  CHECK(config.int_at("/max_batch_size") == 0);
  CHECK(config.string_at("/backend") == "onnxruntime");
  CHECK(config.string_at("/input/0/format") == "FORMAT_NCHW");
  CHECK(json_ints(config.at("/input/0/reshape/shape")) == std::vector<int64_t>{1, 3, 224, 224});
  CHECK(json_ints(config.at("/output/0/reshape/shape")) == std::vector<int64_t>{1, 1000, 1, 1});
  CHECK(config.string_at("/output/0/label_filename") == "densenet_labels.txt");

  auto image = test_image();
  // The scores come back in the output's dims, [1000], not the model's [1,1000,1,1].
  auto r = infer_image(http, image, {3, 224, 224});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto scores_doc = json_document::parse(r.body);
  CHECK(json_ints(scores_doc.at("/outputs/0/shape")) == std::vector<int64_t>{1000});
  auto scores = fp32_output(scores_doc);
  REQUIRE(scores.size() == 1000);
  CHECK(*std::max_element(scores.begin(), scores.end())
        > *std::min_element(scores.begin(), scores.end()));

  // Classification: the three best classes, in order, named from the label file.
  r = infer_image(http, image, {3, 224, 224},
                  ",\"outputs\":[{\"name\":\"fc6_1\",\"parameters\":{\"classification\":3}}]");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto classes_doc = json_document::parse(r.body);
  CHECK(json_ints(classes_doc.at("/outputs/0/shape")) == std::vector<int64_t>{3});
  auto classes = json_strings(classes_doc.at("/outputs/0/data"));
  REQUIRE(classes.size() == 3);
  std::vector<size_t> order(scores.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  for (size_t k = 0; k < 3; ++k) {
    CAPTURE(classes[k]);
    // "score:index:label", the label being line `index` of densenet_labels.txt.
    auto first = classes[k].find(':');
    auto second = classes[k].find(':', first + 1);
    REQUIRE(second != std::string::npos);
    auto index = std::stoul(classes[k].substr(first + 1, second - first - 1));
    CHECK(index == order[k]);
    char label[16];
    std::snprintf(label, sizeof(label), "CLASS_%04zu", order[k]);
    CHECK(classes[k].substr(second + 1) == label);
    CHECK(std::fabs(std::stof(classes[k].substr(0, first)) - scores[order[k]]) < 1e-4f);
  }

  // The model's own shape is not the client's: a request in it is refused.
  r = infer_image(http, image, {1, 3, 224, 224});
  CHECK(r.status == 400);
  CHECK(r.body.find("[3,224,224]") != std::string::npos);
}

TEST_CASE("reshape with batching keeps the batch dimension in front (checked against ONNX "
          "Runtime)") {
  gemm_reference ref;
  staged_models staged;
  staged.write("gemm_reshaped", "config.pbtxt", R"(
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape: { shape: [ 6 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 5, 1 ] reshape: { shape: [ 5 ] } } ]
)");
  staged.write("gemm_reshaped", "1/model.onnx",
               read_binary(onnx_fixtures() / "models" / "op_gemm" / "1" / "model.onnx"));
  test_server server(staged.models);
  auto http = server.client();
  auto r = http.post("/v2/models/gemm_reshaped/infer",
                     infer_body({input_json("x", "FP32", {2, 2, 3}, json_list(ref.x))}),
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{2, 5, 1});
  check_close(fp32_output(doc), ref.y);
}

TEST_CASE("an ONNX model without config.pbtxt is completed as Triton's auto-complete does") {
  gemm_reference ref;
  staged_models staged;
  staged.write("auto_gemm", "1/model.onnx",
               read_binary(onnx_fixtures() / "models" / "op_gemm" / "1" / "model.onnx"));
  test_server server(staged.models);
  auto http = server.client();

  // Every input and output has a variable first dimension: max_batch_size 4
  // (Triton's default-max-batch-size) and dynamic batching are filled in.
  auto config = json_document::parse(http.get("/v2/models/auto_gemm/config").body);
  CHECK(config.int_at("/max_batch_size") == 4);
  CHECK(config.has("/dynamic_batching"));
  CHECK(config.string_at("/platform") == "onnxruntime_onnx");
  CHECK(config.string_at("/backend") == "onnxruntime");
  CHECK(config.string_at("/default_model_filename") == "model.onnx");
  CHECK(config.string_at("/input/0/name") == "x");
  CHECK(json_ints(config.at("/input/0/dims")) == std::vector<int64_t>{6});
  CHECK(config.string_at("/output/0/name") == "y");
  CHECK(json_ints(config.at("/output/0/dims")) == std::vector<int64_t>{5});
  auto meta = json_document::parse(http.get("/v2/models/auto_gemm").body);
  CHECK(json_ints(meta.at("/inputs/0/shape")) == std::vector<int64_t>{-1, 6});

  auto r = http.post("/v2/models/auto_gemm/infer",
                     infer_body({input_json("x", "FP32", {2, 6}, json_list(ref.x))}),
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  check_close(fp32_output(json_document::parse(r.body)), ref.y);
  std::vector<float> five(5 * 6, 0.5f);
  r = http.post("/v2/models/auto_gemm/infer",
                infer_body({input_json("x", "FP32", {5, 6}, json_list(five))}), json_content);
  CHECK(r.status == 400);
}

TEST_CASE("default_model_filename names the model file of each version") {
  staged_models staged;
  staged.write("named_file", "config.pbtxt", R"(
platform: "onnxruntime_onnx"
default_model_filename: "gemm.onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 5 ] } ]
)");
  staged.write("named_file", "1/gemm.onnx",
               read_binary(onnx_fixtures() / "models" / "op_gemm" / "1" / "model.onnx"));
  test_server server(staged.models, model_control_api());
  auto http = server.client();
  auto config = json_document::parse(http.get("/v2/models/named_file/config").body);
  CHECK(config.string_at("/default_model_filename") == "gemm.onnx");
  gemm_reference ref;
  auto r = http.post("/v2/models/named_file/infer",
                     infer_body({input_json("x", "FP32", {2, 6}, json_list(ref.x))}),
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  check_close(fp32_output(json_document::parse(r.body)), ref.y);
}

TEST_CASE("backend-only fields are logged once per model; result-changing ones refuse the "
          "load") {
  staged_models staged;
  auto gemm = read_binary(onnx_fixtures() / "models" / "op_gemm" / "1" / "model.onnx");
  // Two instance groups set rate_limiter: the field is still named once.
  staged.write("accelerated", "config.pbtxt", R"(
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 5 ] } ]
optimization { execution_accelerators {
  gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ] } }
instance_group [ { kind: KIND_CPU rate_limiter { priority: 1 } },
                 { kind: KIND_CPU rate_limiter { priority: 2 } } ]
model_transaction_policy { decoupled: false }
)");
  staged.write("accelerated", "1/model.onnx", gemm);
  staged.write("sequence", "config.pbtxt", R"(
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 5 ] } ]
sequence_batching { max_sequence_idle_microseconds: 5000000 }
)");
  staged.write("sequence", "1/model.onnx", gemm);
  test_server server(staged.models, model_control_api());
  auto http = server.client();

  const std::string accelerators =
    "model accelerated: config field 'optimization.execution_accelerators' is accepted and "
    "ignored";
  const std::string rate_limiter =
    "model accelerated: config field 'instance_group.rate_limiter' is accepted and ignored";
  CHECK(http.get("/v2/models/accelerated/ready").status == 200);
  REQUIRE(server.process->wait_for_output(rate_limiter, std::chrono::seconds(10)));
  // Loading the model again logs nothing new.
  auto load = http.post("/v2/repository/models/accelerated/load", "");
  REQUIRE_MESSAGE(load.status == 200, load.body);
  CHECK(occurrences(server.process->output(), accelerators) == 1);
  CHECK(occurrences(server.process->output(), rate_limiter) == 1);

  CHECK(http.get("/v2/models/sequence/ready").status != 200);
  auto index = http.post("/v2/repository/index", "");
  REQUIRE(index.status == 200);
  CHECK(index.body.find("field 'sequence_batching' of Triton's ModelConfig is not supported by "
                        "caf-serving")
        != std::string::npos);
  // A config the engine cannot serve fails where Triton's does, before the
  // model is read: 500 "failed to load ..." (tritonclient matches on it).
  auto refused = http.post("/v2/repository/models/sequence/load", "");
  CHECK(refused.status == 500);
  CHECK(refused.body.find("failed to load 'sequence'") != std::string::npos);
  CHECK(refused.body.find("sequence_batching") != std::string::npos);
}

TEST_CASE("version_policy serves every selected version, each answering as itself") {
  // Triton's "simple" (the builtin add_sub) in versions 1, 2 and 3, under
  // each policy.
  auto simple = read_binary(example_model("simple") / "config.pbtxt");
  staged_models staged;
  for (auto [model, policy] :
       std::vector<std::pair<std::string, std::string>>{
         {"latest_two", "version_policy: { latest: { num_versions: 2 } }"},
         {"all_three", "version_policy: { all: { } }"},
         {"one_and_three", "version_policy: { specific: { versions: [ 1, 3 ] } }"}}) {
    auto config = simple;
    config.replace(config.find("name: \"simple\""), std::string("name: \"simple\"").size(),
                   policy);
    staged.write(model, "config.pbtxt", config);
    for (const char* v : {"1", "2", "3"})
      staged.write(model, fs::path(v) / "model.builtin", "builtin\n");
  }
  test_server server(staged.models);
  auto http = server.client();
  std::vector<int32_t> a(16, 3), b(16, 1);
  auto body = infer_body({input_json("INPUT0", "INT32", {1, 16}, json_list(a)),
                          input_json("INPUT1", "INT32", {1, 16}, json_list(b))});
  auto served = [&](const std::string& model) {
    std::vector<int> versions;
    for (int v = 1; v <= 3; ++v) {
      auto path = "/v2/models/" + model + "/versions/" + std::to_string(v);
      if (http.get(path + "/ready").status != 200)
        continue;
      auto r = http.post(path + "/infer", body, json_content);
      REQUIRE_MESSAGE(r.status == 200, r.body);
      auto doc = json_document::parse(r.body);
      CHECK(doc.string_at("/model_version") == std::to_string(v));
      CHECK(json_ints(doc.at("/outputs/0/data")) == std::vector<int64_t>(16, 4));
      versions.push_back(v);
    }
    return versions;
  };
  CHECK(served("latest_two") == std::vector<int>{2, 3});
  CHECK(served("all_three") == std::vector<int>{1, 2, 3});
  CHECK(served("one_and_three") == std::vector<int>{1, 3});
  auto meta = json_document::parse(http.get("/v2/models/one_and_three").body);
  CHECK(json_strings(meta.at("/versions")) == std::vector<std::string>{"1", "3"});
  // Without a version the newest served one answers.
  auto r = http.post("/v2/models/latest_two/infer", body, json_content);
  REQUIRE(r.status == 200);
  CHECK(json_document::parse(r.body).string_at("/model_version") == "3");
}
