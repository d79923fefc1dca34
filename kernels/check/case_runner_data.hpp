/// The runs of the data-movement and reduction cases (check/kernel_cases_data.hpp),
/// made by `make_case_run` for op::permute, strided_copy, gather_axis and reduce.
#pragma once

#include <memory>

#include "check/case_runner.hpp"

namespace caf_serving::kernels {

std::unique_ptr<case_run> make_data_case_run(const kernel_case& c, const case_size& size,
                                             case_run_config config);

} // namespace caf_serving::kernels
