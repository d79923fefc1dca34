#include "ingress/generation_admission.hpp"

#include "core/clock.hpp"
#include "postprocess/sampling.hpp"
#include "postprocess/stop_strings.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

#include <caf/send.hpp>

#include <algorithm>

namespace caf_serving::ingress {

result<admitted_generation> admit_generation(const server::model_pipeline& model,
                                             const generate_request& request) {
  const std::string& name = model.config.name;
  if (!model.generative)
    return bad_request("model '" + name + "' is not generative (config.pbtxt has no "
                       "model_transaction_policy { decoupled: true }); send its requests to "
                       "/v2/models/" + name + "/infer");
  const auto& g = *model.generative;
  if (auto bad = postprocess::check(request.sampling))
    return bad_request(*bad);
  if (auto bad = postprocess::check(request.stop))
    return bad_request(*bad);
  admitted_generation out;
  bool add_special = g.add_special_tokens;
  if (request.api == generate_api::openai_chat) {
    if (!g.chat_template)
      return bad_request("model '" + name + "' has no chat template (tokenizer_config.json's "
                         "chat_template or chat_template.jinja); use /v1/completions with a "
                         "prompt");
    std::string messages = "[";
    for (size_t i = 0; i < request.messages.size(); ++i)
      messages += (i ? "," : "") + request.messages[i].json;
    messages += "]";
    auto value = text::jinja::value::from_json(messages);
    if (!value)
      return bad_request("messages: " + value.error().message);
    text::chat_inputs inputs;
    inputs.messages = std::move(*value);
    inputs.add_generation_prompt = request.add_generation_prompt;
    inputs.bos_token = g.bos_token;
    inputs.eos_token = g.eos_token;
    auto rendered = g.chat_template->render(inputs);
    if (!rendered)
      return bad_request("the model's chat template refused the messages: "
                         + rendered.error().message);
    out.prompt_text = std::move(*rendered);
    // The template writes the special tokens itself (as vLLM does for chat).
    add_special = false;
  } else {
    out.prompt_text = request.prompt;
  }
  auto job = std::make_shared<scheduler::generation_job>();
  if (!request.prompt_token_ids.empty()) {
    for (int32_t id : request.prompt_token_ids)
      if (id < 0 || static_cast<size_t>(id) >= g.tokenizer->vocab_size())
        return bad_request("prompt: token id " + std::to_string(id)
                           + " is not in the model's vocabulary of "
                           + std::to_string(g.tokenizer->vocab_size()) + " tokens");
    job->prompt = request.prompt_token_ids;
    out.prompt_text = g.tokenizer->decode(job->prompt);
  } else {
    job->prompt = g.tokenizer->encode(out.prompt_text, {add_special});
  }
  if (job->prompt.empty())
    return bad_request("prompt: it has no tokens; send at least one");
  if (job->prompt.size() > g.limits.max_context)
    return bad_request("prompt: it has " + std::to_string(job->prompt.size())
                       + " tokens, over the model's context of "
                       + std::to_string(g.limits.max_context)
                       + " tokens (max_context); shorten it");
  job->id = scheduler::next_generation_id();
  job->sampling = request.sampling;
  job->stop = request.stop;
  job->skip_special_tokens = request.skip_special_tokens;
  job->include_stop_str_in_output = request.include_stop_str_in_output;
  if (request.ttft_target_ms)
    job->ttft_target = std::chrono::milliseconds(*request.ttft_target_ms);
  out.job = std::move(job);
  return out;
}

void submit_generation(const server::model_pipeline& model,
                       std::shared_ptr<scheduler::generation_job> job) {
  caf::anon_send(model.generative->actor, scheduler::generate_atom::value, std::move(job));
}

void record_generation(const server::model_pipeline& model, int64_t received_ns) {
  auto& s = *model.stats;
  s.inference_count.fetch_add(1, std::memory_order_relaxed);
  s.execution_count.fetch_add(1, std::memory_order_relaxed);
  uint64_t took = static_cast<uint64_t>(std::max<int64_t>(0, now_ns() - received_ns));
  s.success.add(took);
  s.request_us.observe(static_cast<double>(took) / 1000.0);
}

void cancel_generation(const server::model_pipeline& model, uint64_t id) {
  caf::anon_send(model.generative->actor, scheduler::cancel_generation_atom::value, id);
}

} // namespace caf_serving::ingress
