#include "text/chat_template.hpp"

#include "text/jinja_builtins.hpp"
#include "text/jinja_parser.hpp"

#include <cmath>
#include <ctime>

namespace caf_serving::text {

using namespace jinja;

jinja::object chat_inputs::to_context() const {
  object ctx;
  ctx.set("messages", messages);
  ctx.set("tools", tools);
  ctx.set("documents", documents);
  ctx.set("add_generation_prompt", add_generation_prompt);
  ctx.set("bos_token", bos_token);
  ctx.set("eos_token", eos_token);
  for (auto& [k, v] : extra.items())
    ctx.set(k, v);
  return ctx;
}

namespace {

// -- the interpreter's own values -------------------------------------------------

struct scope {
  std::vector<std::pair<std::string, value>> vars;
  std::shared_ptr<scope> parent;

  const value* find(std::string_view name) const {
    for (const scope* s = this; s != nullptr; s = s->parent.get())
      for (auto& [k, v] : s->vars)
        if (k == name)
          return &v;
    return nullptr;
  }

  void set(std::string_view name, value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(std::string{name}, std::move(v));
  }
};
using scope_ptr = std::shared_ptr<scope>;

scope_ptr child_of(const scope_ptr& parent) {
  auto s = std::make_shared<scope>();
  s->parent = parent;
  return s;
}

/// namespace(): the one mutable object, so that a loop can set what outlives it.
struct namespace_object : native {
  object attrs;
  std::string repr() const override { return "<Namespace " + to_python_str(value{attrs}) + ">"; }
};

struct macro_object : native {
  std::string name;
  const std::vector<macro_param>* params = nullptr;
  const stmt_list* body = nullptr;
  /// Weak: the scope that defines a macro holds it, and a strong pointer back
  /// would make a cycle that outlives the render.
  std::weak_ptr<scope> closure;
  std::string repr() const override { return "<Macro '" + name + "'>"; }
  bool callable() const override { return true; }
};

struct loop_object : native {
  std::shared_ptr<const array> items;
  size_t index0 = 0;
  std::string repr() const override { return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items->size()) + ">"; }
};

enum class builtin_fn : uint8_t { range, dict, namespace_, raise_exception, strftime_now };

struct builtin_object : native {
  builtin_fn fn;
  std::string name;
  builtin_object(builtin_fn f, std::string n) : fn(f), name(std::move(n)) {}
  std::string repr() const override { return "<built-in function " + name + ">"; }
  bool callable() const override { return true; }
};

const value* builtin_global(std::string_view name) {
  static const std::pair<std::string_view, value> globals[] = {
    {"range", value{std::make_shared<builtin_object>(builtin_fn::range, "range")}},
    {"dict", value{std::make_shared<builtin_object>(builtin_fn::dict, "dict")}},
    {"namespace", value{std::make_shared<builtin_object>(builtin_fn::namespace_, "namespace")}},
    {"raise_exception", value{std::make_shared<builtin_object>(builtin_fn::raise_exception, "raise_exception")}},
    {"strftime_now", value{std::make_shared<builtin_object>(builtin_fn::strftime_now, "strftime_now")}},
  };
  for (auto& [k, v] : globals)
    if (k == name)
      return &v;
  return nullptr;
}

/// The sandbox's bound on range() (jinja2's MAX_RANGE).
constexpr int64_t max_range = 100000;

/// A short text of an expression for error messages: `messages[0].content`.
std::string describe(const expr& e) {
  switch (e.kind) {
    case expr_kind::name: return e.name;
    case expr_kind::getattr: return describe(*e.a) + "." + e.name;
    case expr_kind::getitem:
      if (e.b->kind == expr_kind::literal)
        return describe(*e.a) + "[" + to_python_repr(e.b->lit) + "]";
      return describe(*e.a) + "[...]";
    case expr_kind::call: return describe(*e.a) + "()";
    case expr_kind::literal: return to_python_repr(e.lit);
    default: return "expression";
  }
}

enum class flow : uint8_t { normal, break_, continue_ };

class interpreter {
public:
  interpreter(const render_limits& limits, const object& context) : limits_(limits) {
    root_ = std::make_shared<scope>();
    for (auto& [k, v] : context.items())
      root_->vars.emplace_back(k, v);
  }

  std::string run(const stmt_list& body) {
    std::string out;
    out_ = &out;
    exec(body, root_);
    return out;
  }

  int line() const { return line_; }

private:
  void step() {
    if (++steps_ > limits_.max_steps)
      fail("rendering stopped after " + std::to_string(limits_.max_steps)
           + " steps (render_limits::max_steps): the conversation is too large for this "
             "template, or the template loops without end");
  }

  void emit(std::string_view s) {
    out_->append(s);
    if (out_->size() > limits_.max_output_bytes)
      fail("rendering stopped: the output passed " + std::to_string(limits_.max_output_bytes)
           + " bytes (render_limits::max_output_bytes)");
  }

  /// Runs `body` into a string of its own.
  std::string capture(const stmt_list& body, const scope_ptr& sc) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    try {
      exec(body, sc);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buf;
  }

  // -- statements ---------------------------------------------------------------

  flow exec(const stmt_list& body, const scope_ptr& sc) {
    for (auto& s : body) {
      flow f = exec(*s, sc);
      if (f != flow::normal)
        return f;
    }
    return flow::normal;
  }

  void assign(const std::vector<std::string>& targets, const value& v, scope& sc) {
    if (targets.size() == 1) {
      sc.set(targets[0], v);
      return;
    }
    if (!v.is_array() || v.as_array().size() != targets.size())
      fail("cannot unpack " + type_name(v) + " into " + std::to_string(targets.size())
           + " variables");
    for (size_t i = 0; i < targets.size(); ++i)
      sc.set(targets[i], v.as_array()[i]);
  }

  flow exec(const stmt& s, const scope_ptr& sc) {
    step();
    line_ = s.line;
    switch (s.kind) {
      case stmt_kind::text: emit(s.text); return flow::normal;
      case stmt_kind::output: {
        value v = eval(*s.value_expr, sc);
        if (v.is_string())
          emit(v.as_string());
        else
          emit(to_python_str(v));
        return flow::normal;
      }
      case stmt_kind::if_:
        for (auto& [cond, body] : s.branches) {
          line_ = s.line;
          if (eval(*cond, sc).truthy())
            return exec(body, sc);
        }
        return exec(s.else_body, sc);
      case stmt_kind::for_: return exec_for(s, sc);
      case stmt_kind::set: {
        value v = eval(*s.value_expr, sc);
        if (!s.target_attr.empty()) {
          const value* ns = sc->find(s.targets[0]);
          auto* target = ns != nullptr && ns->is_native()
                           ? dynamic_cast<namespace_object*>(ns->as_native().get())
                           : nullptr;
          if (target == nullptr)
            fail("cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
          if (!s.target_attr.empty() && s.target_attr[0] == '_')
            fail("chat templates cannot store underscore-prefixed attributes on a namespace");
          target->attrs.set(s.target_attr, std::move(v));
          return flow::normal;
        }
        assign(s.targets, v, *sc);
        return flow::normal;
      }
      case stmt_kind::set_block: {
        value v{capture(s.body, sc)};
        if (s.value_expr)
          v = apply_chain(*s.value_expr, v, sc);
        sc->set(s.targets[0], std::move(v));
        return flow::normal;
      }
      case stmt_kind::filter: {
        value v{capture(s.body, sc)};
        emit(to_python_str(apply_chain(*s.value_expr, v, sc)));
        return flow::normal;
      }
      case stmt_kind::macro: {
        auto m = std::make_shared<macro_object>();
        m->name = s.name;
        m->params = &s.params;
        m->body = &s.body;
        m->closure = sc;
        sc->set(s.name, value{std::shared_ptr<native>{std::move(m)}});
        return flow::normal;
      }
      case stmt_kind::call: {
        auto caller = std::make_shared<macro_object>();
        caller->name = "caller";
        caller->params = &s.params;
        caller->body = &s.body;
        caller->closure = sc;
        const expr& call = *s.value_expr;
        value fn = eval(*call.a, sc);
        call_args args = eval_args(call, sc);
        args.kwargs.emplace_back("caller", value{std::shared_ptr<native>{std::move(caller)}});
        emit(to_python_str(invoke(fn, args, *call.a)));
        return flow::normal;
      }
      case stmt_kind::break_: return flow::break_;
      case stmt_kind::continue_: return flow::continue_;
      case stmt_kind::block: return exec(s.body, sc);
    }
    return flow::normal;
  }

  flow exec_for(const stmt& s, const scope_ptr& sc) {
    array items = iterate(eval(*s.value_expr, sc));
    if (s.filter_expr) {
      array kept;
      for (auto& item : items) {
        step();
        auto probe = child_of(sc);
        assign(s.targets, item, *probe);
        if (eval(*s.filter_expr, probe).truthy())
          kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty())
      return exec(s.else_body, child_of(sc));
    auto loop = std::make_shared<loop_object>();
    loop->items = std::make_shared<const array>(std::move(items));
    value loop_value{std::shared_ptr<native>{loop}};
    for (size_t i = 0; i < loop->items->size(); ++i) {
      step();
      loop->index0 = i;
      auto body_scope = child_of(sc);
      assign(s.targets, (*loop->items)[i], *body_scope);
      body_scope->set("loop", loop_value);
      if (exec(s.body, body_scope) == flow::break_)
        break;
    }
    return flow::normal;
  }

  value apply_chain(const expr& chain, const value& input, const scope_ptr& sc) {
    if (chain.kind != expr_kind::filter)
      return input;
    value v = apply_chain(*chain.a, input, sc);
    return apply_filter(chain.name, v, eval_args(chain, sc));
  }

  // -- expressions --------------------------------------------------------------

  call_args eval_args(const expr& e, const scope_ptr& sc) {
    call_args a;
    a.args.reserve(e.args.size());
    for (auto& x : e.args)
      a.args.push_back(eval(*x, sc));
    for (auto& [k, x] : e.kwargs)
      a.kwargs.emplace_back(k, eval(*x, sc));
    return a;
  }

  [[noreturn]] void undefined_error(const expr& e) { fail("'" + describe(e) + "' is undefined"); }

  value get_attr(const value& obj, const std::string& name, const expr& obj_expr) {
    switch (obj.type()) {
      case value::kind::undefined: undefined_error(obj_expr);
      case value::kind::object: {
        const value* v = obj.as_object().find(name);
        return v != nullptr ? *v : value{};
      }
      case value::kind::native: {
        native* n = obj.as_native().get();
        if (auto* ns = dynamic_cast<namespace_object*>(n)) {
          const value* v = ns->attrs.find(name);
          return v != nullptr ? *v : value{};
        }
        if (auto* loop = dynamic_cast<loop_object*>(n))
          return loop_attr(*loop, name);
        return {};
      }
      default: return {};
    }
  }

  static value loop_attr(const loop_object& l, std::string_view name) {
    auto i = static_cast<int64_t>(l.index0);
    auto n = static_cast<int64_t>(l.items->size());
    if (name == "index")
      return value{i + 1};
    if (name == "index0")
      return value{i};
    if (name == "revindex")
      return value{n - i};
    if (name == "revindex0")
      return value{n - i - 1};
    if (name == "first")
      return value{i == 0};
    if (name == "last")
      return value{i == n - 1};
    if (name == "length")
      return value{n};
    if (name == "depth")
      return value{int64_t{1}};
    if (name == "depth0")
      return value{int64_t{0}};
    if (name == "previtem")
      return i > 0 ? (*l.items)[static_cast<size_t>(i - 1)] : value{};
    if (name == "nextitem")
      return i + 1 < n ? (*l.items)[static_cast<size_t>(i + 1)] : value{};
    return {};
  }

  value slice(const value& obj, const expr& e, const scope_ptr& sc) {
    auto bound = [&](size_t k) -> std::optional<int64_t> {
      if (!e.args[k])
        return std::nullopt;
      value v = eval(*e.args[k], sc);
      if (v.is_none())
        return std::nullopt;
      if (!v.is_int() && !v.is_bool())
        fail("slice indices must be integers or None, not " + type_name(v));
      return v.is_bool() ? int64_t{v.as_bool()} : v.as_int();
    };
    auto start = bound(0), stop = bound(1), stride = bound(2);
    int64_t st = stride.value_or(1);
    if (st == 0)
      fail("slice step cannot be zero");
    if (obj.is_undefined())
      undefined_error(*e.a);
    if (!obj.is_array() && !obj.is_string())
      fail("'" + type_name(obj) + "' object is not subscriptable");
    array items = obj.is_array() ? obj.as_array() : iterate(obj);
    auto n = static_cast<int64_t>(items.size());
    auto clamp = [&](std::optional<int64_t> x, bool is_start) {
      if (!x)
        return st > 0 ? (is_start ? int64_t{0} : n) : (is_start ? n - 1 : int64_t{-1});
      int64_t v = *x;
      if (v < 0) {
        v += n;
        if (v < 0)
          v = st < 0 ? -1 : 0;
      } else if (v >= n) {
        v = st < 0 ? n - 1 : n;
      }
      return v;
    };
    int64_t b = clamp(start, true), end = clamp(stop, false);
    array out;
    for (int64_t i = b; st > 0 ? i < end : i > end; i += st)
      out.push_back(items[static_cast<size_t>(i)]);
    if (obj.is_string()) {
      std::string s;
      for (auto& c : out)
        s += c.as_string();
      return value{std::move(s)};
    }
    return value{std::move(out), obj.is_tuple()};
  }

  value arith(binary_op op, const value& a, const value& b, const expr& e) {
    if (a.is_undefined())
      undefined_error(*e.a);
    if (b.is_undefined())
      undefined_error(*e.b);
    bool an = a.is_number() || a.is_bool();
    bool bn = b.is_number() || b.is_bool();
    static constexpr const char* symbols[] = {"+", "-", "*", "/", "//", "%", "**"};
    auto type_error = [&]() -> value {
      fail(std::string{"unsupported operand type(s) for "} + symbols[static_cast<int>(op)] + ": '"
           + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (an && bn) {
      bool ints = !a.is_double() && !b.is_double();
      int64_t x = ints ? (a.is_bool() ? a.as_bool() : a.as_int()) : 0;
      int64_t y = ints ? (b.is_bool() ? b.as_bool() : b.as_int()) : 0;
      double dx = a.to_double(), dy = b.to_double();
      int64_t r = 0;
      switch (op) {
        case binary_op::add:
          if (!ints)
            return value{dx + dy};
          if (__builtin_add_overflow(x, y, &r))
            fail("integer overflow");
          return value{r};
        case binary_op::sub:
          if (!ints)
            return value{dx - dy};
          if (__builtin_sub_overflow(x, y, &r))
            fail("integer overflow");
          return value{r};
        case binary_op::mul:
          if (!ints)
            return value{dx * dy};
          if (__builtin_mul_overflow(x, y, &r))
            fail("integer overflow");
          return value{r};
        case binary_op::div:
          if (dy == 0)
            fail("division by zero");
          return value{dx / dy};
        case binary_op::floordiv:
          if (dy == 0)
            fail("integer division or modulo by zero");
          if (ints) {
            int64_t q = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0)))
              --q;
            return value{q};
          }
          return value{std::floor(dx / dy)};
        case binary_op::mod:
          if (dy == 0)
            fail("integer division or modulo by zero");
          if (ints) {
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0)))
              m += y;
            return value{m};
          } else {
            double m = std::fmod(dx, dy);
            if (m != 0 && ((m < 0) != (dy < 0)))
              m += dy;
            return value{m};
          }
        case binary_op::pow:
          if (ints && y >= 0) {
            int64_t acc = 1;
            for (int64_t k = 0; k < y; ++k)
              if (__builtin_mul_overflow(acc, x, &acc))
                fail("integer overflow");
            return value{acc};
          }
          return value{std::pow(dx, dy)};
      }
    }
    if (op == binary_op::add) {
      if (a.is_string() && b.is_string()) {
        std::string s = a.as_string();
        s += b.as_string();
        return value{std::move(s)};
      }
      if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
        array items = a.as_array();
        items.insert(items.end(), b.as_array().begin(), b.as_array().end());
        return value{std::move(items), a.is_tuple()};
      }
      if (a.is_string() || b.is_string())
        fail("can only concatenate str (not \"" + type_name(a.is_string() ? b : a) + "\") to str");
    }
    if (op == binary_op::mul && (a.is_int() || b.is_int())) {
      const value& seq = a.is_int() ? b : a;
      int64_t times = a.is_int() ? a.as_int() : b.as_int();
      if (seq.is_string() || seq.is_array()) {
        if (times > 0 && python_len(seq) * static_cast<size_t>(times) > limits_.max_output_bytes)
          fail("repetition too large");
        if (seq.is_string()) {
          std::string s;
          for (int64_t k = 0; k < times; ++k)
            s += seq.as_string();
          return value{std::move(s)};
        }
        array items;
        for (int64_t k = 0; k < times; ++k)
          items.insert(items.end(), seq.as_array().begin(), seq.as_array().end());
        return value{std::move(items), seq.is_tuple()};
      }
    }
    if (op == binary_op::mod && a.is_string())
      fail("printf-style formatting ('...' % x) is not supported in chat templates");
    return type_error();
  }

  bool contains(const value& container, const value& item) {
    switch (container.type()) {
      case value::kind::string:
        if (!item.is_string())
          fail("'in <string>' requires string as left operand, not " + type_name(item));
        return container.as_string().find(item.as_string()) != std::string::npos;
      case value::kind::array:
        for (auto& x : container.as_array())
          if (python_equal(x, item))
            return true;
        return false;
      case value::kind::object:
        return item.is_string() && container.as_object().find(item.as_string()) != nullptr;
      case value::kind::undefined: return false;
      default: fail("argument of type '" + type_name(container) + "' is not iterable");
    }
  }

  value eval(const expr& e, const scope_ptr& sc) {
    step();
    switch (e.kind) {
      case expr_kind::literal: return e.lit;
      case expr_kind::name: {
        if (const value* v = sc->find(e.name))
          return *v;
        if (const value* g = builtin_global(e.name))
          return *g;
        return {};
      }
      case expr_kind::list:
      case expr_kind::tuple: {
        array items;
        items.reserve(e.args.size());
        for (auto& x : e.args)
          items.push_back(eval(*x, sc));
        return value{std::move(items), e.kind == expr_kind::tuple};
      }
      case expr_kind::dict: {
        object o;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          value k = eval(*e.args[i], sc);
          if (!k.is_string())
            fail("chat template dict keys must be strings, got " + type_name(k));
          o.set(k.as_string(), eval(*e.args[i + 1], sc));
        }
        return value{std::move(o)};
      }
      case expr_kind::getattr: return get_attr(eval(*e.a, sc), e.name, *e.a);
      case expr_kind::getitem: {
        value obj = eval(*e.a, sc);
        value key = eval(*e.b, sc);
        if (obj.is_undefined())
          undefined_error(*e.a);
        if (obj.is_native() && key.is_string())
          return get_attr(obj, key.as_string(), *e.a);
        return get_item(obj, key);
      }
      case expr_kind::slice: return slice(eval(*e.a, sc), e, sc);
      case expr_kind::call: return call(e, sc);
      case expr_kind::filter: {
        value v = eval(*e.a, sc);
        line_ = e.line;
        return apply_filter(e.name, v, eval_args(e, sc));
      }
      case expr_kind::test: {
        value v = eval(*e.a, sc);
        line_ = e.line;
        bool r = apply_test(e.name, v, eval_args(e, sc));
        return value{r != e.negated};
      }
      case expr_kind::not_: return value{!eval(*e.a, sc).truthy()};
      case expr_kind::neg:
      case expr_kind::pos: {
        value v = eval(*e.a, sc);
        if (v.is_undefined())
          undefined_error(*e.a);
        bool neg = e.kind == expr_kind::neg;
        if (v.is_int())
          return value{neg ? -v.as_int() : v.as_int()};
        if (v.is_bool())
          return value{int64_t{neg ? -int64_t{v.as_bool()} : int64_t{v.as_bool()}}};
        if (v.is_double())
          return value{neg ? -v.as_double() : v.as_double()};
        fail(std::string{"bad operand type for unary "} + (neg ? "-" : "+") + ": '" + type_name(v) + "'");
      }
      case expr_kind::binary: {
        value a = eval(*e.a, sc);
        value b = eval(*e.b, sc);
        line_ = e.line;
        return arith(e.op, a, b, e);
      }
      case expr_kind::compare: {
        value left = eval(*e.args[0], sc);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          value right = eval(*e.args[i + 1], sc);
          line_ = e.line;
          bool ok = false;
          switch (e.ops[i]) {
            case compare_op::eq: ok = python_equal(left, right); break;
            case compare_op::ne: ok = !python_equal(left, right); break;
            case compare_op::lt: ok = python_less(left, right); break;
            case compare_op::le: ok = !python_less(right, left); break;
            case compare_op::gt: ok = python_less(right, left); break;
            case compare_op::ge: ok = !python_less(left, right); break;
            case compare_op::in: ok = contains(right, left); break;
            case compare_op::not_in: ok = !contains(right, left); break;
          }
          if (!ok)
            return value{false};
          left = std::move(right);
        }
        return value{true};
      }
      case expr_kind::and_: {
        value a = eval(*e.a, sc);
        return a.truthy() ? eval(*e.b, sc) : a;
      }
      case expr_kind::or_: {
        value a = eval(*e.a, sc);
        return a.truthy() ? a : eval(*e.b, sc);
      }
      case expr_kind::cond:
        if (eval(*e.a, sc).truthy())
          return eval(*e.b, sc);
        return e.c ? eval(*e.c, sc) : value{};
      case expr_kind::concat: {
        std::string s;
        for (auto& x : e.args)
          s += to_python_str(eval(*x, sc));
        return value{std::move(s)};
      }
    }
    return {};
  }

  value call(const expr& e, const scope_ptr& sc) {
    const expr& callee = *e.a;
    if (callee.kind == expr_kind::getattr) {
      value obj = eval(*callee.a, sc);
      call_args args = eval_args(e, sc);
      line_ = e.line;
      if (obj.is_native()) {
        if (auto* loop = dynamic_cast<loop_object*>(obj.as_native().get());
            loop != nullptr && callee.name == "cycle") {
          if (args.args.empty())
            fail("no items for cycling given");
          return args.args[loop->index0 % args.args.size()];
        }
        return invoke(get_attr(obj, callee.name, *callee.a), args, callee);
      }
      if (obj.is_undefined())
        undefined_error(*callee.a);
      if (obj.is_object() && !has_method(obj, callee.name)) {
        const value* v = obj.as_object().find(callee.name);
        if (v != nullptr)
          return invoke(*v, args, callee);
      }
      return call_method(obj, callee.name, args);
    }
    value fn = eval(callee, sc);
    call_args args = eval_args(e, sc);
    line_ = e.line;
    return invoke(fn, args, callee);
  }

  value invoke(const value& fn, const call_args& args, const expr& callee) {
    if (fn.is_undefined())
      undefined_error(callee);
    if (!fn.is_native())
      fail("'" + type_name(fn) + "' object is not callable");
    native* n = fn.as_native().get();
    if (auto* m = dynamic_cast<macro_object*>(n))
      return call_macro(*m, args);
    if (auto* b = dynamic_cast<builtin_object*>(n))
      return call_builtin(*b, args);
    fail("'" + n->repr() + "' is not callable");
  }

  value call_macro(const macro_object& m, const call_args& a) {
    if (depth_ >= limits_.max_call_depth)
      fail("macro calls nested deeper than " + std::to_string(limits_.max_call_depth)
           + " (render_limits::max_call_depth)");
    const auto& params = *m.params;
    if (a.args.size() > params.size())
      fail("macro '" + m.name + "' takes not more than " + std::to_string(params.size())
           + " argument(s)");
    auto closure = m.closure.lock();
    if (!closure)
      fail("macro '" + m.name + "' is called after the block that defined it ended");
    auto sc = child_of(closure);
    std::vector<bool> bound(params.size(), false);
    for (size_t i = 0; i < a.args.size(); ++i) {
      sc->set(params[i].name, a.args[i]);
      bound[i] = true;
    }
    for (auto& [k, v] : a.kwargs) {
      size_t i = 0;
      while (i < params.size() && params[i].name != k)
        ++i;
      if (i < params.size()) {
        if (bound[i])
          fail("macro '" + m.name + "' got multiple values for argument '" + k + "'");
        bound[i] = true;
        sc->set(k, v);
      } else if (k == "caller") {
        sc->set(k, v);
      } else {
        fail("macro '" + m.name + "' takes no keyword argument '" + k + "'");
      }
    }
    for (size_t i = 0; i < params.size(); ++i)
      if (!bound[i])
        sc->set(params[i].name, params[i].default_value ? eval(*params[i].default_value, sc) : value{});
    ++depth_;
    int saved_line = line_;
    std::string out;
    try {
      out = capture(*m.body, sc);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    line_ = saved_line;
    return value{std::move(out)};
  }

  value call_builtin(const builtin_object& b, const call_args& a) {
    switch (b.fn) {
      case builtin_fn::raise_exception:
        throw eval_error{to_python_str(a.get(0, "message")), true};
      case builtin_fn::range: {
        if (a.args.empty() || a.args.size() > 3)
          fail("range expected 1 to 3 arguments, got " + std::to_string(a.args.size()));
        auto as_int = [&](const value& v) -> int64_t {
          if (!v.is_int() && !v.is_bool())
            fail("'" + type_name(v) + "' object cannot be interpreted as an integer");
          return v.is_bool() ? v.as_bool() : v.as_int();
        };
        int64_t start = 0, stop = 0, st = 1;
        if (a.args.size() == 1) {
          stop = as_int(a.args[0]);
        } else {
          start = as_int(a.args[0]);
          stop = as_int(a.args[1]);
          if (a.args.size() == 3)
            st = as_int(a.args[2]);
        }
        if (st == 0)
          fail("range() arg 3 must not be zero");
        int64_t count = st > 0 ? (stop > start ? (stop - start + st - 1) / st : 0)
                               : (start > stop ? (start - stop - st - 1) / -st : 0);
        if (count > max_range)
          fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        array out;
        out.reserve(static_cast<size_t>(count));
        for (int64_t k = 0; k < count; ++k)
          out.emplace_back(start + k * st);
        return value{std::move(out)};
      }
      case builtin_fn::dict:
      case builtin_fn::namespace_: {
        object o;
        if (!a.args.empty()) {
          const value& src = a.args[0];
          if (src.is_object()) {
            o = src.as_object();
          } else if (src.is_array()) {
            for (auto& kv : src.as_array()) {
              if (!kv.is_array() || kv.as_array().size() != 2 || !kv.as_array()[0].is_string())
                fail("dict() expects pairs of a string key and a value");
              o.set(kv.as_array()[0].as_string(), kv.as_array()[1]);
            }
          } else if (!src.is_undefined()) {
            fail("'" + type_name(src) + "' object is not iterable");
          }
        }
        for (auto& [k, v] : a.kwargs)
          o.set(k, v);
        if (b.fn == builtin_fn::dict)
          return value{std::move(o)};
        auto ns = std::make_shared<namespace_object>();
        for (auto& [k, v] : o.items())
          if (!k.empty() && k[0] == '_')
            fail("chat templates cannot store underscore-prefixed attributes on a namespace");
        ns->attrs = std::move(o);
        return value{std::shared_ptr<native>{std::move(ns)}};
      }
      case builtin_fn::strftime_now: {
        std::string fmt = to_python_str(a.get(0, "format"));
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[256];
        size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
        return value{std::string{buf, n}};
      }
    }
    return {};
  }

  const render_limits& limits_;
  scope_ptr root_;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  uint32_t depth_ = 0;
  int line_ = 0;
};

} // namespace

result<chat_template> chat_template::parse(std::string_view source, render_limits limits) {
  auto ast = parse_template(source);
  if (!ast)
    return ast.error();
  return chat_template{std::move(*ast), limits};
}

result<std::string> chat_template::render(const jinja::object& context) const {
  interpreter in{limits_, context};
  try {
    return in.run(ast_->body);
  } catch (const eval_error& e) {
    if (e.raised)
      return bad_request(e.message);
    return bad_request("chat template line " + std::to_string(in.line()) + ": " + e.message);
  }
}

} // namespace caf_serving::text
