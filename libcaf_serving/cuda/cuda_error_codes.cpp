/// The named codes of cuda_errors.hpp are cudaError_t's values in the toolkit
/// this backend is built with; a toolkit that renumbers them fails the build.

#include "cuda/cuda_errors.hpp"

#include <cuda_runtime_api.h>

namespace caf_serving::cuda::cuda_code {

#define CAF_SERVING_SAME_CODE(ours, theirs) \
  static_assert(ours == static_cast<int>(theirs), #ours " is not " #theirs)
CAF_SERVING_SAME_CODE(success, cudaSuccess);
CAF_SERVING_SAME_CODE(invalid_value, cudaErrorInvalidValue);
CAF_SERVING_SAME_CODE(memory_allocation, cudaErrorMemoryAllocation);
CAF_SERVING_SAME_CODE(initialization_error, cudaErrorInitializationError);
CAF_SERVING_SAME_CODE(cudart_unloading, cudaErrorCudartUnloading);
CAF_SERVING_SAME_CODE(invalid_configuration, cudaErrorInvalidConfiguration);
CAF_SERVING_SAME_CODE(insufficient_driver, cudaErrorInsufficientDriver);
CAF_SERVING_SAME_CODE(devices_unavailable, cudaErrorDevicesUnavailable);
CAF_SERVING_SAME_CODE(no_device, cudaErrorNoDevice);
CAF_SERVING_SAME_CODE(invalid_device, cudaErrorInvalidDevice);
CAF_SERVING_SAME_CODE(ecc_uncorrectable, cudaErrorECCUncorrectable);
CAF_SERVING_SAME_CODE(nvlink_uncorrectable, cudaErrorNvlinkUncorrectable);
CAF_SERVING_SAME_CODE(contained, cudaErrorContained);
CAF_SERVING_SAME_CODE(invalid_resource_handle, cudaErrorInvalidResourceHandle);
CAF_SERVING_SAME_CODE(not_ready, cudaErrorNotReady);
CAF_SERVING_SAME_CODE(illegal_address, cudaErrorIllegalAddress);
CAF_SERVING_SAME_CODE(launch_out_of_resources, cudaErrorLaunchOutOfResources);
CAF_SERVING_SAME_CODE(launch_timeout, cudaErrorLaunchTimeout);
CAF_SERVING_SAME_CODE(context_is_destroyed, cudaErrorContextIsDestroyed);
CAF_SERVING_SAME_CODE(assert_failed, cudaErrorAssert);
CAF_SERVING_SAME_CODE(hardware_stack_error, cudaErrorHardwareStackError);
CAF_SERVING_SAME_CODE(illegal_instruction, cudaErrorIllegalInstruction);
CAF_SERVING_SAME_CODE(misaligned_address, cudaErrorMisalignedAddress);
CAF_SERVING_SAME_CODE(invalid_address_space, cudaErrorInvalidAddressSpace);
CAF_SERVING_SAME_CODE(invalid_pc, cudaErrorInvalidPc);
CAF_SERVING_SAME_CODE(launch_failure, cudaErrorLaunchFailure);
CAF_SERVING_SAME_CODE(tensor_memory_leak, cudaErrorTensorMemoryLeak);
CAF_SERVING_SAME_CODE(system_not_ready, cudaErrorSystemNotReady);
CAF_SERVING_SAME_CODE(system_driver_mismatch, cudaErrorSystemDriverMismatch);
CAF_SERVING_SAME_CODE(mps_client_terminated, cudaErrorMpsClientTerminated);
CAF_SERVING_SAME_CODE(stream_capture_invalidated, cudaErrorStreamCaptureInvalidated);
CAF_SERVING_SAME_CODE(external_device, cudaErrorExternalDevice);
CAF_SERVING_SAME_CODE(unknown, cudaErrorUnknown);
#undef CAF_SERVING_SAME_CODE

} // namespace caf_serving::cuda::cuda_code
