#pragma once
/// jinja2's filters and tests, Python's string, list and dict methods and the
/// Python semantics of values (equality, ordering, length, iteration) that the
/// chat template interpreter calls (issue 34). Internal to
/// caf_serving_chat_template.
///
/// A failure is thrown as `eval_error` and never leaves the library: the
/// interpreter catches it and answers a serving_error naming the template line.

#include "text/jinja_value.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace caf_serving::text::jinja {

/// A failed evaluation. `raised` marks raise_exception(message), whose message
/// reaches the client as it is.
struct eval_error {
  std::string message;
  bool raised = false;
};

[[noreturn]] void fail(std::string message);

/// The arguments of a call, a filter or a test (after the value it applies to).
struct call_args {
  std::vector<value> args;
  std::vector<std::pair<std::string, value>> kwargs;

  /// Python's binding of one parameter: the `index`th positional argument, or
  /// the keyword `name`, or `fallback`.
  value get(size_t index, std::string_view name, value fallback = {}) const;
};

/// Python's type name ("str", "int", "dict", "NoneType", "Undefined"...).
std::string type_name(const value& v);

/// Python's ==: numbers across int, float and bool; lists and dicts by content.
bool python_equal(const value& a, const value& b);

/// Python's <; fails as Python does for values of unordered types.
bool python_less(const value& a, const value& b);

/// Python's len(); fails for values without a length.
size_t python_len(const value& v);

/// What `for x in v` visits: list items, dict keys, a string's characters;
/// nothing for Undefined.
array iterate(const value& v);

/// `v | name(args)`.
value apply_filter(std::string_view name, const value& v, const call_args& a);

/// `v is name(args)`.
bool apply_test(std::string_view name, const value& v, const call_args& a);

/// `obj.name(args)` for strings, lists and dicts.
value call_method(const value& obj, std::string_view name, const call_args& a);

/// Whether `call_method` knows `name` for values of obj's type.
bool has_method(const value& obj, std::string_view name);

/// `obj[key]` as jinja2's getitem reads it: Undefined where Python fails.
value get_item(const value& obj, const value& key);

} // namespace caf_serving::text::jinja
