#include "cuda/cuda_errors.hpp"

#include "executor/backend.hpp"

#include <algorithm>
#include <iostream>

namespace caf_serving::cuda {

const char* to_string(cuda_fault f) {
  switch (f) {
    case cuda_fault::none: return "none";
    case cuda_fault::recoverable: return "recoverable";
    case cuda_fault::sticky: return "sticky";
  }
  return "?";
}

cuda_fault classify_cuda_error(int code) {
  using namespace cuda_code;
  switch (code) {
    case success:
    case not_ready:
      return cuda_fault::none;
    // The context is corrupted: CUDA documents each of these as leaving the
    // process "in an inconsistent state" where "any further CUDA work will
    // return the same error".
    case ecc_uncorrectable:
    case nvlink_uncorrectable:
    case contained:
    case illegal_address:
    case launch_timeout:
    case assert_failed:
    case hardware_stack_error:
    case illegal_instruction:
    case misaligned_address:
    case invalid_address_space:
    case invalid_pc:
    case launch_failure:
    case tensor_memory_leak:
    case mps_client_terminated:
    case external_device:
    // No usable device, driver or context: nothing later can succeed either.
    case initialization_error:
    case cudart_unloading:
    case insufficient_driver:
    case devices_unavailable:
    case no_device:
    case invalid_device:
    case context_is_destroyed:
    case system_not_ready:
    case system_driver_mismatch:
    case unknown:
      return cuda_fault::sticky;
    default:
      break;
  }
  // The runtime's other errors below 1000 report a call that failed on a
  // working context (an argument, a limit, a capture misuse); above that are
  // values this build does not know.
  return code > 0 && code < 1000 ? cuda_fault::recoverable : cuda_fault::sticky;
}

cuda_fault worst_fault(std::initializer_list<int> codes) {
  cuda_fault worst = cuda_fault::none;
  for (int c : codes)
    worst = std::max(worst, classify_cuda_error(c));
  return worst;
}

void instance_health::ensure_usable() const {
  if (lost())
    throw executor::executor_broken(who_ + " is unusable since an earlier batch: " + lost_reason_);
}

serving_error instance_health::after_failure(cuda_fault fault, const std::string& detail) {
  if (fault == cuda_fault::sticky) {
    lost_reason_ = "a sticky CUDA error (" + detail
                   + "); the device context is lost for this process, so the instance runs no "
                     "more batches: restart the server to use this GPU again";
    throw executor::executor_broken(who_ + ": " + lost_reason_);
  }
  std::cerr << "caf-serving: " << who_ << ": a batch failed on the device and the instance "
            << "recovered (streams synchronized, error cleared): " << detail << std::endl;
  return {status_code::internal,
          who_ + " failed to run a batch on the device; the instance recovered and keeps "
                 "serving; the server log has the details",
          failure_reason::internal};
}

} // namespace caf_serving::cuda
