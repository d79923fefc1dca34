#include "text/jinja_parser.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <initializer_list>

namespace caf_serving::text::jinja {

namespace {

enum class tok : uint8_t {
  data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof
};

struct token {
  tok type = tok::eof;
  std::string text;
  value number;
  size_t pos = 0;
};

/// Thrown inside the parser only and turned into a result at its edge.
struct syntax_error {
  size_t pos;
  std::string message;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

std::string_view rstrip(std::string_view s) {
  while (!s.empty() && is_space(s.back()))
    s.remove_suffix(1);
  return s;
}

/// Python's unicode-escape decoding of a string literal's body, as jinja2's
/// lexer applies it (UTF-8 bytes pass through).
std::string unescape(std::string_view s, size_t pos) {
  std::string out;
  out.reserve(s.size());
  auto put_cp = [&](uint32_t cp) {
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
  };
  auto hex = [&](size_t at, size_t n) -> uint32_t {
    if (at + n > s.size())
      throw syntax_error{pos, "truncated \\x, \\u or \\U escape in a string literal"};
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k) {
      char h = s[at + k];
      v <<= 4;
      if (is_digit(h))
        v |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<uint32_t>(h - 'A' + 10);
      else
        throw syntax_error{pos, "invalid \\x, \\u or \\U escape in a string literal"};
    }
    return v;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c != '\\' || i + 1 >= s.size()) {
      out += c;
      continue;
    }
    char e = s[++i];
    switch (e) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': put_cp(hex(i + 1, 2)); i += 2; break;
      case 'u': put_cp(hex(i + 1, 4)); i += 4; break;
      case 'U': put_cp(hex(i + 1, 8)); i += 8; break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = 0;
          size_t k = 0;
          while (k < 3 && i + k < s.size() && s[i + k] >= '0' && s[i + k] <= '7')
            v = v * 8 + static_cast<uint32_t>(s[i + k++] - '0');
          i += k - 1;
          put_cp(v);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

// -- lexer ----------------------------------------------------------------------

/// Splits the source into text and tags the way jinja2's lexer does with
/// trim_blocks and lstrip_blocks.
class lexer {
public:
  explicit lexer(const std::string& src) : s_(src) {}

  std::vector<token> run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = s_.size();
    while (pos < n) {
      size_t t = find_tag(pos);
      if (t == std::string::npos) {
        emit_data(std::string_view{s_}.substr(pos), pos);
        break;
      }
      std::string_view text = std::string_view{s_}.substr(pos, t - pos);
      char kind = s_[t + 1];
      size_t after = t + 2;
      char sign = 0;
      if (after < n && (s_[after] == '-' || s_[after] == '+'))
        sign = s_[after++];
      if (sign == '-') {
        text = rstrip(text);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()
            && std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(),
                           is_space))
          text = text.substr(0, l_pos);
      }
      emit_data(text, pos);
      if (kind == '#') {
        pos = comment_end(after, t, line_starting);
        continue;
      }
      if (kind == '%') {
        size_t raw_end = 0;
        if (raw_begin(after, raw_end)) {
          pos = raw_body(raw_end, line_starting);
          continue;
        }
      }
      toks_.push_back({kind == '{' ? tok::var_begin : tok::block_begin, {}, {}, t});
      pos = tag_body(after, kind, line_starting);
    }
    toks_.push_back({tok::eof, {}, {}, n});
    return std::move(toks_);
  }

private:
  size_t find_tag(size_t from) const {
    for (size_t p = s_.find('{', from); p != std::string::npos; p = s_.find('{', p + 1))
      if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#'))
        return p;
    return std::string::npos;
  }

  void emit_data(std::string_view text, size_t pos) {
    if (!text.empty())
      toks_.push_back({tok::data, std::string{text}, {}, pos});
  }

  /// Where a tag's end `end` (e.g. "%}") and its whitespace control leave the
  /// source, and whether that end closed a line.
  size_t close_tag(size_t p, bool trim_newline, bool& line_starting) {
    // p is at the end marker, possibly after a '-' or '+'.
    if (s_[p] == '-') {
      p += 3;
      while (p < s_.size() && is_space(s_[p]))
        ++p;
    } else if (s_[p] == '+') {
      p += 3;
    } else {
      p += 2;
      if (trim_newline && p < s_.size() && s_[p] == '\n')
        ++p;
    }
    line_starting = s_[p - 1] == '\n';
    return p;
  }

  size_t comment_end(size_t body, size_t start, bool& line_starting) {
    size_t e = s_.find("#}", body);
    if (e == std::string::npos)
      throw syntax_error{start, "missing end of comment tag '#}'"};
    size_t p = e;
    if (e > body && (s_[e - 1] == '-' || s_[e - 1] == '+'))
      p = e - 1;
    return close_tag(p, true, line_starting);
  }

  bool starts(size_t p, std::string_view what) const {
    return s_.compare(p, what.size(), what) == 0;
  }

  /// `{% raw %}`: after `{%` and its sign at p; sets where the raw text starts.
  bool raw_begin(size_t p, size_t& body) {
    while (p < s_.size() && is_space(s_[p]))
      ++p;
    if (!starts(p, "raw"))
      return false;
    p += 3;
    while (p < s_.size() && is_space(s_[p]))
      ++p;
    if (starts(p, "-%}")) {
      p += 3;
      while (p < s_.size() && is_space(s_[p]))
        ++p;
    } else if (starts(p, "%}")) {
      p += 2;
    } else {
      return false;
    }
    body = p;
    return true;
  }

  size_t raw_body(size_t body, bool& line_starting) {
    line_starting = s_[body - 1] == '\n';
    for (size_t p = s_.find("{%", body); p != std::string::npos; p = s_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+'))
        sign = s_[q++];
      while (q < s_.size() && is_space(s_[q]))
        ++q;
      if (!starts(q, "endraw"))
        continue;
      q += 6;
      while (q < s_.size() && is_space(s_[q]))
        ++q;
      if (!(starts(q, "%}") || starts(q, "-%}") || starts(q, "+%}")))
        continue;
      std::string_view text = std::string_view{s_}.substr(body, p - body);
      if (sign == '-') {
        text = rstrip(text);
      } else if (sign != '+') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()
            && std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(),
                           is_space))
          text = text.substr(0, l_pos);
      }
      emit_data(text, body);
      return close_tag(q, true, line_starting);
    }
    throw syntax_error{body, "missing {% endraw %} for a {% raw %} block"};
  }

  size_t tag_body(size_t p, char kind, bool& line_starting) {
    const char close = kind == '{' ? '}' : '%';
    std::vector<char> balance;
    const size_t n = s_.size();
    for (;;) {
      if (p >= n)
        throw syntax_error{p, std::string{"unexpected end of template, expected the end of the tag '"}
                                + close + "}'"};
      if (balance.empty()) {
        bool minus = s_[p] == '-' && p + 2 < n && s_[p + 1] == close && s_[p + 2] == '}';
        bool plus = kind == '%' && s_[p] == '+' && p + 2 < n && s_[p + 1] == '%' && s_[p + 2] == '}';
        bool plain = s_[p] == close && p + 1 < n && s_[p + 1] == '}';
        if (minus || plus || plain) {
          toks_.push_back({kind == '{' ? tok::var_end : tok::block_end, {}, {}, p});
          return close_tag(p, kind == '%', line_starting);
        }
      }
      char c = s_[p];
      if (is_space(c)) {
        ++p;
        continue;
      }
      if (is_digit(c)) {
        // jinja2 reads no float right after a '.' (`x.0.1` is two subscripts)
        p = lex_number(p, p > 0 && s_[p - 1] == '.');
        continue;
      }
      if (is_name_start(c)) {
        size_t e = p;
        while (e < n && is_name_char(s_[e]))
          ++e;
        toks_.push_back({tok::name, s_.substr(p, e - p), {}, p});
        p = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = p + 1;
        while (e < n && s_[e] != c) {
          if (s_[e] == '\\')
            ++e;
          ++e;
        }
        if (e >= n)
          throw syntax_error{p, "unterminated string literal"};
        toks_.push_back({tok::string, unescape(std::string_view{s_}.substr(p + 1, e - p - 1), p),
                         {}, p});
        p = e + 1;
        continue;
      }
      static constexpr std::string_view two[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (auto t : two)
        if (starts(p, t))
          op = t;
      if (op.empty()) {
        if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr)
          throw syntax_error{p, std::string{"unexpected character '"} + c + "' in a tag"};
        op = std::string(1, c);
      }
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty())
          throw syntax_error{p, "unexpected '" + op + "'"};
        if (balance.back() != op[0])
          throw syntax_error{p, "unexpected '" + op + "', expected '" + balance.back() + "'"};
        balance.pop_back();
      }
      toks_.push_back({tok::op, op, {}, p});
      p += op.size();
    }
  }

  size_t lex_number(size_t p, bool integer_only) {
    const size_t n = s_.size();
    size_t e = p;
    while (e < n && is_digit(s_[e]))
      ++e;
    bool is_float = false;
    if (!integer_only && e + 1 < n && s_[e] == '.' && is_digit(s_[e + 1])) {
      is_float = true;
      ++e;
      while (e < n && is_digit(s_[e]))
        ++e;
    }
    if (!integer_only && e < n && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t x = e + 1;
      if (x < n && (s_[x] == '+' || s_[x] == '-'))
        ++x;
      if (x < n && is_digit(s_[x])) {
        is_float = true;
        e = x;
        while (e < n && is_digit(s_[e]))
          ++e;
      }
    }
    token t{is_float ? tok::floating : tok::integer, s_.substr(p, e - p), {}, p};
    if (is_float) {
      double d = 0;
      std::from_chars(s_.data() + p, s_.data() + e, d);
      t.number = d;
    } else {
      int64_t i = 0;
      auto [ptr, ec] = std::from_chars(s_.data() + p, s_.data() + e, i);
      if (ec != std::errc{})
        throw syntax_error{p, "integer literal too large"};
      t.number = i;
    }
    toks_.push_back(std::move(t));
    return e;
  }

  const std::string& s_;
  std::vector<token> toks_;
};

// -- parser ---------------------------------------------------------------------

std::string describe(const token& t) {
  switch (t.type) {
    case tok::data: return "template text";
    case tok::var_begin: return "'{{'";
    case tok::var_end: return "end of print statement '}}'";
    case tok::block_begin: return "'{%'";
    case tok::block_end: return "end of statement block '%}'";
    case tok::name:
    case tok::op:
    case tok::integer:
    case tok::floating: return "'" + t.text + "'";
    case tok::string: return "a string";
    case tok::eof: return "end of template";
  }
  return "?";
}

class parser {
public:
  parser(std::vector<token> toks, const std::vector<size_t>& line_starts)
    : t_(std::move(toks)), line_starts_(line_starts) {}

  stmt_list parse_all() { return body({}); }

private:
  struct open_block {
    std::string tag;
    int line;
  };

  int line_of(size_t pos) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    return static_cast<int>(it - line_starts_.begin());
  }

  const token& cur() const { return t_[i_]; }
  const token& look(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  int line() const { return line_of(cur().pos); }
  bool is_op(std::string_view op) const { return cur().type == tok::op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == tok::name && cur().text == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op))
      return false;
    ++i_;
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n))
      return false;
    ++i_;
    return true;
  }

  [[noreturn]] void fail(std::string what) const { throw syntax_error{cur().pos, std::move(what)}; }

  void expect_op(std::string_view op) {
    if (!skip_op(op))
      fail("expected '" + std::string{op} + "', found " + describe(cur()));
  }
  std::string expect_name(std::string_view what = "a name") {
    if (cur().type != tok::name)
      fail("expected " + std::string{what} + ", found " + describe(cur()));
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().type != tok::block_end)
      fail("expected end of statement block '%}', found " + describe(cur()));
    ++i_;
  }

  expr_ptr node(expr_kind k, int ln) {
    auto e = std::make_unique<expr>();
    e->kind = k;
    e->line = ln;
    return e;
  }

  // -- statements ---------------------------------------------------------------

  stmt_list body(std::initializer_list<std::string_view> ends) {
    stmt_list out;
    for (;;) {
      const token& tk = cur();
      switch (tk.type) {
        case tok::eof: {
          if (ends.size() == 0)
            return out;
          std::string names;
          for (auto e : ends)
            names += (names.empty() ? "'" : " or '") + std::string{e} + "'";
          fail("unexpected end of template, expected " + names + " to close the '"
               + open_.back().tag + "' at line " + std::to_string(open_.back().line));
        }
        case tok::data: {
          auto s = std::make_unique<stmt>();
          s->kind = stmt_kind::text;
          s->line = line();
          s->text = tk.text;
          out.push_back(std::move(s));
          ++i_;
          break;
        }
        case tok::var_begin: {
          auto s = std::make_unique<stmt>();
          s->kind = stmt_kind::output;
          s->line = line();
          ++i_;
          s->value_expr = parse_tuple({});
          if (cur().type != tok::var_end)
            fail("expected end of print statement '}}', found " + describe(cur()));
          ++i_;
          out.push_back(std::move(s));
          break;
        }
        case tok::block_begin: {
          const token& name = look();
          if (name.type == tok::name
              && std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
            ++i_;
            return out;
          }
          ++i_;
          out.push_back(statement(ends));
          break;
        }
        default: fail("unexpected " + describe(tk));
      }
    }
  }

  stmt_ptr statement(std::initializer_list<std::string_view> ends) {
    if (cur().type != tok::name)
      fail("expected a statement name after '{%', found " + describe(cur()));
    auto s = std::make_unique<stmt>();
    s->line = line();
    std::string tag = t_[i_++].text;
    if (tag == "if")
      return parse_if(std::move(s));
    if (tag == "for")
      return parse_for(std::move(s));
    if (tag == "set")
      return parse_set(std::move(s));
    if (tag == "macro")
      return parse_macro(std::move(s));
    if (tag == "call")
      return parse_call_block(std::move(s));
    if (tag == "filter") {
      s->kind = stmt_kind::filter;
      auto holder = node(expr_kind::literal, s->line);
      s->value_expr = parse_filter(std::move(holder), true);
      expect_block_end();
      s->body = nested("filter", s->line, {"endfilter"});
      end_tag();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loops_ == 0) {
        --i_;
        fail("'" + tag + "' outside a for loop");
      }
      s->kind = tag == "break" ? stmt_kind::break_ : stmt_kind::continue_;
      expect_block_end();
      return s;
    }
    if (tag == "generation") {
      s->kind = stmt_kind::block;
      expect_block_end();
      s->body = nested("generation", s->line, {"endgeneration"});
      end_tag();
      return s;
    }
    --i_;
    std::string msg = "unknown tag '" + tag + "'";
    if (ends.size() > 0) {
      msg += ", expected ";
      bool first = true;
      for (auto e : ends) {
        msg += (first ? "'" : " or '") + std::string{e} + "'";
        first = false;
      }
      msg += " to close the '" + open_.back().tag + "' at line "
             + std::to_string(open_.back().line);
    }
    fail(msg);
  }

  stmt_list nested(std::string tag, int ln, std::initializer_list<std::string_view> ends) {
    open_.push_back({std::move(tag), ln});
    auto out = body(ends);
    open_.pop_back();
    return out;
  }

  /// After body() stopped at an end name: that name and the block end.
  std::string end_tag() {
    std::string n = t_[i_++].text;
    expect_block_end();
    return n;
  }

  stmt_ptr parse_if(stmt_ptr s) {
    s->kind = stmt_kind::if_;
    auto cond = parse_tuple({}, false);
    expect_block_end();
    auto branch = nested("if", s->line, {"elif", "else", "endif"});
    s->branches.emplace_back(std::move(cond), std::move(branch));
    for (;;) {
      std::string n = t_[i_++].text;
      if (n == "elif") {
        auto c = parse_tuple({}, false);
        expect_block_end();
        auto b = nested("if", s->line, {"elif", "else", "endif"});
        s->branches.emplace_back(std::move(c), std::move(b));
      } else if (n == "else") {
        expect_block_end();
        s->else_body = nested("if", s->line, {"endif"});
        end_tag();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  std::vector<std::string> assign_names(std::string_view end_name) {
    std::vector<std::string> names;
    bool parens = skip_op("(");
    for (;;) {
      names.push_back(expect_name("a variable name"));
      if (!skip_op(","))
        break;
      if ((parens && is_op(")")) || (!parens && is_name(end_name)))
        break;
    }
    if (parens)
      expect_op(")");
    return names;
  }

  stmt_ptr parse_for(stmt_ptr s) {
    s->kind = stmt_kind::for_;
    s->targets = assign_names("in");
    if (!skip_name("in"))
      fail("expected 'in' in a for loop, found " + describe(cur()));
    s->value_expr = parse_tuple({"recursive"}, false);
    if (skip_name("if"))
      s->filter_expr = parse_expression();
    if (is_name("recursive"))
      fail("recursive for loops are not supported in chat templates");
    expect_block_end();
    ++loops_;
    s->body = nested("for", s->line, {"endfor", "else"});
    --loops_;
    if (end_tag() == "else") {
      s->else_body = nested("for", s->line, {"endfor"});
      end_tag();
    }
    return s;
  }

  stmt_ptr parse_set(stmt_ptr s) {
    s->kind = stmt_kind::set;
    if (cur().type == tok::name && look().type == tok::op && look().text == ".") {
      s->targets.push_back(t_[i_].text);
      i_ += 2;
      s->target_attr = expect_name("an attribute name");
    } else {
      s->targets = assign_names("");
    }
    if (skip_op("=")) {
      s->value_expr = parse_tuple({});
      expect_block_end();
      return s;
    }
    if (!s->target_attr.empty() || s->targets.size() != 1)
      fail("expected '=' after the target of a set, found " + describe(cur()));
    s->kind = stmt_kind::set_block;
    if (is_op("|"))
      s->value_expr = parse_filter(node(expr_kind::literal, s->line), false);
    expect_block_end();
    s->body = nested("set", s->line, {"endset"});
    end_tag();
    return s;
  }

  std::vector<macro_param> params() {
    std::vector<macro_param> out;
    expect_op("(");
    while (!is_op(")")) {
      if (!out.empty())
        expect_op(",");
      if (is_op(")"))
        break;
      macro_param p;
      p.name = expect_name("a parameter name");
      if (skip_op("="))
        p.default_value = parse_expression();
      out.push_back(std::move(p));
    }
    expect_op(")");
    return out;
  }

  stmt_ptr parse_macro(stmt_ptr s) {
    s->kind = stmt_kind::macro;
    s->name = expect_name("a macro name");
    s->params = params();
    expect_block_end();
    int saved = loops_;
    loops_ = 0;
    s->body = nested("macro", s->line, {"endmacro"});
    loops_ = saved;
    end_tag();
    return s;
  }

  stmt_ptr parse_call_block(stmt_ptr s) {
    s->kind = stmt_kind::call;
    if (is_op("("))
      s->params = params();
    s->value_expr = parse_expression();
    if (s->value_expr->kind != expr_kind::call)
      fail("expected a macro call after 'call'");
    expect_block_end();
    int saved = loops_;
    loops_ = 0;
    s->body = nested("call", s->line, {"endcall"});
    loops_ = saved;
    end_tag();
    return s;
  }

  // -- expressions --------------------------------------------------------------

  bool tuple_end(std::initializer_list<std::string_view> extra) const {
    if (cur().type == tok::var_end || cur().type == tok::block_end || is_op(")"))
      return true;
    for (auto e : extra)
      if (is_name(e))
        return true;
    return false;
  }

  expr_ptr parse_tuple(std::initializer_list<std::string_view> extra, bool with_cond = true,
                       bool explicit_parens = false) {
    int ln = line();
    std::vector<expr_ptr> args;
    bool is_tuple = false;
    for (;;) {
      if (!args.empty())
        expect_op(",");
      if (tuple_end(extra))
        break;
      args.push_back(with_cond ? parse_expression() : parse_or());
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty())
        return std::move(args[0]);
      if (!explicit_parens)
        fail("expected an expression, found " + describe(cur()));
    }
    auto e = node(expr_kind::tuple, ln);
    e->args = std::move(args);
    return e;
  }

  expr_ptr parse_expression() {
    auto e = parse_or();
    while (is_name("if")) {
      int ln = line();
      ++i_;
      auto c = node(expr_kind::cond, ln);
      c->a = parse_or();
      c->b = std::move(e);
      if (skip_name("else"))
        c->c = parse_expression();
      e = std::move(c);
    }
    return e;
  }

  expr_ptr binary_node(expr_kind k, expr_ptr l, expr_ptr r, int ln) {
    auto e = node(k, ln);
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  expr_ptr parse_or() {
    auto e = parse_and();
    while (is_name("or")) {
      int ln = line();
      ++i_;
      e = binary_node(expr_kind::or_, std::move(e), parse_and(), ln);
    }
    return e;
  }

  expr_ptr parse_and() {
    auto e = parse_not();
    while (is_name("and")) {
      int ln = line();
      ++i_;
      e = binary_node(expr_kind::and_, std::move(e), parse_not(), ln);
    }
    return e;
  }

  expr_ptr parse_not() {
    if (is_name("not")) {
      auto e = node(expr_kind::not_, line());
      ++i_;
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  expr_ptr parse_compare() {
    int ln = line();
    auto first = parse_math1();
    std::vector<compare_op> ops;
    std::vector<expr_ptr> args;
    for (;;) {
      compare_op op;
      if (is_op("=="))
        op = compare_op::eq;
      else if (is_op("!="))
        op = compare_op::ne;
      else if (is_op("<"))
        op = compare_op::lt;
      else if (is_op("<="))
        op = compare_op::le;
      else if (is_op(">"))
        op = compare_op::gt;
      else if (is_op(">="))
        op = compare_op::ge;
      else if (is_name("in"))
        op = compare_op::in;
      else if (is_name("not") && look().type == tok::name && look().text == "in") {
        op = compare_op::not_in;
        ++i_;
      } else {
        break;
      }
      ++i_;
      ops.push_back(op);
      args.push_back(parse_math1());
    }
    if (ops.empty())
      return first;
    auto e = node(expr_kind::compare, ln);
    e->args.push_back(std::move(first));
    for (auto& a : args)
      e->args.push_back(std::move(a));
    e->ops = std::move(ops);
    return e;
  }

  expr_ptr arith(expr_ptr l, binary_op op, expr_ptr r, int ln) {
    auto e = binary_node(expr_kind::binary, std::move(l), std::move(r), ln);
    e->op = op;
    return e;
  }

  expr_ptr parse_math1() {
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      int ln = line();
      auto op = cur().text == "+" ? binary_op::add : binary_op::sub;
      ++i_;
      e = arith(std::move(e), op, parse_concat(), ln);
    }
    return e;
  }

  expr_ptr parse_concat() {
    int ln = line();
    auto first = parse_math2();
    if (!is_op("~"))
      return first;
    auto e = node(expr_kind::concat, ln);
    e->args.push_back(std::move(first));
    while (skip_op("~"))
      e->args.push_back(parse_math2());
    return e;
  }

  expr_ptr parse_math2() {
    auto e = parse_pow();
    for (;;) {
      binary_op op;
      if (is_op("*"))
        op = binary_op::mul;
      else if (is_op("/"))
        op = binary_op::div;
      else if (is_op("//"))
        op = binary_op::floordiv;
      else if (is_op("%"))
        op = binary_op::mod;
      else
        return e;
      int ln = line();
      ++i_;
      e = arith(std::move(e), op, parse_pow(), ln);
    }
  }

  expr_ptr parse_pow() {
    auto e = parse_unary(true);
    while (is_op("**")) {
      int ln = line();
      ++i_;
      e = arith(std::move(e), binary_op::pow, parse_unary(true), ln);
    }
    return e;
  }

  expr_ptr parse_unary(bool with_filter) {
    int ln = line();
    expr_ptr e;
    if (skip_op("-")) {
      e = node(expr_kind::neg, ln);
      e->a = parse_unary(false);
    } else if (skip_op("+")) {
      e = node(expr_kind::pos, ln);
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter)
      e = parse_filter_expr(std::move(e));
    return e;
  }

  expr_ptr parse_primary() {
    const token& tk = cur();
    int ln = line();
    switch (tk.type) {
      case tok::name: {
        ++i_;
        auto e = node(expr_kind::literal, ln);
        if (tk.text == "true" || tk.text == "True")
          e->lit = true;
        else if (tk.text == "false" || tk.text == "False")
          e->lit = false;
        else if (tk.text == "none" || tk.text == "None")
          e->lit = value::none();
        else {
          e->kind = expr_kind::name;
          e->name = tk.text;
        }
        return e;
      }
      case tok::string: {
        std::string s;
        while (cur().type == tok::string)
          s += t_[i_++].text;
        auto e = node(expr_kind::literal, ln);
        e->lit = value{std::move(s)};
        return e;
      }
      case tok::integer:
      case tok::floating: {
        auto e = node(expr_kind::literal, ln);
        e->lit = tk.number;
        ++i_;
        return e;
      }
      case tok::op:
        if (tk.text == "(") {
          ++i_;
          auto e = parse_tuple({}, true, true);
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          ++i_;
          auto e = node(expr_kind::list, ln);
          while (!is_op("]")) {
            if (!e->args.empty())
              expect_op(",");
            if (is_op("]"))
              break;
            e->args.push_back(parse_expression());
          }
          expect_op("]");
          return e;
        }
        if (tk.text == "{") {
          ++i_;
          auto e = node(expr_kind::dict, ln);
          while (!is_op("}")) {
            if (!e->args.empty())
              expect_op(",");
            if (is_op("}"))
              break;
            e->args.push_back(parse_expression());
            expect_op(":");
            e->args.push_back(parse_expression());
          }
          expect_op("}");
          return e;
        }
        [[fallthrough]];
      default: fail("unexpected " + describe(tk) + ", expected an expression");
    }
  }

  expr_ptr parse_postfix(expr_ptr e) {
    for (;;) {
      if (is_op(".") || is_op("["))
        e = parse_subscript(std::move(e));
      else if (is_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  expr_ptr parse_filter_expr(expr_ptr e) {
    for (;;) {
      if (is_op("|"))
        e = parse_filter(std::move(e), false);
      else if (is_name("is"))
        e = parse_test(std::move(e));
      else if (is_op("("))
        e = parse_call(std::move(e));
      else
        return e;
    }
  }

  expr_ptr parse_subscript(expr_ptr obj) {
    int ln = line();
    if (skip_op(".")) {
      if (cur().type == tok::name) {
        auto e = node(expr_kind::getattr, ln);
        e->a = std::move(obj);
        e->name = t_[i_++].text;
        return e;
      }
      if (cur().type == tok::integer) {
        auto e = node(expr_kind::getitem, ln);
        e->a = std::move(obj);
        e->b = node(expr_kind::literal, ln);
        e->b->lit = cur().number;
        ++i_;
        return e;
      }
      fail("expected an attribute name after '.', found " + describe(cur()));
    }
    expect_op("[");
    std::vector<expr_ptr> args;
    while (!is_op("]")) {
      if (!args.empty())
        expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.empty())
      fail("expected a subscript inside '[]'");
    if (args.size() == 1 && args[0]->kind == expr_kind::slice) {
      args[0]->a = std::move(obj);
      return std::move(args[0]);
    }
    auto e = node(expr_kind::getitem, ln);
    e->a = std::move(obj);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = node(expr_kind::tuple, ln);
      e->b->args = std::move(args);
    }
    return e;
  }

  expr_ptr parse_subscribed() {
    int ln = line();
    expr_ptr start;
    if (!is_op(":")) {
      start = parse_expression();
      if (!is_op(":"))
        return start;
    }
    ++i_; // ':'
    auto e = node(expr_kind::slice, ln);
    e->args.resize(3);
    e->args[0] = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(","))
      e->args[1] = parse_expression();
    if (skip_op(":") && !is_op("]") && !is_op(","))
      e->args[2] = parse_expression();
    return e;
  }

  void call_args(expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e.args.empty() || !e.kwargs.empty())
        expect_op(",");
      if (is_op(")"))
        break;
      if (is_op("*") || is_op("**"))
        fail("*args and **kwargs in calls are not supported in chat templates");
      if (cur().type == tok::name && look().type == tok::op && look().text == "=") {
        std::string key = t_[i_].text;
        i_ += 2;
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty())
          fail("a positional argument follows a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  expr_ptr parse_call(expr_ptr callee) {
    auto e = node(expr_kind::call, line());
    e->a = std::move(callee);
    call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name("a filter or test name");
    while (is_op(".") && look().type == tok::name) {
      ++i_;
      n += "." + t_[i_++].text;
    }
    return n;
  }

  expr_ptr parse_filter(expr_ptr obj, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline)
        ++i_;
      start_inline = false;
      auto e = node(expr_kind::filter, line());
      e->name = dotted_name();
      e->a = std::move(obj);
      if (is_op("("))
        call_args(*e);
      obj = std::move(e);
    }
    return obj;
  }

  expr_ptr parse_test(expr_ptr obj) {
    auto e = node(expr_kind::test, line());
    ++i_; // is
    e->negated = skip_name("not");
    e->name = dotted_name();
    e->a = std::move(obj);
    if (is_op("(")) {
      call_args(*e);
    } else {
      auto ty = cur().type;
      bool arg_start = ty == tok::name || ty == tok::string || ty == tok::integer
                       || ty == tok::floating || is_op("(") || is_op("[") || is_op("{");
      if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
        if (is_name("is"))
          fail("tests cannot be chained with 'is'");
        e->args.push_back(parse_postfix(parse_primary()));
      }
    }
    return e;
  }

  std::vector<token> t_;
  const std::vector<size_t>& line_starts_;
  size_t i_ = 0;
  int loops_ = 0;
  std::vector<open_block> open_;
};

} // namespace

result<std::shared_ptr<const template_ast>> parse_template(std::string_view source) {
  // jinja2 treats \r\n, \r and \n alike and, without keep_trailing_newline,
  // drops one newline at the end of the source.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n')
        ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n')
    src.pop_back();
  std::vector<size_t> line_starts{0};
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] == '\n')
      line_starts.push_back(i + 1);
  try {
    auto toks = lexer{src}.run();
    auto ast = std::make_shared<template_ast>();
    ast->body = parser{std::move(toks), line_starts}.parse_all();
    return std::shared_ptr<const template_ast>{std::move(ast)};
  } catch (const syntax_error& e) {
    auto it = std::upper_bound(line_starts.begin(), line_starts.end(), e.pos);
    size_t line = static_cast<size_t>(it - line_starts.begin());
    size_t col = e.pos - line_starts[line - 1] + 1;
    return serving_error{status_code::bad_request,
                         "chat template syntax error at line " + std::to_string(line)
                           + ", column " + std::to_string(col) + ": " + e.message};
  }
}

} // namespace caf_serving::text::jinja
