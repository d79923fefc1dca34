/// Loading an ONNX model does the work a request would otherwise wait for, and
/// its instances stay within one compute-thread budget (issue 14, findings 6
/// and 7): every plan the scheduler's batch sizes need is compiled at load,
/// Triton's model_warmup samples run before the model is ready, and the
/// instances of every model share one pool of compute threads.

#include "onnx_cpu/onnx_backend.hpp"
#include "onnx_cpu/work_pool.hpp"
#include "repository/config_parser.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;
namespace fs = std::filesystem;

namespace {

const fs::path fixtures = CAF_SERVING_ONNX_FIXTURES;

struct writer final : executor::output_writer {
  std::vector<std::vector<uint8_t>> buffers;
  uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&, size_t bytes) override {
    buffers.emplace_back(bytes);
    return buffers.back().data();
  }
};

/// op_conv (x [3, 9, 9] -> y [4, 5, 5]) batching up to `max_batch` rows; inputs
/// and outputs completed from the graph.
onnx_model_config op_conv(int max_batch, unsigned threads) {
  onnx_model_config cfg;
  cfg.model_file = fixtures / "models/op_conv/1/model.onnx";
  cfg.config.name = "op_conv";
  cfg.config.max_batch_size = max_batch;
  cfg.threads = threads;
  return cfg;
}

std::vector<float> run(executor::backend& b, int64_t rows) {
  std::vector<float> x(static_cast<size_t>(rows * 3 * 9 * 9), 0.5f);
  executor::batch_view view;
  view.rows = static_cast<uint32_t>(rows);
  view.inputs.push_back({"x", datatype::fp32, {rows, 3, 9, 9},
                         reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
  writer out;
  auto r = b.execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);
  REQUIRE(out.buffers.size() == 1);
  std::vector<float> y(out.buffers[0].size() / 4);
  std::memcpy(y.data(), out.buffers[0].data(), y.size() * 4);
  return y;
}

/// Threads of this process now (/proc/self/task).
int thread_count() {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/task")) {
    (void)e;
    ++n;
  }
  return n;
}

} // namespace

TEST_CASE("after load, every batch size up to max_batch_size runs without compiling") {
  // 12 sizes: more than the 8 plans an instance kept before, so none of the
  // sizes the scheduler forms may be evicted either.
  for (unsigned threads : {1u, 2u}) {
    CAPTURE(threads);
    auto model = load_onnx_model(op_conv(12, threads));
    REQUIRE_MESSAGE(model, model.error().message);
    size_t at_load = model->plans_compiled();
    CHECK(at_load >= 1);
    auto a = model->make_instance();
    auto b = model->make_instance();
    for (int round = 0; round < 2; ++round)
      for (int64_t rows = 1; rows <= 12; ++rows) {
        CAPTURE(rows);
        auto y = run(*a, rows);
        CHECK(y.size() == static_cast<size_t>(rows * 4 * 5 * 5));
        run(*b, 13 - rows);
      }
    CHECK(model->plans_compiled() == at_load);
  }
}

TEST_CASE("the instances of a model share one budget of compute threads") {
  auto pool = std::make_shared<work_pool>(3);
  auto cfg = op_conv(8, 3);
  cfg.pool = pool;
  int before = thread_count();
  auto model = load_onnx_model(cfg);
  REQUIRE_MESSAGE(model, model.error().message);
  auto second = load_onnx_model(cfg); // another model on the same budget
  REQUIRE_MESSAGE(second, second.error().message);
  std::vector<std::shared_ptr<executor::backend>> instances;
  for (int i = 0; i < 3; ++i) {
    instances.push_back(model->make_instance());
    instances.push_back(second->make_instance());
  }
  int after = thread_count();
  CAPTURE(before);
  CAPTURE(after);
  // The pool's two workers were there before; loading and six instances add
  // no compute threads (oneDNN and OpenMP may keep their own idle ones).
  CHECK(after - before <= 1);
  // Six executors running at once on one budget take turns, and are right.
  auto want = run(*instances[0], 5);
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (auto& inst : instances)
    callers.emplace_back([&, inst] {
      for (int i = 0; i < 20; ++i)
        if (run(*inst, 1 + i % 8).size() != static_cast<size_t>((1 + i % 8) * 100))
          ++wrong;
      if (run(*inst, 5) != want)
        ++wrong;
    });
  for (auto& t : callers)
    t.join();
  CHECK(wrong == 0);
}

TEST_CASE("a model without a shared pool gives all its instances one pool") {
  int before = thread_count();
  auto model = load_onnx_model(op_conv(8, 3));
  REQUIRE_MESSAGE(model, model.error().message);
  std::vector<std::shared_ptr<executor::backend>> instances;
  for (int i = 0; i < 3; ++i)
    instances.push_back(model->make_instance());
  for (auto& inst : instances)
    run(*inst, 1);
  int after = thread_count();
  CAPTURE(before);
  CAPTURE(after);
  CHECK(after - before <= 2 + 1); // one pool's 2 workers (+1 for oneDNN/OpenMP)
}

namespace {

/// A copy of op_conv's directory under /tmp with `warmup_files` in warmup/.
fs::path model_dir_with_warmup(const std::string& name,
                               const std::vector<std::pair<std::string, size_t>>& warmup_files) {
  auto dir = fs::temp_directory_path() / ("caf-serving-warmup-" + std::to_string(getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir / "1");
  fs::create_directories(dir / "warmup");
  fs::copy_file(fixtures / "models/op_conv/1/model.onnx", dir / "1/model.onnx");
  for (const auto& [file, bytes] : warmup_files) {
    std::vector<float> data(bytes / 4, 0.25f);
    std::ofstream(dir / "warmup" / file, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(bytes));
  }
  return dir;
}

warmup_input x_input(warmup_data data, std::string file = {}) {
  warmup_input in;
  in.name = "x";
  in.dtype = datatype::fp32;
  in.dims = {3, 9, 9};
  in.data = data;
  in.file = std::move(file);
  return in;
}

} // namespace

TEST_CASE("model_warmup samples run at load; a failing one fails the load with its reason") {
  // As in Triton, a file holds one request's bytes, repeated for each row.
  auto dir = model_dir_with_warmup("good", {{"x.bin", 3 * 9 * 9 * 4}, {"x2.bin", 2 * 3 * 9 * 9 * 4}});
  auto cfg = op_conv(8, 2);
  cfg.model_file = dir / "1/model.onnx";
  warmup_sample zero{"zeros", 1, {x_input(warmup_data::zero)}, 2};
  warmup_sample random{"random", 8, {x_input(warmup_data::random)}, 1};
  warmup_sample file{"from file", 2, {x_input(warmup_data::file, "x.bin")}, 1};
  cfg.config.warmup = {zero, random, file};
  auto model = load_onnx_model(cfg);
  REQUIRE_MESSAGE(model, model.error().message);
  CAPTURE(model->summary);
  CHECK(model->summary.find("warmup: 3 sample(s), 4 run(s)") != std::string::npos);

  struct bad_case {
    const char* what;
    warmup_sample sample;
    const char* says;
  };
  auto wrong_size = file;
  wrong_size.inputs[0].file = "x2.bin"; // two rows' bytes
  auto missing = file;
  missing.inputs[0].file = "nope.bin";
  auto unknown = zero;
  unknown.inputs[0].name = "y";
  auto bad_dims = zero;
  bad_dims.inputs[0].dims = {3, 9, 8};
  auto bad_type = zero;
  bad_type.inputs[0].dtype = datatype::int64;
  auto too_big = zero;
  too_big.batch_size = 9;
  auto no_input = zero;
  no_input.inputs.clear();
  for (const auto& c : {bad_case{"file size", wrong_size, "holds 1944 bytes, but one request of dims [3,9,9] TYPE_FP32 is 972 bytes"},
                        bad_case{"missing file", missing, "nope.bin"},
                        bad_case{"unknown input", unknown, "has no input 'y'"},
                        bad_case{"dims", bad_dims, "dims [3,9,8]"},
                        bad_case{"data_type", bad_type, "TYPE_INT64"},
                        bad_case{"batch", too_big, "max_batch_size 8"},
                        bad_case{"no input", no_input, "gives no data for input 'x'"}}) {
    CAPTURE(c.what);
    auto bad_cfg = cfg;
    bad_cfg.config.warmup = {c.sample};
    auto bad = load_onnx_model(bad_cfg);
    REQUIRE_FALSE(bad);
    CAPTURE(bad.error().message);
    CHECK(bad.error().message.find("model_warmup '" + c.sample.name + "'") != std::string::npos);
    CHECK(bad.error().message.find(c.says) != std::string::npos);
  }
  fs::remove_all(dir.parent_path());
}

TEST_CASE("a config.pbtxt's model_warmup runs at load, its files read from the model's warmup/") {
  auto dir = model_dir_with_warmup("from_pbtxt", {{"x.bin", 3 * 9 * 9 * 4}});
  auto text = std::string(R"(platform: "onnxruntime_onnx"
max_batch_size: 8
model_warmup [
  { name: "ones" batch_size: 4 count: 2
    inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3, 9, 9 ] input_data_file: "x.bin" } } },
  { name: "noise" batch_size: 8
    inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3, 9, 9 ] random_data: true } } }
]
)");
  auto parsed = repository::parse_model_config(text, {"from_pbtxt", "config.pbtxt", true});
  REQUIRE_MESSAGE(parsed, parsed.error().message);
  onnx_model_config cfg;
  cfg.model_file = dir / "1/model.onnx";
  cfg.config = *parsed;
  auto model = load_onnx_model(cfg);
  REQUIRE_MESSAGE(model, model.error().message);
  CHECK(model->summary.find("warmup: 2 sample(s), 3 run(s)") != std::string::npos);
  // The same config with a file that is not there: the model does not load.
  auto missing = text;
  missing.replace(missing.find("x.bin"), 5, "gone.bin");
  parsed = repository::parse_model_config(missing, {"from_pbtxt", "config.pbtxt", true});
  REQUIRE(parsed);
  cfg.config = *parsed;
  auto failed = load_onnx_model(cfg);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().message.find("model_warmup 'ones' input 'x' reads "
                                    + (dir / "warmup/gone.bin").string())
        != std::string::npos);
  fs::remove_all(dir.parent_path());
}
