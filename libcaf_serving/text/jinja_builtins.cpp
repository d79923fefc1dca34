#include "text/jinja_builtins.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace caf_serving::text::jinja {

void fail(std::string message) {
  throw eval_error{std::move(message), false};
}

value call_args::get(size_t index, std::string_view name, value fallback) const {
  if (index < args.size())
    return args[index];
  for (auto& [k, v] : kwargs)
    if (k == name)
      return v;
  return fallback;
}

namespace {

// -- UTF-8 and Python's character classes ---------------------------------------

/// The code point at s[i] and its length in bytes; a stray byte is one code point.
std::pair<uint32_t, size_t> decode(std::string_view s, size_t i) {
  auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size())
    n = 1;
  if (n == 1)
    return {b, 1};
  uint32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80)
      return {b, 1};
    cp = (cp << 6) | (c & 0x3F);
  }
  return {cp, n};
}

/// The code points of s as slices of it.
std::vector<std::string_view> chars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = decode(s, i).second;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0
         || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029
         || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool ascii_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool ascii_lower(char c) { return c >= 'a' && c <= 'z'; }
/// Letters with case: ASCII letters and, as an approximation, every non-ASCII byte.
bool cased(char c) {
  return ascii_upper(c) || ascii_lower(c) || static_cast<unsigned char>(c) >= 0x80;
}
char to_upper(char c) { return ascii_lower(c) ? static_cast<char>(c - 32) : c; }
char to_lower(char c) { return ascii_upper(c) ? static_cast<char>(c + 32) : c; }

std::string upper(std::string s) {
  for (auto& c : s)
    c = to_upper(c);
  return s;
}
std::string lower(std::string s) {
  for (auto& c : s)
    c = to_lower(c);
  return s;
}

/// Python's str.capitalize: the first character upper, the rest lower.
std::string capitalize(std::string_view s) {
  std::string out = lower(std::string{s});
  if (!out.empty())
    out[0] = to_upper(out[0]);
  return out;
}

/// Python's str.title: upper after an uncased character, lower after a cased one.
std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (char c : s) {
    out += prev_cased ? to_lower(c) : to_upper(c);
    // continuation bytes of a non-ASCII letter keep it "cased"
    prev_cased = cased(c);
  }
  return out;
}

/// jinja2's title filter: words start after spaces, '-', '(', '{', '[' or '<'.
std::string jinja_title(std::string_view s) {
  std::string out;
  bool at_start = true;
  for (size_t i = 0; i < s.size();) {
    auto [cp, n] = decode(s, i);
    bool sep = py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (sep) {
      out.append(s.substr(i, n));
      at_start = true;
    } else {
      if (n == 1)
        out += at_start ? to_upper(s[i]) : to_lower(s[i]);
      else
        out.append(s.substr(i, n));
      at_start = false;
    }
    i += n;
  }
  return out;
}

bool in_set(uint32_t cp, std::string_view set) {
  for (size_t i = 0; i < set.size();) {
    auto [c, n] = decode(set, i);
    if (c == cp)
      return true;
    i += n;
  }
  return false;
}

/// Python's strip/lstrip/rstrip: whitespace, or the characters of `set`.
std::string strip(std::string_view s, const value& set, bool left, bool right) {
  auto strips = [&](uint32_t cp) {
    return set.is_string() ? in_set(cp, set.as_string()) : py_space(cp);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e) {
      auto [cp, n] = decode(s, b);
      if (!strips(cp))
        break;
      b += n;
    }
  if (right)
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
        --start;
      auto [cp, n] = decode(s, start);
      if (start + n != e || !strips(cp))
        break;
      e = start;
    }
  return std::string{s.substr(b, e - b)};
}

array split(std::string_view s, const value& sep, int64_t maxsplit) {
  array out;
  if (!sep.is_string()) {
    size_t i = 0;
    while (true) {
      while (i < s.size()) {
        auto [cp, n] = decode(s, i);
        if (!py_space(cp))
          break;
        i += n;
      }
      if (i >= s.size())
        break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        // the rest, without its trailing whitespace
        out.emplace_back(strip(s.substr(i), value{}, false, true));
        break;
      }
      size_t start = i;
      while (i < s.size()) {
        auto [cp, n] = decode(s, i);
        if (py_space(cp))
          break;
        i += n;
      }
      out.emplace_back(std::string{s.substr(start, i - start)});
    }
    return out;
  }
  const std::string& d = sep.as_string();
  if (d.empty())
    fail("empty separator in split()");
  size_t start = 0;
  for (;;) {
    size_t p = s.find(d, start);
    if (p == std::string_view::npos
        || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.emplace_back(std::string{s.substr(start)});
      return out;
    }
    out.emplace_back(std::string{s.substr(start, p - start)});
    start = p + d.size();
  }
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` around every character.
    auto cs = chars(s);
    int64_t done = 0;
    for (auto c : cs) {
      if (count < 0 || done < count) {
        out.append(with);
        ++done;
      }
      out.append(c);
    }
    if (count < 0 || done < count)
      out.append(with);
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  for (;;) {
    size_t p = s.find(old, start);
    if (p == std::string_view::npos || (count >= 0 && done >= count))
      break;
    out.append(s.substr(start, p - start));
    out.append(with);
    start = p + old.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

std::string str(const value& v) { return to_python_str(v); }

const std::string& need_string(const value& v, std::string_view what) {
  if (!v.is_string())
    fail(std::string{what} + " expects a string, got " + type_name(v));
  return v.as_string();
}

int64_t need_int(const value& v, std::string_view what) {
  if (v.is_int())
    return v.as_int();
  if (v.is_bool())
    return v.as_bool() ? 1 : 0;
  fail(std::string{what} + " expects an integer, got " + type_name(v));
}

/// str.format with {} {0} {name} fields and {{ }} escapes (format specs are
/// not supported).
std::string format(std::string_view f, const call_args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t e = f.find('}', i);
      if (e == std::string_view::npos)
        fail("single '{' encountered in format string");
      std::string_view field = f.substr(i + 1, e - i - 1);
      if (field.find_first_of(":!") != std::string_view::npos)
        fail("format specs in str.format are not supported in chat templates");
      if (field.empty()) {
        if (auto_index >= a.args.size())
          fail("Replacement index " + std::to_string(auto_index) + " out of range");
        out += str(a.args[auto_index++]);
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        size_t k = std::stoul(std::string{field});
        if (k >= a.args.size())
          fail("Replacement index " + std::to_string(k) + " out of range");
        out += str(a.args[k]);
      } else {
        bool found = false;
        for (auto& [name, v] : a.kwargs)
          if (name == field) {
            out += str(v);
            found = true;
          }
        if (!found)
          fail("KeyError: '" + std::string{field} + "' in str.format");
      }
      i = e;
    } else if (c == '}') {
      fail("single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

/// Python's int(str): optional sign, digits with single underscores, spaces around.
bool parse_py_int(std::string_view s, int64_t base, int64_t& out) {
  std::string t = strip(s, value{}, true, true);
  std::string digits;
  bool neg = false;
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-'))
    neg = t[i++] == '-';
  for (; i < t.size(); ++i)
    if (t[i] != '_')
      digits += t[i];
  if (digits.empty())
    return false;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v,
                                 static_cast<int>(base));
  if (ec != std::errc{} || p != digits.data() + digits.size())
    return false;
  out = neg ? -v : v;
  return true;
}

bool parse_py_float(std::string_view s, double& out) {
  std::string t = lower(strip(s, value{}, true, true));
  if (t.empty())
    return false;
  std::string_view body = t;
  bool neg = false;
  if (body[0] == '+' || body[0] == '-') {
    neg = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") {
    out = neg ? -INFINITY : INFINITY;
    return true;
  }
  if (body == "nan") {
    out = NAN;
    return true;
  }
  double d = 0;
  auto [p, ec] = std::from_chars(body.data(), body.data() + body.size(), d);
  if (p != body.data() + body.size() || (ec != std::errc{} && ec != std::errc::result_out_of_range))
    return false;
  out = neg ? -d : d;
  return true;
}

/// jinja2's indent filter.
std::string indent(std::string s, const value& width, bool first, bool blank) {
  std::string pad = width.is_string() ? width.as_string()
                                      : std::string(static_cast<size_t>(std::max<int64_t>(0, need_int(width, "indent"))), ' ');
  s += '\n';
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n')
        ++i;
      start = i + 1;
    }
  if (start < s.size())
    lines.push_back(s.substr(start));
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0)
        rv += "\n" + pad;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? std::string{} : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += '\n';
      if (!lines[i].empty())
        rv += pad;
      rv += lines[i];
    }
  }
  if (first)
    rv = pad + rv;
  return rv;
}

/// An attribute of an item for selectattr, map, sort, unique: dotted paths read
/// key by key, Undefined where one is missing.
value attribute_of(const value& item, std::string_view path) {
  value cur = item;
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string_view part = path.substr(start, dot == std::string_view::npos ? dot : dot - start);
    int64_t index = 0;
    auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    if (ec == std::errc{} && p == part.data() + part.size())
      cur = get_item(cur, value{index});
    else
      cur = get_item(cur, value{std::string{part}});
    if (dot == std::string_view::npos)
      return cur;
    start = dot + 1;
  }
}

/// The remaining arguments of a test invocation, after the test's name.
call_args rest_args(const call_args& a, size_t from) {
  call_args rest;
  for (size_t i = from; i < a.args.size(); ++i)
    rest.args.push_back(a.args[i]);
  rest.kwargs = a.kwargs;
  return rest;
}

array select(const value& v, const call_args& a, bool by_attribute, bool keep) {
  array out;
  size_t test_at = by_attribute ? 1 : 0;
  std::string attr;
  if (by_attribute)
    attr = need_string(a.get(0, "attribute"), "selectattr/rejectattr's attribute");
  value test = test_at < a.args.size() ? a.args[test_at] : value{};
  call_args test_args = rest_args(a, test_at + 1);
  for (auto& item : iterate(v)) {
    value x = by_attribute ? attribute_of(item, attr) : item;
    bool ok = test.is_undefined() ? x.truthy() : apply_test(need_string(test, "a test name"), x, test_args);
    if (ok == keep)
      out.push_back(item);
  }
  return out;
}

value sort_key(const value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string())
    return value{lower(v.as_string())};
  return v;
}

value round_value(const value& v, int64_t precision, const std::string& method) {
  if (!v.is_number() && !v.is_bool())
    fail("round expects a number, got " + type_name(v));
  if (method == "common") {
    if (!v.is_double())
      return v.is_bool() ? value{int64_t{v.as_bool()}} : v; // round(int) stays an int
    double d = v.as_double();
    if (!std::isfinite(d))
      return v;
    char buf[512];
    int p = static_cast<int>(std::clamp<int64_t>(precision, 0, 300));
    if (precision < 0) {
      double scale = std::pow(10.0, static_cast<double>(-precision));
      return std::nearbyint(d / scale) * scale;
    }
    std::snprintf(buf, sizeof buf, "%.*f", p, d);
    return std::strtod(buf, nullptr);
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.to_double() * scale;
  if (method == "ceil")
    return std::ceil(x) / scale;
  if (method == "floor")
    return std::floor(x) / scale;
  fail("method must be common, ceil or floor");
}

value tojson(const value& v, const call_args& a) {
  if (a.get(0, "ensure_ascii", false).truthy())
    fail("tojson(ensure_ascii=True) is not supported in chat templates");
  json_format f;
  value ind = a.get(1, "indent", value::none());
  if (ind.is_string()) {
    f.indent_text = ind.as_string();
    f.indent = 0;
  } else if (!ind.is_none() && !ind.is_undefined()) {
    f.indent = static_cast<int>(std::max<int64_t>(0, need_int(ind, "tojson's indent")));
  }
  if (f.indent >= 0)
    f.item_separator = ",";
  value seps = a.get(2, "separators", value::none());
  if (seps.is_array()) {
    if (seps.as_array().size() != 2)
      fail("tojson's separators must be a pair of strings");
    f.item_separator = need_string(seps.as_array()[0], "tojson's separators");
    f.key_separator = need_string(seps.as_array()[1], "tojson's separators");
  }
  f.sort_keys = a.get(3, "sort_keys", false).truthy();
  auto r = to_json(v, f);
  if (!r)
    fail(r.error().message);
  return value{std::move(*r)};
}

} // namespace

// -- Python semantics -------------------------------------------------------------

std::string type_name(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return "Undefined";
    case value::kind::none: return "NoneType";
    case value::kind::boolean: return "bool";
    case value::kind::integer: return "int";
    case value::kind::floating: return "float";
    case value::kind::string: return "str";
    case value::kind::array: return v.is_tuple() ? "tuple" : "list";
    case value::kind::object: return "dict";
    case value::kind::native: return v.as_native()->repr();
  }
  return "?";
}

bool python_equal(const value& a, const value& b) {
  bool an = a.is_number() || a.is_bool();
  bool bn = b.is_number() || b.is_bool();
  if (an && bn) {
    if (!a.is_double() && !b.is_double()) {
      int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      return x == y;
    }
    return a.to_double() == b.to_double();
  }
  if (a.type() != b.type())
    return false;
  switch (a.type()) {
    case value::kind::undefined:
    case value::kind::none: return true;
    case value::kind::string: return a.as_string() == b.as_string();
    case value::kind::array: {
      if (a.is_tuple() != b.is_tuple())
        return false;
      const auto& x = a.as_array();
      const auto& y = b.as_array();
      if (x.size() != y.size())
        return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!python_equal(x[i], y[i]))
          return false;
      return true;
    }
    case value::kind::object: {
      const auto& x = a.as_object();
      const auto& y = b.as_object();
      if (x.size() != y.size())
        return false;
      for (auto& [k, v] : x.items()) {
        const value* w = y.find(k);
        if (w == nullptr || !python_equal(v, *w))
          return false;
      }
      return true;
    }
    case value::kind::native: return a.as_native() == b.as_native();
    default: return false;
  }
}

bool python_less(const value& a, const value& b) {
  bool an = a.is_number() || a.is_bool();
  bool bn = b.is_number() || b.is_bool();
  if (an && bn) {
    if (!a.is_double() && !b.is_double()) {
      int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      return x < y;
    }
    return a.to_double() < b.to_double();
  }
  if (a.is_string() && b.is_string())
    return a.as_string() < b.as_string();
  if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.as_array();
    const auto& y = b.as_array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!python_equal(x[i], y[i]))
        return python_less(x[i], y[i]);
    return x.size() < y.size();
  }
  if (a.is_undefined() || b.is_undefined())
    fail("an undefined value cannot be compared");
  fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

size_t python_len(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return 0;
    case value::kind::string: {
      size_t n = 0;
      for (char c : v.as_string())
        n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
      return n;
    }
    case value::kind::array: return v.as_array().size();
    case value::kind::object: return v.as_object().size();
    default: fail("object of type '" + type_name(v) + "' has no len()");
  }
}

array iterate(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return {};
    case value::kind::array: return v.as_array();
    case value::kind::object: {
      array keys;
      for (auto& [k, item] : v.as_object().items())
        keys.emplace_back(k);
      return keys;
    }
    case value::kind::string: {
      array out;
      for (auto c : chars(v.as_string()))
        out.emplace_back(c);
      return out;
    }
    default: fail("'" + type_name(v) + "' object is not iterable");
  }
}

value get_item(const value& obj, const value& key) {
  if (obj.is_undefined())
    fail("cannot read " + to_python_repr(key) + " of an undefined value");
  if (obj.is_object()) {
    if (!key.is_string())
      return {};
    const value* v = obj.as_object().find(key.as_string());
    return v != nullptr ? *v : value{};
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
    if (obj.is_array()) {
      const auto& items = obj.as_array();
      auto n = static_cast<int64_t>(items.size());
      if (i < 0)
        i += n;
      if (i < 0 || i >= n)
        return {};
      return items[static_cast<size_t>(i)];
    }
    auto cs = chars(obj.as_string());
    auto n = static_cast<int64_t>(cs.size());
    if (i < 0)
      i += n;
    if (i < 0 || i >= n)
      return {};
    return value{cs[static_cast<size_t>(i)]};
  }
  return {};
}

// -- filters ----------------------------------------------------------------------

value apply_filter(std::string_view name, const value& v, const call_args& a) {
  if (name == "default" || name == "d") {
    bool boolean = a.get(1, "boolean", false).truthy();
    if (v.is_undefined() || (boolean && !v.truthy()))
      return a.get(0, "default_value", value{std::string{}});
    return v;
  }
  if (name == "length" || name == "count")
    return value{static_cast<int64_t>(python_len(v))};
  if (name == "tojson")
    return tojson(v, a);
  if (name == "trim")
    return value{strip(str(v), a.get(0, "chars", value::none()), true, true)};
  if (name == "upper")
    return value{upper(str(v))};
  if (name == "lower")
    return value{lower(str(v))};
  if (name == "capitalize")
    return value{capitalize(str(v))};
  if (name == "title")
    return value{jinja_title(str(v))};
  if (name == "safe" || name == "e" || name == "escape") {
    if (name != "safe")
      fail("the escape filter is not supported in chat templates (no autoescaping)");
    return v;
  }
  if (name == "string")
    return value{str(v)};
  if (name == "first" || name == "last") {
    if (v.is_undefined())
      return {};
    auto items = iterate(v);
    if (items.empty())
      return {};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    std::string sep = str(a.get(0, "d", value{std::string{}}));
    value attr = a.get(1, "attribute", value::none());
    std::string out;
    bool first = true;
    for (auto& item : iterate(v)) {
      if (!first)
        out += sep;
      first = false;
      out += str(attr.is_none() ? item : attribute_of(item, str(attr)));
    }
    return value{std::move(out)};
  }
  if (name == "replace") {
    value count = a.get(2, "count", value::none());
    return value{replace(str(v), str(a.get(0, "old")), str(a.get(1, "new")),
                         count.is_none() ? -1 : need_int(count, "replace's count"))};
  }
  if (name == "list")
    return value{iterate(v)};
  if (name == "items") {
    if (v.is_undefined())
      return value{array{}};
    if (!v.is_object())
      fail("the items filter expects a mapping, got " + type_name(v));
    array out;
    for (auto& [k, item] : v.as_object().items())
      out.emplace_back(array{value{k}, item}, true);
    return value{std::move(out)};
  }
  if (name == "int") {
    value fallback = a.get(0, "default", value{int64_t{0}});
    int64_t base = need_int(a.get(1, "base", value{int64_t{10}}), "int's base");
    if (v.is_int())
      return v;
    if (v.is_bool())
      return value{int64_t{v.as_bool()}};
    if (v.is_double())
      return std::isfinite(v.as_double()) ? value{static_cast<int64_t>(v.as_double())} : fallback;
    if (v.is_string()) {
      int64_t i = 0;
      if (parse_py_int(v.as_string(), base, i))
        return value{i};
      double d = 0;
      if (parse_py_float(v.as_string(), d) && std::isfinite(d))
        return value{static_cast<int64_t>(d)};
    }
    return fallback;
  }
  if (name == "float") {
    value fallback = a.get(0, "default", value{0.0});
    if (v.is_number() || v.is_bool())
      return value{v.to_double()};
    double d = 0;
    if (v.is_string() && parse_py_float(v.as_string(), d))
      return value{d};
    return fallback;
  }
  if (name == "abs") {
    if (v.is_int())
      return value{v.as_int() < 0 ? -v.as_int() : v.as_int()};
    if (v.is_bool())
      return value{int64_t{v.as_bool()}};
    if (v.is_double())
      return value{std::fabs(v.as_double())};
    fail("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "round")
    return round_value(v, need_int(a.get(0, "precision", value{int64_t{0}}), "round's precision"),
                       str(a.get(1, "method", value{"common"})));
  if (name == "indent")
    return value{indent(str(v), a.get(0, "width", value{int64_t{4}}), a.get(1, "first", false).truthy(),
                        a.get(2, "blank", false).truthy())};
  if (name == "selectattr" || name == "rejectattr")
    return value{select(v, a, true, name == "selectattr")};
  if (name == "select" || name == "reject")
    return value{select(v, a, false, name == "select")};
  if (name == "map") {
    array out;
    value attr = a.get(99, "attribute");
    if (!attr.is_undefined()) {
      value fallback = a.get(99, "default");
      for (auto& item : iterate(v)) {
        value x = attribute_of(item, str(attr));
        out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
      }
      return value{std::move(out)};
    }
    if (a.args.empty())
      fail("map needs a filter name or attribute=");
    std::string filter = need_string(a.args[0], "map's filter name");
    call_args rest = rest_args(a, 1);
    for (auto& item : iterate(v))
      out.push_back(apply_filter(filter, item, rest));
    return value{std::move(out)};
  }
  if (name == "unique") {
    bool cs = a.get(0, "case_sensitive", false).truthy();
    value attr = a.get(1, "attribute", value::none());
    array out, seen;
    for (auto& item : iterate(v)) {
      value key = sort_key(attr.is_none() ? item : attribute_of(item, str(attr)), cs);
      if (std::none_of(seen.begin(), seen.end(), [&](const value& s) { return python_equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return value{std::move(out)};
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cs = chars(v.as_string());
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it)
        out.append(*it);
      return value{std::move(out)};
    }
    auto items = iterate(v);
    std::reverse(items.begin(), items.end());
    return value{std::move(items)};
  }
  if (name == "sort") {
    bool reverse = a.get(0, "reverse", false).truthy();
    bool cs = a.get(1, "case_sensitive", false).truthy();
    value attr = a.get(2, "attribute", value::none());
    auto items = iterate(v);
    std::vector<std::pair<value, size_t>> keys;
    for (size_t i = 0; i < items.size(); ++i)
      keys.emplace_back(sort_key(attr.is_none() ? items[i] : attribute_of(items[i], str(attr)), cs), i);
    std::stable_sort(keys.begin(), keys.end(), [&](const auto& x, const auto& y) {
      return reverse ? python_less(y.first, x.first) : python_less(x.first, y.first);
    });
    array out;
    for (auto& [k, i] : keys)
      out.push_back(items[i]);
    return value{std::move(out)};
  }
  if (name == "sum") {
    value attr = a.get(0, "attribute", value::none());
    value total = a.get(1, "start", value{int64_t{0}});
    for (auto& item : iterate(v)) {
      value x = attr.is_none() ? item : attribute_of(item, str(attr));
      if (!(x.is_number() || x.is_bool()) || !(total.is_number() || total.is_bool()))
        fail("sum expects numbers, got " + type_name(x));
      if (total.is_double() || x.is_double())
        total = total.to_double() + x.to_double();
      else
        total = value{int64_t{static_cast<int64_t>(total.to_double()) + static_cast<int64_t>(x.to_double())}};
    }
    return total;
  }
  if (name == "wordcount") {
    return value{static_cast<int64_t>(split(str(v), value{}, -1).size())};
  }
  fail("no filter named '" + std::string{name} + "' (chat templates support the filters transformers' jinja2 offers; this one is not implemented here)");
}

// -- tests ------------------------------------------------------------------------

bool apply_test(std::string_view name, const value& v, const call_args& a) {
  if (name == "defined")
    return !v.is_undefined();
  if (name == "undefined")
    return v.is_undefined();
  if (name == "none")
    return v.is_none();
  if (name == "string")
    return v.is_string();
  if (name == "number")
    return v.is_number() || v.is_bool();
  if (name == "integer")
    return v.is_int();
  if (name == "float")
    return v.is_double();
  if (name == "boolean")
    return v.is_bool();
  if (name == "true")
    return v.is_bool() && v.as_bool();
  if (name == "false")
    return v.is_bool() && !v.as_bool();
  if (name == "mapping")
    return v.is_object();
  if (name == "iterable")
    return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "sequence")
    return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "callable")
    return v.is_native() && v.as_native()->callable();
  if (name == "odd" || name == "even") {
    int64_t i = need_int(v, "the odd and even tests");
    return (((i % 2) + 2) % 2 == 1) == (name == "odd");
  }
  if (name == "divisibleby") {
    int64_t d = need_int(a.get(0, "num"), "divisibleby");
    if (d == 0)
      fail("integer division or modulo by zero");
    return need_int(v, "divisibleby") % d == 0;
  }
  if (name == "lower" || name == "upper") {
    std::string s = str(v);
    bool any_cased = false;
    for (char c : s) {
      if (name == "lower" ? ascii_upper(c) : ascii_lower(c))
        return false;
      any_cased = any_cased || ascii_upper(c) || ascii_lower(c);
    }
    return any_cased;
  }
  value other = a.get(0, "other");
  if (name == "eq" || name == "equalto" || name == "==")
    return python_equal(v, other);
  if (name == "ne" || name == "!=")
    return !python_equal(v, other);
  if (name == "lt" || name == "lessthan" || name == "<")
    return python_less(v, other);
  if (name == "le" || name == "<=")
    return !python_less(other, v);
  if (name == "gt" || name == "greaterthan" || name == ">")
    return python_less(other, v);
  if (name == "ge" || name == ">=")
    return !python_less(v, other);
  if (name == "sameas") // Python's `is`: the same type and, as far as values tell, the same object
    return v.type() == other.type() && python_equal(v, other);
  if (name == "in") {
    value seq = a.get(0, "seq");
    if (seq.is_string())
      return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
    for (auto& item : iterate(seq))
      if (python_equal(item, v))
        return true;
    return false;
  }
  fail("no test named '" + std::string{name} + "'");
}

// -- methods ----------------------------------------------------------------------

bool has_method(const value& obj, std::string_view name) {
  static constexpr std::string_view string_methods[] = {
    "strip", "lstrip", "rstrip", "startswith", "endswith", "split", "lower", "upper", "title",
    "capitalize", "replace", "format", "join", "find", "count", "splitlines", "isdigit",
    "isspace", "isalpha", "isalnum", "islower", "isupper", "rsplit"};
  static constexpr std::string_view dict_methods[] = {"items", "keys", "values", "get"};
  if (obj.is_string())
    return std::find(std::begin(string_methods), std::end(string_methods), name) != std::end(string_methods);
  if (obj.is_object())
    return std::find(std::begin(dict_methods), std::end(dict_methods), name) != std::end(dict_methods);
  return false;
}

value call_method(const value& obj, std::string_view name, const call_args& a) {
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return value{strip(s, a.get(0, "chars", value::none()), name != "rstrip", name != "lstrip")};
    if (name == "startswith" || name == "endswith") {
      value what = a.get(0, "prefix");
      array options = what.is_array() ? what.as_array() : array{what};
      for (auto& o : options) {
        const std::string& p = need_string(o, name);
        if (name == "startswith" ? s.rfind(p, 0) == 0
                                 : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
          return value{true};
      }
      return value{false};
    }
    if (name == "split") {
      value mx = a.get(1, "maxsplit", value{int64_t{-1}});
      return value{split(s, a.get(0, "sep", value::none()), need_int(mx, "split's maxsplit"))};
    }
    if (name == "rsplit") {
      value mx = a.get(1, "maxsplit", value{int64_t{-1}});
      if (need_int(mx, "rsplit's maxsplit") >= 0)
        fail("rsplit with maxsplit is not supported in chat templates");
      return value{split(s, a.get(0, "sep", value::none()), -1)};
    }
    if (name == "lower")
      return value{lower(s)};
    if (name == "upper")
      return value{upper(s)};
    if (name == "title")
      return value{py_title(s)};
    if (name == "capitalize")
      return value{capitalize(s)};
    if (name == "replace") {
      value count = a.get(2, "count", value{int64_t{-1}});
      return value{replace(s, need_string(a.get(0, "old"), "replace"), need_string(a.get(1, "new"), "replace"),
                           need_int(count, "replace's count"))};
    }
    if (name == "format")
      return value{format(s, a)};
    if (name == "join") {
      std::string out;
      bool first = true;
      for (auto& item : iterate(a.get(0, "iterable"))) {
        if (!first)
          out += s;
        first = false;
        out += need_string(item, "str.join");
      }
      return value{std::move(out)};
    }
    if (name == "find") {
      size_t p = s.find(need_string(a.get(0, "sub"), "find"));
      if (p == std::string::npos)
        return value{int64_t{-1}};
      return value{static_cast<int64_t>(python_len(value{s.substr(0, p)}))};
    }
    if (name == "count") {
      const std::string& sub = need_string(a.get(0, "sub"), "count");
      if (sub.empty())
        return value{static_cast<int64_t>(python_len(obj) + 1)};
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size()))
        ++n;
      return value{n};
    }
    if (name == "splitlines") {
      array out;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i)
        if (s[i] == '\n' || s[i] == '\r') {
          out.emplace_back(s.substr(start, i - start));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n')
            ++i;
          start = i + 1;
        }
      if (start < s.size())
        out.emplace_back(s.substr(start));
      return value{std::move(out)};
    }
    auto all = [&](auto pred) {
      return !s.empty() && std::all_of(s.begin(), s.end(), pred);
    };
    if (name == "isdigit")
      return value{all([](char c) { return c >= '0' && c <= '9'; })};
    if (name == "isspace")
      return value{all([](char c) { return c == ' ' || (c >= 9 && c <= 13); })};
    if (name == "isalpha")
      return value{all([](char c) { return ascii_lower(c) || ascii_upper(c); })};
    if (name == "isalnum")
      return value{all([](char c) { return ascii_lower(c) || ascii_upper(c) || (c >= '0' && c <= '9'); })};
    if (name == "islower" || name == "isupper")
      return value{apply_test(name.substr(2), obj, {})};
  }
  if (obj.is_object()) {
    const object& o = obj.as_object();
    if (name == "items")
      return apply_filter("items", obj, {});
    if (name == "keys")
      return value{iterate(obj)};
    if (name == "values") {
      array out;
      for (auto& [k, v] : o.items())
        out.push_back(v);
      return value{std::move(out)};
    }
    if (name == "get") {
      value key = a.get(0, "key");
      const value* v = key.is_string() ? o.find(key.as_string()) : nullptr;
      return v != nullptr ? *v : a.get(1, "default", value::none());
    }
  }
  if (obj.is_undefined())
    fail("cannot call ." + std::string{name} + "() on an undefined value");
  fail("'" + type_name(obj) + "' object has no method '" + std::string{name}
       + "' (or it is not supported in chat templates)");
}

} // namespace caf_serving::text::jinja
