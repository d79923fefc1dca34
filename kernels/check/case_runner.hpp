/// Runs one case of the kernel table (`check/kernel_cases.hpp`) on the device.
///
///   auto run = make_case_run(c, size, {seed, true});
///   run->poison(stream);                 // NaN / 0xFF everywhere the kernel writes
///   run->launch(config, stream);
///   auto result = run->verify();         // against the unfused CPU references
///
/// The benchmarks build the same runs without the reference and only `launch` them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "check/kernel_cases.hpp"

namespace caf_serving::kernels {

/// The launch parameters a case can be run with.
struct launch_config {
  int threads = 0;       ///< threads per block; 0 lets the launcher pick
  int rows_per_warp = 0; ///< attention only: 16 or 32 query rows per warp; 0 = pick
};

/// The configurations the GPU test sweeps for `o`: the default and the extremes.
std::vector<launch_config> launch_configs(op o);

struct check_result {
  bool ok = true;
  std::string detail; ///< on failure: where, what was expected, what came out
  double max_abs_error = 0;
};

/// What one launch moves and computes, for GB/s and TFLOP/s.
struct work_size {
  double bytes = 0;
  double flops = 0;
};

struct case_run_config {
  std::uint64_t seed = 0;
  bool with_reference = true; ///< false for benchmark sizes: skips the CPU reference
};

class case_run {
public:
  virtual ~case_run() = default;
  /// Fills every output with a pattern no kernel writes (NaN; 0xFF bytes).
  virtual void poison(cudaStream_t stream) = 0;
  virtual void launch(launch_config config, cudaStream_t stream) = 0;
  /// Waits for the device, copies the outputs back and compares them.
  virtual check_result verify() = 0;
  virtual work_size work() const = 0;
};

/// Allocates and fills the inputs of `c` at `size` with fresh random values from
/// `config.seed`, and computes the expected outputs with the CPU references.
std::unique_ptr<case_run> make_case_run(const kernel_case& c, const case_size& size,
                                        case_run_config config);

/// "1x3x17" style text of the fields of `size` that `o` uses.
std::string describe(op o, const case_size& size);

/// Whether a CUDA device is usable; `why_not` says what cudaGetDeviceCount returned.
struct device_probe {
  bool available = false;
  std::string why_not;
};
device_probe probe_device();

} // namespace caf_serving::kernels
