/// --http-restricted-api as Triton has it: restricted groups answer 403 with
/// Triton's "This API is restricted, expecting header 'KEY'" unless the
/// request carries KEY: VALUE; the other groups stay open; the check comes
/// before routing, so endpoints that do not exist yet (shared memory, trace,
/// logging) are covered too; a bad flag stops the server at start-up.

#include "server_test.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::server_test;

namespace {

/// The flags of Triton's own test (qa/L0_http/test.sh), plus one group for
/// endpoints this server does not have yet.
test_server& server() {
  static test_server s({example_model("simple")},
                       {"--http-restricted-api=model-repository:admin-key=admin-value",
                        "--http-restricted-api", "inference,metadata:infer-key=infer-value",
                        "--http-restricted-api=shared-memory,trace,logging:ops-key=ops"});
  return s;
}

std::string simple_body() {
  std::vector<int32_t> a(16, 3);
  return infer_body({input_json("INPUT0", "INT32", {1, 16}, json_list(a)),
                     input_json("INPUT1", "INT32", {1, 16}, json_list(a))});
}

void expect_refused(const http_response& r, const std::string& header) {
  CHECK_MESSAGE(r.status == 403, r.body);
  CHECK(r.header("content-type") == "application/json");
  auto msg = error_message(r.body);
  CHECK_MESSAGE(msg.rfind("This API is restricted, expecting header '" + header + "'", 0) == 0,
                msg);
}

http_response get(http_client& http, const std::string& path, header_list headers = {}) {
  http_request req;
  req.path = path;
  req.headers = std::move(headers);
  return http.request(req);
}

} // namespace

TEST_CASE("restricted groups need their header; the value must match exactly") {
  auto http = server().client();
  // metadata
  expect_refused(get(http, "/v2"), "infer-key");
  expect_refused(get(http, "/v2/models/simple"), "infer-key");
  expect_refused(get(http, "/v2", {{"infer-key", "wrong"}}), "infer-key");
  expect_refused(get(http, "/v2", {{"admin-key", "admin-value"}}), "infer-key");
  CHECK(get(http, "/v2", {{"infer-key", "infer-value"}}).status == 200);
  CHECK(get(http, "/v2/models/simple", {{"Infer-Key", "infer-value"}}).status == 200);

  // inference
  expect_refused(http.post("/v2/models/simple/infer", simple_body(), json_content), "infer-key");
  expect_refused(http.post("/v2/models/simple/infer", simple_body(),
                           {{"Content-Type", "application/json"}, {"test", "1"}}),
                 "infer-key");
  auto r = http.post("/v2/models/simple/infer", simple_body(),
                     {{"Content-Type", "application/json"}, {"infer-key", "infer-value"}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(json_ints(json_document::parse(r.body).at("/outputs/0/data"))
        == std::vector<int64_t>(16, 6));

  // model repository (Triton's test_model_repository: the other group's key
  // does not open it)
  expect_refused(http.post("/v2/repository/index", ""), "admin-key");
  expect_refused(http.post("/v2/repository/models/simple/unload", "",
                           {{"infer-key", "infer-value"}}),
                 "admin-key");
  r = http.post("/v2/repository/index", "", {{"admin-key", "admin-value"}});
  CHECK_MESSAGE(r.status == 200, r.body);
  // The restriction comes before the method check, as in Triton.
  expect_refused(get(http, "/v2/repository/index"), "admin-key");
}

TEST_CASE("unrestricted groups stay open") {
  auto http = server().client();
  CHECK(get(http, "/v2/health/live").status == 200);
  CHECK(get(http, "/v2/health/ready").status == 200);
  CHECK(get(http, "/v2/models/simple/ready").status == 200);
  CHECK(get(http, "/v2/models/simple/config").status == 200);
  // Triton's test_sanity: statistics with and without another group's header.
  CHECK(get(http, "/v2/models/simple/stats").status == 200);
  CHECK(get(http, "/v2/models/simple/stats", {{"infer-key", "infer-value"}}).status == 200);
  CHECK(get(http, "/v2/models/stats").status == 200);
  CHECK(get(http, "/metrics").status == 200);
  // Unknown paths belong to no group: a 404, not a 403.
  CHECK(get(http, "/v2/frobnicate").status == 404);
}

TEST_CASE("groups are decided by path, so endpoints still to come are covered") {
  auto http = server().client();
  for (const char* path : {"/v2/systemsharedmemory/status",
                           "/v2/systemsharedmemory/region/r0/register",
                           "/v2/cudasharedmemory/status", "/v2/trace/setting",
                           "/v2/models/simple/trace/setting", "/v2/logging"}) {
    CAPTURE(path);
    expect_refused(get(http, path), "ops-key");
    // With the header the request reaches routing (whatever it answers there).
    CHECK(get(http, path, {{"ops-key", "ops"}}).status != 403);
  }
}

TEST_CASE("a bad --http-restricted-api stops the server at start-up") {
  for (std::vector<std::string> flags :
       {std::vector<std::string>{"--http-restricted-api=model-reposit,health:k1=v1"},
        {"--http-restricted-api=model-repository,health:k1=v1",
         "--http-restricted-api=metadata,health:k2=v2"},
        {"--http-restricted-api=inference"}}) {
    CAPTURE(flags[0]);
    CHECK_THROWS_AS(test_server({example_model("simple")}, flags), std::runtime_error);
  }
}
