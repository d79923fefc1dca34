/// caf-cuda-bench MODEL_DIR PRECISION BATCH... : the engine's CUDA executor alone
/// (no server), median milliseconds per batch and inferences/s at each batch
/// size, one JSON line per size on stdout. Inputs are zeros of the model's input
/// types: the timing does not depend on values.
///
/// Two rates per size: one batch at a time (execute(), as a synchronous
/// executor ran), and batches submitted back to back (submit(), as the
/// asynchronous executor runs them: the next batch's copy-in overlaps this
/// one's compute), "pipelined_inferences_per_s"; their ratio is what the
/// overlap buys at that size.

#include "cuda/cuda_backend.hpp"
#include "repository/model_repository.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>

using namespace caf_serving;

namespace {

class sink final : public executor::output_writer {
public:
  std::map<std::string, std::vector<uint8_t>> buf;
  uint8_t* allocate(std::string_view name, datatype, const std::vector<int64_t>&,
                    size_t bytes) override {
    auto& b = buf[std::string(name)];
    b.resize(bytes);
    return b.data();
  }
};

} // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: caf-cuda-bench MODEL_DIR fp32|fp16|bf16 BATCH...\n";
    return 2;
  }
  std::filesystem::path dir = argv[1];
  auto entry = repository::load_model_config(dir.parent_path(), dir.filename().string(), {true});
  if (!entry.config) {
    std::cerr << entry.config.error().message << "\n";
    return 1;
  }
  model_config cfg = entry.config->config;
  cfg.instance_groups = {{"gpu", 1, instance_kind::gpu, {0}}};
  cfg.parameters["precision"] = argv[2];
  std::string sizes;
  for (int i = 3; i < argc; ++i) sizes += (i > 3 ? "," : "") + std::string(argv[i]);
  cfg.parameters["cuda_graph_batch_sizes"] = sizes;
  auto t0 = std::chrono::steady_clock::now();
  auto model = cuda::load_cuda_model({entry.version_dirs.back() / "model.onnx", cfg, {}});
  if (!model) { std::cerr << model.error().message << "\n"; return 1; }
  auto inst = model->make_instance({0, 0});
  if (!inst) { std::cerr << inst.error().message << "\n"; return 1; }
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << model->summary << "; " << inst->report.arena << "; " << inst->report.steps
            << " steps, " << inst->report.host_steps << " on the host; ready in " << load_s << " s\n";
  for (int i = 3; i < argc; ++i) {
    uint32_t rows = static_cast<uint32_t>(std::stoul(argv[i]));
    std::vector<std::vector<uint8_t>> data;
    executor::batch_view view;
    view.rows = rows;
    for (const auto& t : model->config.inputs) {
      std::vector<int64_t> shape = t.dims;
      shape.insert(shape.begin(), rows);
      size_t bytes = 1;
      for (auto d : shape) bytes *= d;
      bytes *= element_size(t.dtype);
      data.emplace_back(bytes, 0);
      view.inputs.push_back({t.name, t.dtype, shape, data.back().data(), bytes});
    }
    sink out;
    for (int w = 0; w < 5; ++w) inst->backend->execute(view, out);
    std::vector<double> ms;
    for (int r = 0; r < 50; ++r) {
      auto a = std::chrono::steady_clock::now();
      auto st = inst->backend->execute(view, out);
      if (auto* e = std::get_if<serving_error>(&st)) { std::cerr << e->message << "\n"; return 1; }
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(ms.begin(), ms.end());
    double median = ms[ms.size() / 2];
    // Back to back: submit() waits for a free staging slot, so at most
    // pipeline_depth() batches are in flight; completions come in order, and a
    // batch's writer is done with once its completion ran (a ring suffices).
    constexpr int pipelined = 200;
    std::vector<sink> ring(4);
    std::mutex mutex;
    std::condition_variable cv;
    int completed = 0;
    std::string failure;
    auto a = std::chrono::steady_clock::now();
    for (int r = 0; r < pipelined; ++r)
      inst->backend->submit(view, ring[r % ring.size()], [&](executor::batch_completion c) {
        std::lock_guard<std::mutex> guard(mutex);
        if (auto* e = std::get_if<serving_error>(&c.status)) failure = e->message;
        if (c.thrown) failure = "a batch threw";
        ++completed;
        cv.notify_all();
      });
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return completed == pipelined; });
    }
    double pipelined_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    if (!failure.empty()) { std::cerr << failure << "\n"; return 1; }
    std::printf("{\"engine\":\"caf-cuda\",\"model\":\"%s\",\"precision\":\"%s\",\"batch\":%u,"
                "\"median_ms\":%.4f,\"inferences_per_s\":%.1f,\"pipelined_inferences_per_s\":%.1f,"
                "\"device_mib\":%.1f}\n",
                dir.filename().c_str(), argv[2], rows, median, rows * 1000.0 / median,
                rows * pipelined / pipelined_s, inst->report.device_bytes / 1048576.0);
    std::fflush(stdout);
  }
  return 0;
}
