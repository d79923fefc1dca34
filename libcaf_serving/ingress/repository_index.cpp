#include "ingress/repository_index.hpp"

#include "core/json.hpp"

#include <simdjson.h>

#include <optional>

namespace caf_serving::ingress {

namespace {

namespace od = simdjson::ondemand;

constexpr std::string_view ready_type_error
  = "Invalid value for 'ready': expected a boolean; send {\"ready\": true} to list only the "
    "ready models, {\"ready\": false} or an empty body to list all";

std::string invalid_json(simdjson::error_code code) {
  return std::string("the repository index request body is not valid JSON (")
         + simdjson::error_message(code)
         + "); send an empty body, or a JSON object such as {\"ready\": true}";
}

/// Finds "ready" by walking the top-level object once, in order, and looks
/// only at the type of its value: a wrong type is named however deeply it
/// nests (Triton's test sends 250,000 nested arrays), before the validation
/// below would stop at simdjson's depth limit.
std::optional<serving_error> check_ready_type(const simdjson::padded_string& json) {
  od::parser parser;
  od::document doc;
  if (parser.iterate(json).get(doc))
    return std::nullopt; // the validation below names the problem
  od::object top;
  if (doc.get_object().get(top))
    return std::nullopt;
  for (auto field : top) {
    std::string_view key;
    if (field.unescaped_key().get(key))
      return std::nullopt;
    if (key != "ready")
      continue;
    od::json_type type;
    if (field.value().type().get(type))
      return std::nullopt;
    if (type != od::json_type::boolean)
      return bad_request(std::string{ready_type_error});
    return std::nullopt;
  }
  return std::nullopt;
}

} // namespace

result<index_request> parse_index_request(std::string_view body) {
  index_request out;
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return out;
  simdjson::padded_string json(body);
  if (auto e = check_ready_type(json))
    return *e;
  // The whole body is validated before its value is used.
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(json).get(doc))
    return bad_request(invalid_json(err));
  simdjson::dom::object top;
  if (doc.get_object().get(top))
    return bad_request("the repository index request body must be a JSON object such as "
                       "{\"ready\": true}, or empty");
  for (auto [key, value] : top) {
    if (key != "ready")
      continue;
    bool ready = false;
    if (value.get_bool().get(ready))
      return bad_request(std::string{ready_type_error});
    out.ready_only = ready;
  }
  return out;
}

std::string serialize_index(const std::vector<index_entry>& rows, const index_request& request) {
  std::string out = "[";
  for (const auto& row : rows) {
    if (request.ready_only && row.state != "READY")
      continue;
    if (out.size() > 1)
      out += ',';
    out += "{\"name\":";
    append_json_string(out, row.name);
    if (!row.version.empty()) {
      out += ",\"version\":";
      append_json_string(out, row.version);
    }
    // A model never loaded is listed by name only, as Triton lists it.
    if (!row.state.empty()) {
      out += ",\"state\":";
      append_json_string(out, row.state);
    }
    if (!row.reason.empty()) {
      out += ",\"reason\":";
      append_json_string(out, row.reason);
    }
    out += '}';
  }
  return out + "]";
}

} // namespace caf_serving::ingress
