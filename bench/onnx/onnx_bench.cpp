/// caf-onnx-bench MODEL.onnx --batch B [--threads T] [--seconds S] [--max-batch N] [--check 1]
///
/// Loads the model as the server does (importer, passes, plan), runs batches of
/// B rows for S seconds after a warm-up, and prints one JSON line: inferences per
/// second, milliseconds per batch, GFLOP per inference, GFLOP/s, and the machine's
/// measured fp32 FMA peak for T cores. With --check 1 it also runs the batch
/// through the reference interpreter (no fusion, no layouts, no Winograd) and
/// reports the relative error of the outputs (the largest over the outputs).
/// --winograd 0 turns Winograd convolutions off; --conv onednn runs the 1x1 and
/// strided convolutions with oneDNN instead of the engine's own kernel; --bands 0
/// splits the other convolutions of one image by channels only (no bands of rows);
/// --layout nhwc keeps convolution tensors NHWC instead of oneDNN's blocked layout;
/// --fuse-patterns 0 leaves LayerNorm, GELU and attention unfused (passes.hpp).
/// With --profile 1 it prints, to stderr, the time of every step of the plan.
/// With --versus "FLAGS" (plan flags, such as "--bands 0 --winograd 0") it loads
/// the model a second time with those flags and runs the two plans batch by
/// batch in turns of --group N batches (default 4; ABBA order) for S seconds:
/// both see the same machine, to within a turn, where separate runs on a shared
/// VM differ by up to 50%. The first batch of a turn, which finds the other
/// plan's data in the caches, is not counted.
/// It prints the median milliseconds per batch of each and the median of the
/// per-pair speed ratios (above 1: the first plan is faster).
/// With --windows N it measures N windows of S seconds, each when a line arrives
/// on stdin, and prints one JSON line per window: a driver (run_bench.py) can
/// then alternate short windows of this engine and of another one, so that the
/// machine's changing speed hits both alike. With --group G too, a window is a
/// turn of G batches whose first is not counted (as with --versus).
/// Every JSON line names the ISA levels it ran at ("onednn_isa", "engine_isa":
/// the best of the CPU, capped by ONEDNN_MAX_CPU_ISA).

#include "onnx/importer.hpp"
#include "onnx_cpu/cpu_level.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/passes.hpp"

#include "cpu_isa.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <immintrin.h>
#include <random>
#include <sstream>
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

/// fp32 FMA throughput of one core with 512-bit vectors: 12 independent chains.
__attribute__((target("avx512f"))) double fma512_peak_one_core() {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_set1_ps(1.0f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  const int64_t iters = 25'000'000;
  auto t0 = clock_type::now();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& a : acc) a = _mm512_fmadd_ps(a, m, c);
  double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  float sink = 0;
  for (auto& a : acc) sink += _mm512_reduce_add_ps(a);
  if (sink == 12345.f) std::puts("");
  return iters * 12.0 * 16 * 2 / s / 1e9;
}

/// fp32 FMA throughput of one core: 12 independent 256-bit FMA chains.
__attribute__((target("avx2,fma"))) double fma256_peak_one_core() {
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

/// The widest FMA the engine runs at (AVX-512 where the CPU has it and
/// ONEDNN_MAX_CPU_ISA does not cap it, else AVX2).
double fma_peak_one_core() {
  namespace kc = caf_serving::kernels::cpu;
  return kc::engine_isa_level() >= kc::isa_level::avx512 ? fma512_peak_one_core()
                                                         : fma256_peak_one_core();
}

/// ,"onednn_isa":"...","engine_isa":"..." for the JSON lines.
std::string isa_fields() {
  const auto& l = onnx::process_cpu_level();
  return ",\"onednn_isa\":\"" + l.onednn_isa + "\",\"engine_isa\":\"" + l.engine_isa + "\"";
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

/// Applies one flag that changes the plan (--profile, --winograd, --conv,
/// --bands, --layout, --fuse-patterns, --chunk-min-rows) to `cfg`; false for any other
/// flag or a bad value.
bool plan_flag(const std::string& f, const std::string& v, onnx::onnx_model_config& cfg) {
  if (f == "--profile" && (v == "0" || v == "1")) cfg.profile = v == "1";
  else if (f == "--winograd" && (v == "0" || v == "1")) cfg.winograd = v == "1";
  else if (f == "--bands" && (v == "0" || v == "1")) cfg.conv_bands = v == "1";
  else if (f == "--fuse-patterns" && (v == "0" || v == "1")) cfg.passes.fuse_patterns = v == "1";
  else if (f == "--chunk-min-rows" && !v.empty() && v.find_first_not_of("0123456789") == v.npos)
    cfg.chunk_min_matmul_rows = std::stoll(v);
  else if (f == "--conv" && (v == "engine" || v == "onednn")) cfg.engine_conv = v == "engine";
  else if (f == "--layout" && (v == "blocked" || v == "nhwc")) cfg.blocked_layout = v == "blocked";
  else return false;
  return true;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: caf-onnx-bench MODEL.onnx --batch B [--threads T] "
                         "[--seconds S] [--max-batch N] [--check 1] [--profile 1] [--winograd 0|1] "
                         "[--conv engine|onednn] [--layout blocked|nhwc] "
                         "[--bands 0|1] [--fuse-patterns 0|1] [--chunk-min-rows N] [--windows N] "
                         "[--versus \"FLAGS\"] [--group N]\n");
    return 2;
  }
  int64_t batch = 1;
  unsigned threads = 1;
  double seconds = 10;
  int max_batch = 64;
  bool check = false;
  int windows = 0;
  std::string versus;
  int group = 0; // --versus: 4 when not given
  onnx::onnx_model_config cfg;
  cfg.model_file = argv[1];
  cfg.config.name = "bench";
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--batch") batch = std::atoll(argv[i + 1]);
    else if (f == "--threads") threads = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else if (f == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (f == "--max-batch") max_batch = std::atoi(argv[i + 1]);
    else if (f == "--check") check = std::atoi(argv[i + 1]) != 0;
    else if (f == "--windows") windows = std::atoi(argv[i + 1]);
    else if (f == "--versus") versus = argv[i + 1];
    else if (f == "--group" && std::atoi(argv[i + 1]) >= 2) group = std::atoi(argv[i + 1]);
    else if (!plan_flag(f, argv[i + 1], cfg)) {
      std::fprintf(stderr, "caf-onnx-bench: unknown flag or value '%s %s'\n", f.c_str(),
                   argv[i + 1]);
      return 2;
    }
  }
  cfg.config.max_batch_size = max_batch;
  cfg.threads = threads;
  onnx::onnx_model_config versus_cfg = cfg;
  if (!versus.empty()) {
    std::istringstream words(versus);
    std::string f, v;
    while (words >> f) {
      if (!(words >> v) || !plan_flag(f, v, versus_cfg)) {
        std::fprintf(stderr, "caf-onnx-bench: --versus takes plan flags with values, such as "
                             "\"--bands 0\"; '%s' is not one\n", versus.c_str());
        return 2;
      }
    }
    versus_cfg.profile = false;
  }
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
  // One batch on `b`; returns its milliseconds (an error ends the bench).
  auto timed = [&](executor::backend& b) {
    buffer_writer w;
    auto t0 = clock_type::now();
    auto r = b.execute(view, w);
    double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    if (auto* e = std::get_if<serving_error>(&r)) {
      std::fprintf(stderr, "caf-onnx-bench: %s\n", e->message.c_str());
      std::exit(1);
    }
    return ms;
  };
  auto run_once = [&] { timed(*backend); };
  // One turn (--group, --versus): `group` batches on `b`; the mean milliseconds
  // of all but the first, which finds the other engine's or plan's data in the
  // caches.
  auto turn = [&](executor::backend& b) {
    timed(b);
    double sum = 0;
    for (int i = 1; i < group; ++i) sum += timed(b);
    return sum / (group - 1);
  };
  for (int i = 0; i < 3; ++i) run_once();
  // --check: the plan's outputs against the reference interpreter (plain
  // kernels, no fusion, no layouts, no Winograd) on the same inputs.
  double rel_error = -1;
  if (check) {
    std::fprintf(stderr, "caf-onnx-bench: checking against the reference interpreter "
                         "(slow: plain loops)...\n");
    auto g = onnx::import_model(cfg.model_file);
    buffer_writer a;
    auto ra = backend->execute(view, a);
    auto plain = onnx::specialize(*g, shapes);
    if (!plain || ra.index() != 0) {
      std::fprintf(stderr, "caf-onnx-bench: --check could not run both\n");
      return 1;
    }
    std::vector<std::string> in;
    for (const auto& d : data)
      in.emplace_back(reinterpret_cast<const char*>(d.data()), d.size());
    auto want = onnx::run_reference_graph(*plain, in);
    rel_error = 0;
    for (size_t i = 0; i < want.size() && i < a.buffers.size(); ++i) {
      auto* x = reinterpret_cast<const float*>(a.buffers[i].data());
      auto* y = reinterpret_cast<const float*>(want[i].data());
      double num = 0, den = 0;
      for (size_t j = 0; j < want[i].size() / 4; ++j) {
        num += (double(x[j]) - y[j]) * (double(x[j]) - y[j]);
        den += double(y[j]) * y[j];
      }
      rel_error = std::max(rel_error, std::sqrt(num / std::max(den, 1e-30)));
    }
  }
  auto g = onnx::import_model(cfg.model_file);
  auto opt = onnx::optimize(*g, shapes);
  double flop = opt ? graph_flop(*opt) / batch : 0;
  // Runs batches for `seconds` (at least 3); returns {runs, elapsed seconds}.
  auto measure = [&] {
    int64_t runs = 0;
    auto t0 = clock_type::now();
    double elapsed = 0;
    while (elapsed < seconds || runs < 3) {
      run_once();
      ++runs;
      elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
    }
    return std::make_pair(runs, elapsed);
  };
  if (windows > 0) {
    double peak = fma_peak_one_core() * threads;
    std::printf("{\"ready\":true,\"gflop_per_inference\":%.4f,\"fma_peak_gflops\":%.2f%s}\n",
                flop / 1e9, peak, isa_fields().c_str());
    std::fflush(stdout);
    char line[64];
    for (int w = 0; w < windows && std::fgets(line, sizeof line, stdin); ++w) {
      double ips = 0;
      if (group > 0) {
        ips = 1000.0 * batch / turn(*backend);
      } else {
        auto [runs, elapsed] = measure();
        ips = runs * batch / elapsed;
      }
      std::printf("{\"window\":%d,\"inferences_per_s\":%.3f,\"gflops\":%.2f%s}\n", w, ips,
                  ips * flop / 1e9, isa_fields().c_str());
      std::fflush(stdout);
    }
    return 0;
  }
  if (!versus.empty()) {
    auto other = onnx::load_onnx_model(versus_cfg);
    if (!other) {
      std::fprintf(stderr, "caf-onnx-bench: %s\n", other.error().message.c_str());
      return 1;
    }
    auto other_backend = other->make_instance();
    if (group == 0)
      group = 4;
    for (int i = 0; i < 3; ++i) timed(*other_backend);
    std::vector<double> mine, theirs, ratio;
    auto t0 = clock_type::now();
    for (int pair = 0;
         pair < 6 || std::chrono::duration<double>(clock_type::now() - t0).count() < seconds;
         ++pair) {
      double a, b;
      if (pair % 2 == 0) {
        a = turn(*backend);
        b = turn(*other_backend);
      } else {
        b = turn(*other_backend);
        a = turn(*backend);
      }
      mine.push_back(a);
      theirs.push_back(b);
      ratio.push_back(b / a);
    }
    std::vector<double> sorted = ratio;
    std::sort(sorted.begin(), sorted.end());
    std::printf("{\"engine\":\"caf-serving\",\"batch\":%lld,\"threads\":%u,\"pairs\":%zu,"
                "\"ms_per_batch\":%.3f,\"versus\":\"%s\",\"versus_ms_per_batch\":%.3f,"
                "\"speed_ratio\":%.4f,\"speed_ratio_q1\":%.4f,\"speed_ratio_q3\":%.4f%s}\n",
                static_cast<long long>(batch), threads, ratio.size(), median_of(mine),
                versus.c_str(), median_of(theirs), median_of(ratio),
                sorted[sorted.size() / 4], sorted[sorted.size() * 3 / 4], isa_fields().c_str());
    if (cfg.profile)
      std::fputs(model->profile_report().c_str(), stderr);
    return 0;
  }
  auto [runs, elapsed] = measure();
  if (cfg.profile)
    std::fputs(model->profile_report().c_str(), stderr);
  double ips = runs * batch / elapsed;
  double peak = fma_peak_one_core() * threads;
  std::printf("{\"engine\":\"caf-serving\",\"batch\":%lld,\"threads\":%u,\"inferences_per_s\":%.3f,"
              "\"ms_per_batch\":%.3f,\"gflop_per_inference\":%.4f,\"gflops\":%.2f,"
              "\"fma_peak_gflops\":%.2f,\"check_relative_error\":%.3g%s}\n",
              static_cast<long long>(batch), threads, ips, 1000.0 * elapsed / runs, flop / 1e9,
              ips * flop / 1e9, peak, rel_error, isa_fields().c_str());
  return 0;
}
