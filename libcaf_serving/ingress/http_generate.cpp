#include "ingress/http_generate.hpp"

#include "core/clock.hpp"
#include "ingress/generation_admission.hpp"
#include "scheduler/generation_actor.hpp"
#include "server/generative_model.hpp"
#include "text/tokenizer.hpp"

#include <kj/async.h>

#include <chrono>
#include <mutex>
#include <optional>

namespace caf_serving::ingress {
namespace {

using scheduler::generation_update;

/// Updates on their way from the generation actor's thread to the loop.
class generation_channel {
public:
  /// Any thread.
  void post(generation_update u) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(u));
    if (waiter_) {
      waiter_->fulfill();
      waiter_ = nullptr;
    }
  }
  /// Loop thread: what has come since the last call, at least one update.
  kj::Promise<std::vector<generation_update>> next() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!queue_.empty()) {
      std::vector<generation_update> out;
      std::swap(out, queue_);
      return out;
    }
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    waiter_ = kj::mv(paf.fulfiller);
    lock.unlock();
    return paf.promise.then([this]() { return next(); });
  }

private:
  std::mutex mutex_;
  std::vector<generation_update> queue_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter_;
};

/// The actor's end of a channel. Every job gets a last update: one dropped
/// without it (the actor stopped) answers 500.
class channel_sink final : public scheduler::generation_sink {
public:
  channel_sink(std::shared_ptr<generation_channel> ch, std::string model)
      : channel_(std::move(ch)), model_(std::move(model)) {}
  ~channel_sink() override {
    if (ended_)
      return;
    generation_update u;
    u.error = serving_error{status_code::internal,
                            "model '" + model_ + "': the request was lost inside the server "
                            "(its generation stopped); retry it"};
    channel_->post(std::move(u));
  }
  void deliver(generation_update u) override {
    ended_ = u.last();
    channel_->post(std::move(u));
  }

private:
  std::shared_ptr<generation_channel> channel_;
  std::string model_;
  bool ended_ = false;
};

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

generation_finish finish_of(const std::optional<std::string>& reason) {
  if (!reason)
    return generation_finish::none;
  return *reason == "length" ? generation_finish::length : generation_finish::stop;
}

} // namespace

/// One generate request, from its body until its last byte is written.
struct http_generate::call {
  std::shared_ptr<const server::model_pipeline> model;
  const server::generative_model* g = nullptr;
  generate_request request;
  bool stream = false;
  std::shared_ptr<generation_channel> channel = std::make_shared<generation_channel>();
  uint64_t id = 0;
  bool submitted = false;
  bool finished = false;
  int64_t received_ns = 0;
  std::string object_id;
  int64_t created = 0;
  std::string version_text;
  std::string prompt_text; ///< for echo
  // What has come so far.
  std::string text;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  std::optional<std::string> finish;
  std::optional<serving_error> error;
  int64_t first_token_ns = 0;
  int64_t last_ns = 0;
  std::vector<int32_t> tokens;
  std::vector<generation_update::token_logprobs> logprobs;
  // The stream, once started, and the bytes of its pending write.
  kj::Own<kj::AsyncOutputStream> out;
  std::string writing;
  bool first_chunk = true;

  ~call() {
    // The client went away (or the server stops): the sequence is dropped and
    // its cache blocks freed before the next step.
    if (submitted && !finished)
      cancel_generation(*model, id);
  }

  bool is_triton() const { return request.api == generate_api::triton_generate; }

  /// A Triton generate answer or event, with the optional outputs it asked for.
  triton_generate_result triton_result(std::string_view text_output,
                                       const std::optional<std::string>& finish_reason,
                                       uint32_t input_tokens, uint32_t output_tokens) const {
    triton_generate_result r;
    r.id = request.request_id;
    r.model_name = model->config.name;
    r.model_version = version_text;
    r.text_output = text_output;
    if (request.triton.return_finish_reason)
      r.finish_reason = finish_of(finish_reason);
    if (request.triton.return_num_input_tokens)
      r.num_input_tokens = input_tokens;
    if (request.triton.return_num_output_tokens)
      r.num_output_tokens = output_tokens;
    return r;
  }

  void take(generation_update& u) {
    text += u.text;
    prompt_tokens = u.prompt_tokens;
    completion_tokens = u.completion_tokens;
    if (request.sampling.logprobs) {
      tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
      logprobs.insert(logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    }
    if (u.finish_reason)
      finish = u.finish_reason;
    if (u.first_token_ns)
      first_token_ns = u.first_token_ns;
    last_ns = u.sent_ns;
    if (u.error)
      error = u.error;
    if (u.last())
      finished = true;
  }
};

namespace {

/// Token texts and logprob views of a call's tokens, alive while encoding.
struct logprob_views {
  std::vector<std::string> texts;
  std::vector<std::vector<std::string>> top_texts;
  std::vector<std::vector<top_logprob>> tops;
  std::vector<token_logprob> entries;

  logprob_views(const text::tokenizer& tok, const std::vector<int32_t>& ids,
                const std::vector<generation_update::token_logprobs>& lps) {
    size_t n = std::min(ids.size(), lps.size());
    texts.reserve(n);
    top_texts.resize(n);
    tops.resize(n);
    for (size_t i = 0; i < n; ++i) {
      texts.push_back(tok.decode(std::vector<int32_t>{ids[i]}));
      for (const auto& [id, lp] : lps[i].top)
        top_texts[i].push_back(tok.decode(std::vector<int32_t>{id}));
      for (size_t j = 0; j < lps[i].top.size(); ++j)
        tops[i].push_back({top_texts[i][j], lps[i].top[j].second});
    }
    for (size_t i = 0; i < n; ++i)
      entries.push_back({texts[i], lps[i].logprob, {tops[i].data(), tops[i].size()}});
  }
};

} // namespace

kj::Promise<void> http_generate::send_error(const call& c, http_response& response,
                                            const serving_error& e) {
  if (c.model)
    record_failure(*c.model, c.received_ns, e);
  if (c.is_triton())
    return writer_.send_error(response, e);
  std::string body;
  append_openai_error(body, openai_error_of(e));
  return writer_.send(response, static_cast<int>(e.status), std::move(body));
}

namespace {

/// The body as text, or nothing when it could not be read whole.
kj::Promise<std::optional<std::string>> read_body(kj::AsyncInputStream& body, uint64_t limit) {
  return body.readAllText(limit).then(
    [](kj::String text) { return std::optional<std::string>(std::string(text.cStr(), text.size())); },
    [](kj::Exception&&) { return std::optional<std::string>(); });
}

serving_error unreadable_body(uint64_t limit) {
  return bad_request("the request body could not be read whole, or is over " +
                     std::to_string(limit) + " bytes (--max-body-bytes)");
}

} // namespace

kj::Promise<void> http_generate::triton(std::shared_ptr<const server::model_pipeline> model,
                                        bool stream, kj::AsyncInputStream& body,
                                        http_response& response, int64_t received) {
  auto c = kj::heap<call>();
  c->model = std::move(model);
  c->received_ns = received;
  c->request.api = generate_api::triton_generate;
  c->stream = stream;
  auto& cr = *c;
  uint64_t limit = shared_.cfg.limits.max_body_bytes;
  return read_body(body, limit)
    .then([this, &cr, &response, limit](std::optional<std::string> text) -> kj::Promise<void> {
      if (!text)
        return send_error(cr, response, unreadable_body(limit));
      // Triton refuses a generate body over its input size limit before
      // parsing it, in these words.
      const uint64_t max_json = std::min<uint64_t>(limit, generate_codec_limits{}.max_triton_input_bytes);
      if (text->size() > max_json)
        return send_error(cr, response,
                          bad_request("request JSON size of " + std::to_string(text->size())
                                      + " bytes exceeds the maximum allowed input size of "
                                      + std::to_string(max_json)
                                      + " bytes (generate bodies: at most 64 MiB and "
                                        "--max-body-bytes); send a smaller request"));
      if (!cr.model->generative)
        return send_error(cr, response,
                          bad_request("model '" + cr.model->config.name + "' is not "
                                      "generative: the generate endpoints serve models with "
                                      "model_transaction_policy { decoupled: true }; send its "
                                      "requests to /v2/models/" + cr.model->config.name
                                      + "/infer"));
      auto parsed = parse_triton_generate(*text, generate_model_info_of(cr.model->config));
      if (!parsed)
        return send_error(cr, response, parsed.error());
      cr.request = std::move(*parsed);
      cr.request.api = generate_api::triton_generate;
      return start(cr, response);
    })
    .attach(kj::mv(c));
}

kj::Promise<void> http_generate::openai(generate_api api, kj::AsyncInputStream& body,
                                        http_response& response, int64_t received) {
  auto c = kj::heap<call>();
  c->received_ns = received;
  c->request.api = api;
  auto& cr = *c;
  uint64_t limit = shared_.cfg.limits.max_body_bytes;
  return read_body(body, limit)
    .then([this, &cr, &response, api, limit](std::optional<std::string> text)
            -> kj::Promise<void> {
      if (!text)
        return send_error(cr, response, unreadable_body(limit));
      auto parsed = api == generate_api::openai_chat ? parse_openai_chat(*text)
                                                     : parse_openai_completion(*text);
      if (!parsed)
        return send_error(cr, response, parsed.error());
      cr.request = std::move(*parsed);
      cr.request.api = api;
      cr.stream = cr.request.stream;
      auto found = shared_.models.find(cr.request.model, 0);
      if (!found)
        return send_error(cr, response,
                          not_found("The model '" + cr.request.model + "' does not exist: "
                                    + found.error().message));
      cr.model = *found;
      if (!cr.model->generative)
        return send_error(cr, response,
                          bad_request("model '" + cr.request.model + "' is not generative "
                                      "(config.pbtxt has no model_transaction_policy { "
                                      "decoupled: true }); the OpenAI endpoints serve "
                                      "generative models only, see GET /v1/models"));
      return start(cr, response);
    })
    .attach(kj::mv(c));
}

kj::Promise<void> http_generate::openai_models(const std::string& id, http_response& response) {
  std::vector<std::shared_ptr<const server::model_pipeline>> served;
  for (const auto& row : shared_.models.index()) {
    if (!id.empty() && row.name != id)
      continue;
    auto p = shared_.models.find(row.name, 0);
    if (p && (*p)->generative)
      served.push_back(*p);
  }
  std::vector<openai_model_card> cards;
  for (const auto& p : served)
    cards.push_back({p->config.name, p->generative->created_s, "caf-serving"});
  std::string body;
  if (!id.empty()) {
    if (cards.empty()) {
      append_openai_error(body, openai_error_of(not_found(
                                  "The model '" + id + "' does not exist")));
      return writer_.send(response, 404, std::move(body));
    }
    append_openai_model(body, cards.front());
  } else {
    append_openai_model_list(body, {cards.data(), cards.size()});
  }
  return writer_.send_json(response, 200, std::move(body));
}

std::string http_generate::prometheus() const {
  std::string out;
  for (const auto& row : shared_.models.index()) {
    for (const auto& p : shared_.models.versions(row.name)) {
      if (!p->generative)
        continue;
      scheduler::render_generation_stats(out, *p->generative->stats,
                                         "model=\"" + p->config.name + "\",version=\""
                                           + std::to_string(p->version) + "\"");
    }
  }
  return out;
}

/// Admits the request (generation_admission.hpp), hands the job to the
/// model's generation actor and answers as the request asked.
kj::Promise<void> http_generate::start(call& c, http_response& response) {
  c.g = c.model->generative.get();
  auto admitted = admit_generation(*c.model, c.request);
  if (!admitted)
    return send_error(c, response, admitted.error());
  c.prompt_text = std::move(admitted->prompt_text);
  auto job = std::move(admitted->job);
  c.id = job->id;
  job->received_ns = c.received_ns;
  job->sink = std::make_shared<channel_sink>(c.channel, c.model->config.name);
  c.created = unix_seconds();
  c.object_id = (c.request.api == generate_api::openai_chat ? "chatcmpl-" : "cmpl-")
                + std::to_string(c.id);
  c.version_text = std::to_string(c.model->version);
  submit_generation(*c.model, std::move(job));
  c.submitted = true;
  return c.stream ? send_stream(c, response) : send_whole(c, response);
}

kj::Promise<void> http_generate::send_whole(call& c, http_response& response) {
  return c.channel->next().then(
    [this, &c, &response](std::vector<generation_update> updates) -> kj::Promise<void> {
      for (auto& u : updates)
        c.take(u);
      if (!c.finished)
        return send_whole(c, response);
      if (c.error)
        return send_error(c, response, *c.error);
      record_generation(c);
      std::string body;
      // Echo: the prompt leads the text (Triton's vLLM backend does so unless
      // exclude_input_in_output; OpenAI's completions when echo is set).
      std::string text = c.request.echo ? c.prompt_text + c.text : c.text;
      if (c.is_triton()) {
        append_triton_generate_response(
          body, c.triton_result(text, c.finish, c.prompt_tokens, c.completion_tokens));
        return writer_.send_json(response, 200, std::move(body));
      }
      logprob_views lp(*c.g->tokenizer, c.tokens, c.logprobs);
      openai_result r;
      r.meta = {c.object_id, c.created, c.model->config.name, {}};
      r.choice.text = text;
      r.choice.with_logprobs = c.request.sampling.logprobs;
      r.choice.logprobs = {lp.entries.data(), lp.entries.size()};
      r.choice.finish = finish_of(c.finish);
      r.usage = {c.prompt_tokens, c.completion_tokens};
      // The request's own timings, as llama.cpp's server reports them: its
      // arrival to its first token, and from there to its last.
      if (c.first_token_ns)
        r.timings = generation_timings{
          c.prompt_tokens, static_cast<double>(c.first_token_ns - c.received_ns) / 1e6,
          c.completion_tokens, static_cast<double>(c.last_ns - c.first_token_ns) / 1e6};
      if (c.request.api == generate_api::openai_chat)
        append_openai_chat_completion(body, r);
      else
        append_openai_completion(body, r);
      return writer_.send_json(response, 200, std::move(body));
    });
}

kj::Promise<void> http_generate::send_stream(call& c, http_response& response) {
  return c.channel->next().then(
    [this, &c, &response](std::vector<generation_update> updates) -> kj::Promise<void> {
      std::string bytes;
      for (auto& u : updates) {
        c.take(u);
        if (!c.out) {
          // Nothing sent yet: a refusal is an answer with its status.
          if (c.error)
            return send_error(c, response, *c.error);
          kj::HttpHeaders headers(shared_.table);
          // Triton's header, charset included (its generate test checks it).
          headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/event-stream; charset=utf-8");
          c.out = response.send(200, "OK", headers, nullptr);
        }
        if (u.error) {
          record_failure(*c.model, c.received_ns, *u.error);
          if (c.is_triton()) {
            append_triton_error_event(bytes, u.error->message);
          } else {
            append_openai_error_event(bytes, openai_error_of(*u.error));
            append_sse_done(bytes);
          }
          continue;
        }
        if (u.text.empty() && !u.last() && !(c.request.echo && c.first_chunk))
          continue;
        if (c.is_triton()) {
          append_triton_generate_event(
            bytes, c.triton_result(u.text, u.finish_reason, u.prompt_tokens,
                                   static_cast<uint32_t>(u.tokens.size())));
        } else {
          std::string text = c.request.echo && c.first_chunk ? c.prompt_text + u.text : u.text;
          logprob_views lp(*c.g->tokenizer, u.tokens, u.logprobs);
          openai_chunk chunk;
          chunk.meta = {c.object_id, c.created, c.model->config.name, {}};
          chunk.choice.text = text;
          chunk.choice.with_logprobs = c.request.sampling.logprobs;
          chunk.choice.logprobs = {lp.entries.data(), lp.entries.size()};
          chunk.choice.finish = finish_of(u.finish_reason);
          chunk.first = c.first_chunk;
          chunk.include_usage = c.request.include_usage;
          if (c.request.api == generate_api::openai_chat)
            append_openai_chat_chunk(bytes, chunk);
          else
            append_openai_completion_chunk(bytes, chunk);
          if (u.last()) {
            if (c.request.include_usage)
              append_openai_usage_chunk(bytes, c.request.api, chunk.meta,
                                        {c.prompt_tokens, c.completion_tokens});
            append_sse_done(bytes);
          }
        }
        c.first_chunk = false;
      }
      if (c.finished && !c.error)
        record_generation(c);
      if (bytes.empty())
        return c.finished ? kj::Promise<void>(kj::READY_NOW) : send_stream(c, response);
      c.writing = std::move(bytes);
      return c.out->write(c.writing.data(), c.writing.size())
        .then([this, &c, &response]() -> kj::Promise<void> {
          if (c.finished) {
            c.out = nullptr; // ends the chunked body
            return kj::READY_NOW;
          }
          return send_stream(c, response);
        });
    });
}

void http_generate::record_generation(const call& c) {
  ingress::record_generation(*c.model, c.received_ns);
}

} // namespace caf_serving::ingress
