/// The operator registry: one entry per operator, reached by name (the
/// engine's own operators apart, which the importer refuses), which version of
/// an operator a model's opset selects, the importer's refusals driven by it
/// (opsets outside 13..28, an operator ONNX defines only after the model's
/// opset, attributes the selected version does not define), and the changes of
/// meaning between opset 13 and 28 that the kernels follow (Split-18's smaller last part, Relu-14's
/// integers, Pow's integer exponent, CastLike, the pools' ceil_mode). The
/// fixtures opset18_* .. opset22_* check the same against ONNX Runtime through
/// the server (onnx.server.test).

#include "onnx/op_registry.hpp"

#include "onnx/importer.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;
namespace pb = ::onnx;

TEST_CASE("every operator is registered once, with ascending versions up to opset 28") {
  const auto& all = registered_operators();
  REQUIRE(all.size() > 60);
  std::set<std::string> names;
  for (const auto& e : all) {
    INFO(e.op);
    CHECK(names.insert(e.op).second);
    REQUIRE(!e.since.empty());
    CHECK(std::is_sorted(e.since.begin(), e.since.end()));
    CHECK(std::adjacent_find(e.since.begin(), e.since.end()) == e.since.end());
    CHECK(e.since.back() <= max_opset);
  }
  // No operator in two tables, nor both a model's and the engine's.
  CHECK(table_entries() == all.size() + engine_operators().size());
  for (const auto& e : engine_operators()) {
    INFO(e.op);
    CHECK(names.insert(e.op).second);
  }
  // Two tables of operator files: ops_nn.cpp's and ops_simple.cpp's.
  CHECK(find_operator("Conv") != nullptr);
  CHECK(find_operator("HardSwish") != nullptr);
  CHECK(find_operator("NoSuchOp") == nullptr);
  // The importer's list is the registry's.
  std::vector<std::string> listed;
  for (const auto& e : all) listed.push_back(e.op);
  CHECK(listed == supported_operators());
}

TEST_CASE("a model's opset selects the largest version at or below it") {
  CHECK(operator_version("ReduceMean", 13) == 13);
  CHECK(operator_version("ReduceMean", 17) == 13);
  CHECK(operator_version("ReduceMean", 18) == 18);
  CHECK(operator_version("ReduceMean", 28) == 18);
  CHECK(operator_version("Split", 17) == 13);
  CHECK(operator_version("Split", 18) == 18);
  CHECK(operator_version("Cast", 20) == 19);
  CHECK(operator_version("Cast", 28) == 28);
  CHECK(operator_version("AveragePool", 21) == 19);
  CHECK(operator_version("Mod", 27) == 13);
  CHECK(operator_version("Mod", 28) == 28);
  CHECK(operator_version("ReduceL2", 17) == 13);
  CHECK(operator_version("ReduceL2", 18) == 18);
  CHECK(operator_version("ReduceL2", 28) == 18);
  CHECK(operator_version("ReduceLogSumExp", 27) == 18);
  CHECK(operator_version("ReduceLogSumExp", 28) == 28); // floats only
  CHECK(operator_version("GlobalMaxPool", 21) == 1);
  CHECK(operator_version("GlobalMaxPool", 22) == 22);
  // Defined only after the opset: unsupported there.
  CHECK_FALSE(operator_version("HardSwish", 13));
  CHECK(operator_version("HardSwish", 14) == 14);
  // onnxruntime's LayerNormalization-1 (its optimizer's output below opset 17), then ONNX's.
  CHECK(operator_version("LayerNormalization", 13) == 1);
  CHECK(operator_version("LayerNormalization", 17) == 17);
  CHECK_FALSE(operator_version("CastLike", 14));
  CHECK_FALSE(operator_version("NoSuchOp", 28));
}

namespace {

struct attr {
  std::string name;
  std::variant<int64_t, std::vector<int64_t>, std::string> v;
};

struct node_spec {
  std::string op;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<attr> attrs;
  std::string name;
};

/// A model of `nodes` at `opset` with FP32 input X [2,6,4] and INT64 initializers
/// `ints` (name -> values, 1-D); its outputs are the last node's.
std::string make_model(int64_t opset, const std::vector<node_spec>& nodes,
                       const std::map<std::string, std::vector<int64_t>>& ints = {}) {
  pb::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  auto* g = m.mutable_graph();
  auto* x = g->add_input();
  x->set_name("X");
  auto* tt = x->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(pb::TensorProto::FLOAT);
  for (int64_t d : {2, 6, 4})
    tt->mutable_shape()->add_dim()->set_dim_value(d);
  for (const auto& [name, vals] : ints) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(pb::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(vals.size()));
    for (auto v : vals) t->add_int64_data(v);
  }
  for (const auto& s : nodes) {
    auto* n = g->add_node();
    n->set_op_type(s.op);
    n->set_name(s.name.empty() ? "n" : s.name);
    for (const auto& i : s.inputs) n->add_input(i);
    for (const auto& o : s.outputs) n->add_output(o);
    for (const auto& a : s.attrs) {
      auto* pa = n->add_attribute();
      pa->set_name(a.name);
      if (auto* i = std::get_if<int64_t>(&a.v)) {
        pa->set_type(pb::AttributeProto::INT);
        pa->set_i(*i);
      } else if (auto* is = std::get_if<std::vector<int64_t>>(&a.v)) {
        pa->set_type(pb::AttributeProto::INTS);
        for (auto v : *is) pa->add_ints(v);
      } else {
        pa->set_type(pb::AttributeProto::STRING);
        pa->set_s(std::get<std::string>(a.v));
      }
    }
  }
  for (const auto& o : nodes.back().outputs)
    g->add_output()->set_name(o);
  return m.SerializeAsString();
}

std::string refusal(const std::string& bytes) {
  auto r = import_model_bytes(bytes, "m.onnx");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::bad_request);
  return r.error().message;
}

void loads(const std::string& bytes) {
  auto r = import_model_bytes(bytes, "m.onnx");
  CHECK_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
}

} // namespace

TEST_CASE("the engine's own operators have entries that no model reaches") {
  std::vector<std::string> names;
  for (const auto& e : engine_operators()) {
    INFO(e.op);
    names.push_back(e.op);
    CHECK(e.since.empty()); // no ONNX version: every backend kernel's range takes them
    REQUIRE(find_engine_operator(e.op) != nullptr);
    CHECK(find_engine_operator(e.op)->op == e.op);
    CHECK(find_operator(e.op) == nullptr);
    CHECK_FALSE(operator_version(e.op, max_opset));
  }
  CHECK(names == std::vector<std::string>{"FusedAttention", "FusedConv", "FusedGelu",
                                          "FusedGeluTanh", "FusedGemm", "FusedLayerNorm", "FusedMatMul",
                                          "QLinearAdd", "QMaxPool",
                                          "com.microsoft.AttentionMask (engine)",
                                          "com.microsoft.PagedGroupQueryAttention (engine)"});
  // The importer refuses them as it refuses any operator it does not know.
  auto bytes = make_model(17, {{"FusedGelu", {"X"}, {"Y"}, {}, "g"}});
  auto r = import_model_bytes(bytes, "m.onnx");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("m.onnx: 1 node uses 1 operator that the engine does not support "
                               "at opset 17: 'FusedGelu' in 1 node ('g'); supported operators: ")
        == 0);
}

TEST_CASE("models at every opset from 13 to 28 load; others are refused with the range") {
  for (int64_t opset = 13; opset <= 28; ++opset) {
    INFO("opset " << opset);
    loads(make_model(opset, {{"Relu", {"X"}, {"Y"}, {}}}));
  }
  for (int64_t opset : {12, 29}) {
    auto msg = refusal(make_model(opset, {{"Relu", {"X"}, {"Y"}, {}}}));
    CHECK(msg == "m.onnx: the model uses opset " + std::to_string(opset)
                   + ", but the engine supports opsets 13 to 28; re-export it with an opset in "
                     "that range, e.g. torch.onnx.export(..., opset_version=18)");
  }
}

TEST_CASE("an operator that ONNX defines only after the model's opset is refused, in the list") {
  auto msg = refusal(make_model(13, {{"CastLike", {"X", "X"}, {"a"}, {}, "ln"},
                                     {"HardSwish", {"a"}, {"b"}, {}, "hs"},
                                     {"Relu", {"b"}, {"Y"}, {}, "ok"}}));
  INFO(msg);
  CHECK(msg.find("m.onnx: 2 nodes use 2 operators that the engine does not support at opset 13: "
                 "'CastLike' in 1 node ('ln') (ONNX defines it from opset 15), "
                 "'HardSwish' in 1 node ('hs') (ONNX defines it from opset 14); supported "
                 "operators: Abs, Add,")
        == 0);
  // From their first versions on they load.
  loads(make_model(17, {{"CastLike", {"X", "X"}, {"a"}, {}, "ln"},
                        {"HardSwish", {"a"}, {"Y"}, {}, "hs"}}));
}

TEST_CASE("attributes that the selected operator version does not define are refused") {
  // ReduceMean-18 takes its axes as an input.
  auto msg = refusal(make_model(18, {{"ReduceMean", {"X"}, {"Y"}, {{"axes", std::vector<int64_t>{1}}}}}));
  CHECK(msg == "m.onnx: node 'n' (ReduceMean, opset 18): attribute 'axes' was replaced by the "
               "second input 'axes' in ReduceMean-18 (opset 18 selects ReduceMean-18); pass the "
               "axes as a constant input");
  loads(make_model(17, {{"ReduceMean", {"X"}, {"Y"}, {{"axes", std::vector<int64_t>{1}}}}}));
  loads(make_model(18, {{"ReduceMean", {"X", "ax"}, {"Y"}, {}}}, {{"ax", {1}}}));
  msg = refusal(make_model(17, {{"ReduceMean", {"X", "ax"}, {"Y"}, {}}}, {{"ax", {1}}}));
  CHECK(msg.find("ReduceMean-13 takes its axes as an attribute; the second input 'axes' exists "
                 "from ReduceMean-18 on") != std::string::npos);
  msg = refusal(make_model(17, {{"ReduceMean", {"X"}, {"Y"}, {{"noop_with_empty_axes", 1}}}}));
  CHECK(msg.find("attribute 'noop_with_empty_axes' exists from ReduceMean-18 on (opset 17 "
                 "selects ReduceMean-13)") != std::string::npos);
  // The same for the other reductions whose axes became an input at 18.
  msg = refusal(make_model(17, {{"ReduceL2", {"X", "ax"}, {"Y"}, {}}}, {{"ax", {1}}}));
  CHECK(msg == "m.onnx: node 'n' (ReduceL2, opset 17): ReduceL2-13 takes its axes as an "
               "attribute; the second input 'axes' exists from ReduceL2-18 on (opset 17 selects "
               "ReduceL2-13); re-export with a newer opset");
  msg = refusal(make_model(18, {{"ReduceLogSumExp", {"X"}, {"Y"},
                                 {{"axes", std::vector<int64_t>{1}}}}}));
  CHECK(msg.find("attribute 'axes' was replaced by the second input 'axes' in "
                 "ReduceLogSumExp-18") != std::string::npos);
  loads(make_model(17, {{"ReduceSumSquare", {"X"}, {"Y"}, {{"axes", std::vector<int64_t>{1}}}}}));
  loads(make_model(18, {{"ReduceL1", {"X", "ax"}, {"Y"}, {{"noop_with_empty_axes", 1}}}},
                   {{"ax", {-1}}}));
  loads(make_model(22, {{"GlobalMaxPool", {"X"}, {"Y"}, {}}}));

  // Split's num_outputs exists from Split-18; it must match the outputs.
  msg = refusal(make_model(17, {{"Split", {"X"}, {"a", "b"}, {{"num_outputs", 2}}}}));
  CHECK(msg == "m.onnx: node 'n' (Split, opset 17): attribute 'num_outputs' exists from Split-18 "
               "on (opset 17 selects Split-13); re-export the model with opset 18 or newer, or "
               "without the attribute");
  msg = refusal(make_model(18, {{"Split", {"X"}, {"a", "b", "c"}, {{"num_outputs", 2}}}}));
  CHECK(msg.find("attribute 'num_outputs' is 2 but the node has 3 outputs") != std::string::npos);
  msg = refusal(make_model(18, {{"Split", {"X", "s"}, {"a", "b"}, {{"num_outputs", 2}}}},
                           {{"s", {3, 3}}}));
  CHECK(msg.find("ONNX allows one of them") != std::string::npos);
  loads(make_model(18, {{"Split", {"X"}, {"a", "b"}, {{"axis", 1}, {"num_outputs", 2}}}}));

  // BatchNormalization in training mode computes batch statistics: refused, not run as inference.
  msg = refusal(make_model(15, {{"BatchNormalization", {"X", "X", "X", "X", "X"}, {"Y"},
                                 {{"training_mode", 1}}}}));
  CHECK(msg.find("attribute 'training_mode' is 1 (opset 15 selects BatchNormalization-15): the "
                 "engine runs inference only") != std::string::npos);

  // Shape's start and end exist from Shape-15.
  msg = refusal(make_model(13, {{"Shape", {"X"}, {"Y"}, {{"start", 1}}}}));
  CHECK(msg.find("attribute 'start' exists from Shape-15 on (opset 13 selects Shape-13)")
        != std::string::npos);
  loads(make_model(15, {{"Shape", {"X"}, {"Y"}, {{"start", 1}}}}));

  // Squeeze/Unsqueeze-13 take their axes as an input, which Unsqueeze needs.
  msg = refusal(make_model(13, {{"Unsqueeze", {"X"}, {"Y"}, {{"axes", std::vector<int64_t>{0}}}}}));
  CHECK(msg.find("attribute 'axes' was replaced by the second input 'axes' in Unsqueeze-13 "
                 "(opset 13 selects Unsqueeze-13)") != std::string::npos);
  msg = refusal(make_model(21, {{"Unsqueeze", {"X"}, {"Y"}, {}}}));
  CHECK(msg.find("the second input 'axes' is missing (opset 21 selects Unsqueeze-21)")
        != std::string::npos);
  loads(make_model(21, {{"Unsqueeze", {"X", "ax"}, {"Y"}, {}}}, {{"ax", {0}}}));

  // A string constant is not silently dropped.
  msg = refusal(make_model(17, {{"Constant", {}, {"Y"}, {{"value_string", std::string("hi")}}}}));
  CHECK(msg.find("attribute 'value_string' (opset 17 selects Constant-13) is a kind of constant")
        != std::string::npos);
}

// ------------------------------------------------------------------ semantics

namespace {

/// One node over graph inputs (values given) and INT64 constants, through
/// shape inference and the reference kernel; the string is inference's error.
struct op_run {
  std::vector<inferred> shapes;
  std::vector<std::vector<uint8_t>> outputs;
};

std::variant<op_run, std::string> run_node(
  int64_t opset, const std::string& op, const std::vector<std::pair<datatype, std::vector<int64_t>>>& ins,
  const std::vector<std::vector<uint8_t>>& in_bytes, const std::map<int, std::vector<int64_t>>& consts,
  size_t outputs, const std::map<std::string, attribute>& attrs = {}) {
  graph g;
  g.opset = opset;
  std::vector<int> vs;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (consts.count(static_cast<int>(i))) {
      const auto& c = consts.at(static_cast<int>(i));
      auto t = make_tensor(datatype::int64, {static_cast<int64_t>(c.size())});
      std::memcpy(t->bytes.data(), c.data(), c.size() * 8);
      vs.push_back(g.add_constant("c" + std::to_string(i), t));
    } else {
      vs.push_back(g.add_value("in" + std::to_string(i), ins[i].first, ins[i].second, true));
    }
  }
  std::vector<int> outs;
  for (size_t i = 0; i < outputs; ++i) outs.push_back(g.add_value("y" + std::to_string(i)));
  auto& n = g.add_node(op, op + "_0", vs, outs);
  n.attrs = attrs;
  auto inf = infer_shapes(g, n);
  if (auto* e = std::get_if<std::string>(&inf))
    return *e;
  op_run r;
  r.shapes = std::get<std::vector<inferred>>(inf);
  std::vector<tensor_ref> in_refs, out_refs;
  for (size_t i = 0; i < ins.size(); ++i) {
    int v = vs[i];
    void* data = g.values[v].constant ? const_cast<uint8_t*>(g.values[v].constant->bytes.data())
                                      : const_cast<uint8_t*>(in_bytes[i].data());
    in_refs.push_back({ins[i].first, g.values[v].constant ? g.values[v].shape : ins[i].second, data});
  }
  r.outputs.resize(r.shapes.size());
  for (size_t i = 0; i < r.shapes.size(); ++i) {
    r.outputs[i].resize(element_count(r.shapes[i].shape) * element_size(r.shapes[i].dtype));
    out_refs.push_back({r.shapes[i].dtype, r.shapes[i].shape, r.outputs[i].data()});
  }
  run_reference(n, in_refs, out_refs);
  return r;
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <class T>
std::vector<T> values_of(const std::vector<uint8_t>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

attribute int_attr(int64_t v) {
  attribute a;
  a.kind = attribute::kind_t::i;
  a.i = v;
  return a;
}

attribute ints_attr(std::vector<int64_t> v) {
  attribute a;
  a.kind = attribute::kind_t::ints;
  a.ints = std::move(v);
  return a;
}

op_run ran(std::variant<op_run, std::string> r) {
  if (auto* e = std::get_if<std::string>(&r))
    FAIL("inference refused: " << *e);
  return std::get<op_run>(r);
}

std::string refused(std::variant<op_run, std::string> r) {
  REQUIRE(std::holds_alternative<std::string>(r));
  return std::get<std::string>(r);
}

} // namespace

TEST_CASE("Split-18 makes the last part smaller; Split-13 must divide evenly") {
  std::vector<float> x{0, 1, 2, 3, 4, 5, 6};
  auto in = bytes_of(x);
  auto r = ran(run_node(18, "Split", {{datatype::fp32, {7}}}, {in}, {}, 3,
                        {{"num_outputs", int_attr(3)}}));
  REQUIRE(r.shapes.size() == 3);
  CHECK(r.shapes[0].shape == std::vector<int64_t>{3});
  CHECK(r.shapes[2].shape == std::vector<int64_t>{1});
  CHECK(values_of<float>(r.outputs[1]) == std::vector<float>{3, 4, 5});
  CHECK(values_of<float>(r.outputs[2]) == std::vector<float>{6});
  auto e = refused(run_node(17, "Split", {{datatype::fp32, {7}}}, {in}, {}, 3));
  CHECK(e.find("Split-13 divides axis 0 of [7] into 3 equal parts, which it cannot") == 0);
  // Sizes that do not add up are refused rather than read past the input.
  e = refused(run_node(18, "Split", {{datatype::fp32, {7}}, {datatype::int64, {2}}}, {in, {}},
                       {{1, {3, 3}}}, 2));
  CHECK(e == "split sizes add up to 6, not to axis 0 of [7]");
}

TEST_CASE("ReduceMean-18 reads its axes input and noop_with_empty_axes") {
  std::vector<float> x{1, 2, 3, 4, 5, 6};
  auto in = bytes_of(x);
  auto r = ran(run_node(18, "ReduceMean", {{datatype::fp32, {2, 3}}, {datatype::int64, {1}}},
                        {in, {}}, {{1, {-1}}}, 1, {{"keepdims", int_attr(0)}}));
  CHECK(r.shapes[0].shape == std::vector<int64_t>{2});
  CHECK(values_of<float>(r.outputs[0]) == std::vector<float>{2, 5});
  r = ran(run_node(18, "ReduceMean", {{datatype::fp32, {2, 3}}}, {in}, {}, 1,
                   {{"noop_with_empty_axes", int_attr(1)}}));
  CHECK(r.shapes[0].shape == std::vector<int64_t>{2, 3});
  CHECK(values_of<float>(r.outputs[0]) == x);
  r = ran(run_node(18, "ReduceMean", {{datatype::fp32, {2, 3}}}, {in}, {}, 1));
  CHECK(values_of<float>(r.outputs[0]) == std::vector<float>{3.5f});
  // Before 18 the attribute, as before.
  r = ran(run_node(17, "ReduceMean", {{datatype::fp32, {2, 3}}}, {in}, {}, 1,
                   {{"axes", ints_attr({0})}}));
  CHECK(values_of<float>(r.outputs[0]) == std::vector<float>{2.5f, 3.5f, 4.5f});
}

TEST_CASE("Relu takes integers from Relu-14 on; other element-wise kernels refuse them") {
  std::vector<int64_t> x{-3, 0, 7};
  auto in = bytes_of(x);
  auto r = ran(run_node(14, "Relu", {{datatype::int64, {3}}}, {in}, {}, 1));
  CHECK(r.shapes[0].dtype == datatype::int64);
  CHECK(values_of<int64_t>(r.outputs[0]) == std::vector<int64_t>{0, 0, 7});
  CHECK(refused(run_node(13, "Relu", {{datatype::int64, {3}}}, {in}, {}, 1))
          .find("the engine runs Relu on FP32 (and on INT8, INT32, INT64 from Relu-14)")
        != std::string::npos);
  CHECK(refused(run_node(17, "Sqrt", {{datatype::int64, {3}}}, {in}, {}, 1))
          == "input 'in0' is INT64; the engine runs Sqrt on FP32");
}

TEST_CASE("Pow with an INT64 exponent, CastLike, and binary operators of two types") {
  std::vector<float> x{1.5f, -2, 3};
  std::vector<int64_t> two{2};
  auto r = ran(run_node(15, "Pow", {{datatype::fp32, {3}}, {datatype::int64, {1}}},
                        {bytes_of(x), bytes_of(two)}, {}, 1));
  CHECK(r.shapes[0].dtype == datatype::fp32);
  CHECK(values_of<float>(r.outputs[0]) == std::vector<float>{2.25f, 4, 9});
  // Add reads both inputs as one type: two types are refused, not mixed up.
  CHECK(refused(run_node(17, "Add", {{datatype::fp32, {3}}, {datatype::int64, {1}}},
                         {bytes_of(x), bytes_of(two)}, {}, 1))
          .find("differ in type; ONNX's Add takes one type (insert a Cast)")
        != std::string::npos);
  std::vector<int64_t> like{0};
  r = ran(run_node(15, "CastLike", {{datatype::fp32, {3}}, {datatype::int64, {1}}},
                   {bytes_of(x), bytes_of(like)}, {}, 1));
  CHECK(r.shapes[0].dtype == datatype::int64);
  CHECK(values_of<int64_t>(r.outputs[0]) == std::vector<int64_t>{1, -2, 3});
}

TEST_CASE("ceil_mode drops a pooling window that would start in the right padding") {
  // Width 7, kernel 2, dilation 1, stride 2, pads 1 and 1: ceil((7 + 2 - 2) / 2) + 1 = 5
  // windows, but the fifth starts at 8 = 7 + 1, in the right padding (ONNX Runtime: 4).
  std::vector<float> x(7);
  for (int i = 0; i < 7; ++i) x[i] = static_cast<float>(i);
  auto r = ran(run_node(19, "AveragePool", {{datatype::fp32, {1, 1, 1, 7}}}, {bytes_of(x)}, {}, 1,
                        {{"kernel_shape", ints_attr({1, 2})},
                         {"strides", ints_attr({1, 2})},
                         {"pads", ints_attr({0, 1, 0, 1})},
                         {"ceil_mode", int_attr(1)}}));
  CHECK(r.shapes[0].shape == std::vector<int64_t>{1, 1, 1, 4});
  // Windows [-1,0], [1,2], [3,4], [5,6], padding excluded.
  CHECK(values_of<float>(r.outputs[0]) == std::vector<float>{0, 1.5f, 3.5f, 5.5f});
}

TEST_CASE("ReduceSum and ReduceMean on integers, Clip on integers (Clip-12 on)") {
  // 2^53 + 1 does not survive a sum in double; an INT64 sum keeps it.
  std::vector<int64_t> x{(int64_t{1} << 53), 1, -7, 2};
  auto r = ran(run_node(13, "ReduceSum", {{datatype::int64, {2, 2}}, {datatype::int64, {1}}},
                        {bytes_of(x), {}}, {{1, {1}}}, 1, {{"keepdims", int_attr(0)}}));
  CHECK(r.shapes[0].dtype == datatype::int64);
  CHECK(values_of<int64_t>(r.outputs[0]) == std::vector<int64_t>{(int64_t{1} << 53) + 1, -5});
  // The mean truncates toward zero: -5 / 2 = -2.
  r = ran(run_node(18, "ReduceMean", {{datatype::int64, {2, 2}}, {datatype::int64, {1}}},
                   {bytes_of(x), {}}, {{1, {1}}}, 1, {{"keepdims", int_attr(0)}}));
  CHECK(values_of<int64_t>(r.outputs[0])[1] == -2);
  std::vector<int64_t> c{-9, 0, 5, 12};
  r = ran(run_node(13, "Clip", {{datatype::int64, {4}}}, {bytes_of(c)}, {}, 1));
  CHECK(values_of<int64_t>(r.outputs[0]) == c); // no bounds: unchanged
  r = ran(run_node(13, "Clip", {{datatype::int64, {4}}, {datatype::int64, {1}}, {datatype::int64, {1}}},
                   {bytes_of(c), {}, {}}, {{1, {-2}}, {2, {6}}}, 1));
  CHECK(values_of<int64_t>(r.outputs[0]) == std::vector<int64_t>{-2, 0, 5, 6});
}

TEST_CASE("a pool's zero stride or oversized kernel is refused, not divided by") {
  std::vector<float> x(7, 1.0f);
  auto e = refused(run_node(22, "MaxPool", {{datatype::fp32, {1, 1, 1, 7}}}, {bytes_of(x)}, {}, 1,
                            {{"kernel_shape", ints_attr({1, 2})}, {"strides", ints_attr({1, 0})}}));
  CHECK(e.find("must be positive") != std::string::npos);
  e = refused(run_node(22, "MaxPool", {{datatype::fp32, {1, 1, 1, 7}}}, {bytes_of(x)}, {}, 1,
                       {{"kernel_shape", ints_attr({2, 2})}}));
  CHECK(e == "the (dilated) kernel [2,2] is larger than the padded input [1,1,1,7]");
  // A ceil_mode window over a smaller input still has an output, as in ONNX
  // Runtime and torch: the maximum of what the window covers.
  std::vector<float> one{3.5f};
  auto r = ran(run_node(22, "MaxPool", {{datatype::fp32, {1, 1, 1, 1}}}, {bytes_of(one)}, {}, 1,
                        {{"kernel_shape", ints_attr({2, 2})}, {"strides", ints_attr({2, 2})},
                         {"ceil_mode", int_attr(1)}}));
  CHECK(r.shapes[0].shape == std::vector<int64_t>{1, 1, 1, 1});
  CHECK(values_of<float>(r.outputs[0]) == std::vector<float>{3.5f});
}

TEST_CASE("types the kernels do not take are refused, not read as another type") {
  // ONNX's node tests: Cast from DOUBLE gave zeros (it converts now), MaxPool-12
  // on UINT8 floats.
  std::vector<double> d{0.5, 1.5};
  auto r = ran(run_node(19, "Cast", {{datatype::fp64, {2}}}, {bytes_of(d)}, {}, 1,
                        {{"to", int_attr(1)}}));
  CHECK(values_of<float>(r.outputs[0]) == std::vector<float>{0.5f, 1.5f});
  std::vector<uint8_t> s(8, 0);
  CHECK(refused(run_node(19, "Cast", {{datatype::bytes, {2}}}, {s}, {}, 1,
                         {{"to", int_attr(1)}}))
        == "Cast from BYTES to FP32 is not supported (FLOAT, FLOAT16, BFLOAT16, DOUBLE, INT64, "
           "INT32, INT16, INT8, UINT64, UINT32, UINT16, UINT8 and BOOL are)");
  std::vector<uint8_t> u(16, 3);
  CHECK(refused(run_node(22, "MaxPool", {{datatype::uint8, {1, 1, 4, 4}}}, {u}, {}, 1,
                         {{"kernel_shape", ints_attr({2, 2})}}))
        == "input 'in0' is UINT8; the engine runs MaxPool on FP32 (Cast it to FLOAT first)");
}

TEST_CASE("every registered operator has its shape inference and reference kernel") {
  for (const auto* table : {&registered_operators(), &engine_operators()})
    for (const auto& e : *table) {
      INFO(e.op);
      CHECK((e.infer != nullptr));
      CHECK((e.reference != nullptr));
      const auto* found = table == &registered_operators() ? find_operator(e.op)
                                                           : find_engine_operator(e.op);
      REQUIRE(found != nullptr);
      CHECK((found->infer == e.infer));
      CHECK((found->reference == e.reference));
      CHECK((found->check == e.check));
    }
  // Through the registry's slot, an operator infers and runs as infer_shapes()
  // and run_reference() do.
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {2, 3}, true);
  int y = g.add_value("y");
  g.add_node("Abs", "abs", {x}, {y});
  const auto* abs = find_operator("Abs");
  REQUIRE(abs != nullptr);
  auto shapes = abs->infer(g, g.nodes[0]);
  REQUIRE(std::holds_alternative<std::vector<inferred>>(shapes));
  CHECK(std::get<std::vector<inferred>>(shapes)[0].shape == std::vector<int64_t>{2, 3});
  std::vector<float> in{-1, 2, -3, 4, -5, 6}, out(6);
  abs->reference(g.nodes[0], {{datatype::fp32, {2, 3}, in.data()}},
                 {{datatype::fp32, {2, 3}, out.data()}});
  CHECK(out == std::vector<float>{1, 2, 3, 4, 5, 6});
}

namespace {

/// A backend whose steps are the names of the kernels that built them.
struct toy_context {
  int built = 0;
};
using toy_table = kernel_table<toy_context, std::string>;

} // namespace

TEST_CASE("a backend's kernels: version ranges, a kernel that declines, the reference after") {
  toy_table table({
    {"ReduceMean", {1, 13}, "axes attribute",
     [](toy_context& c, const graph&, const node&) -> std::optional<std::string> {
       ++c.built;
       return std::string("mean-13");
     }},
    {"ReduceMean", {18, 0}, "axes input",
     [](toy_context&, const graph&, const node& n) -> std::optional<std::string> {
       if (n.get_i("keepdims", 1) == 0)
         return std::nullopt; // declines: the next kernel, else the reference
       return std::string("mean-18");
     }},
    {"ReduceMean", {18, 0}, "axes input, no keepdims",
     [](toy_context&, const graph&, const node&) -> std::optional<std::string> {
       return std::string("mean-18-flat");
     }},
    {"FusedConv", {}, "fused",
     [](toy_context&, const graph&, const node&) -> std::optional<std::string> {
       return std::string("conv");
     }},
  });
  CHECK(table.has("ReduceMean"));
  CHECK(!table.has("Abs"));
  CHECK(table.ops() == std::vector<std::string>{"FusedConv", "ReduceMean"});
  CHECK(table.kernels().size() == 4);

  toy_context ctx;
  graph g;
  int x = g.add_value("x", datatype::fp32, {2, 3}, true);
  int y = g.add_value("y");
  g.add_node("ReduceMean", "m", {x}, {y});
  auto build = [&](int64_t opset) {
    g.opset = opset;
    return table.build(ctx, g, g.nodes[0]);
  };
  CHECK(build(13) == std::optional<std::string>("mean-13"));
  CHECK(build(17) == std::optional<std::string>("mean-13")); // 17 selects ReduceMean-13
  CHECK(build(18) == std::optional<std::string>("mean-18"));
  CHECK(build(28) == std::optional<std::string>("mean-18"));
  g.nodes[0].set_i("keepdims", 0);
  CHECK(build(18) == std::optional<std::string>("mean-18-flat"));
  CHECK(ctx.built == 2);
  // No kernel for the operator: nothing, so the backend runs the reference.
  g.nodes[0].op = "Abs";
  CHECK(build(18) == std::nullopt);
  // The engine's fused operators have no ONNX version: every range takes them.
  g.nodes[0].op = "FusedConv";
  CHECK(build(13) == std::optional<std::string>("conv"));
}
