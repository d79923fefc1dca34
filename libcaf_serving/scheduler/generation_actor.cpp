#include "scheduler/generation_actor.hpp"

#include "core/clock.hpp"
#include "executor/decoder_actor.hpp"
#include "postprocess/generation_postprocessor_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cstdio>
#include <unordered_map>

namespace caf_serving::scheduler {
namespace {

std::atomic<uint64_t> generation_ids{1};

/// One sequence the scheduler holds, from admission to its last update. Its
/// sampler, detokenizer and stop checks are the post-processor's.
struct sequence {
  explicit sequence(std::shared_ptr<generation_job> j) : job(std::move(j)), tokens(job->prompt) {}

  std::shared_ptr<generation_job> job;
  /// Prompt and generated tokens: what the model computes (again, after a
  /// preemption).
  std::vector<int32_t> tokens;
  generation_update pending; ///< what the next delivery carries
  int64_t queued_ns = 0;
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;
  bool ended = false;
  /// Whether the post-processor still holds it (it forgets a sequence whose
  /// sample ended it).
  bool post_open = true;

  uint32_t generated() const {
    return static_cast<uint32_t>(tokens.size() - job->prompt.size());
  }
};

struct generation_state : std::enable_shared_from_this<generation_state> {
  generation_actor::pointer self;
  generation_actor_config cfg;
  generation_policy policy;
  postprocess::generation_postprocessor_actor post;
  executor::decoder_actor executor;
  std::unordered_map<uint64_t, std::unique_ptr<sequence>> sequences;
  /// A step is asked for, in flight, or follows the one that just ended.
  bool stepping = false;
  /// A plan is at the executor; its items' ids.
  bool in_flight = false;
  std::vector<uint64_t> step_ids;
  /// When the plan in flight was sent, and its tokens: the step cost model's
  /// sample when its samples come back.
  time_point step_sent;
  /// When the last step's samples arrived (zero: no step since), for the
  /// scheduler's own time between steps.
  int64_t answered_ns = 0;
  uint32_t step_tokens = 0;
  /// Sequences whose cache the executor must free before its next step.
  std::vector<uint64_t> releases;

  generation_state(generation_actor::pointer s, generation_actor_config c)
      : self(s), cfg(std::move(c)), policy(cfg.limits),
        post(postprocess::spawn_generation_postprocessor(self->system(),
                                                         {cfg.tokenizer, cfg.eos_ids})),
        executor(executor::spawn_decoder_actor(
          self->system(),
          {cfg.signature, cfg.backend,
           {cfg.signature.layers(), cfg.signature.kv_heads,
            cfg.signature.head_dim, cfg.limits.block_tokens, cfg.limits.cache_blocks},
           cfg.runner, generation_sampler_actor{post}})) {
    cfg.stats->cache_blocks_total = cfg.limits.cache_blocks;
    // However this actor ends (stopped, or forgotten by everyone), the other
    // two end with it.
    self->attach_functor([executor = executor, post = post](const caf::error&) {
      caf::anon_send_exit(executor, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(post, caf::exit_reason::user_shutdown);
    });
  }

  void publish() {
    auto& s = *cfg.stats;
    s.running = static_cast<uint32_t>(policy.running());
    s.waiting = static_cast<uint32_t>(policy.waiting());
    // The policy's count: the executor's cache holds as many once the step
    // in flight is done, and it is what the next plan is made from.
    s.cache_blocks_used = policy.used_blocks();
    s.preemptions = policy.preemptions();
    s.shed = policy.shed();
    s.ttft_lateness_milli = static_cast<uint32_t>(policy.first_token_lateness() * 1000.0);
  }

  /// Hands the executor the sequences to free now, unless a plan is at it
  /// (the next plan carries them).
  void flush_releases() {
    if (in_flight || releases.empty())
      return;
    self->send(executor, generation_release_atom::value, std::move(releases));
    releases.clear();
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
      releases.push_back(id);
      if (s.post_open)
        self->send(post, generation_close_atom::value, id);
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
    if (auto refused =
          policy.admit(id, prompt, max_tokens, clock_type::now(), job->ttft_target)) {
      generation_update u;
      u.error = serving_error{static_cast<status_code>(refused->status),
                              "model '" + cfg.model_name + "': " + refused->message};
      u.prompt_tokens = prompt;
      publish(); // the shed count is read before the next step
      job->sink->deliver(std::move(u));
      return;
    }
    cfg.stats->prompt_tokens.fetch_add(prompt, std::memory_order_relaxed);
    // The post-processor hears of it before any step that holds it: this
    // message is in its mailbox before the executor can forward that step.
    auto open = std::make_shared<generation_sequence>();
    open->id = id;
    open->prompt = job->prompt;
    open->sampling = job->sampling;
    open->stop = job->stop;
    open->stop.max_tokens = max_tokens; // "length" in the step the policy ends it
    open->skip_special_tokens = job->skip_special_tokens;
    open->include_stop_str_in_output = job->include_stop_str_in_output;
    self->send(post, generation_open_atom::value,
               std::shared_ptr<const generation_sequence>(std::move(open)));
    auto s = std::make_unique<sequence>(std::move(job));
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
    flush_releases();
  }

  /// Plans the next step and sends it to the executor; stops stepping when
  /// there is nothing to run.
  void run_step() {
    const auto& plan = policy.plan_step();
    releases.insert(releases.end(), plan.preempted.begin(), plan.preempted.end());
    if (plan.work.empty()) {
      if (!plan.preempted.empty()) {
        policy.step_done();
        publish();
        self->send(self, generation_step_atom::value);
        return;
      }
      stepping = false;
      answered_ns = 0; // idle until a request comes: not the scheduler's time
      flush_releases();
      publish();
      return;
    }
    generation_step_plan p;
    p.items.reserve(plan.work.size());
    step_ids.clear();
    for (const auto& w : plan.work) {
      const auto& s = *sequences.at(w.id);
      p.items.push_back({w.id, w.first_position, static_cast<uint32_t>(p.tokens.size()),
                         w.tokens, w.emits_token});
      auto from = s.tokens.begin() + w.first_position;
      p.tokens.insert(p.tokens.end(), from, from + w.tokens);
      step_ids.push_back(w.id);
    }
    p.releases = std::move(releases);
    releases.clear();
    in_flight = true;
    step_sent = clock_type::now();
    if (answered_ns != 0) {
      cfg.stats->scheduler_us.fetch_add(static_cast<uint64_t>(now_ns() - answered_ns) / 1000,
                                        std::memory_order_relaxed);
      answered_ns = 0;
    }
    step_tokens = plan.tokens;
    publish();
    self->request(executor, caf::infinite, generation_run_atom::value, std::move(p))
      .then([st = shared_from_this()](generation_samples& samples) { st->step_answered(samples); },
            [st = shared_from_this()](caf::error& e) {
              generation_samples failed;
              failed.error = serving_error{status_code::internal,
                                           "model '" + st->cfg.model_name
                                             + "': the step's executor or post-processor "
                                               "failed: "
                                             + st->self->system().render(e)};
              st->step_answered(failed);
            });
  }

  /// The samples of the step in flight (or its error) arrived.
  void step_answered(generation_samples& samples) {
    in_flight = false;
    cfg.stats->steps.fetch_add(1, std::memory_order_relaxed);
    if (samples.error) {
      auto ids = std::move(step_ids);
      policy.step_done();
      for (uint64_t id : ids)
        if (auto i = sequences.find(id); i != sequences.end())
          fail(*i->second, *samples.error);
      publish();
      run_step();
      return;
    }
    const auto took = clock_type::now() - step_sent;
    policy.observe_step(step_tokens, took);
    int64_t now = now_ns();
    answered_ns = now;
    {
      auto& st = *cfg.stats;
      const int64_t took_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
      st.model_us.fetch_add(static_cast<uint64_t>(samples.model_ns) / 1000,
                            std::memory_order_relaxed);
      st.sample_us.fetch_add(static_cast<uint64_t>(samples.sample_ns) / 1000,
                             std::memory_order_relaxed);
      st.handoff_us.fetch_add(
        static_cast<uint64_t>(std::max<int64_t>(0, took_ns - samples.model_ns - samples.sample_ns))
          / 1000,
        std::memory_order_relaxed);
    }
    std::vector<uint64_t> emitted;
    for (auto& row : samples.rows) {
      auto i = sequences.find(row.seq);
      if (i == sequences.end())
        continue; // cancelled while the step ran
      auto& s = *i->second;
      emitted.push_back(row.seq);
      if (row.error) {
        s.post_open = false;
        s.pending.error = std::move(row.error);
        continue;
      }
      s.tokens.push_back(row.token);
      if (s.first_token_ns == 0) {
        s.first_token_ns = now;
        int64_t from = s.job->received_ns ? s.job->received_ns : s.queued_ns;
        cfg.stats->ttft_us.observe(static_cast<double>(now - from) / 1000.0);
        policy.observe_first_token(row.seq, std::chrono::nanoseconds(now - s.queued_ns));
      } else {
        cfg.stats->itl_us.observe(static_cast<double>(now - s.last_token_ns) / 1000.0);
      }
      s.last_token_ns = now;
      cfg.stats->generated_tokens.fetch_add(1, std::memory_order_relaxed);
      s.pending.tokens.push_back(row.token);
      if (s.job->sampling.logprobs) {
        generation_update::token_logprobs lp;
        lp.logprob = row.logprob.value_or(0.0f);
        lp.top = std::move(row.top_logprobs);
        s.pending.logprobs.push_back(std::move(lp));
      }
      s.pending.text += row.text;
      if (row.finish_reason) {
        s.post_open = false;
        end(s, std::move(*row.finish_reason));
      }
    }
    // The post-processor knows each sequence's max_tokens and has ended these
    // already; one it has not is ended here all the same.
    for (uint64_t id : policy.step_done())
      if (auto i = sequences.find(id); i != sequences.end())
        end(*i->second, "length");
    for (uint64_t id : emitted)
      if (auto i = sequences.find(id); i != sequences.end())
        deliver(*i->second);
    // Messages that arrived during the step (new requests, cancellations) were
    // taken while it ran: the next is planned at once.
    run_step();
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
  {
    // Where the steps' time went, per stage (per step: divide by the steps).
    const char* name = "caf_serving_generation_step_stage_us_total";
    out += std::string("# HELP ") + name
           + " Time of the decoding steps by stage, microseconds: model (the executor's run "
             "of the model), sample (the post-processor's sampling, detokenizing and stop "
             "checks), handoff (the messages between the three actors), scheduler (the "
             "scheduler's delivering of tokens and planning between two steps)\n# TYPE "
           + name + " counter\n";
    for (auto [stage, value] : {std::pair<const char*, uint64_t>{"model", s.model_us.load()},
                                {"sample", s.sample_us.load()},
                                {"handoff", s.handoff_us.load()},
                                {"scheduler", s.scheduler_us.load()}})
      out += std::string(name) + "{" + labels + ",stage=\"" + stage + "\"} "
             + std::to_string(value) + "\n";
  }
  line("caf_serving_generation_preemptions_total", "counter",
       "Sequences preempted (their cache freed, recomputed later) when the KV cache was full",
       s.preemptions.load());
  line("caf_serving_generation_shed_total", "counter",
       "Requests refused at once (503) because their first token could not come within the "
       "model's time-to-first-token target",
       s.shed.load());
  {
    const char* name = "caf_serving_generation_ttft_lateness_ratio";
    char value[32];
    std::snprintf(value, sizeof value, "%.3f", s.ttft_lateness_milli.load() / 1000.0);
    out += std::string("# HELP ") + name
           + " How late first tokens come against the scheduler's prediction (the running "
             "90th percentile of actual over predicted waits), which the TTFT target's "
             "admission scales its predictions by\n# TYPE "
           + name + " gauge\n" + name + "{" + labels + "} " + value + "\n";
  }
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
    auto st = std::make_shared<generation_state>(self, std::move(cfg));
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
      [st](generation_step_atom) {
        // A step asked for by kick() (requests that arrived together share
        // it); while one is in flight its answer plans the next.
        if (!st->in_flight)
          st->run_step();
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
        // The executor and the post-processor end with this actor (the
        // functor attached in generation_state).
        self->quit();
      },
    };
  };
  return sys.spawn(body);
}

} // namespace caf_serving::scheduler
