#pragma once
/// What a CUDA error means for the executor instance that met it, and what the
/// instance does next. No CUDA here (codes are cudaError_t's documented values,
/// checked against the toolkit's enum where the backend is built): tested
/// without a GPU.
///
/// Two kinds of error:
/// - recoverable: the call failed, the context is fine (out of memory, a bad
///   argument, too many resources for one launch). The instance synchronizes its
///   streams, clears the error, answers the batch with an error and keeps
///   serving.
/// - sticky: the context is corrupted (an illegal address, a kernel that trapped,
///   an uncorrectable ECC error, ...) or there is no usable device or driver;
///   CUDA's documentation: "any further CUDA work will return the same error. To
///   continue using CUDA, the process must be terminated and relaunched." The
///   instance is lost for good: it throws executor::executor_broken, its actor
///   stops, the scheduler stops choosing it and sends its batch elsewhere, and
///   readiness and /metrics (caf_serving_healthy_executors) count it out. GPU
///   instances are not restarted in the process (model_manager), so a model whose
///   every instance is lost answers 503 until it is loaded again.
///
/// Usage (cuda_backend::execute):
///
///     health.ensure_usable();                        // throws once lost
///     try { ... } catch (...) {
///       auto fault = worst_fault({sync(copy_in), sync(compute), ..., cudaGetLastError()});
///       if (auto e = health.after_failure(fault, what)) return *e;  // recoverable
///       // not reached: after_failure threw executor_broken
///     }

#include "core/error.hpp"

#include <initializer_list>
#include <optional>
#include <string>

namespace caf_serving::cuda {

enum class cuda_fault {
  none,        ///< cudaSuccess (or cudaErrorNotReady, which is a status)
  recoverable, ///< this call failed; later work on the context may succeed
  sticky,      ///< the context (or the device) is gone for this process
};

const char* to_string(cuda_fault f);

/// The kind of a cudaError_t value. Codes this build does not know are sticky:
/// an error that cannot be told apart must not be retried forever.
cuda_fault classify_cuda_error(int code);

/// The worst of the faults of `codes` (sticky > recoverable > none).
cuda_fault worst_fault(std::initializer_list<int> codes);

/// Some of cudaError_t's values, named for the classification and its tests.
namespace cuda_code {
inline constexpr int success = 0;
inline constexpr int invalid_value = 1;
inline constexpr int memory_allocation = 2;
inline constexpr int initialization_error = 3;
inline constexpr int cudart_unloading = 4;
inline constexpr int invalid_configuration = 9;
inline constexpr int insufficient_driver = 35;
inline constexpr int devices_unavailable = 46;
inline constexpr int no_device = 100;
inline constexpr int invalid_device = 101;
inline constexpr int ecc_uncorrectable = 214;
inline constexpr int nvlink_uncorrectable = 220;
inline constexpr int contained = 226;
inline constexpr int invalid_resource_handle = 400;
inline constexpr int not_ready = 600;
inline constexpr int illegal_address = 700;
inline constexpr int launch_out_of_resources = 701;
inline constexpr int launch_timeout = 702;
inline constexpr int context_is_destroyed = 709;
inline constexpr int assert_failed = 710;
inline constexpr int hardware_stack_error = 714;
inline constexpr int illegal_instruction = 715;
inline constexpr int misaligned_address = 716;
inline constexpr int invalid_address_space = 717;
inline constexpr int invalid_pc = 718;
inline constexpr int launch_failure = 719;
inline constexpr int tensor_memory_leak = 721;
inline constexpr int system_not_ready = 802;
inline constexpr int system_driver_mismatch = 803;
inline constexpr int mps_client_terminated = 810;
inline constexpr int stream_capture_invalidated = 901;
inline constexpr int external_device = 911;
inline constexpr int unknown = 999;
} // namespace cuda_code

/// Whether one executor instance can still run batches, and the answer to a
/// batch that failed on the device.
class instance_health {
public:
  /// `who` names the instance in messages: "model 'm' on GPU 0".
  explicit instance_health(std::string who) : who_(std::move(who)) {}

  /// Throws executor::executor_broken when an earlier batch met a sticky error;
  /// the instance touches the device no more.
  void ensure_usable() const;

  /// After a batch failed with `fault` (worst_fault of what the streams and
  /// cudaGetLastError said once synchronized): for a recoverable one (or none,
  /// a failure outside CUDA such as cuBLAS refusing an argument), the error the
  /// batch is answered with; for a sticky one, marks the instance lost and
  /// throws executor::executor_broken. `detail` (the failed call, file and line)
  /// goes into the broken message and the log, never into a client's answer.
  serving_error after_failure(cuda_fault fault, const std::string& detail);

  bool lost() const { return !lost_reason_.empty(); }

private:
  std::string who_;
  std::string lost_reason_;
};

} // namespace caf_serving::cuda
