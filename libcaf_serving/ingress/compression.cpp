#include "ingress/compression.hpp"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <vector>

namespace caf_serving::ingress {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i]))
        != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

/// A zlib stream that is always ended.
struct inflate_stream {
  z_stream z{};
  bool initialised = false;
  ~inflate_stream() {
    if (initialised)
      inflateEnd(&z);
  }
};

/// zlib's (RFC 1950) two-byte header, which raw deflate lacks.
bool has_zlib_header(std::string_view body) {
  if (body.size() < 2)
    return false;
  auto cmf = static_cast<unsigned char>(body[0]);
  auto flg = static_cast<unsigned char>(body[1]);
  return (cmf & 0x0F) == 8 && (cmf >> 4) <= 7 && ((cmf << 8) | flg) % 31 == 0;
}

} // namespace

std::string_view to_string(content_encoding e) {
  switch (e) {
    case content_encoding::gzip: return "gzip";
    case content_encoding::deflate: return "deflate";
    case content_encoding::identity: break;
  }
  return "identity";
}

result<content_encoding> parse_content_encoding(std::string_view header) {
  header = trim(header);
  if (header.empty() || iequals(header, "identity"))
    return content_encoding::identity;
  if (iequals(header, "gzip") || iequals(header, "x-gzip"))
    return content_encoding::gzip;
  if (iequals(header, "deflate"))
    return content_encoding::deflate;
  // Triton answers UNSUPPORTED (501) with these words.
  return serving_error{static_cast<status_code>(501),
                       "Unsupported compression type: Content-Encoding '" + std::string{header}
                         + "' is not one this server reads; send the body as gzip, deflate or "
                           "identity",
                       failure_reason::bad_request};
}

result<std::string> decompress(std::string_view body, content_encoding encoding,
                               size_t max_output) {
  // Triton's 400 and words, then which body did it.
  auto too_large = [&] {
    return bad_request("Decompressed data size exceeds the maximum allowed value of "
                       + std::to_string(max_output)
                       + " bytes. Use --http-max-input-size to increase the limit (this "
                         "server's --max-body-bytes): the "
                       + std::string{to_string(encoding)}
                       + " request body inflates to more than the limit of "
                       + std::to_string(max_output) + " bytes");
  };
  if (encoding == content_encoding::identity) {
    if (body.size() > max_output)
      return too_large();
    return std::string{body};
  }
  int window_bits = 15; // zlib format
  if (encoding == content_encoding::gzip)
    window_bits = 16 + 15;
  else if (!has_zlib_header(body))
    window_bits = -15; // raw deflate
  inflate_stream stream;
  if (inflateInit2(&stream.z, window_bits) != Z_OK)
    return serving_error{status_code::internal, "zlib could not start inflating"};
  stream.initialised = true;

  std::string out;
  // Grow geometrically from a guess, never past max_output + 1 (one byte more
  // than allowed is how a bomb is detected).
  size_t capacity_limit = max_output == std::numeric_limits<size_t>::max() ? max_output
                                                                            : max_output + 1;
  size_t initial = std::min(capacity_limit, std::max<size_t>(body.size() * 4, 4096));
  out.resize(initial);
  size_t produced = 0;
  size_t consumed = 0;
  int rc = Z_OK;
  while (true) {
    if (produced == out.size()) {
      if (out.size() >= capacity_limit)
        return too_large();
      out.resize(std::min(capacity_limit, out.size() * 2));
    }
    // zlib's counters are 32-bit: feed and drain at most 1 GiB at a time.
    constexpr size_t chunk = size_t{1} << 30;
    size_t in_now = std::min(chunk, body.size() - consumed);
    size_t out_now = std::min(chunk, out.size() - produced);
    stream.z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data() + consumed));
    stream.z.avail_in = static_cast<uInt>(in_now);
    stream.z.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    stream.z.avail_out = static_cast<uInt>(out_now);
    rc = inflate(&stream.z, Z_NO_FLUSH);
    consumed += in_now - stream.z.avail_in;
    produced += out_now - stream.z.avail_out;
    if (produced > max_output)
      return too_large();
    if (rc == Z_STREAM_END)
      break;
    if (rc == Z_BUF_ERROR && stream.z.avail_out != 0 && consumed == body.size())
      return bad_request("the " + std::string{to_string(encoding)}
                         + " request body is truncated; send the whole compressed body");
    if (rc != Z_OK && rc != Z_BUF_ERROR)
      return bad_request("the request body is not valid " + std::string{to_string(encoding)}
                         + " data (" + (stream.z.msg ? stream.z.msg : "zlib error")
                         + "); check Content-Encoding");
    if (rc == Z_OK && consumed == body.size() && stream.z.avail_out != 0)
      return bad_request("the " + std::string{to_string(encoding)}
                         + " request body is truncated; send the whole compressed body");
  }
  if (consumed != body.size())
    return bad_request("the " + std::string{to_string(encoding)} + " request body has "
                       + std::to_string(body.size() - consumed)
                       + " bytes after the end of its compressed stream");
  out.resize(produced);
  return out;
}

std::string compress(std::string_view body, content_encoding encoding) {
  if (encoding == content_encoding::identity)
    return std::string{body};
  z_stream z{};
  int window_bits = encoding == content_encoding::gzip ? 16 + 15 : 15;
  if (deflateInit2(&z, 1, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    return {}; // only on out of memory or a zlib bug
  std::string out;
  out.resize(deflateBound(&z, static_cast<uLong>(body.size())) + 32); // gzip header slack
  size_t consumed = 0;
  size_t produced = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    constexpr size_t chunk = size_t{1} << 30;
    if (produced == out.size())
      out.resize(out.size() * 2);
    size_t in_now = std::min(chunk, body.size() - consumed);
    size_t out_now = std::min(chunk, out.size() - produced);
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data() + consumed));
    z.avail_in = static_cast<uInt>(in_now);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    z.avail_out = static_cast<uInt>(out_now);
    int flush = consumed + in_now == body.size() ? Z_FINISH : Z_NO_FLUSH;
    rc = deflate(&z, flush);
    consumed += in_now - z.avail_in;
    produced += out_now - z.avail_out;
    if (rc == Z_STREAM_ERROR)
      break;
  }
  deflateEnd(&z);
  out.resize(produced);
  return out;
}

content_encoding choose_encoding(std::string_view accept_encoding) {
  // q-values in thousandths; -1: not mentioned.
  int q_gzip = -1, q_deflate = -1, q_identity = -1, q_star = -1;
  while (!accept_encoding.empty()) {
    size_t comma = accept_encoding.find(',');
    std::string_view item = accept_encoding.substr(0, comma);
    accept_encoding = comma == std::string_view::npos ? std::string_view{}
                                                      : accept_encoding.substr(comma + 1);
    size_t semi = item.find(';');
    std::string_view coding = trim(item.substr(0, semi));
    int q = 1000;
    while (semi != std::string_view::npos) {
      item = item.substr(semi + 1);
      semi = item.find(';');
      std::string_view param = trim(item.substr(0, semi));
      if (param.size() >= 2 && (param[0] == 'q' || param[0] == 'Q') && param[1] == '=') {
        // qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
        std::string_view v = trim(param.substr(2));
        int value = 0;
        bool valid = !v.empty() && (v[0] == '0' || v[0] == '1');
        if (valid) {
          value = (v[0] - '0') * 1000;
          if (v.size() > 1) {
            valid = v[1] == '.' && v.size() <= 5;
            int scale = 100;
            for (size_t i = 2; valid && i < v.size(); ++i, scale /= 10) {
              valid = std::isdigit(static_cast<unsigned char>(v[i])) != 0;
              value += (v[i] - '0') * scale;
            }
          }
        }
        q = valid ? std::min(value, 1000) : 0; // a malformed q makes the coding unusable
      }
    }
    if (iequals(coding, "gzip") || iequals(coding, "x-gzip"))
      q_gzip = std::max(q_gzip, q);
    else if (iequals(coding, "deflate"))
      q_deflate = std::max(q_deflate, q);
    else if (iequals(coding, "identity"))
      q_identity = std::max(q_identity, q);
    else if (coding == "*")
      q_star = std::max(q_star, q);
  }
  auto effective = [&](int q) { return q >= 0 ? q : q_star; };
  int g = effective(q_gzip);
  int d = effective(q_deflate);
  if (g > 0 && g >= d) {
    int i = effective(q_identity);
    if (g >= i)
      return content_encoding::gzip;
  }
  if (d > 0) {
    int i = effective(q_identity);
    if (d >= i && d >= g)
      return content_encoding::deflate;
  }
  return content_encoding::identity;
}

} // namespace caf_serving::ingress
