#pragma once
/// HTTP body compression with zlib: Content-Encoding of requests,
/// Accept-Encoding and Content-Encoding of responses.

#include "core/error.hpp"

#include <cstddef>
#include <string>
#include <string_view>

namespace caf_serving::ingress {

enum class content_encoding { identity, gzip, deflate };

/// "identity", "gzip" or "deflate".
std::string_view to_string(content_encoding e);

/// Parses a Content-Encoding header ("", "identity", "gzip", "x-gzip",
/// "deflate"; case-insensitive). 400 for anything else, naming what is
/// supported (HTTP would say 415; core/error.hpp has no such status).
result<content_encoding> parse_content_encoding(std::string_view header);

/// Inflates `body`. gzip: the gzip format. deflate: the zlib format, as HTTP
/// defines "deflate", or raw deflate when the zlib header is missing (some
/// clients send that). identity: a copy. `max_output` is enforced while
/// inflating, so a decompression bomb stops at max_output bytes with a 400 (Triton's);
/// corrupt or truncated data is a 400.
result<std::string> decompress(std::string_view body, content_encoding encoding,
                               size_t max_output);

/// Deflates `body` as gzip or zlib ("deflate"), at zlib level 1: for a
/// response on the latency path speed matters more than the last few percent.
/// identity: a copy.
std::string compress(std::string_view body, content_encoding encoding);

/// Picks the response encoding from an Accept-Encoding header: the acceptable
/// coding (q > 0) with the highest q-value, ties going to gzip, then deflate,
/// then identity; "*" stands for every coding not named. identity whenever
/// nothing else is acceptable, including an empty or absent header.
content_encoding choose_encoding(std::string_view accept_encoding);

} // namespace caf_serving::ingress
