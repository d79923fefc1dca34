/// The importer on damaged model bytes (the onnx_import fuzzer's findings) and on
/// a well-formed one.

#include "onnx/importer.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <vector>

using namespace caf_serving;

namespace {

/// Y = Identity(W), where W is an FP32 initializer of `dims` holding `values`.
std::string model_with_initializer(const std::vector<int64_t>& dims, size_t values) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto* w = g->add_initializer();
  w->set_name("W");
  w->set_data_type(::onnx::TensorProto::FLOAT);
  for (auto d : dims)
    w->add_dims(d);
  for (size_t i = 0; i < values; ++i)
    w->add_float_data(1.0f);
  auto* n = g->add_node();
  n->set_op_type("Identity");
  n->add_input("W");
  n->add_output("Y");
  g->add_output()->set_name("Y");
  return m.SerializeAsString();
}

} // namespace

TEST_CASE("an initializer's data must match its shape") {
  auto ok = caf_serving::onnx::import_model_bytes(model_with_initializer({2, 3}, 6), "m.onnx");
  REQUIRE_MESSAGE(ok.ok(), ok.error().message);
  CHECK(ok->nodes.size() == 1);

  auto short_data = caf_serving::onnx::import_model_bytes(model_with_initializer({2, 3}, 5), "m.onnx");
  REQUIRE_FALSE(short_data.ok());
  CHECK(short_data.error().message.find("holds 20 bytes, not 24") != std::string::npos);
}

TEST_CASE("huge or negative initializer dims are refused, not multiplied (fuzz: onnx_import)") {
  // The product of these overflowed int64 (undefined behaviour) before it was
  // compared with the data.
  auto huge = caf_serving::onnx::import_model_bytes(
    model_with_initializer({int64_t{1} << 40, int64_t{1} << 40, 8001}, 1), "m.onnx");
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.error().status == status_code::bad_request);
  CHECK(huge.error().message.find("m.onnx: tensor 'W' has shape [1099511627776,1099511627776,8001]")
        == 0);
  auto negative = caf_serving::onnx::import_model_bytes(model_with_initializer({-1, -2}, 2), "m.onnx");
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.error().message.find("negative dimension") != std::string::npos);
}
