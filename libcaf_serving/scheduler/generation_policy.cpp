#include "scheduler/generation_policy.hpp"

#include <algorithm>
#include <chrono>
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

clock_type::duration generation_policy::predicted_first_token(uint32_t prompt_tokens) const {
  if (!cost_.known())
    return clock_type::duration{0};
  // Prefill ahead of it: waiting prompts (and what preempted ones regenerate)
  // and running prompts not computed yet; decoding sequences take a token of
  // every step.
  uint64_t prefill = prompt_tokens;
  for (auto id : waiting_) {
    const auto& s = sequences_.at(id);
    prefill += s.prompt + s.generated;
  }
  uint32_t decoding = 0;
  for (auto id : running_) {
    const auto& s = sequences_.at(id);
    uint32_t need = s.prompt + s.generated - s.computed;
    if (need <= 1)
      ++decoding;
    else
      prefill += need;
  }
  const uint32_t budget = std::max<uint32_t>(step_tokens(), decoding + 1);
  const uint64_t per_step = budget - decoding;
  const uint64_t steps = (prefill + per_step - 1) / per_step;
  const auto step = cost_.predict(static_cast<uint32_t>(
    std::min<uint64_t>(budget, decoding + prefill)));
  return step * static_cast<int64_t>(steps);
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
  if (target.count() > 0) {
    auto predicted = predicted_first_token(prompt_tokens);
    if (predicted > target) {
      ++shed_;
      auto ms = [](clock_type::duration d) {
        return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
      };
      return generation_refused{
        503, "the first token would come in about " + ms(predicted) + " ms, past the "
               + "time-to-first-token target of " + ms(target) + " ms (" +
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
