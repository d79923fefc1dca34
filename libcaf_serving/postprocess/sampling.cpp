#include "postprocess/sampling.hpp"

#include "postprocess/logit_scan.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

namespace caf_serving::postprocess {

namespace {

constexpr float infinity = std::numeric_limits<float>::infinity();
constexpr uint64_t golden_gamma = 0x9E3779B97F4A7C15ull;

/// splitmix64's output function: a bijective mix of 64 bits.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The uniform draw in [0, 1) of step `n` of the stream `seed`: splitmix64's
/// n-th output, a pure function of (seed, n).
double uniform_at(uint64_t seed, uint64_t n) {
  return static_cast<double>(mix64(seed + (n + 1) * golden_gamma) >> 11) * 0x1.0p-53;
}

/// A seed for a sampler whose request brought none: distinct per call, and
/// unpredictable across processes.
uint64_t fresh_seed() {
  static std::atomic<uint64_t> source{[] {
    std::random_device device;
    auto now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return (static_cast<uint64_t>(device()) << 32) ^ device() ^ mix64(now);
  }()};
  return mix64(source.fetch_add(golden_gamma, std::memory_order_relaxed));
}

using logit_scan::block_size;
using logit_scan::exp_floor;
using logit_scan::first_at_least;
using logit_scan::max_of;
using logit_scan::weight_of;

/// Whether `a` ranks before `b` in the order of the filters: heavier first,
/// the lower id first among equals.
template <class Candidate>
bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.token < b.token);
}

/// The position of the middle one of c[x], c[y], c[z] in that order.
template <class Candidate>
std::size_t median_of_three(const Candidate* c, std::size_t x, std::size_t y, std::size_t z) {
  if (ranks_before(c[x], c[y])) {
    if (ranks_before(c[y], c[z]))
      return y;
    return ranks_before(c[x], c[z]) ? z : x;
  }
  if (ranks_before(c[x], c[z]))
    return x;
  return ranks_before(c[y], c[z]) ? z : y;
}

std::string describe(float v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

} // namespace

std::optional<std::string> check(const sampling_params& p) {
  // Each test is written so that NaN fails it.
  if (!(p.temperature >= 0.0f && p.temperature < infinity))
    return "temperature is " + describe(p.temperature)
           + " but must be a finite number >= 0 (0 is greedy decoding)";
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return "top_p is " + describe(p.top_p)
           + " but must lie in (0, 1] (1 keeps every token)";
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    return "min_p is " + describe(p.min_p) + " but must lie in [0, 1] (0 keeps every token)";
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty < infinity))
    return "repetition_penalty is " + describe(p.repetition_penalty)
           + " but must be a finite number > 0 (1 is no penalty)";
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return "presence_penalty is " + describe(p.presence_penalty)
           + " but must lie in [-2, 2] (0 is no penalty)";
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return "frequency_penalty is " + describe(p.frequency_penalty)
           + " but must lie in [-2, 2] (0 is no penalty)";
  if (p.top_logprobs > max_top_logprobs)
    return "top_logprobs is " + std::to_string(p.top_logprobs) + " but must lie in [0, "
           + std::to_string(max_top_logprobs) + "]";
  return std::nullopt;
}

sequence_sampler::sequence_sampler(const sampling_params& params, const_span<int32_t> prompt)
  : params_(params),
    seed_(params.seed ? *params.seed : fresh_seed()),
    penalties_(params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f
               || params.frequency_penalty != 0.0f) {
  assert(!check(params) && "sequence_sampler: the params must pass check() first");
  if (!penalties_)
    return;
  seen_.resize(16);
  for (auto token : prompt)
    if (token >= 0)
      slot_of(token).in_prompt = true;
}

sequence_sampler::seen_token& sequence_sampler::slot_of(int32_t token) {
  auto find = [this](int32_t t) -> seen_token& {
    const std::size_t mask = seen_.size() - 1;
    std::size_t i = (static_cast<uint32_t>(t) * 0x9E3779B1u) & mask;
    while (seen_[i].token >= 0 && seen_[i].token != t)
      i = (i + 1) & mask;
    return seen_[i];
  };
  seen_token* slot = &find(token);
  if (slot->token == token)
    return *slot;
  if ((seen_count_ + 1) * 2 > seen_.size()) {
    std::vector<seen_token> old(seen_.size() * 2);
    old.swap(seen_);
    for (const auto& s : old)
      if (s.token >= 0)
        find(s.token) = s;
    slot = &find(token);
  }
  slot->token = token;
  ++seen_count_;
  return *slot;
}

void sequence_sampler::suppress(std::vector<int32_t> tokens, uint64_t until) {
  suppressed_ = std::move(tokens);
  suppressed_until_ = until;
}

const float* sequence_sampler::penalized(const_span<float> logits) {
  const bool suppressing = step_ < suppressed_until_ && !suppressed_.empty();
  if (!penalties_ && !suppressing)
    return logits.data();
  work_.assign(logits.begin(), logits.end());
  const auto vocab = static_cast<int64_t>(logits.size());
  if (suppressing)
    for (auto token : suppressed_)
      if (token >= 0 && token < vocab)
        work_[static_cast<std::size_t>(token)] = -infinity;
  if (!penalties_)
    return work_.data();
  const float repetition = params_.repetition_penalty;
  for (const auto& s : seen_) {
    if (s.token < 0 || s.token >= vocab)
      continue;
    float& v = work_[static_cast<std::size_t>(s.token)];
    // Hugging Face: every token seen in the prompt or the output, once.
    if (repetition != 1.0f)
      v = v > 0.0f ? v / repetition : v * repetition;
    // OpenAI (and vLLM): the generated tokens only.
    if (s.generated > 0) {
      v -= params_.frequency_penalty * static_cast<float>(s.generated);
      v -= params_.presence_penalty;
    }
  }
  return work_.data();
}

int32_t sequence_sampler::draw(const float* logits, std::size_t vocab) {
  const double u = uniform_at(seed_, step_);
  reserve_for(vocab);
  const float top = max_of(logits, vocab);
  if (!(top > -infinity))
    return -1; // nothing but NaN and -inf
  if (params_.temperature == 0.0f)
    return static_cast<int32_t>(first_at_least(logits, vocab, top)); // the lowest id among equals
  candidate* c = candidates_.data();
  if (top == infinity) {
    // +inf logits share all the probability (softmax's limit), equally.
    std::size_t n = 0;
    for (std::size_t i = 0; i < vocab; ++i)
      if (logits[i] == infinity)
        c[n++] = {1.0f, static_cast<int32_t>(i)};
    return draw_from_candidates(n, static_cast<double>(n), u);
  }
  const float inv_t = 1.0f / params_.temperature;

  // Top-k: every token at least as likely as the k-th (Hugging Face keeps
  // equals); what it keeps is few, and the rest works on those alone.
  const uint32_t k = params_.top_k;
  if (k > 0 && k < vocab) {
    const float kth = kth_largest(logits, vocab, k);
    const float at_least = kth > -infinity ? kth : std::numeric_limits<float>::lowest();
    std::size_t n = 0;
    logit_scan::for_each_at_least(logits, vocab, at_least, [&](std::size_t i) {
      c[n++] = {logits[i], static_cast<int32_t>(i)};
    });
    double total = 0.0;
    for (std::size_t i = 0; i < n; ++i)
      total += c[i].value = weight_of((c[i].value - top) * inv_t);
    return draw_from_candidates(n, total, u);
  }

  // The whole vocabulary: weights (softmax without its normalizer; the
  // likeliest weighs 1) in one vectorized pass, with sums per block.
  float* w = weights_.data();
  const std::size_t blocks = (vocab + block_size - 1) / block_size;
  // Without top-p, min-p only zeroes the weights under its bound.
  const float floor = params_.top_p < 1.0f ? 0.0f : params_.min_p;
  const double total = logit_scan::weigh({logits, vocab, top, inv_t, floor, w, block_sums_.data()});
  if (params_.top_p < 1.0f) {
    // Only tokens of weight `bound` or more can be in the nucleus when those
    // weigh top_p or more together: whatever lies under them has that much
    // before it. Try a tight bound first; the second always holds, for the
    // tokens under it weigh less than vocab * bound = (1 - top_p) / 2 of all.
    const double target = static_cast<double>(params_.top_p) * total;
    float bound = 1.0f / 1024.0f;
    if (logit_scan::mass_at_least(w, vocab, bound) < target)
      bound = static_cast<float>((1.0 - params_.top_p) * total / (2.0 * static_cast<double>(vocab)));
    bound = std::max(bound, params_.min_p); // min-p keeps a prefix too
    bound = std::max(bound, std::numeric_limits<float>::denorm_min()); // no weight 0
    std::size_t n = 0;
    logit_scan::for_each_at_least(w, vocab, bound, [&](std::size_t i) {
      c[n++] = {w[i], static_cast<int32_t>(i)};
    });
    return draw_from_candidates(n, total, u);
  }
  // Every token by its weight: the block, then the token within it.
  const double point = u * total;
  double before = 0.0;
  for (std::size_t b = 0; b < blocks; ++b) {
    if (before + block_sums_[b] <= point && b + 1 < blocks) {
      before += block_sums_[b];
      continue;
    }
    const std::size_t from = b * block_size;
    const std::size_t to = std::min(vocab, from + block_size);
    double sum = before;
    for (std::size_t i = from; i < to; ++i) {
      sum += w[i];
      if (sum > point)
        return static_cast<int32_t>(i);
    }
    // Rounding left the point past this block's sum: the last token with a weight.
    for (std::size_t i = to; i-- > 0;)
      if (w[i] > 0.0f)
        return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(first_at_least(logits, vocab, top));
}

void sequence_sampler::reserve_for(std::size_t vocab) {
  // Sized for the largest vocabulary seen, never shrunk: one allocation each.
  if (candidates_.size() >= vocab)
    return;
  candidates_.resize(vocab);
  weights_.resize(vocab);
  block_sums_.resize((vocab + block_size - 1) / block_size);
  kth_buffer_.reserve(params_.top_k > 4096 ? vocab : params_.top_k);
}

int32_t sequence_sampler::draw_from_candidates(std::size_t n, double total, double u) {
  candidate* c = candidates_.data();
  // Min-p: the likeliest token weighs 1, so its bound is min_p itself. Min-p
  // comes after top-p, but both keep a prefix of the same order, so filtering
  // first changes nothing as long as top-p's target uses the mass before it.
  if (params_.min_p > 0.0f) {
    const float bound = params_.min_p;
    n = static_cast<std::size_t>(
      std::partition(c, c + n, [bound](const candidate& x) { return x.value >= bound; }) - c);
  }

  // Top-p: a token is kept while the mass ranked before it is below top_p. A
  // weighted quickselect finds the edge in expected linear time, unsorted.
  std::size_t kept = n;
  if (params_.top_p < 1.0f) {
    const double target = static_cast<double>(params_.top_p) * total;
    double before = 0.0;
    std::size_t lo = 0;
    std::size_t hi = n;
    while (lo < hi) {
      // The median of three positions: deterministic, so the same logits give
      // the same order and the same token.
      const std::size_t at = median_of_three(c, lo, lo + (hi - lo) / 2, hi - 1);
      const candidate pivot = c[at];
      std::swap(c[at], c[hi - 1]);
      auto* mid = std::partition(c + lo, c + hi - 1,
                                 [&pivot](const candidate& x) { return ranks_before(x, pivot); });
      std::swap(*mid, c[hi - 1]);
      const auto m = static_cast<std::size_t>(mid - c);
      double heavier = 0.0;
      for (std::size_t i = lo; i < m; ++i)
        heavier += c[i].value;
      if (before + heavier >= target) {
        hi = m; // the pivot and everything after it are past the edge
      } else {
        before += heavier + pivot.value;
        lo = m + 1;
        if (before >= target)
          break;
      }
    }
    kept = lo;
  }

  double mass = 0.0;
  for (std::size_t i = 0; i < kept; ++i)
    mass += c[i].value;
  const double point = u * mass;
  double sum = 0.0;
  for (std::size_t i = 0; i < kept; ++i) {
    sum += c[i].value;
    if (sum > point)
      return c[i].token;
  }
  // Rounding left the point at the very end: the last token with a weight.
  for (std::size_t i = kept; i-- > 0;)
    if (c[i].value > 0.0f)
      return c[i].token;
  return c[0].token;
}

float sequence_sampler::kth_largest(const float* logits, std::size_t vocab, uint32_t k) {
  // A min-heap of the k largest seen: after the first k, most values only meet
  // its top. Large k: a selection over a copy instead.
  auto& heap = kth_buffer_;
  heap.clear();
  if (k > 4096) {
    for (std::size_t i = 0; i < vocab; ++i)
      if (!std::isnan(logits[i]))
        heap.push_back(logits[i]);
    if (heap.size() <= k)
      return -infinity;
    std::nth_element(heap.begin(), heap.begin() + (k - 1), heap.end(), std::greater<float>());
    return heap[k - 1];
  }
  std::size_t i = 0;
  for (; i < vocab && heap.size() < k; ++i)
    if (!std::isnan(logits[i])) {
      heap.push_back(logits[i]);
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    }
  if (heap.size() < k)
    return -infinity;
  // Most values are under the heap's smallest: a vectorized scan skips them.
  for (i += logit_scan::first_above(logits + i, vocab - i, heap.front()); i < vocab;
       i += logit_scan::first_above(logits + i, vocab - i, heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
    heap.back() = logits[i++];
    std::push_heap(heap.begin(), heap.end(), std::greater<float>());
  }
  return heap.front();
}

sampled sequence_sampler::with_logprobs(const_span<float> logits, int32_t token) const {
  sampled out;
  out.token = token;
  const std::size_t vocab = logits.size();
  const float top = max_of(logits.data(), vocab);
  // log-softmax: x - (top + log(sum e^(x - top))); with +inf logits, those share
  // the probability and every other token has none.
  double log_total = 0.0;
  std::size_t infinite = 0;
  if (top == infinity) {
    for (float x : logits)
      infinite += x == infinity ? 1 : 0;
    log_total = std::log(static_cast<double>(infinite));
  } else {
    const double total = logit_scan::exp_sum(logits.data(), vocab, top);
    log_total = std::log(total);
  }
  auto logprob_of = [&](float x) -> float {
    if (infinite > 0)
      return x == infinity ? static_cast<float>(-log_total) : -infinity;
    if (std::isnan(x))
      return -infinity;
    return static_cast<float>(static_cast<double>(x - top) - log_total);
  };
  out.logprob = logprob_of(logits[static_cast<std::size_t>(token)]);

  // The likeliest `top_logprobs`, by insertion into a short sorted list: ids
  // come in ascending order, so a later equal ranks after and needs a strict >.
  const uint32_t want = static_cast<uint32_t>(std::min<std::size_t>(params_.top_logprobs, vocab));
  uint32_t count = 0;
  for (std::size_t i = 0; i < vocab && want > 0; ++i) {
    const float x = logits[i];
    if (std::isnan(x) || (count == want && !(x > out.top[count - 1].logprob)))
      continue;
    uint32_t at = count < want ? count++ : want - 1;
    while (at > 0 && x > out.top[at - 1].logprob) {
      out.top[at] = out.top[at - 1];
      --at;
    }
    out.top[at] = {static_cast<int32_t>(i), x}; // the raw logit until the end
  }
  for (uint32_t i = 0; i < count; ++i)
    out.top[i].logprob = logprob_of(out.top[i].logprob);
  out.top_count = count;
  return out;
}

result<sampled> sequence_sampler::next(const_span<float> logits) {
  const int32_t token = draw(penalized(logits), logits.size());
  if (token < 0) {
    return serving_error{status_code::internal,
                         "the model's logits for this sequence (" + std::to_string(logits.size())
                           + " of them) hold no number above -inf (all NaN or -inf): the model "
                             "misbehaved; check its weights and inputs (step "
                           + std::to_string(step_) + ")"};
  }
  if (penalties_)
    ++slot_of(token).generated;
  ++step_;
  if (!params_.logprobs && params_.top_logprobs == 0) {
    sampled out;
    out.token = token;
    return out;
  }
  return with_logprobs(logits, token);
}

} // namespace caf_serving::postprocess
