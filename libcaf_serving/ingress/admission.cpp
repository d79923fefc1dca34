#include "ingress/admission.hpp"

#include "core/clock.hpp"
#include "ingress/infer_message.hpp"
#include "ingress/validate.hpp"

#include <iostream>

namespace caf_serving::ingress {

admission admit(const admission_config& cfg,
                const std::shared_ptr<const server::model_pipeline>& model,
                infer_request&& request, int64_t received_ns) {
  // Built where the caller receives it (every return returns `out`): the
  // answer's parts are moved once, from the request into their place.
  admission out;
  auto& admitted = *std::get_if<admitted_request>(&out);
  auto& answer = admitted.answer;
  const auto& config = model->config;
  auto refuse = [&](const serving_error& e) {
    record_failure(*model, received_ns, e);
    out = e;
  };
  // Triton's words for a decoupled model on the one-answer endpoints.
  if (model->generative) {
    refuse(bad_request("HTTP end point doesn't support models with decoupled transaction "
                       "policy: model '" + config.name + "' is generative; send "
                       "POST /v2/models/" + config.name + "/generate or /generate_stream, "
                       "or /v1/completions"));
    return out;
  }
  auto bound = bind_shared_memory(request, *cfg.shared_memory, config);
  if (!bound) {
    refuse(bound.error());
    return out;
  }
  auto checked = validate(request, config, cfg.limits);
  if (!checked) {
    refuse(checked.error());
    return out;
  }
  auto timing = request.parameters.find("timing");
  answer.timing = timing != request.parameters.end() && timing->second == "true";
  answer.shared_memory = std::move(*bound);
  // Not for requests that use shared memory: their inputs may live in a
  // client's region, which only copy_input_data reads safely.
  if (cfg.cache && config.response_cache_enabled && answer.shared_memory.empty()) {
    auto& miss = answer.miss;
    int64_t start = now_ns();
    auto key = cache_key::of(request, model);
    if (auto hit = cfg.cache->find(key)) {
      int64_t lookup_ns = now_ns() - start;
      answer.request = std::move(request);
      out = cache_hit{std::move(answer), std::move(hit), lookup_ns};
      return out;
    }
    // The key must own its bytes: the protocol's buffer goes before the
    // answer comes.
    if (cfg.cache->admits(key)) {
      key.own();
      miss.key = std::move(key);
    }
    miss.cache = cfg.cache;
    miss.lookup_ns = now_ns() - start;
  }
  auto msg = make_request_message(request, *model, checked->batch_size, received_ns);
  if (!msg) {
    refuse(msg.error());
    return out;
  }
  admitted.message = std::move(*msg);
  // The inputs now live in the message: their views into the protocol's
  // buffer would dangle once it goes, and JSON-converted bytes need not wait
  // for the answer.
  request.inputs.clear();
  answer.request = std::move(request);
  return out;
}

response_view cached_answer(const cache_hit& hit, model_stats& stats, int64_t received_ns) {
  stats.cache_hit.add(static_cast<uint64_t>(hit.lookup_ns));
  stats.queue.add(0);
  response_view view;
  view.outputs = hit.response->views();
  if (hit.answer.timing)
    view.parameters = {
      {"cache_hit_us", static_cast<uint64_t>(hit.lookup_ns) / 1000},
      {"until_response_us", static_cast<uint64_t>(now_ns() - received_ns) / 1000},
    };
  return view;
}

result<response_view> read_answer(const response_message& msg, answer_context& answer,
                                  const server::model_pipeline& model, int64_t received_ns) {
  auto r = msg.reader();
  auto fail = [&](serving_error e) {
    answer.shared_memory = {};
    record_failure(model, received_ns, e);
    return e;
  };
  if (r.getError().getStatus() != 0)
    return fail(pipeline_error(r.getError(), model.config.name));
  response_view view = make_response_view(r, answer.timing);
  auto written = answer.shared_memory.write_outputs(view);
  if (!written)
    return fail(written.error());
  return view;
}

void record_answer(answer_context& answer, model_stats& stats,
                   const std::vector<output_view>& outputs, int64_t received_ns) {
  auto& miss = answer.miss;
  if (miss.cache) {
    int64_t start = now_ns();
    if (miss.key)
      miss.cache->insert(std::move(*miss.key), cached_response::copy_of(outputs));
    stats.cache_miss.add(static_cast<uint64_t>(miss.lookup_ns + (now_ns() - start)));
  }
  record_success(stats, static_cast<uint64_t>(now_ns() - received_ns),
                 answer.request.timeout_us);
}

void record_failure(const server::model_pipeline& model, int64_t received_ns,
                    const serving_error& e) {
  model.stats->record_failure(reason_of(e), static_cast<uint64_t>(now_ns() - received_ns));
}

serving_error pipeline_error(wire::Error::Reader error, const std::string& model_name) {
  auto reason = static_cast<failure_reason>(error.getReason());
  auto text = error.getMessage();
  return {static_cast<status_code>(error.getStatus()),
          with_triton_phrase(reason, client_error_message(
                                       std::string_view(text.cStr(), text.size()), model_name)),
          reason, error.getRetryAfterS()};
}

std::string with_triton_phrase(failure_reason reason, std::string message) {
  const char* phrase = reason == failure_reason::queue_full ? "Exceeds maximum queue size"
                       : reason == failure_reason::timeout  ? "Request timeout expired"
                                                            : nullptr;
  if (phrase == nullptr || message.rfind(phrase, 0) == 0)
    return message;
  return std::string(phrase) + ": " + message;
}

std::string client_error_message(std::string_view message, std::string_view model) {
  // What CAF's render() and kj's exception text look like: "error(3, caf::sec
  // ...)", "system_error(...)", "exit_reason", and source locations.
  static constexpr std::string_view internal_marks[]
    = {"caf::", "sec::", "error(", "exit_reason", "kj::", ".c++:", ".cpp:", ".hpp:"};
  bool internal = false;
  for (auto mark : internal_marks)
    internal = internal || message.find(mark) != std::string_view::npos;
  if (!internal)
    return std::string(message);
  std::cerr << "caf-serving: model '" << model << "' failed a request: " << message << std::endl;
  return "internal error while running model '" + std::string(model) + "'; see the server log";
}

} // namespace caf_serving::ingress
