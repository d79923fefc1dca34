#include "executor/builtin_backend.hpp"
#include "executor/executor_actor.hpp"
#include "core/pipeline_messages.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <map>

using namespace caf_serving;
using namespace caf_serving::executor;

namespace {

struct vector_writer : output_writer {
  std::map<std::string, std::vector<uint8_t>> outputs;
  uint8_t* allocate(std::string_view name, datatype, const std::vector<int64_t>&,
                    size_t bytes) override {
    auto& v = outputs[std::string(name)];
    v.assign(bytes, 0xAB); // poisoned: an unwritten byte shows
    return v.data();
  }
};

model_config simple_config() {
  model_config cfg;
  cfg.name = "simple";
  cfg.max_batch_size = 8;
  cfg.inputs = {{"INPUT0", datatype::int32, {16}}, {"INPUT1", datatype::int32, {16}}};
  cfg.outputs = {{"OUTPUT0", datatype::int32, {16}}, {"OUTPUT1", datatype::int32, {16}}};
  cfg.parameters["function"] = "add_sub";
  return cfg;
}

} // namespace

TEST_CASE("add_sub adds and subtracts every element of a batch") {
  auto be = make_builtin_backend(simple_config());
  REQUIRE(be.ok());
  std::vector<int32_t> a(32), b(32);
  for (int i = 0; i < 32; ++i) {
    a[i] = i * 7 - 50;
    b[i] = 3 - i;
  }
  batch_view batch;
  batch.rows = 2;
  batch.inputs = {{"INPUT0", datatype::int32, {2, 16}, reinterpret_cast<uint8_t*>(a.data()), 128},
                  {"INPUT1", datatype::int32, {2, 16}, reinterpret_cast<uint8_t*>(b.data()), 128}};
  vector_writer out;
  auto r = (*be)->execute(batch, out);
  REQUIRE(std::holds_alternative<std::monostate>(r));
  auto* sum = reinterpret_cast<int32_t*>(out.outputs["OUTPUT0"].data());
  auto* diff = reinterpret_cast<int32_t*>(out.outputs["OUTPUT1"].data());
  for (int i = 0; i < 32; ++i) {
    CHECK(sum[i] == a[i] + b[i]);
    CHECK(diff[i] == a[i] - b[i]);
  }
}

namespace {

std::string bytes_tensor(const std::vector<std::string>& elements) {
  std::string out;
  for (const auto& e : elements) {
    uint32_t n = static_cast<uint32_t>(e.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += e;
  }
  return out;
}

model_config simple_string_config() {
  auto cfg = simple_config();
  cfg.name = "simple_string";
  for (auto* list : {&cfg.inputs, &cfg.outputs})
    for (auto& t : *list)
      t.dtype = datatype::bytes;
  return cfg;
}

} // namespace

TEST_CASE("add_sub on BYTES adds and subtracts numbers written as text (Triton's simple_string)") {
  auto be = make_builtin_backend(simple_string_config());
  REQUIRE(be.ok());
  auto a = bytes_tensor({"0", "-7", "2147483647", "40"});
  auto b = bytes_tensor({"1", "3", "1", "-2"});
  batch_view batch;
  batch.rows = 1;
  batch.inputs = {
    {"INPUT0", datatype::bytes, {1, 4}, reinterpret_cast<const uint8_t*>(a.data()), a.size()},
    {"INPUT1", datatype::bytes, {1, 4}, reinterpret_cast<const uint8_t*>(b.data()), b.size()}};
  vector_writer out;
  auto r = (*be)->execute(batch, out);
  REQUIRE(std::holds_alternative<std::monostate>(r));
  auto as_string = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  // INT32 arithmetic wraps as Triton's model does on 2147483647 + 1.
  CHECK(as_string(out.outputs["OUTPUT0"]) == bytes_tensor({"1", "-4", "-2147483648", "38"}));
  CHECK(as_string(out.outputs["OUTPUT1"]) == bytes_tensor({"-1", "-10", "2147483646", "42"}));
}

TEST_CASE("add_sub on BYTES names an element that is not a number") {
  auto be = make_builtin_backend(simple_string_config());
  REQUIRE(be.ok());
  auto a = bytes_tensor({"1", "x2"});
  auto b = bytes_tensor({"1", "1"});
  batch_view batch;
  batch.rows = 1;
  batch.inputs = {
    {"INPUT0", datatype::bytes, {1, 2}, reinterpret_cast<const uint8_t*>(a.data()), a.size()},
    {"INPUT1", datatype::bytes, {1, 2}, reinterpret_cast<const uint8_t*>(b.data()), b.size()}};
  vector_writer out;
  auto r = (*be)->execute(batch, out);
  REQUIRE(std::holds_alternative<serving_error>(r));
  const auto& e = std::get<serving_error>(r);
  CHECK(e.status == status_code::bad_request);
  CHECK(e.message.find("element 1 of input 'INPUT0' is 'x2'") != std::string::npos);
}

TEST_CASE("identity copies bytes of any datatype") {
  model_config cfg;
  cfg.name = "id";
  cfg.inputs = {{"INPUT0", datatype::bytes, {1}}};
  cfg.outputs = {{"OUTPUT0", datatype::bytes, {1}}};
  cfg.parameters["function"] = "identity";
  auto be = make_builtin_backend(cfg);
  REQUIRE(be.ok());
  std::string data("\x03\0\0\0abc", 7);
  batch_view batch;
  batch.rows = 1;
  batch.inputs = {{"INPUT0", datatype::bytes, {1, 1}, reinterpret_cast<const uint8_t*>(data.data()),
                   data.size()}};
  vector_writer out;
  (*be)->execute(batch, out);
  auto& o = out.outputs["OUTPUT0"];
  CHECK(std::string(o.begin(), o.end()) == data);
}

TEST_CASE("configurations the builtin backend cannot compute are named") {
  auto cfg = simple_config();
  cfg.parameters["function"] = "multiply";
  auto r = make_builtin_backend(cfg);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("unknown builtin function 'multiply'") != std::string::npos);

  cfg = simple_config();
  cfg.inputs[1].dtype = datatype::fp32;
  r = make_builtin_backend(cfg);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("'INPUT1' differs") != std::string::npos);

  cfg = simple_config();
  cfg.parameters.clear();
  r = make_builtin_backend(cfg);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("function") != std::string::npos);
}

TEST_CASE("identity with delay_us blocks for that long and says so") {
  model_config cfg;
  cfg.name = "slow";
  cfg.inputs = {{"INPUT0", datatype::int32, {1}}};
  cfg.outputs = {{"OUTPUT0", datatype::int32, {1}}};
  cfg.parameters["function"] = "identity";
  cfg.parameters["delay_us"] = "20000";
  auto be = make_builtin_backend(cfg);
  REQUIRE(be.ok());
  CHECK((*be)->blocks());
  int32_t v = 5;
  batch_view batch;
  batch.rows = 1;
  batch.inputs = {{"INPUT0", datatype::int32, {1, 1}, reinterpret_cast<uint8_t*>(&v), 4}};
  vector_writer out;
  auto start = std::chrono::steady_clock::now();
  (*be)->execute(batch, out);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(20));
  cfg.parameters["delay_us"] = "soon";
  auto bad = make_builtin_backend(cfg);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("delay_us") != std::string::npos);
}

namespace {

model_config costly_identity(const std::string& per_batch_us, const std::string& per_item_us) {
  model_config cfg;
  cfg.name = "costly";
  cfg.max_batch_size = 8;
  cfg.inputs = {{"INPUT0", datatype::int32, {1}}};
  cfg.outputs = {{"OUTPUT0", datatype::int32, {1}}};
  cfg.parameters["function"] = "identity";
  cfg.parameters["delay_us"] = per_batch_us;
  cfg.parameters["delay_per_item_us"] = per_item_us;
  return cfg;
}

batch_view rows_of(std::vector<int32_t>& values) {
  batch_view batch;
  batch.rows = static_cast<uint32_t>(values.size());
  batch.inputs = {{"INPUT0", datatype::int32, {static_cast<int64_t>(values.size()), 1},
                   reinterpret_cast<uint8_t*>(values.data()), values.size() * 4}};
  return batch;
}

std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

} // namespace

TEST_CASE("identity with delay_per_item_us costs a fixed part plus a part per batch row") {
  auto be = make_builtin_backend(costly_identity("2000", "4000"));
  REQUIRE(be.ok());
  CHECK((*be)->blocks());
  std::vector<int32_t> four{1, 2, 3, 4};
  vector_writer out;
  auto start = std::chrono::steady_clock::now();
  auto r = (*be)->execute(rows_of(four), out);
  // 2 ms + 4 rows * 4 ms: the rows are what makes it 18 ms, not the fixed part.
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(18));
  REQUIRE(std::holds_alternative<std::monostate>(r));
  CHECK(std::memcmp(out.outputs["OUTPUT0"].data(), four.data(), 16) == 0);

  // A per-item cost alone makes the model slow too.
  auto per_item_only = make_builtin_backend(costly_identity("0", "1000"));
  REQUIRE(per_item_only.ok());
  CHECK((*per_item_only)->blocks());
}

TEST_CASE("identity with delay_mode spin holds its core for the delay; sleep does not") {
  auto cfg = costly_identity("20000", "0");
  cfg.parameters["delay_mode"] = "spin";
  auto spin = make_builtin_backend(cfg);
  REQUIRE(spin.ok());
  std::vector<int32_t> one{7};
  vector_writer out;
  auto cpu_before = thread_cpu_time();
  auto start = std::chrono::steady_clock::now();
  (*spin)->execute(rows_of(one), out);
  // The busy wait is 20 ms of this thread's CPU time, however busy the machine.
  CHECK(thread_cpu_time() - cpu_before >= std::chrono::milliseconds(20));
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(20));

  cfg.parameters["delay_mode"] = "sleep";
  auto sleep = make_builtin_backend(cfg);
  REQUIRE(sleep.ok());
  cpu_before = thread_cpu_time();
  start = std::chrono::steady_clock::now();
  (*sleep)->execute(rows_of(one), out);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(20));
  CHECK(thread_cpu_time() - cpu_before < std::chrono::milliseconds(10));
}

TEST_CASE("identity names a bad delay_per_item_us or delay_mode") {
  auto r = make_builtin_backend(costly_identity("0", "-3"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("delay_per_item_us") != std::string::npos);
  auto cfg = costly_identity("100", "10");
  cfg.parameters["delay_mode"] = "busy";
  r = make_builtin_backend(cfg);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("delay_mode must be \"sleep\"") != std::string::npos);
}

TEST_CASE("run_one_batch sizes the result's first segment from the model's outputs") {
  // Cap'n Proto zeroes the whole first segment: a fixed 4 KiB on top of every
  // batch result was a memset per request. The hint now follows the outputs,
  // and the result still fits in one segment.
  auto cfg = simple_config();
  auto be = make_builtin_backend(cfg);
  REQUIRE(be.ok());
  for (uint32_t rows : {1u, 8u}) {
    auto batch = batch_message::create(1 << 12);
    auto b = batch.builder();
    b.setModelName(cfg.name);
    b.setRows(rows);
    b.initRequestRows(1).set(0, rows);
    auto inputs = b.initInputs(2);
    for (unsigned i = 0; i < 2; ++i) {
      inputs[i].setName(cfg.inputs[i].name);
      inputs[i].setDatatype(wire::DataType::INT32);
      auto shape = inputs[i].initShape(2);
      shape.set(0, rows);
      shape.set(1, 16);
      inputs[i].initData(rows * 64);
    }
    auto result = run_one_batch(**be, cfg, batch.reader());
    auto r = result.reader();
    REQUIRE(r.getError().getStatus() == 0);
    REQUIRE(r.getOutputs().size() == 2);
    size_t data = r.getOutputs()[0].getData().size() + r.getOutputs()[1].getData().size();
    CHECK(data == rows * 128);
    CHECK(result.segment_count() == 1);
    CHECK(result.first_segment_bytes() < data + 1024);
  }
}
