#include "support/json_document.hpp"

#include <stdexcept>

namespace caf_serving::support {

namespace {

std::string excerpt(const std::string& text) {
  return text.size() <= 400 ? text : text.substr(0, 400) + "...";
}

template <class T>
void flatten(simdjson::dom::element e, std::vector<T>& out) {
  if (e.is_array()) {
    // Held by value: iterating `e.get_array().value()` directly would walk a
    // reference into a destroyed temporary.
    simdjson::dom::array children = e.get_array().value();
    for (auto child : children)
      flatten(child, out);
    return;
  }
  T v;
  if (auto err = e.get(v))
    throw std::runtime_error(std::string("unexpected JSON element type: ")
                             + simdjson::error_message(err) + " in "
                             + simdjson::minify(e));
  out.push_back(std::move(v));
}

} // namespace

json_document json_document::parse(std::string_view text) {
  json_document doc;
  doc.parser_ = std::make_unique<simdjson::dom::parser>();
  doc.text_ = std::string(text);
  if (auto err = doc.parser_->parse(doc.text_).get(doc.root_))
    throw std::runtime_error(std::string("not valid JSON (") + simdjson::error_message(err)
                             + "): " + excerpt(doc.text_));
  return doc;
}

simdjson::dom::element json_document::at(std::string_view pointer) const {
  simdjson::dom::element e;
  if (auto err = root_.at_pointer(pointer).get(e))
    throw std::runtime_error("no JSON value at '" + std::string(pointer) + "' ("
                             + simdjson::error_message(err) + ") in " + excerpt(text_));
  return e;
}

bool json_document::has(std::string_view pointer) const {
  simdjson::dom::element e;
  return !root_.at_pointer(pointer).get(e);
}

std::string json_document::string_at(std::string_view pointer) const {
  std::string_view s;
  if (auto err = at(pointer).get(s))
    throw std::runtime_error("JSON value at '" + std::string(pointer) + "' is not a string ("
                             + simdjson::error_message(err) + ") in " + excerpt(text_));
  return std::string(s);
}

int64_t json_document::int_at(std::string_view pointer) const {
  int64_t v;
  if (auto err = at(pointer).get(v))
    throw std::runtime_error("JSON value at '" + std::string(pointer) + "' is not an integer ("
                             + simdjson::error_message(err) + ") in " + excerpt(text_));
  return v;
}

uint64_t json_document::uint_at(std::string_view pointer) const {
  uint64_t v;
  if (auto err = at(pointer).get(v))
    throw std::runtime_error("JSON value at '" + std::string(pointer)
                             + "' is not a non-negative integer ("
                             + simdjson::error_message(err) + ") in " + excerpt(text_));
  return v;
}

std::vector<double> json_numbers(simdjson::dom::element array) {
  std::vector<double> out;
  flatten(array, out);
  return out;
}

std::vector<int64_t> json_ints(simdjson::dom::element array) {
  std::vector<int64_t> out;
  flatten(array, out);
  return out;
}

std::vector<std::string> json_strings(simdjson::dom::element array) {
  std::vector<std::string_view> views;
  flatten(array, views);
  return {views.begin(), views.end()};
}

std::string error_message(std::string_view body) {
  auto doc = json_document::parse(body);
  return doc.string_at("/error");
}

} // namespace caf_serving::support
