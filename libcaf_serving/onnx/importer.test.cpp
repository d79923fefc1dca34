/// The importer on damaged model bytes (the onnx_import fuzzer's findings) and on
/// a well-formed one.

#include "onnx/importer.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <tuple>
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

namespace {

/// A chain of `ops` (op type, node name, domain) from X to Y, at opset 17.
std::string model_with_nodes(
  const std::vector<std::tuple<std::string, std::string, std::string>>& ops) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto* x = g->add_input();
  x->set_name("X");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(::onnx::TensorProto::FLOAT);
  std::string prev = "X";
  for (size_t i = 0; i < ops.size(); ++i) {
    auto* n = g->add_node();
    n->set_op_type(std::get<0>(ops[i]));
    n->set_name(std::get<1>(ops[i]));
    n->set_domain(std::get<2>(ops[i]));
    n->add_input(prev);
    prev = i + 1 == ops.size() ? "Y" : "t" + std::to_string(i);
    n->add_output(prev);
  }
  g->add_output()->set_name("Y");
  return m.SerializeAsString();
}

} // namespace

TEST_CASE("a model's unsupported operators are all named at once, with their counts and nodes") {
  auto r = caf_serving::onnx::import_model_bytes(
    model_with_nodes({{"LSTM", "g1", ""},
                      {"Relu", "ok", ""},
                      {"GridSample", "grid", ""},
                      {"LSTM", "", ""},
                      {"SparseAttention", "att", "com.microsoft"},
                      {"LSTM", "g3", "ai.onnx"},
                      {"LSTM", "g4", ""},
                      {"LSTM", "g5", ""},
                      {"LSTM", "g6", ""},
                      {"LSTM", "g7", ""},
                      {"LSTM", "g8", ""},
                      {"LSTM", "g9", ""},
                      {"LSTM", "g10", ""}}),
    "m.onnx");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::bad_request);
  const auto& msg = r.error().message;
  INFO(msg);
  // Most used first, then in file order; unnamed nodes numbered as the graph IR names them.
  CHECK(msg.find("m.onnx: 12 nodes use 3 operators that the engine does not support at opset 17: "
                 "'LSTM' in 10 nodes ('g1', 'LSTM_3', 'g3', 'g4', 'g5', 'g6', 'g7', "
                 "'g8' and 2 more), 'GridSample' in 1 node ('grid'), "
                 "'com.microsoft.SparseAttention' in 1 node ('att'); the engine runs the "
                 "default ONNX domain and the com.microsoft operators among the supported ones")
        == 0);
  CHECK(msg.find("supported operators: Abs, Add,") != std::string::npos);
  CHECK(msg.find("'ok'") == std::string::npos);

  auto one = caf_serving::onnx::import_model_bytes(model_with_nodes({{"GridSample", "", ""}}),
                                                   "m.onnx");
  REQUIRE_FALSE(one.ok());
  CHECK(one.error().message.find("m.onnx: 1 node uses 1 operator that the engine does not "
                                 "support at opset 17: 'GridSample' in 1 node ('GridSample_0'); "
                                 "supported operators:")
        == 0);

  // The operators added for current exporters import.
  auto fine = caf_serving::onnx::import_model_bytes(
    model_with_nodes({{"IsNaN", "a", ""}, {"Not", "b", ""}, {"GatherND", "c", ""},
                      {"Pad", "d", ""}, {"Trilu", "e", ""}}),
    "m.onnx");
  CHECK_MESSAGE(fine.ok(), (fine.ok() ? "" : fine.error().message));
}

namespace {

struct io {
  std::string name;
  int32_t type;
};

/// One node `op` from `inputs` to `outputs` (all of shape [batch, 2]), with
/// FP16 initializer "H" = {1.5, -0.25} when `with_half_weight`.
std::string typed_model(const std::string& op, const std::vector<io>& inputs,
                        const std::vector<io>& outputs, bool with_half_weight = false) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name("the_node");
  for (const auto& i : inputs)
    n->add_input(i.name);
  if (with_half_weight) {
    auto* w = g->add_initializer();
    w->set_name("H");
    w->set_data_type(::onnx::TensorProto::FLOAT16);
    w->add_dims(2);
    w->add_int32_data(0x3e00); // 1.5
    w->add_int32_data(0xb400); // -0.25
    n->add_input("H");
  }
  for (const auto& o : outputs)
    n->add_output(o.name);
  auto declare = [](::onnx::ValueInfoProto* vi, const io& t) {
    vi->set_name(t.name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(t.type);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    tt->mutable_shape()->add_dim()->set_dim_value(2);
  };
  for (const auto& i : inputs)
    declare(g->add_input(), i);
  for (const auto& o : outputs)
    declare(g->add_output(), o);
  return m.SerializeAsString();
}

constexpr int32_t fp16 = ::onnx::TensorProto::FLOAT16;

} // namespace

TEST_CASE("FP16 inputs, outputs and weights: stored half at the edges, computed as fp32") {
  auto g = caf_serving::onnx::import_model_bytes(
    typed_model("Add", {{"x", fp16}}, {{"y", fp16}}, true), "m.onnx");
  REQUIRE_MESSAGE(g.ok(), g.error().message);
  REQUIRE(g->inputs.size() == 1);
  CHECK(g->values[g->inputs[0]].dtype == datatype::fp16);
  CHECK(g->values[g->inputs[0]].name == "x");
  REQUIRE(g->outputs.size() == 1);
  CHECK(g->values[g->outputs[0]].dtype == datatype::fp16);
  CHECK(g->values[g->outputs[0]].name == "y");
  // Cast in, the model's Add, Cast out.
  REQUIRE(g->nodes.size() == 3);
  CHECK(g->nodes[0].op == "Cast");
  CHECK(g->nodes[0].get_i("to", 0) == ::onnx::TensorProto::FLOAT);
  CHECK(g->nodes[1].op == "Add");
  CHECK(g->nodes[2].op == "Cast");
  CHECK(g->nodes[2].get_i("to", 0) == fp16);
  const auto& w = *g->values[g->nodes[1].inputs[1]].constant;
  CHECK(w.dtype == datatype::fp32);
  CHECK(w.as<float>()[0] == 1.5f);
  CHECK(w.as<float>()[1] == -0.25f);
}

TEST_CASE("INT16, UINT16, UINT32, UINT64 and BFLOAT16 tensors are accepted") {
  for (int32_t t : {::onnx::TensorProto::INT16, ::onnx::TensorProto::UINT16,
                    ::onnx::TensorProto::UINT32, ::onnx::TensorProto::UINT64,
                    ::onnx::TensorProto::BFLOAT16}) {
    CAPTURE(t);
    auto g = caf_serving::onnx::import_model_bytes(
      typed_model("Identity", {{"x", t}}, {{"y", t}}), "m.onnx");
    CHECK_MESSAGE(g.ok(), g.error().message);
  }
  auto complex = caf_serving::onnx::import_model_bytes(
    typed_model("Identity", {{"x", ::onnx::TensorProto::COMPLEX64}},
                {{"y", ::onnx::TensorProto::COMPLEX64}}),
    "m.onnx");
  REQUIRE_FALSE(complex.ok());
  CHECK(complex.error().message.find("graph input 'x' has ONNX element type 14") !=
        std::string::npos);
}

TEST_CASE("a STRING input passed through Identity is served beside the graph; computing on it is refused") {
  constexpr int32_t str = ::onnx::TensorProto::STRING;
  auto g = caf_serving::onnx::import_model_bytes(
    typed_model("Identity", {{"s", str}}, {{"t", str}}), "m.onnx");
  REQUIRE_MESSAGE(g.ok(), g.error().message);
  CHECK(g->nodes.empty());
  CHECK(g->inputs.empty());
  REQUIRE(g->strings.inputs.size() == 1);
  CHECK(g->strings.inputs[0].name == "s");
  CHECK(g->strings.inputs[0].shape == std::vector<int64_t>{-1, 2});
  REQUIRE(g->strings.outputs.size() == 1);
  CHECK(g->strings.outputs[0].name == "t");
  CHECK(g->strings.outputs[0].input == "s");

  auto computed = caf_serving::onnx::import_model_bytes(
    typed_model("Equal", {{"s", str}, {"u", str}}, {{"t", ::onnx::TensorProto::BOOL}}),
    "m.onnx");
  REQUIRE_FALSE(computed.ok());
  CHECK(computed.error().message.find("node 'the_node' (Equal) computes on the STRING tensor 's'")
        != std::string::npos);
}
