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

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <fstream>
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

reference read_reference(const std::string& model) {
  reference r;
  std::istringstream lines(read_all(fixtures / "reference" / model / "manifest.txt"));
  std::string kind, name, type, dims, file;
  while (lines >> kind >> name >> type >> dims >> file) {
    ref_tensor t;
    t.name = name;
    t.datatype = type.substr(5); // TYPE_FP32 -> FP32
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

std::vector<std::string> fixture_models() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fixtures / "models"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// The first row of every reference tensor (all fixtures batch their first
/// dimension, max_batch_size 8): row 0 of the outputs is what ONNX Runtime
/// computed for row 0 of the inputs.
reference first_row(reference r) {
  for (auto* list : {&r.inputs, &r.outputs})
    for (auto& t : *list) {
      REQUIRE(!t.shape.empty());
      REQUIRE(t.shape[0] > 0);
      t.bytes.resize(t.bytes.size() / static_cast<size_t>(t.shape[0]));
      t.shape[0] = 1;
    }
  return r;
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
    if (want.datatype != "FP32") {
      CHECK(got == want.bytes); // BOOL, INT64: exactly ONNX Runtime's
      continue;
    }
    auto a = from_bytes<float>(got);
    auto b = from_bytes<float>(want.bytes);
    double err = relative_error(a, b);
    CHECK(err < 1e-4);
  }
}

/// A one-node model, written with the ONNX protobuf classes.
std::string one_node_model(const std::string& op, int64_t opset) {
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
    tt->set_elem_type(onnx::TensorProto::FLOAT);
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
  for (const auto& n : names) {
    check_model_matches(http, n, read_reference(n));
    // One row alone is fewer rows than executor threads: the plan whose
    // steps split across the threads (channel pieces, bands of rows, the
    // engine's 1x1 kernel) instead of a row chunk per thread.
    check_model_matches(http, n, first_row(read_reference(n)));
  }

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
  // The good model still serves.
  check_model_matches(http, "op_tanh", read_reference("op_tanh"));
}
