#include "ingress/restricted_api.hpp"

namespace caf_serving::ingress {

namespace {

constexpr std::array<std::string_view, api_group_count> group_names{
  "health",           "metadata",   "inference", "shared-memory", "model-config",
  "model-repository", "statistics", "trace",     "logging"};

std::string all_group_names() {
  std::string s;
  for (auto n : group_names)
    s += (s.empty() ? "" : ", ") + std::string{n};
  return s;
}

} // namespace

std::string_view to_string(api_group g) {
  return group_names[static_cast<size_t>(g)];
}

std::optional<api_group> api_group_from_name(std::string_view name) {
  for (size_t i = 0; i < group_names.size(); ++i)
    if (group_names[i] == name)
      return static_cast<api_group>(i);
  return std::nullopt;
}

std::optional<api_group> api_group_of(const std::vector<std::string>& p) {
  // The OpenAI-compatible endpoints (issue 34): listing models is metadata,
  // the rest is inference.
  if (!p.empty() && p[0] == "v1")
    return p.size() >= 2 && p[1] == "models" ? api_group::metadata : api_group::inference;
  if (p.empty() || p[0] != "v2")
    return std::nullopt;
  if (p.size() == 1)
    return api_group::metadata;
  const std::string& area = p[1];
  if (area == "health")
    return api_group::health;
  if (area == "repository")
    return api_group::model_repository;
  if (area == "systemsharedmemory" || area == "cudasharedmemory")
    return api_group::shared_memory;
  if (area == "trace")
    return api_group::trace;
  if (area == "logging")
    return api_group::logging;
  if (area != "models")
    return std::nullopt;
  if (p.size() == 3 && p[2] == "stats")
    return api_group::statistics;
  if (p.size() < 3)
    return std::nullopt;
  // /v2/models/{m}[/versions/{v}][/{action}...]
  size_t next = p.size() >= 5 && p[3] == "versions" ? 5 : 3;
  if (p.size() == next)
    return api_group::metadata;
  const std::string& action = p[next];
  if (action == "ready")
    return api_group::health;
  if (action == "infer" || action == "generate" || action == "generate_stream")
    return api_group::inference;
  if (action == "config")
    return api_group::model_config;
  if (action == "stats")
    return api_group::statistics;
  if (action == "trace")
    return api_group::trace;
  return std::nullopt;
}

std::optional<std::string> restricted_apis::add(std::string_view spec) {
  const std::string flag = "--http-restricted-api";
  const std::string format = flag + " takes API[,API...]:KEY=VALUE (e.g. "
                             "model-repository,statistics:admin-key=secret), with APIs from: "
                             + all_group_names() + "; got '" + std::string{spec} + "'";
  auto colon = spec.find(':');
  if (colon == std::string_view::npos)
    return format;
  auto eq = spec.find('=', colon + 1);
  if (eq == std::string_view::npos)
    return format;
  std::string_view list = spec.substr(0, colon);
  std::string_view key = spec.substr(colon + 1, eq - colon - 1);
  std::string_view value = spec.substr(eq + 1);
  if (list.empty() || key.empty() || value.empty())
    return format;
  for (char c : key)
    if (c <= ' ' || c >= 127 || c == ':')
      return flag + ": header name '" + std::string{key}
             + "' must be printable ASCII without spaces or ':'";
  std::vector<api_group> groups;
  size_t at = 0;
  while (at <= list.size()) {
    auto comma = list.find(',', at);
    if (comma == std::string_view::npos)
      comma = list.size();
    std::string_view name = list.substr(at, comma - at);
    auto g = api_group_from_name(name);
    if (!g)
      return "unknown restricted api '" + std::string{name} + "' in " + flag + " "
             + std::string{spec} + "; the APIs are " + all_group_names();
    for (auto seen : groups)
      if (seen == *g)
        return "restricted api '" + std::string{name}
               + "' can not be specified in multiple config groups: it is listed twice in "
               + flag + " " + std::string{spec};
    if (by_group_[static_cast<size_t>(*g)])
      return "restricted api '" + std::string{name}
             + "' can not be specified in multiple config groups: an earlier " + flag
             + " restricts it already; give each API one KEY=VALUE";
    groups.push_back(*g);
    at = comma + 1;
  }
  for (auto g : groups)
    by_group_[static_cast<size_t>(g)] = api_restriction{std::string{key}, std::string{value}};
  return std::nullopt;
}

const api_restriction* restricted_apis::find(api_group group) const {
  const auto& r = by_group_[static_cast<size_t>(group)];
  return r ? &*r : nullptr;
}

bool restricted_apis::empty() const {
  for (const auto& r : by_group_)
    if (r)
      return false;
  return true;
}

std::string restricted_apis::refusal(api_group group) const {
  const auto* r = find(group);
  std::string header = r ? r->header : std::string();
  return "This API is restricted, expecting header '" + header + "' (the "
         + std::string{to_string(group)}
         + " endpoints need it, with the value the server was given in "
           "--http-restricted-api)";
}

} // namespace caf_serving::ingress
