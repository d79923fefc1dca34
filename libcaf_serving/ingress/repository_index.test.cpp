#include "ingress/repository_index.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

std::string error_of(std::string_view body) {
  auto r = parse_index_request(body);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::bad_request);
  return r.error().message;
}

} // namespace

TEST_CASE("an empty body, {} and {\"ready\": false} list every model") {
  for (std::string_view body : {"", "  \r\n", "{}", "{\"ready\":false}", "{\"other\":[1,2]}"}) {
    auto r = parse_index_request(body);
    REQUIRE_MESSAGE(r.ok(), body);
    CHECK_FALSE(r->ready_only);
  }
  auto r = parse_index_request("{\"ready\": true}");
  REQUIRE(r.ok());
  CHECK(r->ready_only);
}

TEST_CASE("a non-boolean ready and malformed bodies are 400s naming the problem") {
  for (std::string_view body : {"{\"ready\":\"true\"}", "{\"ready\":1}", "{\"ready\":null}",
                                "{\"ready\":[true]}", "{\"ready\":{}}"}) {
    CAPTURE(body);
    CHECK(error_of(body).rfind("Invalid value for 'ready': expected a boolean", 0) == 0);
  }
  // Triton's test: 250,000 nested arrays, past any JSON parser's depth limit.
  std::string deep = "{\"ready\":" + std::string(250000, '[') + "true"
                     + std::string(250000, ']') + "}";
  CHECK(error_of(deep).rfind("Invalid value for 'ready': expected a boolean", 0) == 0);
  CHECK(error_of("{\"ready\":tru}").find("not valid JSON") != std::string::npos);
  CHECK(error_of("{\"ready\":true").find("not valid JSON") != std::string::npos);
  CHECK(error_of("{\"ready\":true} x").find("not valid JSON") != std::string::npos);
  CHECK(error_of("[true]").find("must be a JSON object") != std::string::npos);
}

TEST_CASE("rows carry Triton's fields; ready_only keeps the READY ones") {
  std::vector<index_entry> rows{{"a", "1", "READY", ""},
                                {"b", "", "UNAVAILABLE", "unloaded"},
                                {"c", "2", "LOADING", ""}};
  CHECK(serialize_index(rows, {})
        == "[{\"name\":\"a\",\"version\":\"1\",\"state\":\"READY\"},"
           "{\"name\":\"b\",\"state\":\"UNAVAILABLE\",\"reason\":\"unloaded\"},"
           "{\"name\":\"c\",\"version\":\"2\",\"state\":\"LOADING\"}]");
  index_request ready;
  ready.ready_only = true;
  CHECK(serialize_index(rows, ready) == "[{\"name\":\"a\",\"version\":\"1\",\"state\":\"READY\"}]");
  CHECK(serialize_index({}, ready) == "[]");
}
