#pragma once
/// The protobuf side of config_parser: for this library's sources only (the
/// generated types stay at the edge, STYLE.md). A loader that builds Triton's
/// ModelConfig another way (from a load request's JSON) converts it here, with
/// the same checks as config.pbtxt.

#include "repository/config_parser.hpp"
#include "repository/model_config.pb.h"

namespace caf_serving::repository {

/// Validates `proto` and converts it, exactly as parse_model_config_full()
/// does after parsing the text.
result<parsed_model_config> convert_model_config(const config::ModelConfig& proto,
                                                 const parse_context& ctx);

} // namespace caf_serving::repository
