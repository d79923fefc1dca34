#pragma once
/// The JSON bodies of KServe v2's model endpoints, shaped as Triton shapes
/// them so that Triton's clients and tools (perf_analyzer, model_analyzer)
/// read them unchanged:
///
/// - GET /v2/models/{m}/config: the configuration printed the way Triton
///   prints its ModelConfig proto: proto field names, every field present
///   (defaults included), enums by name, int64/uint64 values as strings:
///
///       {"name":"simple","platform":"","backend":"builtin",
///        "version_policy":{"latest":{"num_versions":1}},"max_batch_size":8,
///        "input":[{"name":"INPUT0","data_type":"TYPE_INT32","dims":["16"]}],...}
///
/// - GET /v2/models/{m}: the model metadata, with KServe datatype names and
///   the batch dimension as a leading -1 when max_batch_size > 0:
///
///       {"name":"simple","versions":["1"],"platform":"builtin",
///        "inputs":[{"name":"INPUT0","datatype":"INT32","shape":[-1,16]}],
///        "outputs":[...]}

#include "core/json.hpp"
#include "core/model_config.hpp"
#include "repository/config_parser.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace caf_serving::repository {

/// The /config body, with the version policy and label files that
/// config.pbtxt gave.
std::string model_config_json(const parsed_model_config& parsed);

/// The /config body of a model_config alone: version_policy is `specific`
/// when config.specific_versions is non-empty and `latest { 1 }` otherwise;
/// no label files.
std::string model_config_json(const model_config& config);

/// The metadata body. `versions` are the served versions. `platform` is the
/// config's platform, or its backend when the platform is empty (Triton's
/// clients read this field to tell what kind of model it is).
std::string model_metadata_json(const model_config& config,
                                const std::vector<int64_t>& versions);

} // namespace caf_serving::repository
