/// config.pbtxt text, as the model repository reads it from a model directory,
/// parsed and validated, and then written as the JSON that
/// GET /v2/models/{m}/config serves.
///
/// Input: one control byte (bit 0: allow_missing_io, as for ONNX models whose
/// inputs come from the model file), then the text.
///
/// Beyond "no crash, no sanitizer report": every failure is a 400 whose message
/// starts with "model '<name>'", and a config that parses is written as JSON
/// that parses again.

#include "repository/config_json.hpp"
#include "repository/config_parser.hpp"

#include <google/protobuf/stubs/logging.h>
#include <simdjson.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

using namespace caf_serving;
using namespace caf_serving::repository;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "config_pbtxt: invariant broken: %s\n", what);
    std::abort();
  }
}

void check_json(const std::string& text) {
  simdjson::dom::parser parser;
  check(!parser.parse(text).error(), "the config is written as valid JSON");
}

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
  parse_context ctx;
  ctx.model_name = "fuzzed";
  ctx.config_path = "/models/fuzzed/config.pbtxt";
  ctx.allow_missing_io = (data[0] & 1) != 0;
  std::string_view text{reinterpret_cast<const char*>(data) + 1, size - 1};
  auto parsed = parse_model_config_full(text, ctx);
  if (!parsed) {
    check(parsed.error().status == status_code::bad_request, "a bad config is a 400");
    check(parsed.error().message.rfind("model 'fuzzed'", 0) == 0,
          "the message starts with the model's name");
    return 0;
  }
  check(parsed->config.name == "fuzzed", "the name is the directory's");
  check(parsed->config.max_batch_size >= 0, "max_batch_size is not negative");
  check_json(model_config_json(*parsed));
  check_json(model_metadata_json(parsed->config, {}));
  return 0;
}
