#pragma once
/// The syntax tree of a chat template and the parser that builds it (issue 34).
///
/// The parser follows jinja2 3.1 as transformers configures it: the lexer's
/// whitespace rules (`trim_blocks`, `lstrip_blocks`, `{%- -%}`, `{%+`, one
/// trailing newline of the source dropped), its operator precedence, and the
/// statements chat templates use: if/elif/else, for (with else, a filter
/// `if`, tuple targets), set (names, tuples, `ns.attr`, blocks), macro, call,
/// filter blocks, break/continue, raw, and transformers' generation block.

#include "core/error.hpp"
#include "text/jinja_value.hpp"

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace caf_serving::text::jinja {

enum class expr_kind : uint8_t {
  literal,   ///< lit
  name,      ///< name
  list,      ///< args
  tuple,     ///< args
  dict,      ///< args: key, value, key, value...
  getattr,   ///< a.name
  getitem,   ///< a[b]
  slice,     ///< a[args[0]:args[1]:args[2]] (null entries for the missing)
  call,      ///< a(args, kwargs)
  filter,    ///< a | name(args, kwargs)
  test,      ///< a is [not] name(args)
  not_,      ///< not a
  neg,       ///< -a
  pos,       ///< +a
  binary,    ///< a op b
  compare,   ///< args[0] ops[0] args[1] ops[1] args[2]...
  and_,      ///< a and b
  or_,       ///< a or b
  cond,      ///< b if a else c (c may be null)
  concat,    ///< args[0] ~ args[1] ~ ...
};

enum class binary_op : uint8_t { add, sub, mul, div, floordiv, mod, pow };
enum class compare_op : uint8_t { eq, ne, lt, le, gt, ge, in, not_in };

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct expr {
  expr_kind kind = expr_kind::literal;
  binary_op op = binary_op::add;
  /// For `is not`.
  bool negated = false;
  int line = 0;
  value lit;
  std::string name;
  expr_ptr a, b, c;
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  std::vector<compare_op> ops;
};

enum class stmt_kind : uint8_t {
  text,      ///< text
  output,    ///< {{ value }}
  if_,       ///< branches
  for_,      ///< for targets in value [if filter]: body [else else_body]
  set,       ///< set targets (or target_object.name) = value
  set_block, ///< set targets[0]: body, then the filters of value
  macro,     ///< macro name(params): body
  call,      ///< call(params) value: body
  filter,    ///< filter value: body (value is a filter chain on a null literal)
  break_,
  continue_,
  block,     ///< body only (generation blocks)
};

struct stmt;
using stmt_ptr = std::unique_ptr<stmt>;
using stmt_list = std::vector<stmt_ptr>;

struct macro_param {
  std::string name;
  expr_ptr default_value;
};

struct stmt {
  stmt_kind kind = stmt_kind::text;
  int line = 0;
  std::string text;
  expr_ptr value_expr;
  expr_ptr filter_expr;
  std::vector<std::string> targets;
  /// `set ns.attr = ...`: the namespace's variable in targets[0], the attribute here.
  std::string target_attr;
  std::vector<std::pair<expr_ptr, stmt_list>> branches;
  stmt_list body;
  stmt_list else_body;
  std::string name;
  std::vector<macro_param> params;
};

/// A parsed template: its statements.
struct template_ast {
  stmt_list body;
};

/// Parses `source`. A syntax error says line and column and what was expected.
result<std::shared_ptr<const template_ast>> parse_template(std::string_view source);

} // namespace caf_serving::text::jinja
