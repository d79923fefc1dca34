#include "server/model_directory.hpp"

#include <algorithm>
#include <cctype>

namespace caf_serving::server {

std::optional<model_control_mode> parse_model_control_mode(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "none")
    return model_control_mode::none;
  if (lower == "explicit")
    return model_control_mode::explicit_control;
  if (lower == "poll")
    return model_control_mode::poll;
  return std::nullopt;
}

std::string_view to_string(model_control_mode mode) {
  switch (mode) {
    case model_control_mode::explicit_control: return "explicit";
    case model_control_mode::poll: return "poll";
    default: return "none";
  }
}

void model_directory::request_load(const std::string& name, load_parameters params,
                                   load_done done) {
  auto shared = std::make_shared<load_parameters>(std::move(params));
  request_load(
    name, [shared]() -> result<load_parameters> { return std::move(*shared); },
    std::move(done));
}

} // namespace caf_serving::server
