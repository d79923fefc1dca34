#pragma once
/// The values a chat template computes with (issue 34): what Python's jinja2
/// sees when transformers renders a chat template, reduced to JSON's data plus
/// the few objects templates make themselves.
///
/// A value is null (Python's None), a boolean, a 64-bit integer, a double, a
/// UTF-8 string, an array (a list, or a tuple when made by `(a, b)` or
/// `.items()`), an object (a dict; its keys keep their insertion order, as
/// Python's do), or jinja2's Undefined (what a missing variable, key or index
/// reads as: empty when printed, false, `is defined` false). The template
/// interpreter also makes namespaces (`namespace()`), macros, the loop object
/// and builtin functions; those stay opaque outside it.
///
/// Values share their contents: copying one copies a pointer, and arrays,
/// objects and strings never change once built (templates cannot mutate them,
/// as in transformers' ImmutableSandboxedEnvironment), so a render never copies
/// the conversation.
///
/// ## Usage
///
/// ```
/// auto messages = jinja::value::from_json(R"([{"role": "user", "content": "hi"}])");
/// jinja::object context;
/// context.set("messages", *messages);
/// context.set("add_generation_prompt", true);
/// ```

#include "core/error.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace caf_serving::text::jinja {

class value;
class object;
using array = std::vector<value>;

/// What a template made itself (namespace, macro, loop, builtin function): the
/// interpreter's own types, opaque here.
struct native {
  virtual ~native() = default;
  /// What Python prints for it, e.g. "<Namespace {'a': 1}>".
  virtual std::string repr() const = 0;
  /// Whether the template can call it (macros and builtin functions).
  virtual bool callable() const { return false; }
};

/// Python's None.
struct none_type {};

/// jinja2's Undefined.
struct undefined_type {};

class value {
public:
  enum class kind : uint8_t {
    undefined, none, boolean, integer, floating, string, array, object, native
  };

  /// Undefined.
  value() = default;
  value(none_type) : v_(none_type{}) {}
  value(bool b) : v_(b) {}
  value(int i) : v_(int64_t{i}) {}
  value(int64_t i) : v_(i) {}
  value(double d) : v_(d) {}
  value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  value(std::string_view s) : value(std::string{s}) {}
  value(const char* s) : value(std::string{s}) {}
  value(array items, bool tuple = false)
    : v_(std::make_shared<const array>(std::move(items))), tuple_(tuple) {}
  value(object items);
  value(std::shared_ptr<native> n) : v_(std::move(n)) {}

  static value none() { return value{none_type{}}; }

  /// Parses JSON text (RFC 8259) the way Python's json.loads does: a number
  /// with a fraction or exponent is a double, any other an integer (a double
  /// when it does not fit 64 bits); objects keep their keys' order (a repeated
  /// key keeps its first place and its last value).
  static result<value> from_json(std::string_view json);

  kind type() const { return static_cast<kind>(v_.index()); }
  bool is_undefined() const { return type() == kind::undefined; }
  bool is_none() const { return type() == kind::none; }
  bool is_bool() const { return type() == kind::boolean; }
  bool is_int() const { return type() == kind::integer; }
  bool is_double() const { return type() == kind::floating; }
  /// An integer or a double (not a boolean).
  bool is_number() const { return is_int() || is_double(); }
  bool is_string() const { return type() == kind::string; }
  bool is_array() const { return type() == kind::array; }
  bool is_tuple() const { return is_array() && tuple_; }
  bool is_object() const { return type() == kind::object; }
  bool is_native() const { return type() == kind::native; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_double() const { return std::get<double>(v_); }
  /// An integer, a double or a boolean as a double.
  double to_double() const;
  const std::string& as_string() const { return *std::get<5>(v_); }
  const array& as_array() const { return *std::get<6>(v_); }
  const object& as_object() const { return *std::get<7>(v_); }
  const std::shared_ptr<native>& as_native() const { return std::get<8>(v_); }

  /// Python's truth: None, Undefined, false, 0, 0.0 and empty strings,
  /// arrays and objects are false.
  bool truthy() const;

  /// json.dumps(v, ensure_ascii=False) with Python's default separators
  /// (", " and ": "), as transformers' `tojson` filter writes it without
  /// arguments. Fails on Undefined and on the interpreter's own objects, as
  /// json.dumps does.
  result<std::string> to_json() const;

private:
  std::variant<undefined_type, none_type, bool, int64_t, double,
               std::shared_ptr<const std::string>, std::shared_ptr<const array>,
               std::shared_ptr<const object>, std::shared_ptr<native>>
    v_;
  bool tuple_ = false;
};

/// A dict: keys in insertion order, looked up by a scan (chat messages and
/// tool schemas hold a handful of keys).
class object {
public:
  object() = default;
  object(std::initializer_list<std::pair<std::string, value>> items);

  /// The value of `key`, or nullptr.
  const value* find(std::string_view key) const;
  /// Sets `key`, keeping its place when it exists.
  void set(std::string key, value v);
  const std::vector<std::pair<std::string, value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }

private:
  std::vector<std::pair<std::string, value>> items_;
};

inline value::value(object items) : v_(std::make_shared<const object>(std::move(items))) {}

// -- Python's text forms --------------------------------------------------------

/// How json.dumps writes a value: `indent` spaces per level (negative: one
/// line), the separators, keys sorted or not.
struct json_format {
  /// An indent as a string (jinja's `tojson(indent='\t')`); used when not empty.
  std::string indent_text;
  int indent = -1;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

/// json.dumps(v, ensure_ascii=False, ...) as transformers' `tojson` filter calls it.
result<std::string> to_json(const value& v, const json_format& format);

/// Python's str(v): what `{{ v }}` prints (Undefined prints nothing, None
/// "None", true "True", a double as repr, a list as its repr).
std::string to_python_str(const value& v);

/// Python's repr(v): strings quoted as Python quotes them.
std::string to_python_repr(const value& v);

/// repr() of a double: the shortest form that reads back the same, "1.0",
/// "1e+16", "1e-05", "inf", "nan".
std::string python_float_repr(double d);

} // namespace caf_serving::text::jinja
