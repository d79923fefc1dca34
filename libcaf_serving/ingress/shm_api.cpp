#include "ingress/shm_api.hpp"

#include "core/json.hpp"
#include "ingress/kserve_codec.hpp"

#include <simdjson.h>

#include <optional>

namespace caf_serving::ingress {

namespace {

/// Triton's text, word for word: clients and Triton's tests match on it.
constexpr const char* client_shm_disabled
  = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to "
    "enable.";

shm_api_response error(int status, const std::string& message) {
  return {status, serialize_error(message)};
}

shm_api_response error(const serving_error& e) {
  return error(static_cast<int>(e.status), e.message);
}

std::string status_json(const std::vector<region_status>& regions) {
  std::string out = "[";
  for (const auto& r : regions) {
    if (out.size() > 1)
      out += ',';
    out += "{\"name\":";
    append_json_string(out, r.name);
    out += ",\"key\":";
    append_json_string(out, r.key);
    out += ",\"offset\":" + std::to_string(r.offset)
           + ",\"byte_size\":" + std::to_string(r.byte_size) + "}";
  }
  return out + "]";
}

constexpr const char* register_shape
  = "send {\"key\": \"/shm_key\", \"offset\": 0, \"byte_size\": N}";

/// POST .../region/{name}/register with {"key","offset","byte_size"}.
shm_api_response register_system(shared_memory_registry& registry, const std::string& name,
                                 std::string_view body) {
  if (body.size() > max_shm_request_bytes)
    return error(413, "the register request body has " + std::to_string(body.size())
                        + " bytes, more than " + std::to_string(max_shm_request_bytes) + "; "
                        + register_shape);
  // As in Triton, an empty body is an empty request (and lacks 'key').
  simdjson::padded_string json(body.empty() ? std::string_view("{}") : body);
  simdjson::dom::parser parser;
  simdjson::dom::object request;
  if (auto err = parser.parse(json).get(request); err)
    return error(400, std::string("the register request body is not a JSON object (")
                        + simdjson::error_message(err) + "); " + register_shape);
  simdjson::dom::element key_value;
  if (request["key"].get(key_value))
    return error(400, std::string("Shared memory register request has no 'key' field; ")
                        + register_shape);
  std::string_view key;
  if (key_value.get(key))
    return error(400, std::string("Shared memory register request's 'key' must be a string, "
                                  "the name given to shm_open; ")
                        + register_shape);
  uint64_t offset = 0;
  simdjson::dom::element offset_value;
  if (!request["offset"].get(offset_value) && offset_value.get(offset))
    return error(400, std::string("Shared memory register request's 'offset' must be a "
                                  "non-negative integer (bytes into the object); ")
                        + register_shape);
  simdjson::dom::element size_value;
  if (request["byte_size"].get(size_value))
    return error(400, std::string("Shared memory register request has no 'byte_size' field; ")
                        + register_shape);
  uint64_t byte_size = 0;
  if (size_value.get(byte_size))
    return error(400, std::string("Shared memory register request's 'byte_size' must be a "
                                  "non-negative integer; ")
                        + register_shape);
  auto r = registry.register_system(name, std::string(key), offset, byte_size);
  if (!r)
    return error(r.error());
  return {200, ""};
}

/// Everything under /v2/cudasharedmemory: answered as a Triton built without
/// GPU support answers.
shm_api_response cuda(shared_memory_registry& registry, const std::string& action,
                      const std::optional<std::string>& name) {
  if (action == "status") {
    if (!name)
      return {200, "[]"};
    if (registry.status(*name, region_kind::system))
      return error(404, "The region named '" + *name
                          + "' is registered as system shared memory, not CUDA shared memory; "
                            "GET /v2/systemsharedmemory/region/"
                          + *name + "/status shows it");
    return error(404, "Unable to find cuda shared memory region: '" + *name
                        + "'; caf-serving does not support CUDA shared memory yet");
  }
  if (!registry.config().allow_client_shm)
    return error(501, client_shm_disabled);
  if (action == "register") {
    if (!name)
      return error(400, "'region name' is necessary to register cuda shared memory region");
    return error(400, "failed to register CUDA shared memory region: '" + *name
                        + "', GPUs not supported; caf-serving does not support CUDA shared "
                          "memory yet: put the tensors in system shared memory "
                          "(/v2/systemsharedmemory) instead");
  }
  return {200, ""}; // unregister: no CUDA region can exist
}

} // namespace

bool is_shared_memory_path(const std::vector<std::string>& parts) {
  return parts.size() >= 2 && parts[0] == "v2"
         && (parts[1] == "systemsharedmemory" || parts[1] == "cudasharedmemory");
}

std::string percent_decode(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0
        && hex(text[i + 2]) >= 0) {
      out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

shm_api_response handle_shared_memory_request(shared_memory_registry& registry,
                                              const shm_api_request& request) {
  const auto& parts = request.parts;
  bool is_cuda = parts[1] == "cudasharedmemory";
  std::string base = is_cuda ? "/v2/cudasharedmemory" : "/v2/systemsharedmemory";
  std::optional<std::string> name;
  std::string action;
  if (parts.size() == 3) {
    action = parts[2];
  } else if (parts.size() == 5 && parts[2] == "region") {
    name = percent_decode(parts[3]);
    action = parts[4];
  }
  if (action != "status" && action != "register" && action != "unregister")
    return error(404, "unknown shared-memory endpoint; they are GET " + base
                        + "[/region/{name}]/status, POST " + base
                        + "/region/{name}/register and POST " + base
                        + "[/region/{name}]/unregister");
  shm_method wanted = action == "status" ? shm_method::get : shm_method::post;
  if (request.method != wanted)
    return error(405, std::string("Method Not Allowed; ") + base + " " + action + " takes "
                        + (wanted == shm_method::get ? "GET" : "POST"));
  if (is_cuda)
    return cuda(registry, action, name);
  if (action == "status") {
    auto s = registry.status(name, region_kind::system);
    if (!s)
      return error(s.error());
    return {200, status_json(*s)};
  }
  if (!registry.config().allow_client_shm)
    return error(501, client_shm_disabled);
  if (action == "register") {
    if (!name)
      return error(400, "'region name' is necessary to register system shared memory region; "
                        "POST /v2/systemsharedmemory/region/{name}/register");
    return register_system(registry, *name, request.body);
  }
  if (name)
    registry.unregister(*name, region_kind::system);
  else
    registry.unregister_all(region_kind::system);
  return {200, ""};
}

} // namespace caf_serving::ingress
