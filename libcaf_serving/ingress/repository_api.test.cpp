#include "ingress/repository_api.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("a load body gives the config and the file: parameters") {
  for (const char* empty : {"", "  \n", "{}", R"({"parameters":{}})"}) {
    auto p = parse_load_request(empty);
    REQUIRE_MESSAGE(p, empty);
    CHECK_FALSE(p->config);
    CHECK(p->files.empty());
  }
  auto p = parse_load_request(
    R"({"parameters":{"config":"{\"max_batch_size\":16}","file:1/model.onnx":"YQ==",)"
    R"("file:labels.txt":"Yg=="}})");
  REQUIRE(p);
  REQUIRE(p->config);
  CHECK(*p->config == R"({"max_batch_size":16})");
  REQUIRE(p->files.size() == 2);
  CHECK(p->files[0].path == "1/model.onnx");
  CHECK(p->files[0].base64 == "YQ==");
  CHECK(p->files[1].path == "labels.txt");
}

TEST_CASE("a load body that is not what Triton takes is a 400 saying why") {
  auto unknown = parse_load_request(R"({"parameters":{"priority":"high"}})");
  REQUIRE(!unknown);
  CHECK(unknown.error().status == status_code::bad_request);
  CHECK(unknown.error().message.rfind("Unrecognized load parameter 'priority' with type 'STRING'", 0)
        == 0);
  auto not_string = parse_load_request(R"({"parameters":{"config":{"max_batch_size":16}}})");
  REQUIRE(!not_string);
  CHECK(contains(not_string.error().message, "load parameter 'config' is an object"));
  auto broken = parse_load_request(R"({"parameters":)");
  REQUIRE(!broken);
  CHECK(contains(broken.error().message, "failed to parse the request JSON buffer"));
  auto not_object = parse_load_request("[1]");
  REQUIRE(!not_object);
  CHECK(contains(not_object.error().message, "is an array"));
  auto params_not_object = parse_load_request(R"({"parameters":"config"})");
  REQUIRE(!params_not_object);
  CHECK(contains(params_not_object.error().message, "'parameters' of the load request is a string"));
}

TEST_CASE("an unload body: unload_dependents must be a boolean") {
  CHECK_FALSE(parse_unload_request("")->unload_dependents);
  CHECK(parse_unload_request(R"({"parameters":{"unload_dependents":true}})")->unload_dependents);
  CHECK_FALSE(parse_unload_request(R"({"parameters":{"unload_dependents":false}})")->unload_dependents);
  // Other unload parameters are ignored, as Triton ignores them.
  CHECK(parse_unload_request(R"({"parameters":{"something":1}})"));
  auto bad = parse_unload_request(R"({"parameters":{"unload_dependents":"yes"}})");
  REQUIRE(!bad);
  CHECK(bad.error().status == status_code::bad_request);
  CHECK(bad.error().message.rfind("Unable to parse 'unload_dependents': it is a string", 0) == 0);
  CHECK(!parse_unload_request("{"));
}
