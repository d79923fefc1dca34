#include "http.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::perf;

TEST_CASE("a response with Content-Length is complete only with its body") {
  std::string full = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
  for (std::size_t cut = 0; cut < full.size(); ++cut)
    CHECK(parse_response(full.substr(0, cut)).state
          == parse_state::incomplete);
  auto r = parse_response(full + "HTTP/1.1");
  REQUIRE(r.state == parse_state::complete);
  CHECK(r.status == 200);
  CHECK(r.body() == "hello");
  CHECK(r.consumed == full.size());
  CHECK(r.keep_alive);
}

TEST_CASE("header names are case-insensitive and Connection: close is seen") {
  auto r = parse_response(
    "HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nCONNECTION: close\r\n\r\n{}");
  REQUIRE(r.state == parse_state::complete);
  CHECK(r.status == 404);
  CHECK_FALSE(r.keep_alive);
  CHECK(parse_response("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
          .keep_alive
        == false);
}

TEST_CASE("chunked bodies are decoded") {
  std::string full = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
  CHECK(parse_response(full.substr(0, full.size() - 2)).state
        == parse_state::incomplete);
  auto r = parse_response(full);
  REQUIRE(r.state == parse_state::complete);
  CHECK(r.body() == "abcde");
  CHECK(r.consumed == full.size());
}

TEST_CASE("garbage is malformed, not incomplete") {
  CHECK(parse_response("SSH-2.0-OpenSSH\r\n\r\n").state
        == parse_state::malformed);
  CHECK(parse_response("HTTP/1.1 200 OK\r\n\r\n").state
        == parse_state::malformed);
  CHECK(parse_response("HTTP/1.1 204 No Content\r\n\r\n").state
        == parse_state::complete);
}

TEST_CASE("endpoints parse with and without port") {
  auto a = parse_endpoint("http://example.org:8001/");
  CHECK(a.error.empty());
  CHECK(a.value.host == "example.org");
  CHECK(a.value.port == 8001);
  auto b = parse_endpoint("myhost");
  CHECK(b.value.port == 8000);
  CHECK_FALSE(parse_endpoint("h:99999").error.empty());
  CHECK_FALSE(parse_endpoint("h:x").error.empty());
}

TEST_CASE("requests carry Host and Content-Length") {
  auto r = build_request("POST", "/v2/models/m/infer", "h:1",
                         "X-A: 1\r\n", "body");
  CHECK(r == "POST /v2/models/m/infer HTTP/1.1\r\nHost: h:1\r\nX-A: 1\r\n"
             "Content-Length: 4\r\n\r\nbody");
  CHECK(build_request("GET", "/", "h", "", "") == "GET / HTTP/1.1\r\nHost: h\r\n\r\n");
}

TEST_CASE("connecting to a closed port fails with a message") {
  endpoint ep{"127.0.0.1", 1};
  auto c = connect_tcp(ep);
  CHECK(c.fd < 0);
  CHECK(c.error.find("cannot connect to 127.0.0.1:1") != std::string::npos);
}
