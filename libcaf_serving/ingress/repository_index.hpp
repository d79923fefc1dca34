#pragma once
/// POST /v2/repository/index: its optional JSON body ({"ready": true} lists
/// only the ready models) and the JSON array it answers with, Triton's rows
/// ("name", then "version", "state" and "reason" where they apply).

#include "core/error.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::ingress {

/// What a repository index request asks for.
struct index_request {
  /// Only the rows whose state is READY.
  bool ready_only = false;
};

/// Parses the body of POST /v2/repository/index. An empty body (or one of
/// white space only) asks for everything. Every failure is a 400 whose message
/// begins with Triton's text where Triton's tests match on it ("Invalid value
/// for 'ready': expected a boolean"), however deep the wrong value nests.
result<index_request> parse_index_request(std::string_view body);

/// One row of the index, as the model manager reports it.
struct index_entry {
  std::string name;
  std::string version; ///< omitted when empty (nothing served)
  std::string state;   ///< READY, UNAVAILABLE, LOADING ...
  std::string reason;  ///< omitted when empty
};

/// The JSON array of `rows`; with `request.ready_only`, only the READY ones.
std::string serialize_index(const std::vector<index_entry>& rows, const index_request& request);

} // namespace caf_serving::ingress
