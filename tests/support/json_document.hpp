#pragma once
/// Reading JSON answers in tests with simdjson's DOM API.
///
/// Usage:
///
///   auto doc = support::json_document::parse(response.body);   // throws on bad JSON
///   CHECK(doc.string_at("/model_name") == "simple");
///   auto sums = support::json_ints(doc.at("/outputs/0/data"));
///
/// Paths are JSON pointers (RFC 6901). A missing path or a value of another
/// type throws std::runtime_error naming the path and the document, so a test
/// fails with the text it could not read.

#include <simdjson.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::support {

class json_document {
public:
  static json_document parse(std::string_view text);

  simdjson::dom::element root() const { return root_; }
  /// The element at a JSON pointer ("" is the root).
  simdjson::dom::element at(std::string_view pointer) const;
  bool has(std::string_view pointer) const;
  std::string string_at(std::string_view pointer) const;
  int64_t int_at(std::string_view pointer) const;
  uint64_t uint_at(std::string_view pointer) const;
  const std::string& text() const { return text_; }

private:
  std::unique_ptr<simdjson::dom::parser> parser_;
  std::string text_;
  simdjson::dom::element root_;
};

/// The numbers of a (possibly nested) JSON array, flattened in order.
std::vector<double> json_numbers(simdjson::dom::element array);
/// The integers of a (possibly nested) JSON array, flattened in order.
std::vector<int64_t> json_ints(simdjson::dom::element array);
/// The strings of a (possibly nested) JSON array, flattened in order.
std::vector<std::string> json_strings(simdjson::dom::element array);

/// The "error" string of a KServe error body ({"error":"..."}); throws when
/// the body is not one.
std::string error_message(std::string_view body);

} // namespace caf_serving::support
