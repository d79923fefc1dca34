#include "conformance.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx-data_pb.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <unistd.h>

using namespace caf_serving;
using namespace caf_serving::conformance;
namespace fs = std::filesystem;

namespace {

const fs::path node_cases = CAF_SERVING_NODE_CASES;

/// A scratch copy of sample cases, removed at the end of the test.
struct scratch_cases {
  fs::path root = fs::temp_directory_path()
                  / ("caf-conformance-test-" + std::to_string(::getpid()));
  scratch_cases() { fs::create_directories(root); }
  ~scratch_cases() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  fs::path copy(const std::string& name) {
    fs::copy(node_cases / name, root / name, fs::copy_options::recursive);
    return root / name;
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

void spill(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

loaded_tensor floats(std::vector<float> v, std::vector<int64_t> shape) {
  loaded_tensor t;
  t.dtype = datatype::fp32;
  t.shape = std::move(shape);
  t.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  return t;
}

} // namespace

TEST_CASE("parse_tensor reads raw and typed fields in the engine's layout") {
  ::onnx::TensorProto typed;
  typed.set_name("x");
  typed.set_data_type(::onnx::TensorProto::FLOAT);
  typed.add_dims(2);
  typed.add_float_data(1.5f);
  typed.add_float_data(-2.0f);
  auto t = parse_tensor(typed.SerializeAsString(), "typed");
  REQUIRE(t);
  CHECK(t->name == "x");
  CHECK(t->dtype == datatype::fp32);
  CHECK(t->shape == std::vector<int64_t>{2});
  float back[2];
  REQUIRE(t->bytes.size() == sizeof back);
  std::memcpy(back, t->bytes.data(), sizeof back);
  CHECK(back[0] == 1.5f);
  CHECK(back[1] == -2.0f);

  // INT8 and FLOAT16 are stored widened in int32_data.
  ::onnx::TensorProto small;
  small.set_data_type(::onnx::TensorProto::INT8);
  small.add_dims(3);
  for (int v : {-3, 0, 7}) small.add_int32_data(v);
  auto s = parse_tensor(small.SerializeAsString(), "small");
  REQUIRE(s);
  CHECK(s->dtype == datatype::int8);
  CHECK(s->bytes == std::string("\xfd\x00\x07", 3));

  ::onnx::TensorProto raw;
  raw.set_data_type(::onnx::TensorProto::INT64);
  raw.add_dims(1);
  int64_t v = -5;
  raw.set_raw_data(std::string(reinterpret_cast<const char*>(&v), 8));
  auto r = parse_tensor(raw.SerializeAsString(), "raw");
  REQUIRE(r);
  CHECK(r->dtype == datatype::int64);
  CHECK(r->bytes.size() == 8);

  ::onnx::TensorProto strings;
  strings.set_data_type(::onnx::TensorProto::STRING);
  strings.add_dims(2);
  strings.add_string_data("ab");
  strings.add_string_data("");
  auto b = parse_tensor(strings.SerializeAsString(), "strings");
  REQUIRE(b);
  CHECK(b->dtype == datatype::bytes);
  CHECK(b->bytes == std::string("\x02\0\0\0ab\0\0\0\0", 10));
}

TEST_CASE("parse_tensor names what it cannot read") {
  ::onnx::TensorProto f8;
  f8.set_data_type(17); // FLOAT8E4M3FN, newer than some protobuf classes
  f8.add_dims(1);
  f8.set_raw_data("x");
  auto e = parse_tensor(f8.SerializeAsString(), "output_0.pb");
  REQUIRE_FALSE(e);
  CHECK(e.error().message.find("element type 17 (FLOAT8E4M3FN)") != std::string::npos);

  ::onnx::TensorProto short_data;
  short_data.set_data_type(::onnx::TensorProto::FLOAT);
  short_data.add_dims(4);
  short_data.add_float_data(1.0f);
  auto d = parse_tensor(short_data.SerializeAsString(), "input_1.pb");
  REQUIRE_FALSE(d);
  CHECK(d.error().message.find("holds 4 bytes, not 16") != std::string::npos);
}

TEST_CASE("compare follows ONNX's runner: atol + rtol * |expected|, NaN and infinities") {
  tolerance tol; // rtol 1e-3, atol 1e-7
  auto expected = floats({1.0f, 100.0f}, {2});
  CHECK(compare(expected, floats({1.0009f, 100.09f}, {2}), tol).equal);
  auto off = compare(expected, floats({1.0f, 100.2f}, {2}), tol);
  CHECK_FALSE(off.equal);
  CHECK(off.mismatches == 1);
  CHECK(off.max_abs_error == doctest::Approx(0.2).epsilon(1e-3));
  CHECK(off.detail.find("element 1 is 100.") != std::string::npos);

  float nan = std::numeric_limits<float>::quiet_NaN();
  float inf = std::numeric_limits<float>::infinity();
  CHECK(compare(floats({nan, inf}, {2}), floats({nan, inf}, {2}), tol).equal);
  CHECK_FALSE(compare(floats({nan, inf}, {2}), floats({0.0f, inf}, {2}), tol).equal);
  CHECK_FALSE(compare(floats({1.0f, inf}, {2}), floats({1.0f, -inf}, {2}), tol).equal);

  CHECK(compare(expected, floats({1.0f, 100.0f}, {1, 2}), tol).detail
        == "shape [1,2], expected [2]");
  auto ints = expected;
  ints.dtype = datatype::int32;
  CHECK(compare(ints, expected, tol).detail == "element type FP32, expected INT32");
}

TEST_CASE("compare is exact for integers, even where a double would round") {
  auto as_int64 = [](int64_t v) {
    loaded_tensor t;
    t.dtype = datatype::int64;
    t.shape = {1};
    t.bytes.assign(reinterpret_cast<const char*>(&v), 8);
    return t;
  };
  int64_t big = (int64_t{1} << 60) + 1;
  CHECK(compare(as_int64(big), as_int64(big), {}).equal);
  CHECK_FALSE(compare(as_int64(big), as_int64(big - 1), {}).equal);
  CHECK_FALSE(compare(as_int64(3), as_int64(4), {1.0, 1.0}).equal);
}

TEST_CASE("a sample case runs through the engine and passes") {
  auto r = run_case({node_cases / "test_relu", {}, false});
  CHECK(to_string(r.status) == std::string("pass"));
  CHECK(r.detail.empty());
}

TEST_CASE("a wrong expected output is a failure that names the output and the error") {
  scratch_cases scratch;
  auto dir = scratch.copy("test_add");
  auto out = dir / "test_data_set_0" / "output_0.pb";
  ::onnx::TensorProto t;
  REQUIRE(t.ParseFromString(slurp(out)));
  REQUIRE(t.has_raw_data());
  std::string raw = t.raw_data();
  float first;
  std::memcpy(&first, raw.data(), 4);
  first += 0.5f;
  std::memcpy(raw.data(), &first, 4);
  t.set_raw_data(raw);
  spill(out, t.SerializeAsString());
  auto r = run_case({dir, {}, false});
  CHECK(to_string(r.status) == std::string("fail"));
  CHECK(r.detail.find("output 0 '" + t.name() + "': 1 of ") != std::string::npos);
  CHECK(r.detail.find("max |error| 0.5") != std::string::npos);
}

TEST_CASE("an operator the engine does not run is refused with the engine's error") {
  scratch_cases scratch;
  auto dir = scratch.copy("test_relu");
  ::onnx::ModelProto m;
  REQUIRE(m.ParseFromString(slurp(dir / "model.onnx")));
  m.mutable_graph()->mutable_node(0)->set_op_type("NoSuchOperator");
  spill(dir / "model.onnx", m.SerializeAsString());
  auto r = run_case({dir, {}, false});
  CHECK(to_string(r.status) == std::string("refused"));
  CHECK(r.detail.find("'NoSuchOperator'") != std::string::npos);
  // The folder already names the case; the message says model.onnx.
  CHECK(r.detail.find(dir.string()) == std::string::npos);
}

TEST_CASE("constant_inputs turns an input the engine needs at load into a constant") {
  auto as_input = run_case({node_cases / "test_clip_example", {}, false});
  CHECK(to_string(as_input.status) == std::string("refused"));
  CHECK(as_input.detail.find("it depends on 'min'") != std::string::npos);
  auto as_constant = run_case({node_cases / "test_clip_example", {}, true});
  CHECK(to_string(as_constant.status) == std::string("pass"));
  CHECK(as_constant.detail == "(with 'min', 'max' as constants)");
}

TEST_CASE("a case that crashes, hangs or runs out of memory in its child is reported") {
  isolation_config iso{1, 64};
  auto segv = run_isolated([]() -> case_result { std::raise(SIGSEGV); return {}; }, iso);
  CHECK(to_string(segv.status) == std::string("crashed"));
  CHECK(segv.detail.find("signal " + std::to_string(SIGSEGV)) != std::string::npos);
  auto aborted = run_isolated([]() -> case_result { std::abort(); }, iso);
  CHECK(aborted.detail.find("signal " + std::to_string(SIGABRT)) != std::string::npos);
  // Killed by the alarm the child set itself; the parent only waits for it.
  auto hung = run_isolated([]() -> case_result { for (;;) ::pause(); }, iso);
  CHECK(to_string(hung.status) == std::string("crashed"));
  CHECK(hung.detail == "timed out after 1 s");
  auto hungry = run_isolated([]() -> case_result {
    std::vector<char> big(size_t{1} << 30, 1);
    return {case_status::pass, std::to_string(big[12345])};
  }, iso);
  CHECK(to_string(hungry.status) == std::string("crashed"));
  CHECK(hungry.detail.find("out of memory") != std::string::npos);
  // The caller goes on, and a real case still runs in its own child.
  auto relu = run_case_isolated({node_cases / "test_relu", {}, false}, {});
  CHECK(to_string(relu.status) == std::string("pass"));
}
