/// caf-onnx-bench MODEL.onnx --batch B [--threads T] [--seconds S] [--max-batch N] [--check 1]
///
/// Loads the model as the server does (importer, passes, plan), runs batches of
/// B rows for S seconds after a warm-up, and prints one JSON line: inferences per
/// second, milliseconds per batch, GFLOP per inference, GFLOP/s, and the machine's
/// measured fp32 FMA peak for T cores. With --check 1 it also runs the batch on a
/// 1-thread instance and reports the largest absolute difference of the outputs
/// (the T-thread plans split work differently, so this checks the splitting).

#include "onnx/importer.hpp"
#include "onnx/onnx_backend.hpp"
#include "onnx/passes.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <immintrin.h>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace caf_serving;
using clock_type = std::chrono::steady_clock;

namespace {

struct buffer_writer final : executor::output_writer {
  std::vector<std::vector<uint8_t>> buffers;
  uint8_t* allocate(std::string_view, datatype, const std::vector<int64_t>&, size_t bytes) override {
    buffers.emplace_back(bytes);
    return buffers.back().data();
  }
};

/// fp32 FMA throughput of one core: 12 independent 256-bit FMA chains.
__attribute__((target("avx2,fma"))) double fma_peak_one_core() {
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_set1_ps(1.0f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  const int64_t iters = 50'000'000;
  auto t0 = clock_type::now();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& a : acc) a = _mm256_fmadd_ps(a, m, c);
  double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  float sink = 0;
  for (auto& a : acc) sink += _mm256_cvtss_f32(a);
  if (sink == 12345.f) std::puts("");
  return iters * 12.0 * 8 * 2 / s / 1e9;
}

/// Multiply-adds of the optimized graph at one batch, as 2 FLOP each.
double graph_flop(const onnx::graph& g) {
  double f = 0;
  for (const auto& n : g.nodes) {
    auto shp = [&](int v) { return g.values[v].shape; };
    if (n.op == "FusedConv" || n.op == "Conv") {
      auto y = shp(n.outputs[0]), w = shp(n.inputs[1]);
      f += 2.0 * onnx::element_count(y) * w[1] * w[2] * w[3];
    } else if (n.op == "FusedMatMul" || n.op == "MatMul") {
      auto a = shp(n.inputs[0]), y = shp(n.outputs[0]);
      f += 2.0 * onnx::element_count(y) * a.back();
    } else if (n.op == "FusedGemm" || n.op == "Gemm") {
      auto y = shp(n.outputs[0]), a = shp(n.inputs[0]);
      f += 2.0 * onnx::element_count(y) * (n.get_i("transA", 0) ? a[0] : a[1]);
    } else if (n.op == "FusedAttention") {
      auto q = shp(n.inputs[0]);
      f += 4.0 * q[0] * q[1] * q[1] * q[2];
    }
  }
  return f;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: caf-onnx-bench MODEL.onnx --batch B [--threads T] "
                         "[--seconds S] [--max-batch N]\n");
    return 2;
  }
  int64_t batch = 1;
  unsigned threads = 1;
  double seconds = 10;
  int max_batch = 64;
  bool check = false;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--batch") batch = std::atoll(argv[i + 1]);
    else if (f == "--threads") threads = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else if (f == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (f == "--max-batch") max_batch = std::atoi(argv[i + 1]);
    else if (f == "--check") check = std::atoi(argv[i + 1]) != 0;
  }
  onnx::onnx_model_config cfg;
  cfg.model_file = argv[1];
  cfg.config.name = "bench";
  cfg.config.max_batch_size = max_batch;
  cfg.threads = threads;
  auto model = onnx::load_onnx_model(cfg);
  if (!model) {
    std::fprintf(stderr, "caf-onnx-bench: %s\n", model.error().message.c_str());
    return 1;
  }
  // Inputs: ids in [0, 100) for integer inputs (token ids, masks of 1), normal floats otherwise.
  std::mt19937 rng(1);
  std::vector<std::vector<uint8_t>> data;
  executor::batch_view view;
  view.rows = static_cast<uint32_t>(batch);
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& t : model->config.inputs) {
    std::vector<int64_t> s = t.dims;
    s.insert(s.begin(), batch);
    shapes.push_back(s);
    int64_t n = onnx::element_count(s);
    std::vector<uint8_t> bytes(n * element_size(t.dtype));
    if (t.dtype == datatype::int64) {
      auto* p = reinterpret_cast<int64_t*>(bytes.data());
      bool mask = t.name.find("mask") != std::string::npos;
      bool types = t.name.find("type") != std::string::npos;
      for (int64_t i = 0; i < n; ++i) p[i] = mask ? 1 : types ? 0 : static_cast<int64_t>(rng() % 100);
    } else {
      std::normal_distribution<float> d;
      auto* p = reinterpret_cast<float*>(bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
    }
    data.push_back(std::move(bytes));
  }
  for (size_t i = 0; i < data.size(); ++i)
    view.inputs.push_back({model->config.inputs[i].name, model->config.inputs[i].dtype, shapes[i],
                           data[i].data(), data[i].size()});
  auto backend = model->make_instance();
  auto run_once = [&] {
    buffer_writer w;
    auto r = backend->execute(view, w);
    if (auto* e = std::get_if<serving_error>(&r)) {
      std::fprintf(stderr, "caf-onnx-bench: %s\n", e->message.c_str());
      std::exit(1);
    }
  };
  for (int i = 0; i < 3; ++i) run_once();
  double max_diff = -1;
  if (check) {
    auto one_cfg = cfg;
    one_cfg.threads = 1;
    auto one = onnx::load_onnx_model(one_cfg);
    buffer_writer a, b;
    auto ra = backend->execute(view, a);
    auto rb = one->make_instance()->execute(view, b);
    if (ra.index() != 0 || rb.index() != 0 || a.buffers.size() != b.buffers.size()) {
      std::fprintf(stderr, "caf-onnx-bench: --check could not run both instances\n");
      return 1;
    }
    max_diff = 0;
    for (size_t i = 0; i < a.buffers.size(); ++i) {
      auto* x = reinterpret_cast<const float*>(a.buffers[i].data());
      auto* y = reinterpret_cast<const float*>(b.buffers[i].data());
      for (size_t j = 0; j < a.buffers[i].size() / 4; ++j)
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(x[j] - y[j])));
    }
  }
  int64_t runs = 0;
  auto t0 = clock_type::now();
  double elapsed = 0;
  while (elapsed < seconds || runs < 3) {
    run_once();
    ++runs;
    elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  auto g = onnx::import_model(cfg.model_file);
  auto opt = onnx::optimize(*g, shapes);
  double flop = opt ? graph_flop(*opt) / batch : 0;
  double ips = runs * batch / elapsed;
  double peak = fma_peak_one_core() * threads;
  std::printf("{\"engine\":\"caf-serving\",\"batch\":%lld,\"threads\":%u,\"inferences_per_s\":%.3f,"
              "\"ms_per_batch\":%.3f,\"gflop_per_inference\":%.4f,\"gflops\":%.2f,"
              "\"fma_peak_gflops\":%.2f,\"check_max_abs_diff\":%.3g}\n",
              static_cast<long long>(batch), threads, ips, 1000.0 * elapsed / runs, flop / 1e9,
              ips * flop / 1e9, peak, max_diff);
  return 0;
}
