/// Runs the element-wise cases of the kernel table (binary, unary, Where, Cast) on
/// the device against `cpu/reference_elementwise.hpp`; `make_case_run` calls these.
#pragma once

#include <memory>
#include <string>

#include "check/case_runner.hpp"

namespace caf_serving::kernels {

std::unique_ptr<case_run> make_elementwise_run(const kernel_case& c, const case_size& size,
                                               case_run_config config);

/// "b2 h12 s128" style text of the size fields an element-wise case uses (those not 1).
std::string describe_elementwise(const case_size& size);

} // namespace caf_serving::kernels
