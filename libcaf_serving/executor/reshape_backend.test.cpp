#include "executor/reshape_backend.hpp"

#include "core/reshape.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>

using namespace caf_serving;
using namespace caf_serving::executor;

namespace {

using dims = std::vector<int64_t>;

/// Records the input shapes it is given and allocates one output of a fixed
/// model shape.
struct recording_backend final : backend {
  std::map<std::string, dims> seen;
  dims output_shape;
  bool blocks() const override { return false; }
  std::variant<std::monostate, serving_error> execute(const batch_view& batch,
                                                      output_writer& out) override {
    for (const auto& in : batch.inputs)
      seen[std::string(in.name)] = in.shape;
    out.allocate("y", datatype::fp32, output_shape, 4);
    return {};
  }
};

struct recording_writer final : output_writer {
  std::map<std::string, dims> shapes;
  std::vector<uint8_t> buffer = std::vector<uint8_t>(1 << 16);
  uint8_t* allocate(std::string_view name, datatype, const std::vector<int64_t>& shape,
                    size_t) override {
    shapes[std::string(name)] = shape;
    return buffer.data();
  }
};

} // namespace

TEST_CASE("a model without reshape keeps its backend") {
  model_config cfg;
  cfg.inputs = {{"x", datatype::fp32, {4}}};
  auto inner = std::make_shared<recording_backend>();
  CHECK(with_reshape(inner, cfg) == inner);
  CHECK_FALSE(has_reshape(cfg));
}

TEST_CASE("inputs reach the model in reshape shape and outputs leave in dims shape") {
  model_config cfg;
  cfg.max_batch_size = 0;
  tensor_config x{"x", datatype::fp32, {3, 224, 224}};
  x.reshape = dims{1, 3, 224, 224};
  tensor_config y{"y", datatype::fp32, {1000}};
  y.reshape = dims{1, 1000, 1, 1};
  cfg.inputs = {x};
  cfg.outputs = {y};
  auto inner = std::make_shared<recording_backend>();
  inner->output_shape = {1, 1000, 1, 1};
  auto be = with_reshape(inner, cfg);
  REQUIRE(be != inner);
  std::vector<uint8_t> data(3 * 224 * 224 * 4);
  batch_view batch;
  batch.rows = 1;
  batch.inputs.push_back({"x", datatype::fp32, {3, 224, 224}, data.data(), data.size()});
  recording_writer out;
  auto r = be->execute(batch, out);
  REQUIRE(std::holds_alternative<std::monostate>(r));
  CHECK(inner->seen["x"] == dims{1, 3, 224, 224});
  CHECK(out.shapes["y"] == dims{1000});
  // The model-side config is what the inner backend was built from.
  auto side = model_side(cfg);
  CHECK(side.inputs[0].dims == dims{1, 3, 224, 224});
  CHECK(side.outputs[0].dims == dims{1, 1000, 1, 1});
}

TEST_CASE("with batching the batch dimension stays in front") {
  model_config cfg;
  cfg.max_batch_size = 8;
  tensor_config x{"x", datatype::fp32, {2, 4, -1, 6}};
  x.reshape = dims{8, -1, 1, 6};
  tensor_config y{"y", datatype::fp32, {1}};
  y.reshape = dims{}; // a scalar per row
  cfg.inputs = {x};
  cfg.outputs = {y};
  auto inner = std::make_shared<recording_backend>();
  inner->output_shape = {5};
  auto be = with_reshape(inner, cfg);
  std::vector<uint8_t> data(5 * 2 * 4 * 7 * 6 * 4);
  batch_view batch;
  batch.rows = 5;
  batch.inputs.push_back({"x", datatype::fp32, {5, 2, 4, 7, 6}, data.data(), data.size()});
  recording_writer out;
  REQUIRE(std::holds_alternative<std::monostate>(be->execute(batch, out)));
  CHECK(inner->seen["x"] == dims{5, 8, 7, 1, 6});
  CHECK(out.shapes["y"] == dims{5, 1});
}
