#include "scheduler/generation_policy.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

namespace caf_serving::scheduler {

std::optional<std::string> check_limits(const generation_limits& l) {
  if (l.max_running == 0 || l.block_tokens == 0 || l.cache_blocks == 0 || l.max_context == 0)
    return std::string("max_running, block_tokens, cache_blocks and max_context must be positive");
  if (l.max_step_tokens < l.max_running)
    return "max_step_tokens (" + std::to_string(l.max_step_tokens)
           + ") must be at least max_running (" + std::to_string(l.max_running)
           + "), so that every running sequence can decode in one step";
  return std::nullopt;
}

generation_policy::generation_policy(generation_limits limits)
  : limits_(limits), free_blocks_(limits.cache_blocks) {
}

uint32_t generation_policy::blocks_for(uint32_t tokens) const {
  return (tokens + limits_.block_tokens - 1) / limits_.block_tokens;
}

uint32_t generation_policy::step_tokens() const {
  if (limits_.tpot_target.count() > 0 && cost_.known())
    return cost_.tokens_within(limits_.tpot_target, limits_.max_step_tokens);
  return limits_.max_step_tokens;
}

clock_type::duration generation_policy::predicted_first_token(uint32_t prompt_tokens,
                                                               clock_type::duration give_up) const {
  if (!cost_.known())
    return clock_type::duration{0};
  // The steps ahead, replayed as plan_step() would plan them with the queue as
  // it is and nothing more arriving, each priced by the cost model: the step
  // running now, then decodes first, prefill chunks, and admission while a
  // running slot and the blocks for the prompt's first chunk are free. A
  // request behind a full running batch thus waits for sequences to finish
  // (at their max_tokens: a stop or EOS can only come sooner). Preemption is
  // not replayed: a sequence that outgrows the free blocks keeps running and
  // the queue waits until blocks are free again.
  struct replayed {
    uint64_t id = 0;
    uint32_t computed = 0; ///< tokens the cache holds
    uint32_t total = 0;    ///< prompt and generated tokens
    uint32_t left = 0;     ///< tokens it may still generate
    uint32_t blocks = 0;
    bool asking = false;   ///< the request being priced
  };
  std::vector<replayed> running;
  std::deque<replayed> waiting;
  for (auto id : running_) {
    const auto& s = sequences_.at(id);
    running.push_back({id, s.computed, s.prompt + s.generated, s.max_tokens - s.generated,
                       s.blocks, false});
  }
  for (auto id : waiting_) {
    const auto& s = sequences_.at(id);
    waiting.push_back({id, 0, s.prompt + s.generated, s.max_tokens - s.generated, 0, false});
  }
  waiting.push_back({0, 0, prompt_tokens, 1, 0, true});
  int64_t free_blocks = free_blocks_;
  clock_type::duration elapsed{0};
  // A step's sequences that computed all they hold yield a token; those at
  // their max_tokens leave. True when the asking request got its first token.
  auto emit = [&] {
    for (size_t i = 0; i < running.size();) {
      auto& r = running[i];
      if (r.computed < r.total) {
        ++i;
        continue;
      }
      if (r.asking)
        return true;
      ++r.total;
      if (--r.left > 0) {
        ++i;
        continue;
      }
      free_blocks += r.blocks;
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return false;
  };
  if (planned_) {
    // The step running now lands first; nothing new joins it.
    for (size_t i = 0; i < plan_.work.size(); ++i) {
      const auto& w = plan_.work[i];
      for (auto& r : running)
        if (r.id == w.id && sequences_.at(w.id).order == plan_orders_[i])
          r.computed = w.first_position + w.tokens;
    }
    elapsed += cost_.predict(plan_.tokens);
    emit();
  }
  const uint32_t target_tokens = step_tokens();
  const size_t max_running = std::min<size_t>(limits_.max_running, target_tokens);
  for (int steps = 0; steps < (1 << 20); ++steps) {
    uint32_t budget = std::max<uint32_t>(target_tokens, static_cast<uint32_t>(running.size()));
    uint32_t used = 0;
    auto compute = [&](replayed& r, uint32_t n) {
      uint32_t blocks = blocks_for(r.computed + n);
      if (blocks > r.blocks) {
        free_blocks -= blocks - r.blocks;
        r.blocks = blocks;
      }
      r.computed += n;
      budget -= n;
      used += n;
    };
    for (int pass = 0; pass < 2; ++pass)
      for (auto& r : running) {
        uint32_t need = r.total - r.computed;
        if ((pass == 0) != (need == 1) || budget == 0)
          continue;
        compute(r, std::min(need, budget));
      }
    while (!waiting.empty() && running.size() < max_running && budget > 0) {
      auto r = waiting.front();
      if (blocks_for(std::min(r.total, budget)) > free_blocks)
        break;
      waiting.pop_front();
      compute(r, std::min(r.total, budget));
      running.push_back(r);
    }
    if (used == 0)
      return std::chrono::hours(24); // nothing can run: never in time
    elapsed += cost_.predict(used);
    if (emit() || (give_up.count() > 0 && elapsed > give_up))
      return elapsed;
  }
  return elapsed;
}

std::optional<generation_refused>
generation_policy::admit(uint64_t id, uint32_t prompt_tokens, uint32_t max_tokens,
                         time_point now, clock_type::duration ttft_target) {
  if (prompt_tokens == 0)
    return generation_refused{400, "the prompt is empty: a generation needs at least one token"};
  if (max_tokens == 0)
    return generation_refused{400, "max_tokens must be at least 1"};
  uint64_t total = uint64_t{prompt_tokens} + max_tokens;
  if (total > limits_.max_context)
    return generation_refused{
      400, "the prompt's " + std::to_string(prompt_tokens) + " tokens and max_tokens "
             + std::to_string(max_tokens) + " exceed the model's context of "
             + std::to_string(limits_.max_context) + " tokens; shorten the prompt or lower "
             + "max_tokens"};
  if (blocks_for(static_cast<uint32_t>(total)) > limits_.cache_blocks)
    return generation_refused{
      400, "the prompt's " + std::to_string(prompt_tokens) + " tokens and max_tokens "
             + std::to_string(max_tokens) + " need more than the whole KV cache ("
             + std::to_string(limits_.cache_blocks) + " blocks of "
             + std::to_string(limits_.block_tokens) + " tokens); lower max_tokens"};
  if (sequences_.count(id))
    return generation_refused{400, "sequence " + std::to_string(id) + " is already running"};
  if (waiting_.size() >= limits_.max_waiting)
    return generation_refused{503, "the model's queue holds " + std::to_string(waiting_.size())
                                     + " waiting generations (max_waiting); retry later"};
  auto target = limits_.ttft_target;
  if (ttft_target.count() > 0 && (target.count() == 0 || ttft_target < target))
    target = ttft_target;
  clock_type::duration predicted{0};
  if (target.count() > 0 && cost_.known()) {
    predicted = predicted_first_token(
      prompt_tokens, std::chrono::duration_cast<clock_type::duration>(target / lateness_));
    using ms = std::chrono::duration<double, std::milli>;
    const double expected = ms(predicted).count() * lateness_;
    if (expected > ms(target).count()) {
      ++shed_;
      return generation_refused{
        503, "the first token would come in " + std::to_string(std::llround(expected))
               + " ms or more, past the time-to-first-token target of "
               + std::to_string(std::llround(ms(target).count())) + " ms (" +
               std::to_string(running_.size()) + " sequences running, " +
               std::to_string(waiting_.size()) + " waiting); retry later"};
    }
  }
  sequence s;
  s.id = id;
  s.prompt = prompt_tokens;
  s.max_tokens = max_tokens;
  s.arrived = now;
  s.order = next_order_++;
  s.predicted = predicted;
  sequences_.emplace(id, s);
  waiting_.push_back(id);
  return std::nullopt;
}

void generation_policy::release(sequence& s) {
  free_blocks_ += s.blocks;
  s.blocks = 0;
  s.computed = 0;
}

uint32_t generation_policy::preempt_youngest() {
  uint64_t id = running_.back();
  running_.pop_back();
  auto& s = sequences_.at(id);
  release(s);
  // Work already planned for it in this step is taken back.
  uint32_t tokens = 0;
  for (size_t i = 0; i < plan_.work.size();) {
    if (plan_.work[i].id != id) {
      ++i;
      continue;
    }
    tokens += plan_.work[i].tokens;
    plan_.work.erase(plan_.work.begin() + static_cast<std::ptrdiff_t>(i));
    plan_orders_.erase(plan_orders_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  // Older than every sequence that never ran: it goes first. Among preempted
  // ones, the older goes first too.
  auto at = std::find_if(waiting_.begin(), waiting_.end(), [&](uint64_t w) {
    return sequences_.at(w).order > s.order;
  });
  waiting_.insert(at, id);
  plan_.preempted.push_back(id);
  ++preemptions_;
  return tokens;
}

const step_plan& generation_policy::plan_step() {
  if (planned_)
    return plan_;
  plan_ = step_plan{};
  plan_orders_.clear();
  // Every running sequence may decode, whatever the target allows.
  const uint32_t target_tokens = step_tokens();
  uint32_t budget = std::max<uint32_t>(target_tokens, static_cast<uint32_t>(running_.size()));
  const uint32_t step_budget = budget;
  // Decodes first (one token each, oldest first), then prefill chunks: a
  // running sequence never waits behind a long prompt. A sequence that cannot
  // grow preempts the youngest running one (possibly itself).
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size(); ++i) {
      auto& s = sequences_.at(running_[i]);
      uint32_t need = s.prompt + s.generated - s.computed;
      bool decode = need == 1;
      if ((pass == 0) != decode || budget == 0)
        continue;
      uint32_t n = std::min(need, budget);
      uint32_t blocks = blocks_for(s.computed + n);
      bool preempted_self = false;
      while (blocks > s.blocks + free_blocks_) {
        preempted_self = running_.back() == s.id;
        budget += preempt_youngest();
        if (preempted_self)
          break;
      }
      if (preempted_self) {
        --i; // running_[i] was s, and it is gone
        continue;
      }
      free_blocks_ -= blocks - std::min(blocks, s.blocks);
      s.blocks = std::max(blocks, s.blocks);
      plan_.work.push_back({s.id, s.computed, n, n == need});
      plan_orders_.push_back(s.order);
      budget -= n;
    }
  }
  // Admission: the head of the queue joins while it fits without preempting.
  const size_t max_running = std::min<size_t>(limits_.max_running, target_tokens);
  while (!waiting_.empty() && running_.size() < max_running && budget > 0) {
    auto& s = sequences_.at(waiting_.front());
    uint32_t need = s.prompt + s.generated;
    uint32_t n = std::min(need, budget);
    uint32_t blocks = blocks_for(n);
    if (blocks > free_blocks_ || !plan_.preempted.empty())
      break; // after a preemption in this step, nothing new joins it
    waiting_.pop_front();
    free_blocks_ -= blocks;
    s.blocks = blocks;
    auto at = std::find_if(running_.begin(), running_.end(), [&](uint64_t r) {
      return sequences_.at(r).order > s.order;
    });
    running_.insert(at, s.id);
    plan_.work.push_back({s.id, 0, n, n == need});
    plan_orders_.push_back(s.order);
    budget -= n;
  }
  // In admission order, the orders beside their items.
  std::vector<size_t> by_order(plan_.work.size());
  for (size_t i = 0; i < by_order.size(); ++i)
    by_order[i] = i;
  std::sort(by_order.begin(), by_order.end(),
            [&](size_t a, size_t b) { return plan_orders_[a] < plan_orders_[b]; });
  std::vector<step_work> work;
  std::vector<uint64_t> orders;
  for (auto i : by_order) {
    work.push_back(plan_.work[i]);
    orders.push_back(plan_orders_[i]);
  }
  plan_.work = std::move(work);
  plan_orders_ = std::move(orders);
  plan_.tokens = step_budget - budget;
  // An empty plan does not stand: a request admitted after it runs at the
  // next call (the actor asks again when one arrives).
  planned_ = !plan_.work.empty() || !plan_.preempted.empty();
  return plan_;
}

std::vector<uint64_t> generation_policy::step_done() {
  std::vector<uint64_t> finished;
  if (!planned_)
    return finished;
  for (size_t i = 0; i < plan_.work.size(); ++i) {
    const auto& w = plan_.work[i];
    auto it = sequences_.find(w.id);
    if (it == sequences_.end() || it->second.order != plan_orders_[i])
      continue; // finished or cancelled while the step ran (and maybe queued anew)
    auto& s = it->second;
    s.computed = w.first_position + w.tokens;
    if (w.emits_token && ++s.generated == s.max_tokens) {
      finished.push_back(s.id);
      finish(s.id);
    }
  }
  planned_ = false;
  plan_ = step_plan{};
  return finished;
}

void generation_policy::finish(uint64_t id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end())
    return;
  release(it->second);
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  sequences_.erase(it);
}

void generation_policy::observe_first_token(uint64_t id, clock_type::duration waited) {
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second.predicted <= std::chrono::milliseconds(1))
    return;
  const double ratio = std::chrono::duration<double>(waited).count()
                       / std::chrono::duration<double>(it->second.predicted).count();
  it->second.predicted = clock_type::duration{0};
  // A running quantile: up by 0.9 of a step when a wait was later than the
  // factor, down by 0.1 when not, so that it settles where one in ten is.
  constexpr double rate = 0.02;
  lateness_ += ratio > lateness_ ? rate * 0.9 : -rate * 0.1;
  lateness_ = std::clamp(lateness_, 0.5, 4.0);
}

uint32_t generation_policy::generated(uint64_t id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : it->second.generated;
}

clock_type::duration generation_policy::oldest_waiting(time_point now) const {
  clock_type::duration oldest{0};
  for (auto id : waiting_)
    oldest = std::max(oldest, now - sequences_.at(id).arrived);
  return oldest;
}

} // namespace caf_serving::scheduler
