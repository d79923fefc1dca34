#pragma once
/// Triton's --http-restricted-api API_LIST:KEY=VALUE: groups of endpoints that
/// answer only requests carrying header KEY with value VALUE; a request
/// without it gets 403 and Triton's "This API is restricted, expecting header
/// 'KEY'". The rest of the API stays open.
///
/// Usage:
///
///   ingress::restricted_apis r;
///   if (auto err = r.add("model-repository,statistics:admin-key=secret"))
///     fail(*err);                              // at start-up, a usage error
///   ...
///   if (auto g = ingress::api_group_of(path_parts))
///     if (const auto* need = r.find(*g)) ...    // check header need->header
///
/// The group of a request is decided from its path alone, before routing, so
/// endpoints added later (shared memory, trace, logging) are covered by the
/// group their path prefix names.

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::ingress {

/// Triton's API groups (its RestrictedCategory), in Triton's order.
enum class api_group {
  health,
  metadata,
  inference,
  shared_memory,
  model_config,
  model_repository,
  statistics,
  trace,
  logging,
};

inline constexpr size_t api_group_count = 9;

/// "health", "metadata", "inference", "shared-memory", "model-config",
/// "model-repository", "statistics", "trace", "logging".
std::string_view to_string(api_group g);

/// The group named `name` (Triton's names, exactly), if any.
std::optional<api_group> api_group_from_name(std::string_view name);

/// The group of the endpoint at `path_parts` (the URL path split at '/',
/// without the query string), as Triton assigns them: /v2 is metadata,
/// /v2/health/... and /v2/models/{m}/ready are health, /v2/models/{m} is
/// metadata, .../infer (and generate) inference, .../config model-config,
/// .../stats and /v2/models/stats statistics, /v2/repository/... the model
/// repository, /v2/systemsharedmemory/... and /v2/cudasharedmemory/...
/// shared memory, /v2/trace/... and .../trace/setting trace, /v2/logging
/// logging. Nothing for other paths (they are 404s) and /metrics.
std::optional<api_group> api_group_of(const std::vector<std::string>& path_parts);

/// The header a restricted group requires.
struct api_restriction {
  std::string header;
  std::string value;
};

/// Which groups are restricted, and by what header.
class restricted_apis {
public:
  /// Adds one --http-restricted-api value, "API[,API...]:KEY=VALUE". Returns
  /// why it is wrong, naming the flag: a missing ':' or '=', an empty list,
  /// key or value, an unknown API (Triton's "unknown restricted api 'x'"), or
  /// an API restricted twice (Triton's "api 'x' can not be specified in
  /// multiple config groups"). Nothing is added when it fails.
  std::optional<std::string> add(std::string_view spec);

  /// The restriction of `group`, or null when it is open.
  const api_restriction* find(api_group group) const;

  bool empty() const;

  /// Whether a request whose header `header` (if any) has `value` may use
  /// `group`. Header names compare without case; the value exactly.
  template <class HeaderLookup>
  bool allows(api_group group, HeaderLookup&& lookup) const {
    const auto* r = find(group);
    if (r == nullptr)
      return true;
    std::optional<std::string> got = lookup(r->header);
    return got && *got == r->value;
  }

  /// Triton's 403 message for `group`.
  std::string refusal(api_group group) const;

private:
  std::array<std::optional<api_restriction>, api_group_count> by_group_;
};

} // namespace caf_serving::ingress
