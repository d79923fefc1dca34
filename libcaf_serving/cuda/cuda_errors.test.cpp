#include "cuda/cuda_errors.hpp"

#include "executor/backend.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;
using namespace caf_serving::cuda;

TEST_CASE("errors that corrupt the context are sticky") {
  using namespace cuda_code;
  for (int code : {illegal_address, launch_failure, misaligned_address, illegal_instruction,
                   invalid_pc, invalid_address_space, hardware_stack_error, assert_failed,
                   launch_timeout, ecc_uncorrectable, nvlink_uncorrectable, contained,
                   tensor_memory_leak, external_device, mps_client_terminated}) {
    CAPTURE(code);
    CHECK(classify_cuda_error(code) == cuda_fault::sticky);
  }
}

TEST_CASE("no usable device, driver or context is sticky too; so is an unknown code") {
  using namespace cuda_code;
  for (int code : {initialization_error, cudart_unloading, insufficient_driver,
                   devices_unavailable, no_device, invalid_device, context_is_destroyed,
                   system_not_ready, system_driver_mismatch, unknown, 1234, -1}) {
    CAPTURE(code);
    CHECK(classify_cuda_error(code) == cuda_fault::sticky);
  }
}

TEST_CASE("a call that failed on a working context is recoverable") {
  using namespace cuda_code;
  for (int code : {invalid_value, memory_allocation, invalid_configuration,
                   launch_out_of_resources, invalid_resource_handle,
                   stream_capture_invalidated}) {
    CAPTURE(code);
    CHECK(classify_cuda_error(code) == cuda_fault::recoverable);
  }
  CHECK(classify_cuda_error(cuda_code::success) == cuda_fault::none);
  CHECK(classify_cuda_error(cuda_code::not_ready) == cuda_fault::none);
}

TEST_CASE("the worst fault among what the streams said decides") {
  using namespace cuda_code;
  CHECK(worst_fault({success, success}) == cuda_fault::none);
  CHECK(worst_fault({success, memory_allocation, success}) == cuda_fault::recoverable);
  // The out-of-memory copy and the kernel that hit an illegal address: lost.
  CHECK(worst_fault({memory_allocation, illegal_address}) == cuda_fault::sticky);
  CHECK(worst_fault({}) == cuda_fault::none);
}

TEST_CASE("a recoverable failure answers the batch; the instance keeps serving") {
  instance_health h("model 'm' on GPU 0");
  auto e = h.after_failure(cuda_fault::recoverable,
                           "cudaMalloc failed at x.cpp:1: cudaErrorMemoryAllocation");
  CHECK(e.status == status_code::internal);
  CHECK(e.message.find("model 'm' on GPU 0") != std::string::npos);
  CHECK(e.message.find("recovered") != std::string::npos);
  // What the failed call was goes to the log, not to the client.
  CHECK(e.message.find("x.cpp") == std::string::npos);
  CHECK(e.message.find("cudaMalloc") == std::string::npos);
  CHECK_FALSE(h.lost());
  CHECK_NOTHROW(h.ensure_usable());
  // A failure with no CUDA error behind it (cuBLAS refused an argument) too.
  CHECK(h.after_failure(cuda_fault::none, "cublasLtMatmul: invalid value").status
        == status_code::internal);
  CHECK_NOTHROW(h.ensure_usable());
}

TEST_CASE("a sticky failure breaks the executor, and every later batch too") {
  instance_health h("model 'm' on GPU 1");
  try {
    h.after_failure(cuda_fault::sticky, "cudaStreamSynchronize: cudaErrorIllegalAddress");
    FAIL("a sticky fault must throw executor_broken");
  } catch (const executor::executor_broken& e) {
    std::string what = e.what();
    CHECK(what.find("model 'm' on GPU 1") != std::string::npos);
    CHECK(what.find("cudaErrorIllegalAddress") != std::string::npos);
    CHECK(what.find("restart the server") != std::string::npos);
  }
  CHECK(h.lost());
  // The next batch does not touch the device: it breaks at once.
  CHECK_THROWS_AS(h.ensure_usable(), executor::executor_broken);
  CHECK_THROWS_AS(h.ensure_usable(), executor::executor_broken);
}
