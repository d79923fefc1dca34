// Micro-benchmarks of the fused kernels, reusing the check table's cases at their
// bench sizes. Each reports GB/s (or TFLOP/s for attention) and the fraction of the
// device's peak, with the peak measured in the same run: a large device-to-device
// copy for bandwidth, a large bf16 GEMM through cuBLAS for matrix throughput.
// Attention is also timed unfused (cuBLAS GEMM, our softmax kernel, cuBLAS GEMM).
//
//   caf_kernels_bench [--smoke] [Google Benchmark flags]
//
// --smoke runs every benchmark once at the smallest sweep size (the CTest entry),
// so the benchmarks cannot rot. Without a CUDA device it prints why and exits 0.
#include <benchmark/benchmark.h>

#include "check/case_runner.hpp"
#include "cuda/convert.hpp"
#include "cuda/cublas_check.hpp"
#include "cuda/softmax.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace caf_serving::kernels;

namespace {

bool smoke = false;
double peak_copy_gbs = 0;     // bytes read + written per second / 1e9
double peak_gemm_tflops = 0;

/// An owned device allocation (the benchmarks' own scratch buffers).
struct device_memory {
  void* ptr = nullptr;
  explicit device_memory(std::size_t bytes) {
    CAF_CUDA_CHECK(cudaMalloc(&ptr, bytes));
  }
  ~device_memory() {
    cudaFree(ptr);
  }
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
};

/// Times `launches` back-to-back runs of `f` with CUDA events; seconds per run.
template <class F>
double time_gpu(cudaStream_t stream, int launches, F&& f) {
  cudaEvent_t start, stop;
  CAF_CUDA_CHECK(cudaEventCreate(&start));
  CAF_CUDA_CHECK(cudaEventCreate(&stop));
  CAF_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < launches; ++i)
    f();
  CAF_CUDA_CHECK(cudaEventRecord(stop, stream));
  CAF_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CAF_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CAF_CUDA_CHECK(cudaEventDestroy(start));
  CAF_CUDA_CHECK(cudaEventDestroy(stop));
  return ms / 1e3 / launches;
}

// Each iteration times this many launches, so that host launch latency hides
// behind the device work instead of being measured.
constexpr int launches_per_iteration = 10;

/// Fills a device buffer of `n` floats with uniform random values in [-1, 1],
/// uploading one random block and repeating it (cheap for gigabyte buffers).
void fill_random_f32(void* dst, std::size_t n) {
  std::vector<float> block(std::min<std::size_t>(n, 1 << 22));
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : block)
    x = dist(rng);
  for (std::size_t done = 0; done < n; done += block.size())
    CAF_CUDA_CHECK(cudaMemcpy(static_cast<float*>(dst) + done, block.data(),
                              std::min(block.size(), n - done) * sizeof(float),
                              cudaMemcpyHostToDevice));
}

void fill_random(void* dst, dtype type, std::size_t n) {
  if (type == dtype::f32)
    return fill_random_f32(dst, n);
  device_memory tmp(n * sizeof(float));
  fill_random_f32(tmp.ptr, n);
  convert_args a;
  a.to = type;
  a.input = tmp.ptr;
  a.output = dst;
  a.count = n;
  launch_convert(a, nullptr);
  CAF_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- peaks ---------------------------------------------------------------------------

/// Measures the copy bandwidth once, before the kernels, so every benchmark can
/// report its fraction of it.
double measure_copy_gbs() {
  std::size_t bytes = smoke ? (32u << 20) : (std::size_t{2} << 30);
  device_memory src(bytes), dst(bytes);
  CAF_CUDA_CHECK(cudaMemset(src.ptr, 1, bytes));
  auto copy = [&] {
    CAF_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, nullptr));
  };
  time_gpu(nullptr, 2, copy);
  return 2.0 * bytes / time_gpu(nullptr, 10, copy) / 1e9;
}

double measure_gemm_tflops() {
  int n = smoke ? 1024 : 8192;
  std::size_t elems = static_cast<std::size_t>(n) * n;
  device_memory a(elems * 2), b(elems * 2), c(elems * 2);
  fill_random(a.ptr, dtype::bf16, elems);
  fill_random(b.ptr, dtype::bf16, elems);
  cublasHandle_t handle;
  CAF_CUDA_CHECK(cublasCreate(&handle));
  float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    CAF_CUDA_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.ptr,
                                CUDA_R_16BF, n, b.ptr, CUDA_R_16BF, n, &beta, c.ptr,
                                CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  time_gpu(nullptr, 3, gemm);
  double s = time_gpu(nullptr, smoke ? 2 : 10, gemm);
  CAF_CUDA_CHECK(cublasDestroy(handle));
  return 2.0 * n * n * static_cast<double>(n) / s / 1e12;
}

// ---- the table's cases ---------------------------------------------------------------

/// Sets GB/s, TFLOP/s and their fractions of the measured peaks from the device
/// time the loop accumulated (rates computed here, not by the library, so they
/// are certainly per device second).
void report(benchmark::State& state, work_size w, double device_seconds) {
  double runs = static_cast<double>(state.iterations()) * launches_per_iteration;
  if (device_seconds <= 0)
    return;
  double gbs = w.bytes * runs / device_seconds / 1e9;
  state.counters["GB/s"] = gbs;
  state.counters["frac_copy_peak"] = peak_copy_gbs > 0 ? gbs / peak_copy_gbs : 0;
  if (w.flops > 0) {
    double tflops = w.flops * runs / device_seconds / 1e12;
    state.counters["TFLOP/s"] = tflops;
    state.counters["frac_gemm_peak"] = peak_gemm_tflops > 0 ? tflops / peak_gemm_tflops : 0;
  }
}

void bm_case(benchmark::State& state, const kernel_case* c, case_size size,
             launch_config config) {
  // Built once per case and size (Google Benchmark calls this for every repetition).
  static std::map<std::string, std::unique_ptr<case_run>> runs;
  auto& run = runs[c->name + "/" + describe(c->operation, size)];
  if (!run)
    run = make_case_run(*c, size, {1234, false});
  cudaStream_t stream = nullptr;
  run->launch(config, stream);
  double total = 0;
  for (auto _ : state) {
    double t = time_gpu(stream, launches_per_iteration, [&] { run->launch(config, stream); });
    state.SetIterationTime(t);
    total += t * launches_per_iteration;
  }
  report(state, run->work(), total);
}

/// The unfused path the fused attention replaces: S = scale·Q Kᵀ (cuBLAS, fp16/bf16
/// out), P = softmax(S) (our kernel), O = P V (cuBLAS), over [batch·heads] strided
/// batches. Inputs are random; the work counted is the same as the fused kernel's.
void bm_attention_unfused(benchmark::State& state, const kernel_case* c, case_size s) {
  auto batches = static_cast<int>(s.batch * s.heads);
  auto seq = static_cast<long long>(s.seq), d = static_cast<long long>(c->head_dim);
  std::size_t qkv = batches * seq * d, scores = batches * seq * seq;
  device_memory q(qkv * 2), k(qkv * 2), v(qkv * 2), o(qkv * 2), sc(scores * 2), p(scores * 2);
  fill_random(q.ptr, c->type, qkv);
  fill_random(k.ptr, c->type, qkv);
  fill_random(v.ptr, c->type, qkv);
  auto cuda_type = c->type == dtype::f16 ? CUDA_R_16F : CUDA_R_16BF;
  cublasHandle_t handle;
  CAF_CUDA_CHECK(cublasCreate(&handle));
  float scale = 1.0f / std::sqrt(static_cast<float>(d)), one = 1.0f, zero = 0.0f;
  auto s_int = static_cast<int>(seq), d_int = static_cast<int>(d);
  auto unfused = [&] {
    // Column-major view: Sᵀ[seq_k, seq_q] = K · Qᵀ.
    CAF_CUDA_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, s_int, s_int, d_int, &scale, k.ptr, cuda_type, d_int,
      seq * d, q.ptr, cuda_type, d_int, seq * d, &zero, sc.ptr, cuda_type, s_int, seq * seq,
      batches, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    softmax_args sm;
    sm.type = c->type;
    sm.input = sc.ptr;
    sm.output = p.ptr;
    sm.rows = static_cast<std::size_t>(batches) * s.seq;
    sm.cols = s.seq;
    launch_softmax(sm, nullptr);
    // Oᵀ[d, seq_q] = Vᵀ · Pᵀ.
    CAF_CUDA_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, d_int, s_int, s_int, &one, v.ptr, cuda_type, d_int,
      seq * d, p.ptr, cuda_type, s_int, seq * seq, &zero, o.ptr, cuda_type, d_int, seq * d,
      batches, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  unfused();
  double total = 0;
  for (auto _ : state) {
    double t = time_gpu(nullptr, launches_per_iteration, unfused);
    state.SetIterationTime(t);
    total += t * launches_per_iteration;
  }
  CAF_CUDA_CHECK(cublasDestroy(handle));
  double flops = 4.0 * batches * static_cast<double>(seq * seq * d);
  report(state, {4.0 * qkv * 2, flops}, total);
}

void register_benchmarks() {
  for (const auto& c : kernel_cases()) {
    std::vector<case_size> sizes = c.bench;
    if (smoke) // the largest checked size: quick, and the same code path
      sizes = {c.sweep.back()};
    if (sizes.empty())
      continue;
    for (const auto& size : sizes) {
      std::string name = c.name + "/" + describe(c.operation, size);
      auto* b = benchmark::RegisterBenchmark(name.c_str(), bm_case, &c, size, launch_config{});
      b->UseManualTime()->Unit(benchmark::kMicrosecond);
      if (smoke)
        b->Iterations(1);
      // Other block sizes for the memory-bound kernels, to check the default's choice.
      std::vector<int> block_sizes;
      if (c.operation == op::softmax)
        block_sizes = {256, 512};
      else if (c.operation == op::add_layer_norm)
        block_sizes = {64, 256};
      else if (c.operation == op::epilogue || c.operation == op::convert)
        block_sizes = {512};
      if (smoke)
        block_sizes.clear();
      for (int threads : block_sizes) {
        std::string variant = c.name + " t" + std::to_string(threads) + "/"
                              + describe(c.operation, size);
        auto* v = benchmark::RegisterBenchmark(variant.c_str(), bm_case, &c, size,
                                               launch_config{threads, 0});
        v->UseManualTime()->Unit(benchmark::kMicrosecond);
      }
      if (c.operation == op::attention && !c.padded) // both tilings, to pick the default
        for (int rows : {16, 32}) {
          std::string variant = c.name + " rows" + std::to_string(rows) + "/"
                                + describe(c.operation, size);
          auto* v = benchmark::RegisterBenchmark(variant.c_str(), bm_case, &c, size,
                                                 launch_config{0, rows});
          v->UseManualTime()->Unit(benchmark::kMicrosecond);
          if (smoke)
            v->Iterations(1);
        }
      if (c.operation == op::attention && !c.padded) {
        std::string unfused = "attention unfused" + c.name.substr(std::strlen("attention"))
                              + "/" + describe(c.operation, size);
        auto* u = benchmark::RegisterBenchmark(unfused.c_str(), bm_attention_unfused, &c, size);
        u->UseManualTime()->Unit(benchmark::kMicrosecond);
        if (smoke)
          u->Iterations(1);
      }
    }
  }
}

} // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0)
      smoke = true;
    else
      args.push_back(argv[i]);
  }
  auto probe = probe_device();
  if (!probe.available) {
    std::printf("SKIPPED: %s\n", probe.why_not.c_str());
    return 77; // CTest's SKIP_RETURN_CODE: skipped, not passed
  }
  try {
    cudaDeviceProp prop{};
    CAF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    peak_copy_gbs = measure_copy_gbs();
    peak_gemm_tflops = measure_gemm_tflops();
    std::printf("device: %s, %d SMs; measured peaks: copy %.0f GB/s (read + write), "
                "bf16 GEMM %.0f TFLOP/s\n",
                prop.name, prop.multiProcessorCount, peak_copy_gbs, peak_gemm_tflops);
    benchmark::AddCustomContext("device", prop.name);
    benchmark::AddCustomContext("peak_copy_GB/s", std::to_string(peak_copy_gbs));
    benchmark::AddCustomContext("peak_gemm_bf16_TFLOP/s", std::to_string(peak_gemm_tflops));
    register_benchmarks();
    int n = static_cast<int>(args.size());
    benchmark::Initialize(&n, args.data());
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel benchmarks failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
