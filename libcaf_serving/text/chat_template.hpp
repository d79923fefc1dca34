#pragma once
/// Chat templates (issue 34): a generative model's Jinja2 template that turns
/// an OpenAI-style conversation into its prompt text, rendered as transformers'
/// `apply_chat_template` renders it (jinja2 3.1, ImmutableSandboxedEnvironment,
/// trim_blocks and lstrip_blocks, the loopcontrols extension, transformers'
/// globals `raise_exception`, `strftime_now`, `namespace`, `dict` and its
/// `tojson` filter), without Python.
///
/// The template comes from the model's files (tokenizer_config.json's
/// `chat_template` or `chat_template.jinja`), so it is parsed once when the
/// model loads and rendered per request. A render is bounded: it stops with an
/// error after `render_limits::max_steps` evaluation steps or when its output
/// passes `max_output_bytes`, so a template's loop cannot hang the server.
///
/// What it covers: the statements if/elif/else, for (else, loop.*, a filter
/// `if`, tuple targets, break/continue), set (namespaces, blocks), macro, call,
/// filter, raw and transformers' generation block; expressions with jinja2's
/// precedence; the tests, filters and str/dict methods chat templates use (see
/// jinja_builtins.hpp). Undefined variables behave as jinja2's default
/// Undefined. Not covered: template inheritance and includes, recursive loops,
/// `*args`/`**kwargs`, str % formatting, Unicode case mapping beyond ASCII.
///
/// ## Usage
///
/// ```
/// auto tmpl = text::chat_template::parse(source);      // at model load
/// if (!tmpl) { /* the model's template is broken: tmpl.error().message */ }
/// text::chat_inputs in;
/// in.messages = *jinja::value::from_json(request_messages_json);
/// in.add_generation_prompt = true;
/// in.bos_token = "<s>";
/// auto prompt = tmpl->render(in);                       // per request
/// if (!prompt) { /* 400: prompt.error().message */ }
/// ```

#include "core/error.hpp"
#include "text/jinja_value.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace caf_serving::text {

namespace jinja {
struct template_ast;
}

/// Bounds on one render.
struct render_limits {
  /// Evaluation steps (an expression node, a statement, a loop iteration) at
  /// most. A chat of a hundred messages with a tool list takes some tens of
  /// thousands.
  uint64_t max_steps = 2'000'000;
  /// Bytes of output at most (also bounds each captured block and macro call).
  size_t max_output_bytes = size_t{16} << 20;
  /// Nested macro calls at most.
  uint32_t max_call_depth = 64;
};

/// What transformers passes a chat template: the conversation, the model's
/// special tokens, the tools and documents (None when absent) and any extra
/// keyword arguments (e.g. `enable_thinking`, `date_string`).
struct chat_inputs {
  /// An array of message objects ({"role": ..., "content": ...}).
  jinja::value messages = jinja::value{jinja::array{}};
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  /// An array of tool schemas, or None.
  jinja::value tools = jinja::value::none();
  /// An array of documents, or None.
  jinja::value documents = jinja::value::none();
  /// Further variables; they override the ones above.
  jinja::object extra;

  /// The variables the template sees.
  jinja::object to_context() const;
};

class chat_template {
public:
  /// Parses a template. A syntax error names the line and column and what was
  /// expected ("chat template syntax error at line 3, column 9: ...").
  static result<chat_template> parse(std::string_view source, render_limits limits = {});

  /// Renders with `context`'s entries as the template's variables.
  /// `raise_exception(msg)` in the template fails with exactly msg; any other
  /// failure (an undefined function, a type error, a limit) names the template
  /// line. All failures are bad_request (400): they come from what the request
  /// sent to this template.
  result<std::string> render(const jinja::object& context) const;

  result<std::string> render(const chat_inputs& inputs) const {
    return render(inputs.to_context());
  }

  const render_limits& limits() const { return limits_; }

private:
  chat_template(std::shared_ptr<const jinja::template_ast> ast, render_limits limits)
    : ast_(std::move(ast)), limits_(limits) {}

  std::shared_ptr<const jinja::template_ast> ast_;
  render_limits limits_;
};

} // namespace caf_serving::text
