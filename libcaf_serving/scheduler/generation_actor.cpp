#include "scheduler/generation_actor.hpp"

#include "core/clock.hpp"
#include "postprocess/sampling.hpp"
#include "postprocess/stop_strings.hpp"
#include "text/tokenizer.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <unordered_map>

namespace caf_serving::scheduler {
namespace {

std::atomic<uint64_t> generation_ids{1};

/// One sequence the actor holds, from admission to its last update.
struct sequence {
  sequence(std::shared_ptr<generation_job> j, const text::tokenizer& tok)
      : job(std::move(j)), tokens(job->prompt),
        sampler(job->sampling, {job->prompt.data(), job->prompt.size()}),
        detok(tok, job->prompt, text::decode_options{job->skip_special_tokens}),
        stops(job->stop.stop) {}

  std::shared_ptr<generation_job> job;
  /// Prompt and generated tokens: what the model computes (again, after a
  /// preemption).
  std::vector<int32_t> tokens;
  postprocess::sequence_sampler sampler;
  text::detokenizer detok;
  postprocess::stop_string_checker stops;
  generation_update pending; ///< what the next delivery carries
  int64_t queued_ns = 0;
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;
  bool ended = false;

  uint32_t generated() const {
    return static_cast<uint32_t>(tokens.size() - job->prompt.size());
  }
};

struct generation_state {
  generation_actor_config cfg;
  generation_policy policy;
  executor::decoder_runner runner;
  std::unordered_map<uint64_t, std::unique_ptr<sequence>> sequences;
  bool stepping = false;

  explicit generation_state(generation_actor_config c)
      : cfg(std::move(c)), policy(cfg.limits),
        runner(cfg.signature, cfg.backend,
               {cfg.signature.layers(), cfg.signature.kv_heads,
                cfg.signature.head_dim, cfg.limits.block_tokens, cfg.limits.cache_blocks},
               cfg.runner) {
    cfg.stats->cache_blocks_total = cfg.limits.cache_blocks;
  }

  void publish() {
    auto& s = *cfg.stats;
    s.running = static_cast<uint32_t>(policy.running());
    s.waiting = static_cast<uint32_t>(policy.waiting());
    s.cache_blocks_used = runner.cache().used_blocks();
    s.preemptions = policy.preemptions();
  }

  /// Sends `s`'s pending update and, when it is the last, forgets `s`.
  void deliver(sequence& s) {
    s.pending.prompt_tokens = static_cast<uint32_t>(s.job->prompt.size());
    s.pending.completion_tokens = s.generated();
    s.pending.queued_ns = s.queued_ns;
    s.pending.first_token_ns = s.first_token_ns;
    s.pending.sent_ns = now_ns();
    bool last = s.pending.last();
    s.job->sink->deliver(std::move(s.pending));
    s.pending = generation_update{};
    if (last) {
      uint64_t id = s.job->id;
      policy.finish(id);
      runner.release(id);
      sequences.erase(id);
    }
  }

  void fail(sequence& s, serving_error e) {
    s.pending.error = std::move(e);
    cfg.stats->failed.fetch_add(1, std::memory_order_relaxed);
    deliver(s);
  }

  void end(sequence& s, std::string reason) {
    if (s.ended)
      return;
    s.ended = true;
    if (!s.stops.stopped()) {
      auto tail = s.stops.feed(s.detok.flush());
      s.pending.text += tail.text;
      s.pending.text += s.stops.flush();
    }
    s.pending.finish_reason = std::move(reason);
    cfg.stats->finished.fetch_add(1, std::memory_order_relaxed);
  }

  void admit(std::shared_ptr<generation_job> job) {
    uint64_t id = job->id;
    if (job->prompt.empty()) {
      generation_update u;
      u.error = bad_request("the prompt has no tokens; send at least one");
      job->sink->deliver(std::move(u));
      return;
    }
    uint32_t prompt = static_cast<uint32_t>(job->prompt.size());
    uint32_t room = cfg.limits.max_context > prompt ? cfg.limits.max_context - prompt : 0;
    uint32_t max_tokens = job->stop.max_tokens ? *job->stop.max_tokens : room;
    if (max_tokens == 0)
      max_tokens = 1; // the policy refuses it, naming the context
    if (auto refused = policy.admit(id, prompt, max_tokens, clock_type::now())) {
      generation_update u;
      u.error = serving_error{static_cast<status_code>(refused->status),
                              "model '" + cfg.model_name + "': " + refused->message};
      u.prompt_tokens = prompt;
      job->sink->deliver(std::move(u));
      return;
    }
    cfg.stats->prompt_tokens.fetch_add(prompt, std::memory_order_relaxed);
    auto s = std::make_unique<sequence>(std::move(job), *cfg.tokenizer);
    // End-of-sequence and stop ids cannot be drawn before min_tokens.
    if (s->job->stop.min_tokens > 0)
      s->sampler.suppress(
        postprocess::ending_tokens(s->job->stop, {cfg.eos_ids.data(), cfg.eos_ids.size()}),
        s->job->stop.min_tokens);
    s->queued_ns = now_ns();
    sequences.emplace(id, std::move(s));
  }

  void cancel(uint64_t id) {
    auto i = sequences.find(id);
    if (i == sequences.end())
      return;
    cfg.stats->cancelled.fetch_add(1, std::memory_order_relaxed);
    // Nobody reads the answer; the sink still gets its one last update.
    i->second->pending.error = serving_error{status_code::bad_request, "cancelled",
                                             failure_reason::bad_request};
    deliver(*i->second);
  }

  /// One step; false when there was nothing to run.
  bool step() {
    const auto& plan = policy.plan_step();
    for (uint64_t p : plan.preempted)
      runner.release(p);
    if (plan.work.empty()) {
      if (!plan.preempted.empty())
        policy.step_done();
      publish();
      return !plan.preempted.empty();
    }
    std::vector<executor::decoder_step_item> items;
    items.reserve(plan.work.size());
    for (const auto& w : plan.work) {
      auto& s = *sequences.at(w.id);
      items.push_back({w.id, w.first_position, s.tokens.data() + w.first_position, w.tokens,
                       w.emits_token});
    }
    auto logits = runner.run(items);
    cfg.stats->steps.fetch_add(1, std::memory_order_relaxed);
    if (!logits) {
      std::vector<uint64_t> ids;
      for (const auto& w : plan.work)
        ids.push_back(w.id);
      policy.step_done();
      for (uint64_t id : ids)
        if (auto i = sequences.find(id); i != sequences.end())
          fail(*i->second, logits.error());
      publish();
      return true;
    }
    const uint32_t vocab = cfg.signature.vocab;
    std::vector<uint64_t> emitted;
    size_t row = 0;
    int64_t now = now_ns();
    for (const auto& w : plan.work) {
      if (!w.emits_token)
        continue;
      auto& s = *sequences.at(w.id);
      auto pick = s.sampler.next({logits->data() + row++ * vocab, vocab});
      emitted.push_back(w.id);
      if (!pick) {
        s.pending.error = pick.error();
        continue;
      }
      int32_t token = pick->token;
      s.tokens.push_back(token);
      if (s.first_token_ns == 0) {
        s.first_token_ns = now;
        int64_t from = s.job->received_ns ? s.job->received_ns : s.queued_ns;
        cfg.stats->ttft_us.observe(static_cast<double>(now - from) / 1000.0);
      } else {
        cfg.stats->itl_us.observe(static_cast<double>(now - s.last_token_ns) / 1000.0);
      }
      s.last_token_ns = now;
      cfg.stats->generated_tokens.fetch_add(1, std::memory_order_relaxed);
      s.pending.tokens.push_back(token);
      if (s.job->sampling.logprobs) {
        generation_update::token_logprobs lp;
        lp.logprob = pick->logprob.value_or(0.0f);
        for (const auto& t : pick->top_logprobs())
          lp.top.emplace_back(t.token, t.logprob);
        s.pending.logprobs.push_back(std::move(lp));
      }
      auto ended = postprocess::end_after_token(
        s.job->stop, {cfg.eos_ids.data(), cfg.eos_ids.size()}, s.generated(), token);
      if (ended && ended->token) {
        // An end-of-sequence or stop token: counted, not shown.
        end(s, postprocess::to_string(ended->reason));
        continue;
      }
      std::string piece = s.detok.push(token);
      auto scan = s.generated() < s.job->stop.min_tokens ? s.stops.feed_before_min_tokens(piece)
                                                         : s.stops.feed(piece);
      s.pending.text += scan.text;
      if (scan.stop) {
        if (s.job->include_stop_str_in_output)
          s.pending.text += s.job->stop.stop[*scan.stop];
        end(s, "stop");
      } else if (ended) {
        end(s, postprocess::to_string(ended->reason));
      }
    }
    for (uint64_t id : policy.step_done())
      if (auto i = sequences.find(id); i != sequences.end())
        end(*i->second, "length");
    for (uint64_t id : emitted)
      if (auto i = sequences.find(id); i != sequences.end())
        deliver(*i->second);
    publish();
    return true;
  }
};

} // namespace

generation_stats::generation_stats()
    : ttft_us({1000, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000,
               5000000, 10000000}),
      itl_us({500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000}) {}

void render_generation_stats(std::string& out, const generation_stats& s,
                             const std::string& labels) {
  auto line = [&](const char* name, const char* type, const char* help, uint64_t value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n"
           + name + "{" + labels + "} " + std::to_string(value) + "\n";
  };
  line("caf_serving_generation_prompt_tokens_total", "counter",
       "Prompt tokens of admitted generative requests", s.prompt_tokens.load());
  line("caf_serving_generation_tokens_total", "counter", "Tokens generated",
       s.generated_tokens.load());
  line("caf_serving_generation_steps_total", "counter", "Decoding steps run", s.steps.load());
  line("caf_serving_generation_preemptions_total", "counter",
       "Sequences preempted (their cache freed, recomputed later) when the KV cache was full",
       s.preemptions.load());
  line("caf_serving_generation_running", "gauge", "Sequences in the running batch",
       s.running.load());
  line("caf_serving_generation_waiting", "gauge", "Sequences waiting for a place",
       s.waiting.load());
  line("caf_serving_generation_kv_cache_blocks_used", "gauge", "KV cache blocks in use",
       s.cache_blocks_used.load());
  line("caf_serving_generation_kv_cache_blocks_free", "gauge", "KV cache blocks free",
       s.cache_blocks_total.load() - s.cache_blocks_used.load());
  line("caf_serving_generation_finished_total", "counter", "Sequences that ended with tokens",
       s.finished.load());
  line("caf_serving_generation_cancelled_total", "counter",
       "Sequences cancelled (the client went away)", s.cancelled.load());
  line("caf_serving_generation_failed_total", "counter", "Sequences that failed",
       s.failed.load());
  out += "# HELP caf_serving_generation_ttft_us Time to first token: the request's arrival "
         "at the server to its first token, microseconds\n# TYPE caf_serving_generation_ttft_us "
         "histogram\n";
  s.ttft_us.render(out, "caf_serving_generation_ttft_us", labels);
  out += "# HELP caf_serving_generation_itl_us Inter-token latency of one sequence, "
         "microseconds\n# TYPE caf_serving_generation_itl_us histogram\n";
  s.itl_us.render(out, "caf_serving_generation_itl_us", labels);
}

uint64_t next_generation_id() { return generation_ids.fetch_add(1, std::memory_order_relaxed); }

generation_actor spawn_generation_actor(caf::actor_system& sys, generation_actor_config config) {
  auto body = [cfg = std::move(config)](generation_actor::pointer self) mutable
    -> generation_actor::behavior_type {
    auto st = std::make_shared<generation_state>(std::move(cfg));
    auto kick = [self, st] {
      if (!st->stepping) {
        st->stepping = true;
        self->send(self, generation_step_atom::value);
      }
    };
    return {
      [st, kick](generate_atom, std::shared_ptr<generation_job> job) {
        st->admit(std::move(job));
        st->publish();
        kick();
      },
      [st](cancel_generation_atom, uint64_t id) {
        st->cancel(id);
        st->publish();
      },
      [self, st](generation_step_atom) {
        // Messages that arrived during a step (new requests, cancellations)
        // are taken before the next: the step re-sends itself.
        if (st->step())
          self->send(self, generation_step_atom::value);
        else
          st->stepping = false;
      },
      [self, st](generation_stop_atom) {
        for (auto& [id, s] : st->sequences)
          s->pending.error = unavailable("model '" + st->cfg.model_name
                                         + "' was unloaded while this request was generating");
        std::vector<uint64_t> ids;
        for (auto& [id, s] : st->sequences)
          ids.push_back(id);
        for (uint64_t id : ids)
          st->deliver(*st->sequences.at(id));
        self->quit();
      },
    };
  };
  return sys.spawn<caf::detached>(body);
}

} // namespace caf_serving::scheduler
