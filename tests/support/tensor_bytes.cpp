#include "support/tensor_bytes.hpp"

#include "support/http_client.hpp"

#include <zlib.h>

namespace caf_serving::support {

std::string bytes_elements(const std::vector<std::string>& elements) {
  std::string out;
  for (const auto& e : elements) {
    auto len = static_cast<uint32_t>(e.size());
    char buf[4];
    std::memcpy(buf, &len, 4);
    out.append(buf, 4);
    out += e;
  }
  return out;
}

std::vector<std::string> parse_bytes_elements(std::string_view data) {
  std::vector<std::string> out;
  while (!data.empty()) {
    if (data.size() < 4)
      throw std::runtime_error("BYTES data ends inside a 4-byte length");
    uint32_t len;
    std::memcpy(&len, data.data(), 4);
    data.remove_prefix(4);
    if (len > data.size())
      throw std::runtime_error("BYTES element of length " + std::to_string(len)
                               + " runs past the end of the data");
    out.emplace_back(data.substr(0, len));
    data.remove_prefix(len);
  }
  return out;
}

uint16_t float_to_half(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  uint32_t sign = (bits >> 16) & 0x8000;
  int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
  uint32_t mantissa = bits & 0x7FFFFF;
  if (((bits >> 23) & 0xFF) == 0xFF)
    return static_cast<uint16_t>(sign | 0x7C00 | (mantissa ? 0x200 : 0));
  if (exponent >= 31)
    return static_cast<uint16_t>(sign | 0x7C00);
  if (exponent <= 0) {
    if (exponent < -10)
      return static_cast<uint16_t>(sign);
    mantissa |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1)))
      ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
    ++half; // may carry into the exponent, which is the right rounding
  return static_cast<uint16_t>(half);
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    float f = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  if (exponent == 0x1F)
    bits = sign | 0x7F800000u | (mantissa << 13);
  else
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

binary_body split_binary(const http_response& response) {
  auto header = response.header("inference-header-content-length");
  if (header.empty())
    return {response.body, {}};
  size_t n = std::strtoull(header.c_str(), nullptr, 10);
  if (n > response.body.size())
    throw std::runtime_error("Inference-Header-Content-Length " + header
                             + " is past the end of a body of "
                             + std::to_string(response.body.size()) + " bytes");
  return {response.body.substr(0, n), response.body.substr(n)};
}

namespace {

std::string compress_with(std::string_view data, int window_bits) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window_bits, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::runtime_error("deflateInit2 failed");
  std::string out(deflateBound(&zs, static_cast<uLong>(data.size())) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  int r = ::deflate(&zs, Z_FINISH);
  deflateEnd(&zs);
  if (r != Z_STREAM_END)
    throw std::runtime_error("deflate failed");
  out.resize(zs.total_out);
  return out;
}

} // namespace

std::string gzip(std::string_view data) {
  return compress_with(data, 15 + 16);
}

std::string deflate(std::string_view data) {
  return compress_with(data, 15);
}

std::string inflate(std::string_view data) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) // 32: detect gzip or zlib
    throw std::runtime_error("inflateInit2 failed");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  std::string out;
  char buf[65536];
  int r;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    r = ::inflate(&zs, Z_NO_FLUSH);
    if (r != Z_OK && r != Z_STREAM_END) {
      inflateEnd(&zs);
      throw std::runtime_error("compressed body is corrupt (zlib error " + std::to_string(r)
                               + ")");
    }
    out.append(buf, sizeof(buf) - zs.avail_out);
  } while (r != Z_STREAM_END);
  inflateEnd(&zs);
  return out;
}

} // namespace caf_serving::support
