// The GPU check of every kernel: each case of the table (check/kernel_cases.hpp), at
// every sweep size and launch configuration, with fresh random inputs per size and
// the outputs poisoned before every launch, against the unfused CPU references.
//
// Without a CUDA device it prints why and exits 0 (the `gpu` label lets CI skip it).
// CAF_KERNELS_SEED=<n> repeats a failing run's inputs; the seed is printed at start.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "check/case_runner.hpp"
#include "cuda/attention.hpp"
#include "cuda/check.hpp"
#include "cuda/softmax_top_k.hpp"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>

using namespace caf_serving::kernels;

namespace {

std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    if (const char* env = std::getenv("CAF_KERNELS_SEED"))
      return static_cast<std::uint64_t>(std::strtoull(env, nullptr, 10));
    return (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }();
  return seed;
}

} // namespace

TEST_CASE("every kernel case matches the unfused references at every size and config") {
  cudaStream_t stream;
  CAF_CUDA_CHECK(cudaStreamCreate(&stream));
  std::uint64_t seed = base_seed();
  for (const auto& c : kernel_cases()) {
    double worst = 0;
    int runs = 0;
    for (const auto& size : c.sweep) {
      auto run = make_case_run(c, size, {seed++, true});
      for (auto config : launch_configs(c.operation)) {
        run->poison(stream);
        run->launch(config, stream);
        auto result = run->verify();
        ++runs;
        worst = std::max(worst, result.max_abs_error);
        INFO(c.name, " at ", describe(c.operation, size), " with ", config.threads,
             " threads, ", config.rows_per_warp, " rows per warp (0 = default), seed ",
             seed - 1, ": ", result.detail);
        CHECK(result.ok);
      }
    }
    std::printf("  %-40s %3d runs, max abs error %.3g (tolerance %.3g + %.3g rel: %s)\n",
                c.name.c_str(), runs, worst, c.tol.abs, c.tol.rel, c.why.c_str());
  }
  CAF_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("launchers reject what they cannot do with a message that says so") {
  attention_args a;
  a.head_dim = 96;
  CHECK_THROWS_WITH_AS(launch_attention(a, nullptr),
                       doctest::Contains("head dimension 96 is not supported"),
                       std::invalid_argument);
  softmax_top_k_args t;
  t.cols = 10;
  t.k = 11;
  CHECK_THROWS_AS(launch_softmax_top_k(t, nullptr), std::invalid_argument);
}

int main(int argc, char** argv) {
  auto probe = probe_device();
  if (!probe.available) {
    std::printf("SKIPPED: %s\n", probe.why_not.c_str());
    return 77; // CTest's SKIP_RETURN_CODE: skipped, not passed
  }
  cudaDeviceProp prop{};
  CAF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d), seed %llu\n", prop.name, prop.major, prop.minor,
              static_cast<unsigned long long>(base_seed()));
  doctest::Context context(argc, argv);
  return context.run();
}
