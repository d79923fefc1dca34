/// The JSON bodies of Triton's control requests, as a client sends them:
/// a load request's parameters (repository_api), the "config" override it
/// carries (read through the ModelConfig schema, alone or over a builtin
/// model's config.pbtxt), an unload's parameters, and the repository index's
/// body (repository_index).
///
/// Input: one control byte (which parser, below), then the body.
///
/// Beyond "no crash, no sanitizer report": a failure is a client error (4xx)
/// with a message, and a config that parses is written as JSON that parses
/// again.

#include "ingress/repository_api.hpp"
#include "ingress/repository_index.hpp"
#include "repository/config_json.hpp"
#include "repository/config_parser.hpp"

#include <google/protobuf/stubs/logging.h>
#include <simdjson.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

using namespace caf_serving;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "control_json: invariant broken: %s\n", what);
    std::abort();
  }
}

void check_error(const serving_error& e) {
  auto status = static_cast<int>(e.status);
  check(status >= 400 && status < 500, "a bad body is a client error");
  check(!e.message.empty(), "an error says what was wrong");
}

void check_config(const result<repository::parsed_model_config>& parsed) {
  if (!parsed) {
    check_error(parsed.error());
    return;
  }
  simdjson::dom::parser parser;
  check(!parser.parse(repository::model_config_json(*parsed)).error(),
        "the config is written as valid JSON");
}

/// Triton's "simple" example, the base a builtin model's override goes over.
constexpr std::string_view simple_config = R"(name: "simple"
backend: "builtin"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
parameters { key: "function" value: { string_value: "add_sub" } }
)";

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every string field that is not UTF-8; thousands a second.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  std::string_view body{reinterpret_cast<const char*>(data) + 1, size - 1};
  repository::parse_context ctx{"simple", "the 'config' load parameter", true};
  switch (data[0] % 4) {
    case 0:
      check_config(repository::parse_model_config_json(body, ctx));
      break;
    case 1:
      check_config(repository::parse_model_config_json_over(body, simple_config, ctx));
      break;
    case 2:
      if (auto r = ingress::parse_index_request(body); !r)
        check_error(r.error());
      break;
    default:
      if (auto r = ingress::parse_load_request(body); !r)
        check_error(r.error());
      if (auto r = ingress::parse_unload_request(body); !r)
        check_error(r.error());
      break;
  }
  return 0;
}
