/// External data files: a model's weights in model.onnx.data (or files of their
/// own) beside model.onnx, mapped read-only and viewed by the constants; the
/// locations the model file names are refused when they lead outside the
/// model's directory or past a file's end.

#include "onnx/external_data.hpp"
#include "onnx/importer.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;
namespace fs = std::filesystem;

namespace {

/// A fresh directory, removed at the end of the test.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "external_data.XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~temp_dir() { fs::remove_all(path); }
};

void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string floats(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

/// Y = Add(X, W), W = FP32 [n] in external file `location` at `offset`.
std::string model_with_external(const std::string& location, int64_t n, int64_t offset,
                                std::optional<int64_t> length) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto* w = g->add_initializer();
  w->set_name("W");
  w->set_data_type(::onnx::TensorProto::FLOAT);
  w->add_dims(n);
  w->set_data_location(::onnx::TensorProto::EXTERNAL);
  auto entry = [&](const std::string& k, const std::string& v) {
    auto* e = w->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  entry("location", location);
  entry("offset", std::to_string(offset));
  if (length)
    entry("length", std::to_string(*length));
  auto* node = g->add_node();
  node->set_op_type("Add");
  node->add_input("X");
  node->add_input("W");
  node->add_output("Y");
  for (auto* vi : {g->add_input(), g->add_output()}) {
    vi->set_name(vi == &g->input(0) ? "X" : "Y");
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(::onnx::TensorProto::FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_value(n);
  }
  return m.SerializeAsString();
}

result<graph> import_at(const fs::path& model, const std::string& bytes) {
  write_file(model, bytes);
  return import_model(model);
}

} // namespace

TEST_CASE("an initializer in model.onnx.data is a view of the mapped file, alive with the graph") {
  temp_dir dir;
  auto model = dir.path / "1" / "model.onnx";
  write_file(dir.path / "1" / "model.onnx.data", floats({9, 9, 1.5f, -2, 4.25f, 9}));
  constant_ptr w;
  {
    auto g = import_at(model, model_with_external("model.onnx.data", 3, 8, 12));
    REQUIRE_MESSAGE(g.ok(), g.error().message);
    w = g->values[g->nodes[0].inputs[1]].constant;
  }
  // The graph and the importer are gone; the constant still reads the file.
  REQUIRE(w);
  CHECK(w->bytes.is_view());
  CHECK(w->shape == std::vector<int64_t>{3});
  CHECK(w->as<float>()[0] == 1.5f);
  CHECK(w->as<float>()[1] == -2.0f);
  CHECK(w->as<float>()[2] == 4.25f);
  // No length: to the end of the file.
  auto to_end = import_at(model, model_with_external("model.onnx.data", 2, 16, std::nullopt));
  REQUIRE_MESSAGE(to_end.ok(), to_end.error().message);
}

TEST_CASE("a misaligned offset is copied, not viewed") {
  temp_dir dir;
  auto data = floats({7, 8});
  write_file(dir.path / "w.bin", "x" + data);
  auto g = import_at(dir.path / "model.onnx", model_with_external("w.bin", 2, 1, 8));
  REQUIRE_MESSAGE(g.ok(), g.error().message);
  auto w = g->values[g->nodes[0].inputs[1]].constant;
  CHECK_FALSE(w->bytes.is_view());
  CHECK(w->as<float>()[1] == 8.0f);
}

TEST_CASE("external data locations outside the model's directory or past the file are refused") {
  temp_dir dir;
  auto model = dir.path / "m" / "1" / "model.onnx";
  write_file(dir.path / "m" / "1" / "w.bin", floats({1, 2, 3}));
  write_file(dir.path / "secret.bin", floats({1, 2, 3}));
  fs::create_symlink(dir.path / "secret.bin", dir.path / "m" / "1" / "link.bin");
  auto refusal = [&](const std::string& location, int64_t offset, std::optional<int64_t> length) {
    auto g = import_at(model, model_with_external(location, 3, offset, length));
    REQUIRE_FALSE(g.ok());
    CHECK(g.error().status == status_code::bad_request);
    CHECK(g.error().message.find(model.string() + ": tensor 'W'") == 0);
    return g.error().message;
  };
  CHECK(refusal((dir.path / "secret.bin").string(), 0, 12).find("an absolute path")
        != std::string::npos);
  CHECK(refusal("../../secret.bin", 0, 12).find("'..'") != std::string::npos);
  CHECK(refusal("sub/../../../secret.bin", 0, 12).find("'..'") != std::string::npos);
  CHECK(refusal("link.bin", 0, 12).find("outside the model's directory")
        != std::string::npos);
  CHECK(refusal("missing.bin", 0, 12).find("cannot be opened") != std::string::npos);
  CHECK(refusal("w.bin", 4, 12).find("past the end of the file") != std::string::npos);
  CHECK(refusal("w.bin", 13, std::nullopt).find("past the end of the file")
        != std::string::npos);
  CHECK(refusal("w.bin", 0, 8).find("needs 12 bytes") != std::string::npos);
  CHECK(refusal(".", 0, 12).find("not a regular file") != std::string::npos);
  // A huge offset does not wrap around the file's size.
  CHECK(refusal("w.bin", 4, INT64_MAX).find("past the end") != std::string::npos);
}

TEST_CASE("a model read from memory cannot name external data") {
  auto g = import_model_bytes(model_with_external("model.onnx.data", 3, 0, 12), "m.onnx");
  REQUIRE_FALSE(g.ok());
  CHECK(g.error().message.find("load it from its model.onnx file") != std::string::npos);
}
