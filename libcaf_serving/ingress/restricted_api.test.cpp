#include "ingress/restricted_api.hpp"

#include <doctest/doctest.h>

#include <map>

using namespace caf_serving::ingress;

namespace {

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> parts;
  size_t at = 0;
  while (at < path.size()) {
    auto next = path.find('/', at);
    if (next == std::string::npos)
      next = path.size();
    if (next > at)
      parts.push_back(path.substr(at, next - at));
    at = next + 1;
  }
  return parts;
}

std::optional<api_group> group_of(const std::string& path) {
  return api_group_of(split(path));
}

} // namespace

TEST_CASE("every endpoint path belongs to Triton's group") {
  const std::map<std::string, api_group> expected{
    {"/v2", api_group::metadata},
    {"/v2/health/live", api_group::health},
    {"/v2/health/ready", api_group::health},
    {"/v2/models/simple", api_group::metadata},
    {"/v2/models/simple/versions/2", api_group::metadata},
    {"/v2/models/simple/ready", api_group::health},
    {"/v2/models/simple/versions/1/ready", api_group::health},
    {"/v2/models/simple/infer", api_group::inference},
    {"/v2/models/simple/versions/3/infer", api_group::inference},
    {"/v2/models/simple/generate", api_group::inference},
    {"/v2/models/simple/generate_stream", api_group::inference},
    {"/v2/models/simple/config", api_group::model_config},
    {"/v2/models/simple/stats", api_group::statistics},
    {"/v2/models/simple/versions/1/stats", api_group::statistics},
    {"/v2/models/stats", api_group::statistics},
    {"/v2/models/simple/trace/setting", api_group::trace},
    {"/v2/trace/setting", api_group::trace},
    {"/v2/logging", api_group::logging},
    {"/v2/repository/index", api_group::model_repository},
    {"/v2/repository/models/simple/load", api_group::model_repository},
    {"/v2/repository/models/simple/unload", api_group::model_repository},
    // Endpoints other helpers add: covered by their path prefix.
    {"/v2/systemsharedmemory/status", api_group::shared_memory},
    {"/v2/systemsharedmemory/region/r0/register", api_group::shared_memory},
    {"/v2/cudasharedmemory/region/r0/unregister", api_group::shared_memory},
  };
  for (const auto& [path, group] : expected) {
    CAPTURE(path);
    auto g = group_of(path);
    REQUIRE(g);
    CHECK(to_string(*g) == to_string(group));
  }
  for (const char* none : {"/", "/metrics", "/v3/models/x", "/v2/frobnicate", "/v2/models"})
    CHECK_MESSAGE(!group_of(none), none);
}

TEST_CASE("group names are Triton's and round-trip") {
  for (size_t i = 0; i < api_group_count; ++i) {
    auto g = static_cast<api_group>(i);
    CHECK(api_group_from_name(to_string(g)) == g);
  }
  CHECK(to_string(api_group::shared_memory) == "shared-memory");
  CHECK(to_string(api_group::model_repository) == "model-repository");
  CHECK_FALSE(api_group_from_name("Health"));
  CHECK_FALSE(api_group_from_name("model-reposit"));
}

TEST_CASE("restrictions: parsed, looked up, checked against a header") {
  restricted_apis r;
  CHECK(r.empty());
  REQUIRE_FALSE(r.add("model-repository:admin-key=admin-value"));
  REQUIRE_FALSE(r.add("inference,metadata:infer-key=a=b"));
  CHECK_FALSE(r.empty());
  REQUIRE(r.find(api_group::metadata));
  CHECK(r.find(api_group::metadata)->header == "infer-key");
  CHECK(r.find(api_group::metadata)->value == "a=b"); // the value may hold '='
  CHECK_FALSE(r.find(api_group::health));

  auto with = [](std::optional<std::string> value) {
    return [value](const std::string&) { return value; };
  };
  CHECK(r.allows(api_group::health, with(std::nullopt)));
  CHECK_FALSE(r.allows(api_group::model_repository, with(std::nullopt)));
  CHECK_FALSE(r.allows(api_group::model_repository, with("admin-valu")));
  CHECK_FALSE(r.allows(api_group::model_repository, with("Admin-Value")));
  CHECK(r.allows(api_group::model_repository, with("admin-value")));
  std::string asked;
  r.allows(api_group::inference, [&](const std::string& h) {
    asked = h;
    return std::optional<std::string>();
  });
  CHECK(asked == "infer-key");
  CHECK(r.refusal(api_group::model_repository)
          .rfind("This API is restricted, expecting header 'admin-key'", 0)
        == 0);
}

TEST_CASE("bad --http-restricted-api values say what is wrong; nothing is added") {
  restricted_apis r;
  auto err = r.add("model-reposit,health:k1=v1");
  REQUIRE(err);
  CHECK(err->rfind("unknown restricted api 'model-reposit'", 0) == 0);
  CHECK(r.empty());

  REQUIRE_FALSE(r.add("model-repository,health:k1=v1"));
  err = r.add("metadata,health:k2=v2");
  REQUIRE(err);
  CHECK(err->find("restricted api 'health' can not be specified in multiple config groups")
        != std::string::npos);
  CHECK_FALSE(r.find(api_group::metadata)); // the failed flag added nothing

  err = r.add("trace,trace:k=v");
  REQUIRE(err);
  CHECK(err->find("can not be specified in multiple config groups") != std::string::npos);

  for (const char* bad : {"inference", "inference:key", ":k=v", "inference:=v", "inference:k=",
                          "inference,:k=v"}) {
    CAPTURE(bad);
    restricted_apis fresh;
    auto e = fresh.add(bad);
    REQUIRE(e);
    CHECK(fresh.empty());
  }
  CHECK(r.add("logging:bad key=v")->find("header name 'bad key'") != std::string::npos);
}
