/// The ONNX backend through the whole server: each fixture exported by
/// tools/export_onnx_models.py is served by caf-serving and its outputs are
/// compared with ONNX Runtime's (relative error of the whole output < 1e-4, fp32;
/// BOOL and INT64 outputs exactly).
/// Broken model files fail to load with errors that name what is wrong, while
/// the server keeps serving the other models.

#include "support/http_client.hpp"
#include "support/json_document.hpp"
#include "support/server_process.hpp"
#include "support/tensor_bytes.hpp"

#include "core/half.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

using namespace caf_serving::support;
namespace fs = std::filesystem;

namespace {

const fs::path fixtures = CAF_SERVING_ONNX_FIXTURES;

struct ref_tensor {
  std::string name;
  std::string datatype; ///< KServe name (FP32, INT64)
  std::vector<int64_t> shape;
  std::string bytes;
};

struct reference {
  std::vector<ref_tensor> inputs, outputs;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// `model`'s reference set, or with `tag` its set reference/<model>@<tag>
/// (fixtures with variable dimensions have one per input size).
reference read_reference(const std::string& model) {
  reference r;
  std::istringstream lines(read_all(fixtures / "reference" / model / "manifest.txt"));
  std::string kind, name, type, dims, file;
  while (lines >> kind >> name >> type >> dims >> file) {
    ref_tensor t;
    t.name = name;
    t.datatype = type == "TYPE_STRING" ? "BYTES" : type.substr(5); // TYPE_FP32 -> FP32
    std::stringstream ds(dims);
    for (std::string d; std::getline(ds, d, ',');)
      t.shape.push_back(std::stoll(d));
    t.bytes = read_all(fixtures / "reference" / model / file);
    (kind == "input" ? r.inputs : r.outputs).push_back(t);
  }
  return r;
}

std::string shape_json(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

/// POSTs the reference inputs with the binary extension, all outputs binary.
http_response infer(http_client& http, const std::string& model, const reference& r) {
  std::string json = "{\"inputs\":[";
  std::string tail;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const auto& t = r.inputs[i];
    json += (i ? "," : "") + std::string("{\"name\":\"") + t.name + "\",\"datatype\":\""
            + t.datatype + "\",\"shape\":" + shape_json(t.shape)
            + ",\"parameters\":{\"binary_data_size\":" + std::to_string(t.bytes.size()) + "}}";
    tail += t.bytes;
  }
  json += "],\"outputs\":[";
  for (size_t i = 0; i < r.outputs.size(); ++i)
    json += (i ? "," : "") + std::string("{\"name\":\"") + r.outputs[i].name
            + "\",\"parameters\":{\"binary_data\":true}}";
  json += "]}";
  return http.post("/v2/models/" + model + "/infer", json + tail,
                   {{"Content-Type", "application/octet-stream"},
                    {"Inference-Header-Content-Length", std::to_string(json.size())}});
}

/// ||a - b|| / ||b|| over the whole tensor.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

/// The reference sets of `model`: its own directory, then each `model@tag`.
std::vector<std::string> reference_sets(const std::string& model) {
  std::vector<std::string> sets{model};
  for (const auto& e : fs::directory_iterator(fixtures / "reference")) {
    auto name = e.path().filename().string();
    if (name.rfind(model + "@", 0) == 0)
      sets.push_back(name);
  }
  std::sort(sets.begin() + 1, sets.end());
  return sets;
}

std::vector<std::string> fixture_models() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fixtures / "models"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// The bytes of the first row of BYTES tensor `t`: its elements are each a
/// 4-byte length and that many bytes.
size_t first_row_bytes(const ref_tensor& t) {
  int64_t per_row = 1;
  for (size_t i = 1; i < t.shape.size(); ++i)
    per_row *= t.shape[i];
  size_t at = 0;
  for (int64_t e = 0; e < per_row; ++e) {
    uint32_t len = 0;
    REQUIRE(at + 4 <= t.bytes.size());
    std::memcpy(&len, t.bytes.data() + at, 4);
    at += 4 + len;
  }
  return at;
}

/// The first row of every reference tensor (all fixtures batch their first
/// dimension, max_batch_size 8): row 0 of the outputs is what ONNX Runtime
/// computed for row 0 of the inputs.
reference first_row(reference r) {
  for (auto* list : {&r.inputs, &r.outputs})
    for (auto& t : *list) {
      REQUIRE(!t.shape.empty());
      REQUIRE(t.shape[0] > 0);
      t.bytes.resize(t.datatype == "BYTES" ? first_row_bytes(t)
                                           : t.bytes.size() / static_cast<size_t>(t.shape[0]));
      t.shape[0] = 1;
    }
  return r;
}

/// FP16 or BF16 elements as floats.
std::vector<float> half_floats(const std::string& bytes, const std::string& type) {
  auto bits = from_bytes<uint16_t>(bytes);
  std::vector<float> out;
  for (auto b : bits)
    out.push_back(type == "FP16" ? caf_serving::fp16_to_float(b)
                                 : caf_serving::bf16_to_float(b));
  return out;
}

void check_model_matches(http_client& http, const std::string& model, const reference& ref) {
  CAPTURE(model);
  CAPTURE(ref.inputs.at(0).shape[0]);
  auto resp = infer(http, model, ref);
  REQUIRE_MESSAGE(resp.status == 200, resp.body);
  auto body = split_binary(resp);
  auto doc = json_document::parse(body.json);
  size_t at = 0;
  for (size_t i = 0; i < ref.outputs.size(); ++i) {
    const auto& want = ref.outputs[i];
    std::string p = "/outputs/" + std::to_string(i);
    CHECK(doc.string_at(p + "/name") == want.name);
    CHECK(json_ints(doc.at(p + "/shape")) == want.shape);
    auto size = doc.uint_at(p + "/parameters/binary_data_size");
    REQUIRE(size == want.bytes.size());
    auto got = body.binary.substr(at, size);
    at += size;
    CAPTURE(want.name);
    CHECK(doc.string_at(p + "/datatype") == want.datatype);
    if (want.datatype == "FP16" || want.datatype == "BF16") {
      // The engine computes in fp32 and rounds once at the output; ONNX
      // Runtime rounds after each half operator: an output ulp apart
      // (2^-11 relative for FP16, 2^-8 for BF16).
      double err = relative_error(half_floats(got, want.datatype),
                                  half_floats(want.bytes, want.datatype));
      CHECK(err < (want.datatype == "FP16" ? 2e-3 : 1e-2));
      continue;
    }
    if (want.datatype == "FP64") {
      // Computed in fp32.
      auto a = from_bytes<double>(got);
      auto b = from_bytes<double>(want.bytes);
      CHECK(relative_error(std::vector<float>(a.begin(), a.end()),
                           std::vector<float>(b.begin(), b.end()))
            < 1e-5);
      continue;
    }
    if (want.datatype != "FP32") {
      CHECK(got == want.bytes); // BOOL, INT*, UINT*, BYTES: exactly ONNX Runtime's
      continue;
    }
    auto a = from_bytes<float>(got);
    auto b = from_bytes<float>(want.bytes);
    double err = relative_error(a, b);
    CHECK(err < 1e-4);
  }
}

/// A one-node model, written with the ONNX protobuf classes; input and output
/// of ONNX element type `elem`.
std::string one_node_model(const std::string& op, int64_t opset,
                           int32_t elem = onnx::TensorProto::FLOAT) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* imp = m.add_opset_import();
  imp->set_domain("");
  imp->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name("the_" + op + "_node");
  n->add_input("x");
  n->add_output("y");
  for (auto* vi : {g->add_input(), g->add_output()}) {
    vi->set_name(vi == &g->input(0) ? "x" : "y");
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    tt->mutable_shape()->add_dim()->set_dim_value(4);
  }
  return m.SerializeAsString();
}

const char* minimal_config = "platform: \"onnxruntime_onnx\"\nmax_batch_size: 4\n";

} // namespace

TEST_CASE("every fixture matches ONNX Runtime through the server") {
  temp_repository repo;
  auto names = fixture_models();
  REQUIRE(names.size() > 20);
  for (const auto& n : names)
    repo.add_model(fixtures / "models" / n);
  server_process server({CAF_SERVING_BINARY, repo.path().string(), {"--executor-threads", "2"}});
  http_client http(server.http_port());
  for (const auto& n : names)
    for (const auto& set : reference_sets(n)) {
      CAPTURE(set);
      check_model_matches(http, n, read_reference(set));
      // One row alone is fewer rows than executor threads: the plan whose
      // steps split across the threads (channel pieces, bands of rows, the
      // engine's 1x1 kernel) instead of a row chunk per thread.
      check_model_matches(http, n, first_row(read_reference(set)));
    }
  // No plan of any fixture lands on a oneDNN reference kernel at this ISA
  // level (CTest runs this at AVX2 and AVX512_CORE too): the loader warns.
  CHECK_MESSAGE(server.output().find("no optimised kernel") == std::string::npos,
                server.output());

  SUBCASE("inputs and outputs left out of config.pbtxt are derived from the graph") {
    auto doc = json_document::parse(http.get("/v2/models/bert_2layer_opset17").body);
    CHECK(doc.string_at("/inputs/0/name") == "input_ids");
    CHECK(doc.string_at("/inputs/0/datatype") == "INT64");
    CHECK(json_ints(doc.at("/inputs/0/shape")) == std::vector<int64_t>{-1, 16});
    CHECK(doc.string_at("/outputs/0/name") == "last_hidden_state");
    CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{-1, 16, 64});
    CHECK(json_ints(doc.at("/outputs/1/shape")) == std::vector<int64_t>{-1, 64});
  }

  SUBCASE("the classification extension works on a ResNet's logits") {
    auto ref = read_reference("resnet_narrow_opset17");
    const auto& x = ref.inputs[0];
    std::string json = "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":"
                       + shape_json(x.shape) + ",\"parameters\":{\"binary_data_size\":"
                       + std::to_string(x.bytes.size())
                       + "}}],\"outputs\":[{\"name\":\"logits\",\"parameters\":"
                         "{\"classification\":3}}]}";
    auto resp = http.post("/v2/models/resnet_narrow_opset17/infer", json + x.bytes,
                          {{"Content-Type", "application/octet-stream"},
                           {"Inference-Header-Content-Length", std::to_string(json.size())}});
    REQUIRE_MESSAGE(resp.status == 200, resp.body);
    auto doc = json_document::parse(resp.body);
    auto classes = json_strings(doc.at("/outputs/0/data"));
    REQUIRE(classes.size() == 6); // 2 rows x top 3
    // The top class of row 0 is the argmax of ONNX Runtime's logits.
    auto logits = from_bytes<float>(ref.outputs[0].bytes);
    auto top = std::max_element(logits.begin(), logits.begin() + 10) - logits.begin();
    CHECK(classes[0].substr(classes[0].rfind(':') + 1) == std::to_string(top));
  }
}

TEST_CASE("the server says what its CPU backend runs at, and the example models' plans run no "
          "oneDNN reference kernel at that level") {
  server_process server(
    {CAF_SERVING_BINARY, CAF_SERVING_EXAMPLE_MODELS, {"--executor-threads", "2"}});
  http_client http(server.http_port());
  auto out = server.output();
  CAPTURE(out);
  CHECK(out.find("CPU: oneDNN ") != std::string::npos);
  CHECK(out.find("no optimised kernel") == std::string::npos);
  auto v2 = json_document::parse(http.get("/v2").body);
  auto onednn = v2.string_at("/engine/cpu/onednn_isa");
  auto engine = v2.string_at("/engine/cpu/engine_isa");
  CHECK(out.find("CPU: oneDNN " + onednn + ", engine kernels " + engine) != std::string::npos);
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && std::string(cap) == "AVX2") { // this machine has AVX2 at least
    CHECK(onednn == "avx2");
    CHECK(engine == "avx2");
  }
  auto metrics = http.get("/metrics").body;
  CHECK(metrics.find("caf_serving_cpu_info{onednn_isa=\"" + onednn + "\",engine_isa=\"" + engine
                     + "\"")
        != std::string::npos);
}

TEST_CASE("broken ONNX models fail to load with clear errors; the others serve") {
  temp_repository repo;
  repo.add_model(fixtures / "models" / "op_tanh");
  auto good = read_all(fixtures / "models" / "op_tanh" / "1" / "model.onnx");
  repo.write_file("truncated/config.pbtxt", minimal_config);
  repo.write_file("truncated/1/model.onnx", good.substr(0, good.size() / 2));
  repo.write_file("not_onnx/config.pbtxt", minimal_config);
  repo.write_file("not_onnx/1/model.onnx", "this is not a protobuf at all");
  repo.write_file("old_opset/config.pbtxt", minimal_config);
  repo.write_file("old_opset/1/model.onnx", one_node_model("Tanh", 11));
  repo.write_file("unknown_op/config.pbtxt", minimal_config);
  repo.write_file("unknown_op/1/model.onnx", one_node_model("Hardmax", 17));
  repo.write_file("bad_dims/config.pbtxt",
                  std::string(minimal_config)
                    + "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 5 ] } ]\n");
  repo.write_file("bad_dims/1/model.onnx", one_node_model("Tanh", 17));
  repo.write_file("string_relu/config.pbtxt", minimal_config);
  repo.write_file("string_relu/1/model.onnx",
                  one_node_model("Relu", 17, onnx::TensorProto::STRING));
  // External data that leads out of the model's version directory.
  onnx::ModelProto escape;
  REQUIRE(escape.ParseFromString(
    read_all(fixtures / "models" / "type_external_data" / "1" / "model.onnx")));
  for (auto& init : *escape.mutable_graph()->mutable_initializer())
    for (auto& e : *init.mutable_external_data())
      if (e.key() == "location")
        e.set_value("../model.onnx.data");
  repo.write_file("escape/config.pbtxt", minimal_config);
  repo.write_file("escape/1/model.onnx", escape.SerializeAsString());
  repo.write_file("escape/model.onnx.data",
                  read_all(fixtures / "models" / "type_external_data" / "1" / "model.onnx.data"));
  // A STRING input that config.pbtxt declares as another type.
  repo.write_file("string_as_fp32/config.pbtxt",
                  std::string(minimal_config)
                    + "input [ { name: \"s\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n");
  repo.write_file("string_as_fp32/1/model.onnx",
                  read_all(fixtures / "models" / "type_string_identity" / "1" / "model.onnx"));
  server_process server({CAF_SERVING_BINARY, repo.path().string(), {}});
  http_client http(server.http_port());
  auto index = http.post("/v2/repository/index", "{}").body;
  auto reason = [&](const std::string& model) {
    auto doc = json_document::parse(index);
    for (size_t i = 0;; ++i) {
      auto p = "/" + std::to_string(i);
      if (!doc.has(p)) return std::string("<not in index>");
      if (doc.string_at(p + "/name") == model)
        return doc.has(p + "/reason") ? doc.string_at(p + "/reason") : std::string();
    }
  };
  CAPTURE(index);
  CHECK(reason("truncated").find("not a valid ONNX file") != std::string::npos);
  CHECK(reason("not_onnx").find("not a valid ONNX file") != std::string::npos);
  CHECK(reason("old_opset").find("opset 11") != std::string::npos);
  auto op = reason("unknown_op");
  CHECK(op.find("'Hardmax'") != std::string::npos);
  CHECK(op.find("the_Hardmax_node") != std::string::npos);
  CHECK(op.find("opset 17") != std::string::npos);
  auto dims = reason("bad_dims");
  CHECK(dims.find("[5]") != std::string::npos);
  CHECK(dims.find("[4]") != std::string::npos);
  CHECK(reason("string_relu").find("computes on the STRING tensor 'x'") != std::string::npos);
  CHECK(reason("string_as_fp32").find("input 's' data_type TYPE_FP32, but the ONNX graph has "
                                      "STRING") != std::string::npos);
  auto escaped = reason("escape");
  CHECK(escaped.find("'../model.onnx.data'") != std::string::npos);
  CHECK(escaped.find("leads out of the model's directory") != std::string::npos);
  // The good model still serves.
  check_model_matches(http, "op_tanh", read_reference("op_tanh"));
}

namespace {

/// What differs between the server's answer to `ref`'s inputs and `ref`'s
/// outputs (empty when nothing does); callable from any thread.
std::string model_mismatch(uint16_t port, const std::string& model, const reference& ref) {
  http_client http(port);
  auto resp = infer(http, model, ref);
  if (resp.status != 200)
    return "status " + std::to_string(resp.status) + ": " + resp.body;
  auto body = split_binary(resp);
  auto doc = json_document::parse(body.json);
  size_t at = 0;
  for (size_t i = 0; i < ref.outputs.size(); ++i) {
    const auto& want = ref.outputs[i];
    std::string p = "/outputs/" + std::to_string(i);
    auto what = want.name + " at input shape " + shape_json(ref.inputs.at(0).shape) + ": ";
    if (json_ints(doc.at(p + "/shape")) != want.shape)
      return what + "shape " + shape_json(json_ints(doc.at(p + "/shape")));
    auto size = doc.uint_at(p + "/parameters/binary_data_size");
    if (size != want.bytes.size())
      return what + std::to_string(size) + " bytes";
    double err = relative_error(from_bytes<float>(body.binary.substr(at, size)),
                                from_bytes<float>(want.bytes));
    at += size;
    if (!(err < 1e-4))
      return what + "relative error " + std::to_string(err);
  }
  return "";
}

} // namespace

TEST_CASE("variable sequence lengths and image sizes: concurrent requests of mixed shapes all "
          "match ONNX Runtime") {
  temp_repository repo;
  const std::string bert = "dyn_bert_block_opset17", cnn = "dyn_cnn_opset17";
  repo.add_model(fixtures / "models" / bert);
  repo.add_model(fixtures / "models" / cnn);
  // A longer queue delay, so that requests of one length meet in a batch
  // while others of other lengths wait beside them; two instances.
  auto config = read_all(fixtures / "models" / bert / "config.pbtxt");
  auto at = config.find("max_queue_delay_microseconds: 200 ");
  REQUIRE(at != std::string::npos);
  config.replace(at, std::string("max_queue_delay_microseconds: 200 ").size(),
                 "max_queue_delay_microseconds: 20000 ");
  // Room for two plans besides the pinned ones: lengths keep evicting each other.
  config += "parameters { key: \"plan_cache_size\" value: { string_value: \"2\" } }\n";
  config += "instance_group [ { count: 2 kind: KIND_CPU } ]\n";
  repo.write_file(bert + "/config.pbtxt", config);
  server_process server({CAF_SERVING_BINARY, repo.path().string(), {"--executor-threads", "2"}});
  http_client http(server.http_port());

  SUBCASE("config shows -1 where a dimension varies, given or derived") {
    auto doc = json_document::parse(http.get("/v2/models/" + bert).body);
    CHECK(json_ints(doc.at("/inputs/0/shape")) == std::vector<int64_t>{-1, -1});
    CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{-1, -1, 16});
    CHECK(json_ints(doc.at("/outputs/1/shape")) == std::vector<int64_t>{-1, 16});
    auto derived = json_document::parse(http.get("/v2/models/" + cnn).body);
    CHECK(json_ints(derived.at("/inputs/0/shape")) == std::vector<int64_t>{-1, 3, -1, -1});
    CHECK(derived.string_at("/outputs/0/name") == "features");
    CHECK(json_ints(derived.at("/outputs/0/shape")) == std::vector<int64_t>{-1, 8, -1, -1});
    CHECK(json_ints(derived.at("/outputs/1/shape")) == std::vector<int64_t>{-1, 5});
  }

  SUBCASE("concurrent clients, mixed lengths") {
    // Every reference set, whole and its first row, for both models.
    std::vector<std::pair<std::string, reference>> cases;
    for (const auto& model : {bert, cnn})
      for (const auto& set : reference_sets(model)) {
        cases.emplace_back(model, read_reference(set));
        cases.emplace_back(model, first_row(read_reference(set)));
      }
    REQUIRE(cases.size() >= 16);
    constexpr int clients = 8, rounds = 3;
    std::vector<std::future<std::vector<std::string>>> answers;
    for (int c = 0; c < clients; ++c)
      answers.push_back(std::async(std::launch::async, [&, c] {
        std::vector<std::string> wrong;
        // Each client walks the cases from its own offset: at any moment the
        // server holds requests of several shapes of each model.
        for (size_t i = 0; i < rounds * cases.size(); ++i) {
          const auto& [model, ref] = cases[(i + static_cast<size_t>(c) * 5) % cases.size()];
          auto m = model_mismatch(server.http_port(), model, ref);
          if (!m.empty())
            wrong.push_back(model + ": " + m);
        }
        return wrong;
      }));
    for (auto& a : answers)
      for (const auto& w : a.get())
        CHECK_MESSAGE(false, w);
    auto stats = json_document::parse(http.get("/v2/models/" + bert + "/stats").body);
    auto runs = stats.uint_at("/model_stats/0/execution_count");
    auto requests = stats.uint_at("/model_stats/0/inference_count");
    MESSAGE(bert << ": " << requests << " rows in " << runs << " batches");
    CHECK(runs > 0);
  }

  SUBCASE("plans evicted from a small cache compile again and stay correct") {
    // The byte bound is covered in onnx.onnx_backend.test; here the count
    // bound of the running server: more lengths than the two plans it keeps.
    for (int round = 0; round < 2; ++round)
      for (const auto& set : reference_sets(bert))
        CHECK(model_mismatch(server.http_port(), bert, first_row(read_reference(set))) == "");
  }
}

namespace {

/// x [batch, n] -> Reshape [0, -1, 4] ("split_by_four") -> y: runs only where
/// 4 divides n. Written with the ONNX protobuf classes.
std::string reshape_by_four_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* imp = m.add_opset_import();
  imp->set_domain("");
  imp->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* target = g->add_initializer();
  target->set_name("target");
  target->set_data_type(onnx::TensorProto::INT64);
  target->add_dims(3);
  for (int64_t d : {0, -1, 4})
    target->add_int64_data(d);
  auto* n = g->add_node();
  n->set_op_type("Reshape");
  n->set_name("split_by_four");
  n->add_input("x");
  n->add_input("target");
  n->add_output("y");
  auto* x = g->add_input();
  x->set_name("x");
  auto* xt = x->mutable_type()->mutable_tensor_type();
  xt->set_elem_type(onnx::TensorProto::FLOAT);
  xt->mutable_shape()->add_dim()->set_dim_param("batch");
  xt->mutable_shape()->add_dim()->set_dim_param("n");
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return m.SerializeAsString();
}

} // namespace

TEST_CASE("a shape the graph cannot take is a 400 naming the shapes and the node; the server "
          "keeps serving") {
  temp_repository repo;
  repo.write_file("by_four/config.pbtxt", minimal_config);
  repo.write_file("by_four/1/model.onnx", reshape_by_four_model());
  server_process server({CAF_SERVING_BINARY, repo.path().string(), {"--executor-threads", "2"}});
  http_client http(server.http_port());
  auto doc = json_document::parse(http.get("/v2/models/by_four").body);
  CHECK(json_ints(doc.at("/inputs/0/shape")) == std::vector<int64_t>{-1, -1});
  CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{-1, -1, 4});
  auto request = [&](int64_t rows, int64_t n) {
    std::string data;
    for (int64_t i = 0; i < rows * n; ++i)
      data += (i ? "," : "") + std::to_string(i);
    return http.post("/v2/models/by_four/infer",
                     "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":["
                       + std::to_string(rows) + "," + std::to_string(n) + "],\"data\":[" + data
                       + "]}]}");
  };
  for (int64_t rows : {1, 3}) {
    CAPTURE(rows);
    auto bad = request(rows, 6);
    CHECK(bad.status == 400);
    CHECK(bad.body.find("model 'by_four' cannot run inputs x [" + std::to_string(rows)
                        + ",6]: node 'split_by_four' (operator 'Reshape', opset 17): cannot "
                          "reshape")
          != std::string::npos);
    auto good = request(rows, 8);
    REQUIRE_MESSAGE(good.status == 200, good.body);
    auto out = json_document::parse(good.body);
    CHECK(json_ints(out.at("/outputs/0/shape")) == std::vector<int64_t>{rows, 2, 4});
  }
}

namespace {

/// The value of counter `name` for `model` in the server's /metrics text; -1 if absent.
double metric_of(const server_process& server, const std::string& name, const std::string& model) {
  http_client metrics(server.metrics_port());
  auto text = metrics.get("/metrics").body;
  auto key = name + "{model=\"" + model + "\"";
  auto at = text.find(key);
  if (at == std::string::npos)
    return -1;
  auto value = text.find("} ", at);
  return value == std::string::npos ? -1 : std::stod(text.substr(value + 2));
}

} // namespace

TEST_CASE("padded batching: concurrent requests of mixed sequence lengths share padded batches "
          "and each answer matches ONNX Runtime at its own length") {
  temp_repository repo;
  const std::string bert = "dyn_bert_block_opset17";
  repo.add_model(fixtures / "models" / bert);
  auto config = read_all(fixtures / "models" / bert / "config.pbtxt");
  auto at = config.find("max_queue_delay_microseconds: 200 ");
  REQUIRE(at != std::string::npos);
  // A long queue delay and a loose waste bound, so that lengths 1..40 meet.
  config.replace(at, std::string("max_queue_delay_microseconds: 200 ").size(),
                 "max_queue_delay_microseconds: 20000 ");
  config += "parameters { key: \"padded_batching\" value: { string_value: "
            "\"input_ids:1:0;attention_mask:1:0\" } }\n"
            "parameters { key: \"padded_batching_max_waste\" value: { string_value: \"0.95\" } }\n"
            "parameters { key: \"padded_outputs\" value: { string_value: \"hidden:1\" } }\n";
  repo.write_file(bert + "/config.pbtxt", config);
  server_process server({CAF_SERVING_BINARY, repo.path().string(), {"--executor-threads", "2"}});
  http_client http(server.http_port());
  REQUIRE(metric_of(server, "caf_serving_padded_batches", bert) == 0);

  // Every reference set (lengths 7, 3, 12, 1, 40), whole and its first row.
  std::vector<reference> cases;
  for (const auto& set : reference_sets(bert)) {
    cases.push_back(read_reference(set));
    cases.push_back(first_row(read_reference(set)));
  }
  REQUIRE(cases.size() >= 10);
  constexpr int clients = 8, rounds = 3;
  std::vector<std::future<std::vector<std::string>>> answers;
  for (int c = 0; c < clients; ++c)
    answers.push_back(std::async(std::launch::async, [&, c] {
      std::vector<std::string> wrong;
      for (size_t i = 0; i < rounds * cases.size(); ++i) {
        const auto& ref = cases[(i + static_cast<size_t>(c) * 3) % cases.size()];
        auto m = model_mismatch(server.http_port(), bert, ref);
        if (!m.empty())
          wrong.push_back(m);
      }
      return wrong;
    }));
  for (auto& a : answers)
    for (const auto& w : a.get())
      CHECK_MESSAGE(false, w);
  auto padded = metric_of(server, "caf_serving_padded_batches", bert);
  auto stats = json_document::parse(http.get("/v2/models/" + bert + "/stats").body);
  MESSAGE(bert << ": " << stats.uint_at("/model_stats/0/inference_count") << " rows in "
               << stats.uint_at("/model_stats/0/execution_count") << " batches, " << padded
               << " of them of mixed lengths");
  CHECK(padded > 0);
}

TEST_CASE("padded batching: bad parameters fail the load with the reason; the server keeps "
          "serving") {
  temp_repository repo;
  const std::string bert = "dyn_bert_block_opset17";
  repo.add_model(fixtures / "models" / bert);
  repo.add_model(fixtures / "models" / "op_tanh");
  auto config = read_all(fixtures / "models" / bert / "config.pbtxt");
  config += "parameters { key: \"padded_batching\" value: { string_value: "
            "\"input_ids:1:0;token_type_ids:1:0\" } }\n";
  repo.write_file(bert + "/config.pbtxt", config);
  server_process server({CAF_SERVING_BINARY, repo.path().string(), {}});
  http_client http(server.http_port());
  auto index = http.post("/v2/repository/index", "{}").body;
  CHECK(index.find("token_type_ids") != std::string::npos);
  CHECK(index.find("does not have") != std::string::npos);
  check_model_matches(http, "op_tanh", read_reference("op_tanh"));
}

TEST_CASE("a model with DynamicQuantizeLinear is not batched: concurrent requests get exactly "
          "the answers they get alone") {
  // quantize_dynamic's MLP quantizes its activations with one scale over the
  // whole tensor: batched together, each request's answer would depend on the
  // other's range. A long queue delay and preferred batches of 2 would batch
  // the two requests below if the scheduler were allowed to.
  temp_repository repo;
  const std::string mlp = "quant_mlp_dynamic";
  repo.add_model(fixtures / "models" / mlp);
  auto config = read_all(fixtures / "models" / mlp / "config.pbtxt");
  auto at = config.find("dynamic_batching {");
  REQUIRE(at != std::string::npos);
  config.replace(at, std::string::npos,
                 "dynamic_batching { preferred_batch_size: [ 2 ] "
                 "max_queue_delay_microseconds: 3000000 }\n");
  repo.write_file(mlp + "/config.pbtxt", config);
  // One compute thread: with two, a batch of two rows ran as two chunks of one.
  server_process server({CAF_SERVING_BINARY, repo.path().string(), {"--executor-threads", "1"}});
  CHECK(server.wait_for_output("dynamic batching off", std::chrono::seconds(10)));
  CHECK(server.output().find("DynamicQuantizeLinear") != std::string::npos);

  auto one_row = read_reference(mlp);
  REQUIRE(one_row.inputs.at(0).shape == std::vector<int64_t>{1, 16});
  // Two requests whose ranges differ by 20x: a shared scale would coarsen the small one.
  reference small = one_row, large = one_row;
  auto x = from_bytes<float>(one_row.inputs[0].bytes);
  for (auto& v : x) v *= 20.0f;
  large.inputs[0].bytes.assign(reinterpret_cast<const char*>(x.data()), x.size() * 4);
  auto output_of = [&](const reference& r) {
    http_client http(server.http_port());
    auto resp = infer(http, mlp, r);
    REQUIRE_MESSAGE(resp.status == 200, resp.body);
    return split_binary(resp).binary;
  };
  auto small_alone = output_of(small);
  auto large_alone = output_of(large);
  CHECK(relative_error(from_bytes<float>(small_alone), from_bytes<float>(one_row.outputs[0].bytes))
        < 1e-4);
  for (int round = 0; round < 3; ++round) {
    auto a = std::async(std::launch::async, [&] { return output_of(small); });
    auto b = std::async(std::launch::async, [&] { return output_of(large); });
    CHECK(a.get() == small_alone);
    CHECK(b.get() == large_alone);
  }
  http_client http(server.http_port());
  auto stats = json_document::parse(http.get("/v2/models/" + mlp + "/stats").body);
  CHECK(stats.uint_at("/model_stats/0/execution_count")
        == stats.uint_at("/model_stats/0/inference_count"));
}
