#pragma once
/// Building and reading KServe tensor bytes and bodies in tests: raw
/// little-endian values, BYTES elements (4-byte length + bytes), FP16, the
/// binary tensor extension's split, and gzip/deflate bodies.
///
/// Usage:
///
///   std::string data = support::to_bytes(std::vector<float>{1, 2, 3});
///   auto body = support::split_binary(response);       // JSON header + binary tail
///   auto values = support::from_bytes<float>(body.binary.substr(0, 12));
///   std::string compressed = support::gzip(json);

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::support {

struct http_response;

template <class T>
std::string to_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty())
    std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <class T>
std::vector<T> from_bytes(std::string_view bytes) {
  if (bytes.size() % sizeof(T) != 0)
    throw std::runtime_error(std::to_string(bytes.size()) + " bytes are not a whole number of "
                             + std::to_string(sizeof(T)) + "-byte elements");
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty())
    std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

/// BYTES elements as the binary extension carries them.
std::string bytes_elements(const std::vector<std::string>& elements);
/// The elements of BYTES tensor data; throws when a length runs past the end.
std::vector<std::string> parse_bytes_elements(std::string_view data);

/// IEEE half precision, round to nearest even (no NaN payloads needed here).
uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);

/// A response body split at its Inference-Header-Content-Length (the whole
/// body is JSON when the header is absent).
struct binary_body {
  std::string json;
  std::string binary;
};
binary_body split_binary(const http_response& response);

/// gzip format (Content-Encoding: gzip).
std::string gzip(std::string_view data);
/// zlib format (Content-Encoding: deflate, as HTTP defines it).
std::string deflate(std::string_view data);
/// Inflates gzip or zlib data (detected from the header); throws on bad data.
std::string inflate(std::string_view data);

} // namespace caf_serving::support
