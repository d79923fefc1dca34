#pragma once
/// JSON text helpers shared by every part of the engine that writes JSON by hand
/// (KServe bodies, model configuration, statistics, cluster state).

#include <string>
#include <string_view>

namespace caf_serving {

/// Appends `text` as a JSON string literal, quotes included: quotes, backslashes
/// and control characters are escaped, and invalid UTF-8 becomes U+FFFD, so the
/// result is always valid JSON whatever bytes a client or a model sent.
void append_json_string(std::string& out, std::string_view text);

/// `text` as a JSON string literal (see append_json_string).
std::string json_string(std::string_view text);

/// `text` with each invalid UTF-8 byte (overlong forms, surrogates, code points
/// past U+10FFFF, truncated sequences) replaced by U+FFFD, for JSON written by a
/// printer that passes such bytes through (protobuf's).
std::string repair_utf8(std::string_view text);

} // namespace caf_serving
