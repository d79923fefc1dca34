/// The KServe v2 request codec and validation: bytes as the HTTP server hands
/// them over (a body, maybe Inference-Header-Content-Length, a content type),
/// parsed and then checked against a fixed model, as the ingress does.
///
/// Input: one control byte, then for the binary extension a 4-byte
/// little-endian header length, then the body.
///   control & 3 == 0: JSON body, copied into an exact-size buffer
///   control & 3 == 1: JSON body with 64 readable bytes of padding (parsed in place)
///   control & 3 == 2: binary extension (header length from the next 4 bytes)
///   control & 3 == 3: raw application/octet-stream body for the model's one input
///
/// Beyond "no crash, no sanitizer report", it checks what the rest of the
/// server relies on: every failure is a 400 or 413 with a message, every error
/// body is valid JSON, and a request that validates has tensor data of exactly
/// the size its shape and datatype call for, inside the body or its own buffer.

#include "ingress/kserve_codec.hpp"
#include "ingress/validate.hpp"

#include <simdjson.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

model_config make_model() {
  model_config m;
  m.name = "fuzzed";
  m.max_batch_size = 8;
  m.inputs = {{"INPUT0", datatype::fp32, {3, -1}},
              {"INPUT1", datatype::int32, {4}},
              {"TEXT", datatype::bytes, {1}}};
  m.outputs = {{"OUTPUT0", datatype::fp32, {10}}, {"NAMES", datatype::bytes, {1}}};
  return m;
}

/// The raw binary mode needs a model with exactly one input.
model_config make_single_input_model() {
  model_config m;
  m.name = "raw";
  m.max_batch_size = 0;
  m.inputs = {{"INPUT0", datatype::fp32, {2, -1}}};
  m.outputs = {{"OUTPUT0", datatype::fp32, {2, -1}}};
  return m;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kserve_request: invariant broken: %s\n", what);
    std::abort();
  }
}

void check_error(const serving_error& e) {
  check(e.status == status_code::bad_request || e.status == status_code::payload_too_large,
        "a request parse or validation failure is a 400 or 413");
  check(!e.message.empty(), "every error has a message");
  auto body = serialize_error(e.message);
  simdjson::dom::parser parser;
  auto doc = parser.parse(body);
  check(!doc.error(), "serialize_error writes valid JSON");
  std::string_view msg;
  check(!doc["error"].get(msg), "the error body has an \"error\" string");
}

bool inside(std::string_view part, std::string_view whole) {
  return part.empty()
         || (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const model_config model = make_model();
  static const model_config single = make_single_input_model();
  if (size < 1)
    return 0;
  unsigned mode = data[0] & 3;
  ++data;
  --size;

  parse_input in;
  std::optional<uint64_t> header_length;
  if (mode == 2) {
    if (size < 4)
      return 0;
    uint32_t h;
    std::memcpy(&h, data, 4);
    header_length = h;
    data += 4;
    size -= 4;
  }
  // An exact-size heap buffer, so that ASan sees any read past the body; the
  // padded mode promises (and only promises) 64 more readable bytes.
  size_t padding = mode == 1 ? simdjson::SIMDJSON_PADDING : 0;
  auto buffer = std::make_unique<char[]>(size + padding);
  if (size > 0)
    std::memcpy(buffer.get(), data, size);
  std::memset(buffer.get() + size, '}', padding);
  std::string_view body{buffer.get(), size};

  in.body = body;
  in.header_length = header_length;
  in.readable_padding = padding;
  in.content_type = mode == 3 ? "application/octet-stream" : "application/json";
  in.model = mode == 3 ? &single : nullptr;
  in.limits.max_body_bytes = 1 << 20;
  in.limits.max_elements = 1 << 16;

  auto req = parse_infer_request(in);
  if (!req) {
    check_error(req.error());
    return 0;
  }
  for (auto& input : req->inputs)
    check(input.owns_data() ? inside(input.data, input.owned) : inside(input.data, body),
          "an input's data lies in the body or in its own buffer");

  const auto& target = mode == 3 ? single : model;
  auto ok = validate(*req, target, in.limits);
  if (!ok) {
    check_error(ok.error());
    return 0;
  }
  for (auto& input : req->inputs) {
    auto count = checked_element_count(input.shape, in.limits.max_elements, input.name);
    check(count.ok(), "a validated shape has a checked element count");
    if (input.dtype == datatype::bytes) {
      auto n = count_bytes_elements(input.data, input.name);
      check(n.ok() && *n == *count, "validated BYTES data holds one element per shape entry");
    } else {
      check(input.data.size() == *count * element_size(input.dtype),
            "validated data is exactly shape x element size bytes");
    }
  }
  check(ok->batch_size >= 1, "a validated request has a batch size");
  check(target.max_batch_size == 0 || ok->batch_size <= static_cast<uint32_t>(target.max_batch_size),
        "the batch size is within max_batch_size");
  return 0;
}
