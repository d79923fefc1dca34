#include "text/jinja_value.hpp"

#include "core/json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace caf_serving::text::jinja {

// -- object ---------------------------------------------------------------------

object::object(std::initializer_list<std::pair<std::string, value>> items) {
  for (auto& [k, v] : items)
    set(k, v);
}

const value* object::find(std::string_view key) const {
  for (auto& [k, v] : items_)
    if (k == key)
      return &v;
  return nullptr;
}

void object::set(std::string key, value v) {
  for (auto& [k, old] : items_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items_.emplace_back(std::move(key), std::move(v));
}

// -- value ----------------------------------------------------------------------

double value::to_double() const {
  switch (type()) {
    case kind::integer: return static_cast<double>(as_int());
    case kind::floating: return as_double();
    case kind::boolean: return as_bool() ? 1.0 : 0.0;
    default: return 0.0;
  }
}

bool value::truthy() const {
  switch (type()) {
    case kind::undefined:
    case kind::none: return false;
    case kind::boolean: return as_bool();
    case kind::integer: return as_int() != 0;
    case kind::floating: return as_double() != 0.0;
    case kind::string: return !as_string().empty();
    case kind::array: return !as_array().empty();
    case kind::object: return !as_object().empty();
    case kind::native: return true;
  }
  return false;
}

result<std::string> value::to_json() const {
  return jinja::to_json(*this, json_format{});
}

// -- JSON reading ----------------------------------------------------------------

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// A recursive-descent JSON reader; nesting is bounded so that a hostile body
/// cannot exhaust the stack.
class json_reader {
public:
  explicit json_reader(std::string_view text) : s_(text) {}

  result<value> read_document() {
    value v;
    if (!read(v, 0))
      return error();
    skip_ws();
    if (pos_ != s_.size()) {
      fail("unexpected text after the JSON value");
      return error();
    }
    return v;
  }

private:
  static constexpr int max_depth = 256;

  serving_error error() const {
    return bad_request("invalid JSON at offset " + std::to_string(err_pos_) + ": " + err_);
  }

  bool fail(std::string what) {
    if (err_.empty()) {
      err_ = std::move(what);
      err_pos_ = pos_;
    }
    return false;
  }

  void skip_ws() {
    while (pos_ < s_.size()
           && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }

  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word)
      return fail("expected a JSON value");
    pos_ += word.size();
    return true;
  }

  bool read(value& out, int depth) {
    if (depth > max_depth)
      return fail("nesting deeper than 256 levels");
    skip_ws();
    if (pos_ >= s_.size())
      return fail("unexpected end of the text, expected a JSON value");
    char c = s_[pos_];
    switch (c) {
      case 'n': out = value::none(); return literal("null");
      case 't': out = true; return literal("true");
      case 'f': out = false; return literal("false");
      case '"': {
        std::string str;
        if (!read_string(str))
          return false;
        out = value{std::move(str)};
        return true;
      }
      case '[': {
        ++pos_;
        array items;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          out = value{std::move(items)};
          return true;
        }
        for (;;) {
          value item;
          if (!read(item, depth + 1))
            return false;
          items.push_back(std::move(item));
          skip_ws();
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            continue;
          }
          if (pos_ < s_.size() && s_[pos_] == ']') {
            ++pos_;
            out = value{std::move(items)};
            return true;
          }
          return fail("expected ',' or ']' in an array");
        }
      }
      case '{': {
        ++pos_;
        object items;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          out = value{std::move(items)};
          return true;
        }
        for (;;) {
          skip_ws();
          if (pos_ >= s_.size() || s_[pos_] != '"')
            return fail("expected a string key in an object");
          std::string key;
          if (!read_string(key))
            return false;
          skip_ws();
          if (pos_ >= s_.size() || s_[pos_] != ':')
            return fail("expected ':' after an object key");
          ++pos_;
          value item;
          if (!read(item, depth + 1))
            return false;
          items.set(std::move(key), std::move(item));
          skip_ws();
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            continue;
          }
          if (pos_ < s_.size() && s_[pos_] == '}') {
            ++pos_;
            out = value{std::move(items)};
            return true;
          }
          return fail("expected ',' or '}' in an object");
        }
      }
      default:
        if (c == '-' || (c >= '0' && c <= '9'))
          return read_number(out);
        return fail("expected a JSON value");
    }
  }

  bool read_hex4(uint32_t& cp) {
    if (pos_ + 4 > s_.size())
      return fail("truncated \\u escape");
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9')
        cp |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        cp |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        cp |= static_cast<uint32_t>(h - 'A' + 10);
      else
        return fail("invalid \\u escape");
    }
    return true;
  }

  bool read_string(std::string& out) {
    ++pos_; // the opening quote
    for (;;) {
      size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\\'
             && static_cast<unsigned char>(s_[pos_]) >= 0x20)
        ++pos_;
      out.append(s_.substr(start, pos_ - start));
      if (pos_ >= s_.size())
        return fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"')
        return true;
      if (c != '\\')
        return fail("control character in a string (escape it as \\u00XX)");
      if (pos_ >= s_.size())
        return fail("unterminated string");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp;
          if (!read_hex4(cp))
            return false;
          if (cp >= 0xD800 && cp < 0xDC00 && pos_ + 1 < s_.size() && s_[pos_] == '\\'
              && s_[pos_ + 1] == 'u') {
            size_t save = pos_;
            pos_ += 2;
            uint32_t low;
            if (!read_hex4(low))
              return false;
            if (low >= 0xDC00 && low < 0xE000)
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            else
              pos_ = save;
          }
          if (cp >= 0xD800 && cp < 0xE000)
            cp = 0xFFFD; // a lone surrogate has no UTF-8 form
          append_utf8(out, cp);
          break;
        }
        default: return fail(std::string{"invalid escape \\"} + e);
      }
    }
  }

  bool read_number(value& out) {
    size_t start = pos_;
    bool is_float = false;
    if (s_[pos_] == '-')
      ++pos_;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        is_float = true;
        ++pos_;
      } else {
        break;
      }
    }
    const char* b = s_.data() + start;
    const char* e = s_.data() + pos_;
    if (!is_float) {
      int64_t i = 0;
      auto [p, ec] = std::from_chars(b, e, i);
      if (ec == std::errc{} && p == e) {
        out = i;
        return true;
      }
    }
    double d = 0;
    auto [p, ec] = std::from_chars(b, e, d);
    if (p != e || (ec != std::errc{} && ec != std::errc::result_out_of_range))
      return fail("invalid number");
    out = d;
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string err_;
  size_t err_pos_ = 0;
};

} // namespace

result<value> value::from_json(std::string_view json) {
  return json_reader{json}.read_document();
}

// -- Python's text forms --------------------------------------------------------

std::string python_float_repr(double d) {
  if (std::isnan(d))
    return "nan";
  if (std::isinf(d))
    return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci{buf, static_cast<size_t>(r.ptr - buf)};
  // sci is [-]D[.DDD]e[+-]XX
  bool negative = sci.front() == '-';
  if (negative)
    sci.remove_prefix(1);
  size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos))
    if (c != '.')
      digits += c;
  int exp = std::atoi(std::string{sci.substr(epos + 1)}.c_str());
  std::string out = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1);
    }
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
  }
  if (exp < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-exp - 1), '0');
    out += digits;
    return out;
  }
  size_t int_digits = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_digits) {
    out += digits;
    out.append(int_digits - digits.size(), '0');
    return out + ".0";
  }
  out.append(digits, 0, int_digits);
  out += '.';
  out.append(digits, int_digits);
  return out;
}

namespace {

/// json.dumps' string form with ensure_ascii=False: the engine's JSON
/// string writer escapes the same characters the same way (a Python string
/// is always valid UTF-8, so its U+FFFD repair never applies).
void append_json_str(std::string& out, std::string_view s) { append_json_string(out, s); }

struct json_writer {
  const json_format& f;
  std::string out;
  std::string error;

  bool indented() const { return f.indent >= 0 || !f.indent_text.empty(); }

  void newline(int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) {
      if (!f.indent_text.empty())
        out += f.indent_text;
      else
        out.append(static_cast<size_t>(f.indent), ' ');
    }
  }

  bool write(const value& v, int level) {
    switch (v.type()) {
      case value::kind::undefined:
        error = "Object of type Undefined is not JSON serializable";
        return false;
      case value::kind::native:
        error = "Object of type " + v.as_native()->repr() + " is not JSON serializable";
        return false;
      case value::kind::none: out += "null"; return true;
      case value::kind::boolean: out += v.as_bool() ? "true" : "false"; return true;
      case value::kind::integer: out += std::to_string(v.as_int()); return true;
      case value::kind::floating: {
        double d = v.as_double();
        if (std::isnan(d))
          out += "NaN";
        else if (std::isinf(d))
          out += d < 0 ? "-Infinity" : "Infinity";
        else
          out += python_float_repr(d);
        return true;
      }
      case value::kind::string: append_json_str(out, v.as_string()); return true;
      case value::kind::array: {
        const auto& items = v.as_array();
        if (items.empty()) {
          out += "[]";
          return true;
        }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0)
            out += f.item_separator;
          if (indented())
            newline(level + 1);
          if (!write(items[i], level + 1))
            return false;
        }
        if (indented())
          newline(level);
        out += ']';
        return true;
      }
      case value::kind::object: {
        const auto& items = v.as_object().items();
        if (items.empty()) {
          out += "{}";
          return true;
        }
        std::vector<const std::pair<std::string, value>*> order;
        for (auto& kv : items)
          order.push_back(&kv);
        if (f.sort_keys)
          std::stable_sort(order.begin(), order.end(),
                           [](auto* a, auto* b) { return a->first < b->first; });
        out += '{';
        for (size_t i = 0; i < order.size(); ++i) {
          if (i > 0)
            out += f.item_separator;
          if (indented())
            newline(level + 1);
          append_json_str(out, order[i]->first);
          out += f.key_separator;
          if (!write(order[i]->second, level + 1))
            return false;
        }
        if (indented())
          newline(level);
        out += '}';
        return true;
      }
    }
    return false;
  }
};

void append_repr(std::string& out, const value& v);

void append_str_repr(std::string& out, std::string_view s) {
  char quote = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos)
    quote = '"';
  out += quote;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char x[8];
      std::snprintf(x, sizeof x, "\\x%02x", c);
      out += x;
    } else {
      out += ch;
    }
  }
  out += quote;
}

void append_str(std::string& out, const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return;
    case value::kind::none: out += "None"; return;
    case value::kind::boolean: out += v.as_bool() ? "True" : "False"; return;
    case value::kind::integer: out += std::to_string(v.as_int()); return;
    case value::kind::floating: out += python_float_repr(v.as_double()); return;
    case value::kind::string: out += v.as_string(); return;
    case value::kind::array: {
      const auto& items = v.as_array();
      out += v.is_tuple() ? '(' : '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0)
          out += ", ";
        append_repr(out, items[i]);
      }
      if (v.is_tuple() && items.size() == 1)
        out += ',';
      out += v.is_tuple() ? ')' : ']';
      return;
    }
    case value::kind::object: {
      out += '{';
      bool first = true;
      for (auto& [k, item] : v.as_object().items()) {
        if (!first)
          out += ", ";
        first = false;
        append_str_repr(out, k);
        out += ": ";
        append_repr(out, item);
      }
      out += '}';
      return;
    }
    case value::kind::native: out += v.as_native()->repr(); return;
  }
}

void append_repr(std::string& out, const value& v) {
  if (v.is_string())
    append_str_repr(out, v.as_string());
  else if (v.is_undefined())
    out += "Undefined";
  else
    append_str(out, v);
}

} // namespace

result<std::string> to_json(const value& v, const json_format& format) {
  json_writer w{format, {}, {}};
  if (!w.write(v, 0))
    return bad_request(w.error);
  return std::move(w.out);
}

std::string to_python_str(const value& v) {
  std::string out;
  append_str(out, v);
  return out;
}

std::string to_python_repr(const value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

} // namespace caf_serving::text::jinja
