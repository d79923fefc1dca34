/// Config completion in the model library, as both backends run it: inputs and
/// outputs from the graph, Triton's auto-complete of batching, a config that
/// contradicts the graph refused with both sides named, and the client's dims
/// kept for a tensor with a reshape. Links the model alone (no backend).

#include "onnx/model_config.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;

namespace {

/// x [-1, 3] -> Relu -> y
graph relu_graph() {
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 3}, true);
  int y = g.add_value("y");
  g.add_node("Relu", "relu", {x}, {y});
  g.inputs = {x};
  g.outputs = {y};
  return g;
}

config_completion_config completion(model_config cfg) {
  cfg.name = "m";
  return {"models/m/1/model.onnx", cfg};
}

} // namespace

TEST_CASE("an empty config is completed from the graph, with Triton's batching defaults") {
  auto done = complete_model_config(relu_graph(), completion({}));
  REQUIRE_MESSAGE(done, done.error().message);
  CHECK(done->autofilled.max_batch_size == 4);
  CHECK(done->autofilled.dynamic_batching_enabled);
  REQUIRE(done->model.inputs.size() == 1);
  CHECK(done->model.inputs[0].name == "x");
  CHECK(done->model.inputs[0].dims == std::vector<int64_t>{3});
  REQUIRE(done->model.outputs.size() == 1);
  CHECK(done->model.outputs[0].name == "y");
  CHECK(done->model.outputs[0].dtype == datatype::fp32);
  CHECK(done->model.outputs[0].dims == std::vector<int64_t>{3});
  CHECK(done->client.inputs[0].dims == std::vector<int64_t>{3});

  auto strict = completion({});
  strict.auto_complete = false;
  auto unbatched = complete_model_config(relu_graph(), strict);
  REQUIRE_MESSAGE(unbatched, unbatched.error().message);
  CHECK(unbatched->model.max_batch_size == 0);
  CHECK(unbatched->model.inputs[0].dims == std::vector<int64_t>{-1, 3});
}

TEST_CASE("a config that contradicts the graph is refused, naming the file and both sides") {
  model_config cfg;
  cfg.max_batch_size = 8;
  cfg.inputs.push_back({"x", datatype::fp32, {4}});
  auto done = complete_model_config(relu_graph(), completion(cfg));
  REQUIRE(!done);
  CHECK(done.error().status == status_code::bad_request);
  const auto& m = done.error().message;
  INFO(m);
  CHECK(m.find("model 'm'") != std::string::npos);
  CHECK(m.find("models/m/1/model.onnx") != std::string::npos);
  CHECK(m.find("dims [4]") != std::string::npos);
  CHECK(m.find("[3]") != std::string::npos);

  model_config unknown;
  unknown.max_batch_size = 8;
  unknown.inputs.push_back({"tokens", datatype::fp32, {3}});
  auto missing = complete_model_config(relu_graph(), completion(unknown));
  REQUIRE(!missing);
  CHECK(missing.error().message.find("no such input; its inputs are 'x'") != std::string::npos);
}

TEST_CASE("a tensor with a reshape is checked on reshape.shape and keeps its dims for clients") {
  model_config cfg;
  cfg.max_batch_size = 8;
  tensor_config x{"x", datatype::fp32, {1, 3}};
  x.reshape = std::vector<int64_t>{3};
  cfg.inputs.push_back(x);
  auto done = complete_model_config(relu_graph(), completion(cfg));
  REQUIRE_MESSAGE(done, done.error().message);
  CHECK(done->model.inputs[0].dims == std::vector<int64_t>{3});
  CHECK(done->client.inputs[0].dims == std::vector<int64_t>{1, 3});

  cfg.inputs[0].reshape = std::vector<int64_t>{4};
  auto bad = complete_model_config(relu_graph(), completion(cfg));
  REQUIRE(!bad);
  CHECK(bad.error().message.find("the dims checked against the graph are reshape.shape")
        != std::string::npos);
}
