#include "ingress/compression.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

/// Deterministic bytes that compress a little but not to nothing.
std::string sample_bytes(size_t n) {
  std::string s(n, '\0');
  uint32_t x = 12345;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = static_cast<char>((x >> 24) % 16 + 'a');
  }
  return s;
}

} // namespace

TEST_CASE("gzip and deflate round-trip bodies of several sizes") {
  for (auto encoding : {content_encoding::gzip, content_encoding::deflate}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{100}, size_t{70000}, size_t{1} << 20}) {
      CAPTURE(to_string(encoding));
      CAPTURE(n);
      std::string original = sample_bytes(n);
      std::string packed = compress(original, encoding);
      REQUIRE_FALSE(packed.empty());
      if (n >= 70000)
        CHECK(packed.size() < original.size());
      auto unpacked = decompress(packed, encoding, n);
      REQUIRE(unpacked.ok());
      CHECK(*unpacked == original);
    }
  }
}

TEST_CASE("gzip output carries the gzip magic and deflate the zlib header") {
  std::string gz = compress("hello", content_encoding::gzip);
  REQUIRE(gz.size() > 2);
  CHECK(static_cast<unsigned char>(gz[0]) == 0x1f);
  CHECK(static_cast<unsigned char>(gz[1]) == 0x8b);
  std::string zl = compress("hello", content_encoding::deflate);
  REQUIRE(zl.size() > 2);
  CHECK((static_cast<unsigned char>(zl[0]) & 0x0F) == 8);
  CHECK(((static_cast<unsigned char>(zl[0]) << 8) | static_cast<unsigned char>(zl[1])) % 31 == 0);
}

TEST_CASE("deflate also accepts raw deflate without the zlib header") {
  std::string original = sample_bytes(5000);
  std::string zl = compress(original, content_encoding::deflate);
  // Strip the 2-byte zlib header and 4-byte Adler-32 trailer: raw deflate.
  std::string raw = zl.substr(2, zl.size() - 6);
  auto out = decompress(raw, content_encoding::deflate, 1 << 20);
  REQUIRE(out.ok());
  CHECK(*out == original);
}

TEST_CASE("identity passes through, within the limit") {
  auto ok = decompress("abc", content_encoding::identity, 3);
  REQUIRE(ok.ok());
  CHECK(*ok == "abc");
  auto big = decompress("abcd", content_encoding::identity, 3);
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().status == status_code::bad_request);
  CHECK(compress("xyz", content_encoding::identity) == "xyz");
}

TEST_CASE("a decompression bomb stops at the limit with Triton's 400") {
  // 64 MiB of zeros compress to about 64 KiB.
  std::string zeros(size_t{64} << 20, '\0');
  for (auto encoding : {content_encoding::gzip, content_encoding::deflate}) {
    std::string bomb = compress(zeros, encoding);
    CHECK(bomb.size() < (size_t{1} << 20));
    auto out = decompress(bomb, encoding, size_t{1} << 20);
    REQUIRE_FALSE(out.ok());
    CHECK(out.error().status == status_code::bad_request);
    CHECK(out.error().message.rfind("Decompressed data size exceeds the maximum allowed value of "
                                    "1048576 bytes. Use --http-max-input-size to increase the "
                                    "limit",
                                    0)
          == 0);
    CHECK(out.error().message.find("more than the limit of 1048576 bytes") != std::string::npos);
  }
}

TEST_CASE("the limit is exact: max_output bytes pass, one more fails") {
  std::string original = sample_bytes(10000);
  std::string gz = compress(original, content_encoding::gzip);
  CHECK(decompress(gz, content_encoding::gzip, 10000).ok());
  auto over = decompress(gz, content_encoding::gzip, 9999);
  REQUIRE_FALSE(over.ok());
  CHECK(over.error().status == status_code::bad_request);
}

TEST_CASE("corrupt, truncated and trailing data are 400") {
  std::string original = sample_bytes(20000);
  std::string gz = compress(original, content_encoding::gzip);

  auto truncated = decompress(gz.substr(0, gz.size() / 2), content_encoding::gzip, 1 << 20);
  REQUIRE_FALSE(truncated.ok());
  CHECK(truncated.error().status == status_code::bad_request);
  CHECK(truncated.error().message.find("truncated") != std::string::npos);

  auto not_gzip = decompress("this is plain text", content_encoding::gzip, 1 << 20);
  REQUIRE_FALSE(not_gzip.ok());
  CHECK(not_gzip.error().status == status_code::bad_request);
  CHECK(not_gzip.error().message.find("not valid gzip") != std::string::npos);

  std::string corrupt = gz;
  corrupt[gz.size() - 3] ^= 0x55; // the CRC/length trailer
  auto bad_crc = decompress(corrupt, content_encoding::gzip, 1 << 20);
  REQUIRE_FALSE(bad_crc.ok());
  CHECK(bad_crc.error().status == status_code::bad_request);

  auto trailing = decompress(gz + "extra", content_encoding::gzip, 1 << 20);
  REQUIRE_FALSE(trailing.ok());
  CHECK(trailing.error().message.find("5 bytes after the end") != std::string::npos);

  auto empty = decompress("", content_encoding::deflate, 100);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.error().status == status_code::bad_request);
}

TEST_CASE("Content-Encoding header parsing") {
  CHECK(*parse_content_encoding("") == content_encoding::identity);
  CHECK(*parse_content_encoding("identity") == content_encoding::identity);
  CHECK(*parse_content_encoding(" GZIP ") == content_encoding::gzip);
  CHECK(*parse_content_encoding("x-gzip") == content_encoding::gzip);
  CHECK(*parse_content_encoding("Deflate") == content_encoding::deflate);
  auto br = parse_content_encoding("br");
  REQUIRE_FALSE(br.ok());
  CHECK(static_cast<int>(br.error().status) == 501); // Triton's UNSUPPORTED
  CHECK(br.error().message.rfind("Unsupported compression type: Content-Encoding 'br'", 0) == 0);
}

TEST_CASE("Accept-Encoding negotiation with q-values") {
  CHECK(choose_encoding("") == content_encoding::identity);
  CHECK(choose_encoding("gzip") == content_encoding::gzip);
  CHECK(choose_encoding("GZip") == content_encoding::gzip);
  CHECK(choose_encoding("deflate") == content_encoding::deflate);
  CHECK(choose_encoding("gzip, deflate, br") == content_encoding::gzip);
  CHECK(choose_encoding("deflate, gzip;q=0.5") == content_encoding::deflate);
  CHECK(choose_encoding("deflate;q=1.0, gzip;q=0.999") == content_encoding::deflate);
  CHECK(choose_encoding("gzip;q=0.5, deflate;q=0.5") == content_encoding::gzip);
  CHECK(choose_encoding("gzip;q=0, deflate;q=0") == content_encoding::identity);
  CHECK(choose_encoding("gzip;q=0") == content_encoding::identity);
  CHECK(choose_encoding("*") == content_encoding::gzip);
  CHECK(choose_encoding("*;q=0, identity") == content_encoding::identity);
  CHECK(choose_encoding("gzip;q=0, *") == content_encoding::deflate);
  CHECK(choose_encoding("identity;q=0, deflate;q=0.1") == content_encoding::deflate);
  CHECK(choose_encoding("identity, gzip;q=0.5") == content_encoding::identity);
  CHECK(choose_encoding("br, zstd") == content_encoding::identity);
  CHECK(choose_encoding("gzip;q=abc") == content_encoding::identity);
  CHECK(choose_encoding("gzip ; q=0.8 , deflate ; q=0.9") == content_encoding::deflate);
}
