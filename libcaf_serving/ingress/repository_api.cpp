#include "ingress/repository_api.hpp"

#include <simdjson.h>

namespace caf_serving::ingress {

namespace {

namespace dom = simdjson::dom;

std::string type_name(dom::element_type t) {
  switch (t) {
    case dom::element_type::ARRAY: return "an array";
    case dom::element_type::OBJECT: return "an object";
    case dom::element_type::INT64:
    case dom::element_type::UINT64:
    case dom::element_type::DOUBLE: return "a number";
    case dom::element_type::STRING: return "a string";
    case dom::element_type::BOOL: return "a boolean";
    default: return "null";
  }
}

bool blank(std::string_view body) {
  return body.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

/// The body's "parameters" object, absent when the body is empty or has none.
/// `what` names the request in messages ("load", "unload").
result<std::optional<dom::object>> parameters_of(dom::parser& parser, std::string_view body,
                                                 const char* what) {
  if (blank(body))
    return std::optional<dom::object>{};
  dom::element doc;
  if (auto err = parser.parse(body.data(), body.size()).get(doc))
    return bad_request(std::string("failed to parse the request JSON buffer: ")
                       + simdjson::error_message(err) + "; the " + what
                       + " request body is a JSON object such as {\"parameters\": {...}}, "
                         "or empty");
  dom::object root;
  if (doc.get(root))
    return bad_request(std::string("the ") + what + " request body is " + type_name(doc.type())
                       + "; send a JSON object such as {\"parameters\": {...}}, or nothing");
  dom::element params;
  if (root["parameters"].get(params))
    return std::optional<dom::object>{};
  dom::object object;
  if (params.get(object))
    return bad_request(std::string("'parameters' of the ") + what + " request is "
                       + type_name(params.type()) + "; it must be a JSON object");
  return std::optional<dom::object>{object};
}

} // namespace

result<server::load_parameters> parse_load_request(std::string_view body) {
  dom::parser parser;
  auto params = parameters_of(parser, body, "load");
  if (!params)
    return params.error();
  server::load_parameters out;
  if (!*params)
    return out;
  constexpr std::string_view file_prefix = "file:";
  for (auto [key, value] : **params) {
    std::string name(key);
    std::string_view text;
    if (value.get(text))
      return bad_request("load parameter '" + name + "' is " + type_name(value.type())
                         + ", but every load parameter is a JSON string: \"config\" holds "
                           "the model configuration as JSON text, \"file:<path>\" a file in "
                           "base64");
    if (name == "config") {
      out.config = std::string(text);
    } else if (name.compare(0, file_prefix.size(), file_prefix) == 0) {
      out.files.push_back({name.substr(file_prefix.size()), std::string(text)});
    } else {
      return bad_request("Unrecognized load parameter '" + name
                         + "' with type 'STRING'; the load parameters are \"config\" (the "
                           "model configuration as JSON) and \"file:<path>\" (a model file, "
                           "base64)");
    }
  }
  return out;
}

result<server::unload_parameters> parse_unload_request(std::string_view body) {
  dom::parser parser;
  auto params = parameters_of(parser, body, "unload");
  if (!params)
    return params.error();
  server::unload_parameters out;
  if (!*params)
    return out;
  dom::element value;
  if ((*params)->at_key("unload_dependents").get(value))
    return out;
  if (value.get(out.unload_dependents))
    return bad_request("Unable to parse 'unload_dependents': it is " + type_name(value.type())
                       + "; use true or false");
  return out;
}

} // namespace caf_serving::ingress
