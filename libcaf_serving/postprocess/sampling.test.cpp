#include "postprocess/sampling.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <random>
#include <set>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::postprocess;

// Every allocation of this test program is counted, so that a test can check
// that sampling a token allocates nothing.
namespace {
std::atomic<uint64_t> allocations{0};
} // namespace

void* operator new(std::size_t size) {
  ++allocations;
  if (void* p = std::malloc(size ? size : 1))
    return p;
  throw std::bad_alloc{};
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();

// ---- The reference: written out directly, in double, with full sorts --------

/// Hugging Face's repetition penalty, then OpenAI's frequency and presence
/// penalties, token by token.
std::vector<float> reference_penalized(const std::vector<float>& logits,
                                       const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& generated,
                                       const sampling_params& p) {
  std::vector<float> out = logits;
  for (std::size_t t = 0; t < out.size(); ++t) {
    const auto id = static_cast<int32_t>(t);
    const bool in_prompt = std::count(prompt.begin(), prompt.end(), id) > 0;
    const auto count = std::count(generated.begin(), generated.end(), id);
    if (in_prompt || count > 0)
      out[t] = out[t] < 0 ? out[t] * p.repetition_penalty : out[t] / p.repetition_penalty;
    out[t] -= p.frequency_penalty * static_cast<float>(count);
    if (count > 0)
      out[t] -= p.presence_penalty;
  }
  return out;
}

/// The probability of each token after temperature, top-k, top-p and min-p
/// (Hugging Face's warpers, in their order), from a full sort. `margin`
/// receives how close a top-p or min-p decision came to its edge, so that a
/// test can avoid cases that rounding could decide either way.
struct reference_distribution {
  std::vector<double> probability;
  double margin = 1.0;
};

reference_distribution reference_probabilities(const std::vector<float>& logits,
                                               const sampling_params& p) {
  const std::size_t v = logits.size();
  std::vector<std::size_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<bool> keep(v, true);
  if (p.top_k > 0 && p.top_k < v) {
    const float kth = logits[order[p.top_k - 1]];
    for (std::size_t t = 0; t < v; ++t)
      keep[t] = logits[t] >= kth;
  }
  reference_distribution out;
  auto softmax = [&] {
    double top = -1e300;
    for (std::size_t t = 0; t < v; ++t)
      if (keep[t])
        top = std::max(top, static_cast<double>(logits[t]) / p.temperature);
    std::vector<double> prob(v, 0.0);
    double sum = 0;
    for (std::size_t t = 0; t < v; ++t)
      if (keep[t])
        sum += prob[t] = std::exp(static_cast<double>(logits[t]) / p.temperature - top);
    for (auto& x : prob)
      x /= sum;
    return prob;
  };
  if (p.top_p < 1.0f) {
    const auto prob = softmax();
    double before = 0;
    for (std::size_t t : order) {
      if (!keep[t])
        continue;
      out.margin = std::min(out.margin, std::abs(before - p.top_p));
      if (!(before < p.top_p))
        keep[t] = false;
      before += prob[t];
    }
  }
  if (p.min_p > 0.0f) {
    const auto prob = softmax();
    const double top = *std::max_element(prob.begin(), prob.end());
    for (std::size_t t = 0; t < v; ++t) {
      if (!keep[t])
        continue;
      out.margin = std::min(out.margin, std::abs(prob[t] / top - p.min_p));
      if (prob[t] < p.min_p * top)
        keep[t] = false;
    }
  }
  out.probability = softmax();
  return out;
}

std::vector<double> reference_log_softmax(const std::vector<float>& logits) {
  double top = -1e300;
  for (float x : logits)
    top = std::max(top, static_cast<double>(x));
  double sum = 0;
  for (float x : logits)
    sum += std::exp(x - top);
  std::vector<double> out;
  for (float x : logits)
    out.push_back(x - top - std::log(sum));
  return out;
}

// ---- Helpers ---------------------------------------------------------------

std::vector<float> random_logits(std::mt19937_64& rng, std::size_t v, float spread) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> out(v);
  for (auto& x : out)
    x = normal(rng);
  return out;
}

sampling_params seeded(uint64_t seed) {
  sampling_params p;
  p.seed = seed;
  return p;
}

int32_t take(sequence_sampler& s, const std::vector<float>& logits) {
  auto r = s.next(logits);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  return r->token;
}

/// Logits under which only `token` can be chosen, whatever the penalties.
std::vector<float> forcing(std::size_t v, int32_t token) {
  std::vector<float> out(v, -inf);
  out[static_cast<std::size_t>(token)] = 0.0f;
  return out;
}

/// Pearson's chi-square of `counts` against `probability` over `draws`, bins
/// with fewer than 5 expected merged into one; and its degrees of freedom.
std::pair<double, int> chi_square(const std::vector<uint64_t>& counts,
                                  const std::vector<double>& probability, uint64_t draws) {
  double chi = 0, rest_expected = 0, rest_seen = 0;
  int bins = 0;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const double expected = probability[t] * static_cast<double>(draws);
    if (expected < 5) {
      rest_expected += expected;
      rest_seen += static_cast<double>(counts[t]);
      continue;
    }
    chi += (counts[t] - expected) * (counts[t] - expected) / expected;
    ++bins;
  }
  if (rest_expected > 0) {
    chi += (rest_seen - rest_expected) * (rest_seen - rest_expected) / rest_expected;
    ++bins;
  }
  return {chi, bins - 1};
}

} // namespace

// ---- check -----------------------------------------------------------------

TEST_CASE("check: the defaults pass and each field out of range is named with its range") {
  CHECK_FALSE(check(sampling_params{}));
  struct bad_case {
    sampling_params params;
    const char* names;
  };
  std::vector<bad_case> cases;
  auto with = [&](auto edit, const char* names) {
    sampling_params p;
    edit(p);
    cases.push_back({p, names});
  };
  with([](auto& p) { p.temperature = -0.5f; }, "temperature is -0.5");
  with([](auto& p) { p.temperature = nan_value; }, "temperature is nan");
  with([](auto& p) { p.temperature = inf; }, "temperature is inf");
  with([](auto& p) { p.top_p = 0.0f; }, "top_p is 0 but must lie in (0, 1]");
  with([](auto& p) { p.top_p = 1.5f; }, "top_p is 1.5");
  with([](auto& p) { p.min_p = -0.1f; }, "min_p is -0.1 but must lie in [0, 1]");
  with([](auto& p) { p.min_p = 1.1f; }, "min_p is 1.1");
  with([](auto& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty is 0");
  with([](auto& p) { p.presence_penalty = 2.5f; }, "presence_penalty is 2.5 but must lie in [-2, 2]");
  with([](auto& p) { p.frequency_penalty = -3.0f; }, "frequency_penalty is -3");
  with([](auto& p) { p.top_logprobs = 21; }, "top_logprobs is 21 but must lie in [0, 20]");
  for (const auto& c : cases) {
    auto why = check(c.params);
    REQUIRE(why);
    CHECK_MESSAGE(why->find(c.names) != std::string::npos, *why);
  }
  sampling_params edges;
  edges.temperature = 0.0f;
  edges.top_p = 1.0f;
  edges.min_p = 1.0f;
  edges.presence_penalty = -2.0f;
  edges.frequency_penalty = 2.0f;
  edges.top_logprobs = 20;
  CHECK_FALSE(check(edges));
}

// ---- Greedy ----------------------------------------------------------------

TEST_CASE("greedy: temperature 0 takes the argmax, the lowest id among equals, never a NaN") {
  std::mt19937_64 rng(11);
  auto p = seeded(1);
  p.temperature = 0.0f;
  for (int round = 0; round < 200; ++round) {
    auto logits = random_logits(rng, 97, 2.0f);
    // Ties at the top in some rounds: copies of the maximum at higher ids.
    if (round % 3 == 0) {
      const auto at = std::max_element(logits.begin(), logits.end()) - logits.begin();
      for (std::size_t t = static_cast<std::size_t>(at) + 1; t < logits.size(); t += 7)
        logits[t] = logits[static_cast<std::size_t>(at)];
    }
    const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
    // NaNs anywhere must not be taken (argmax over the numbers).
    if (round % 5 == 0)
      logits[static_cast<std::size_t>((expected + 3) % 97)] = nan_value;
    const auto reference = std::max_element(logits.begin(), logits.end(), [](float a, float b) {
      return std::isnan(a) || (!std::isnan(b) && a < b);
    }) - logits.begin();
    sequence_sampler s(p, {});
    CHECK(take(s, logits) == reference);
  }
  std::vector<float> ties{1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  sequence_sampler s(p, {});
  CHECK(take(s, ties) == 1);
}

TEST_CASE("top_k 1 samples the argmax whatever the seed and temperature") {
  std::mt19937_64 rng(12);
  for (int round = 0; round < 200; ++round) {
    auto logits = random_logits(rng, 500, 1.0f);
    const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
    auto p = seeded(static_cast<uint64_t>(round));
    p.top_k = 1;
    p.temperature = 0.5f + static_cast<float>(round % 4);
    sequence_sampler s(p, {});
    for (int step = 0; step < 5; ++step)
      CHECK(take(s, logits) == expected);
  }
}

// ---- The filters and the draw against the reference ------------------------

TEST_CASE("filters and draw: the support is the reference's mask and the frequencies "
          "match its probabilities (chi-square)") {
  struct filter_case {
    const char* name;
    float temperature;
    uint32_t top_k;
    float top_p;
    float min_p;
  };
  const filter_case cases[] = {
    {"plain", 1.0f, 0, 1.0f, 0.0f},
    {"temperature 0.6", 0.6f, 0, 1.0f, 0.0f},
    {"temperature 1.7", 1.7f, 0, 1.0f, 0.0f},
    {"top_k 5", 1.0f, 5, 1.0f, 0.0f},
    {"top_p 0.7", 1.0f, 0, 0.7f, 0.0f},
    {"top_p 0.9, temperature 0.8", 0.8f, 0, 0.9f, 0.0f},
    {"min_p 0.1", 1.0f, 0, 1.0f, 0.1f},
    {"top_k 12, top_p 0.8", 1.2f, 12, 0.8f, 0.0f},
    {"top_k 20, top_p 0.95, min_p 0.05, temperature 0.7", 0.7f, 20, 0.95f, 0.05f},
    {"top_p 0.5, min_p 0.3", 1.0f, 0, 0.5f, 0.3f},
  };
  constexpr std::size_t vocab = 40;
  constexpr uint64_t draws = 60000;
  std::mt19937_64 rng(13);
  for (const auto& fc : cases) {
    CAPTURE(fc.name);
    auto p = seeded(1000 + static_cast<uint64_t>(&fc - cases));
    p.temperature = fc.temperature;
    p.top_k = fc.top_k;
    p.top_p = fc.top_p;
    p.min_p = fc.min_p;
    // Logits whose filters decide nothing within rounding of an edge.
    std::vector<float> logits;
    reference_distribution ref;
    do {
      logits = random_logits(rng, vocab, 1.5f);
      ref = reference_probabilities(logits, p);
    } while (ref.margin < 1e-3);
    sequence_sampler s(p, {});
    std::vector<uint64_t> counts(vocab, 0);
    for (uint64_t i = 0; i < draws; ++i)
      ++counts[static_cast<std::size_t>(take(s, logits))];
    for (std::size_t t = 0; t < vocab; ++t) {
      CAPTURE(t);
      CAPTURE(ref.probability[t]);
      if (ref.probability[t] == 0.0)
        CHECK(counts[t] == 0); // outside the mask: never
      if (ref.probability[t] > 1e-3)
        CHECK(counts[t] > 0); // missed with odds under 1e-26
    }
    auto [chi, df] = chi_square(counts, ref.probability, draws);
    CAPTURE(df);
    // df + 6 standard deviations: a correct sampler passes it with odds of about
    // 1 - 1e-7 for these degrees of freedom (the seeds are fixed in any case).
    CHECK(chi < df + 6.0 * std::sqrt(2.0 * df));
    CHECK(df >= 0);
  }
}

TEST_CASE("top-k keeps every token equal to the k-th (Hugging Face), top-p keeps the one "
          "that crosses it") {
  // Ids 1, 2 and 3 tie for second place: top_k 2 keeps all four.
  std::vector<float> logits{0.0f, -1.0f, -1.0f, -1.0f, -5.0f, -6.0f};
  auto p = seeded(5);
  p.top_k = 2;
  sequence_sampler s(p, {});
  std::set<int32_t> seen;
  for (int i = 0; i < 4000; ++i)
    seen.insert(take(s, logits));
  CHECK(seen == std::set<int32_t>{0, 1, 2, 3});

  // Probabilities 0.5, 0.3, 0.2: top_p 0.6 keeps the first two (0.5 is below 0.6).
  std::vector<float> three{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  auto q = seeded(6);
  q.top_p = 0.6f;
  sequence_sampler t(q, {});
  seen.clear();
  for (int i = 0; i < 4000; ++i)
    seen.insert(take(t, three));
  CHECK(seen == std::set<int32_t>{0, 1});
}

TEST_CASE("a large vocabulary: every token drawn lies in the reference's top-p and top-k mask") {
  std::mt19937_64 rng(14);
  const std::size_t vocab = 151936;
  auto logits = random_logits(rng, vocab, 3.0f);
  for (auto [k, top_p] : {std::pair<uint32_t, float>{0, 0.9f}, {50, 1.0f}, {200, 0.6f}}) {
    auto p = seeded(k + 1);
    p.temperature = 0.8f;
    p.top_k = k;
    p.top_p = top_p;
    const auto ref = reference_probabilities(logits, p);
    sequence_sampler s(p, {});
    for (int i = 0; i < 300; ++i) {
      const auto token = take(s, logits);
      CHECK(ref.probability[static_cast<std::size_t>(token)] > 0.0);
    }
  }
}

// ---- Penalties ---------------------------------------------------------------

TEST_CASE("penalties: greedy after a known history takes the argmax of the direct formula") {
  std::mt19937_64 rng(15);
  constexpr std::size_t vocab = 24;
  std::uniform_int_distribution<int32_t> any_token(0, vocab - 1);
  const float repetitions[] = {1.0f, 1.3f, 0.7f, 2.0f};
  const float presences[] = {0.0f, 0.8f, -0.5f, 2.0f};
  const float frequencies[] = {0.0f, 0.4f, -0.3f, 1.5f};
  int differed = 0;
  for (int round = 0; round < 600; ++round) {
    sampling_params p = seeded(static_cast<uint64_t>(round));
    p.temperature = 0.0f;
    p.repetition_penalty = repetitions[round % 4];
    p.presence_penalty = presences[(round / 4) % 4];
    p.frequency_penalty = frequencies[(round / 16) % 4];
    std::vector<int32_t> prompt(static_cast<std::size_t>(round % 7));
    for (auto& t : prompt)
      t = any_token(rng);
    prompt.push_back(static_cast<int32_t>(vocab + 5)); // outside the vocabulary: ignored
    sequence_sampler s(p, prompt);
    std::vector<int32_t> generated(static_cast<std::size_t>(round % 9));
    for (auto& t : generated) {
      t = any_token(rng);
      CHECK(take(s, forcing(vocab, t)) == t);
    }
    auto logits = random_logits(rng, vocab, 1.0f);
    const auto penalized = reference_penalized(logits, prompt, generated, p);
    const auto expected = std::max_element(penalized.begin(), penalized.end()) - penalized.begin();
    differed += expected != std::max_element(logits.begin(), logits.end()) - logits.begin();
    CAPTURE(round);
    CHECK(take(s, logits) == expected);
  }
  // The penalties moved the argmax often enough for the check to mean something.
  CHECK(differed > 100);
}

TEST_CASE("penalties: the sampled distribution is the reference's over the penalized logits") {
  std::mt19937_64 rng(16);
  constexpr std::size_t vocab = 16;
  sampling_params p;
  p.repetition_penalty = 1.4f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.3f;
  p.temperature = 0.9f;
  const std::vector<int32_t> prompt{1, 2, 3, 3};
  const std::vector<int32_t> generated{3, 4, 4, 4, 9};
  const auto logits = random_logits(rng, vocab, 1.0f);
  const auto ref =
    reference_probabilities(reference_penalized(logits, prompt, generated, p), p).probability;
  // One draw per sampler, each after the same history; seeds differ.
  constexpr uint64_t draws = 30000;
  std::vector<uint64_t> counts(vocab, 0);
  for (uint64_t i = 0; i < draws; ++i) {
    p.seed = 77 + i * 1000003;
    sequence_sampler s(p, prompt);
    for (auto t : generated)
      take(s, forcing(vocab, t));
    ++counts[static_cast<std::size_t>(take(s, logits))];
  }
  auto [chi, df] = chi_square(counts, ref, draws);
  CAPTURE(df);
  CHECK(chi < df + 6.0 * std::sqrt(2.0 * df));
}

// ---- Seeds and independence from the batch -----------------------------------

TEST_CASE("the same seed gives the same tokens; samplers interleaved in any order give each "
          "the tokens it gives alone") {
  std::mt19937_64 rng(17);
  constexpr std::size_t vocab = 300;
  constexpr int steps = 60;
  // Each sequence's logits at each step are fixed up front (as the model would
  // give them for the same history).
  std::vector<std::vector<std::vector<float>>> logits(3);
  for (auto& per_step : logits)
    for (int i = 0; i < steps; ++i)
      per_step.push_back(random_logits(rng, vocab, 2.0f));
  std::vector<sampling_params> params(3);
  params[0] = seeded(42);
  params[0].top_p = 0.9f;
  params[1] = seeded(43);
  params[1].temperature = 0.7f;
  params[1].repetition_penalty = 1.2f;
  params[1].frequency_penalty = 0.5f;
  params[2] = seeded(42); // sequence 0's seed, other logits
  params[2].top_k = 40;
  const std::vector<int32_t> prompt{5, 6, 7};

  auto alone = [&](std::size_t which) {
    sequence_sampler s(params[which], prompt);
    std::vector<int32_t> out;
    for (int i = 0; i < steps; ++i)
      out.push_back(take(s, logits[which][static_cast<std::size_t>(i)]));
    return out;
  };
  const std::vector<std::vector<int32_t>> expected{alone(0), alone(1), alone(2)};
  CHECK(alone(0) == expected[0]);
  CHECK(expected[0] != expected[1]);

  for (int order_seed = 0; order_seed < 20; ++order_seed) {
    std::mt19937 order_rng(static_cast<unsigned>(order_seed));
    std::vector<sequence_sampler> samplers;
    for (std::size_t i = 0; i < 3; ++i)
      samplers.emplace_back(params[i], prompt);
    std::vector<std::vector<int32_t>> got(3);
    // Steps of a random subset of the sequences, in a random order.
    while (got[0].size() + got[1].size() + got[2].size() < 3 * steps) {
      std::vector<std::size_t> batch;
      for (std::size_t i = 0; i < 3; ++i)
        if (got[i].size() < steps && order_rng() % 3 != 0)
          batch.push_back(i);
      std::shuffle(batch.begin(), batch.end(), order_rng);
      for (auto i : batch)
        got[i].push_back(take(samplers[i], logits[i][got[i].size()]));
    }
    CHECK(got == expected);
  }
}

TEST_CASE("without a seed each sampler draws its own") {
  std::set<uint64_t> seeds;
  for (int i = 0; i < 100; ++i)
    seeds.insert(sequence_sampler(sampling_params{}, {}).seed());
  CHECK(seeds.size() == 100);
  CHECK(sequence_sampler(seeded(9), {}).seed() == 9);
}

// ---- Log-probabilities ---------------------------------------------------------

TEST_CASE("logprobs: log-softmax of the raw logits, whatever the penalties and temperature; "
          "the top alternatives in order; exp of all of them sums to 1") {
  std::mt19937_64 rng(18);
  constexpr std::size_t vocab = 1000;
  auto p = seeded(3);
  p.logprobs = true;
  p.top_logprobs = 20;
  p.temperature = 0.5f;
  p.repetition_penalty = 1.5f;
  p.presence_penalty = 1.0f;
  const std::vector<int32_t> prompt{1, 2};
  sequence_sampler s(p, prompt);
  for (int step = 0; step < 20; ++step) {
    auto logits = random_logits(rng, vocab, 4.0f);
    logits[3] = logits[4]; // a tie, ordered by id
    const auto ref = reference_log_softmax(logits);
    double total = 0;
    for (double x : ref)
      total += std::exp(x);
    REQUIRE(total == doctest::Approx(1.0).epsilon(1e-12));

    auto r = s.next(logits);
    REQUIRE(r.ok());
    REQUIRE(r->logprob);
    CHECK(*r->logprob == doctest::Approx(ref[static_cast<std::size_t>(r->token)]).epsilon(1e-5));
    std::vector<std::size_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const auto top = r->top_logprobs();
    REQUIRE(top.size() == 20);
    for (std::size_t i = 0; i < top.size(); ++i) {
      CHECK(top[i].token == static_cast<int32_t>(order[i]));
      CHECK(top[i].logprob == doctest::Approx(ref[order[i]]).epsilon(1e-5));
    }
  }
}

TEST_CASE("logprobs: over a vocabulary of 20, the alternatives are every token, and the "
          "exponentials of their logprobs sum to 1") {
  std::mt19937_64 rng(19);
  for (float spread : {0.1f, 3.0f, 30.0f}) {
    const auto logits = random_logits(rng, max_top_logprobs, spread);
    const auto ref = reference_log_softmax(logits);
    auto p = seeded(1);
    p.top_logprobs = max_top_logprobs;
    p.frequency_penalty = 1.0f; // no effect on logprobs
    sequence_sampler s(p, {});
    auto r = s.next(logits);
    REQUIRE(r.ok());
    REQUIRE(r->top_logprobs().size() == max_top_logprobs);
    double mass = 0;
    std::set<int32_t> tokens;
    for (auto x : r->top_logprobs()) {
      mass += std::exp(static_cast<double>(x.logprob));
      tokens.insert(x.token);
      CHECK(x.logprob == doctest::Approx(ref[static_cast<std::size_t>(x.token)]).epsilon(1e-5));
    }
    CHECK(tokens.size() == max_top_logprobs);
    CHECK(mass == doctest::Approx(1.0).epsilon(1e-5));
  }
}

TEST_CASE("logprobs are left out unless asked for") {
  sequence_sampler s(seeded(1), {});
  auto r = s.next(std::vector<float>{0.0f, 1.0f});
  REQUIRE(r.ok());
  CHECK_FALSE(r->logprob);
  CHECK(r->top_logprobs().size() == 0);
}

// ---- Logits that are not numbers -------------------------------------------------

TEST_CASE("NaN and infinite logits: all NaN is an error value; a NaN is never drawn; "
          "+inf tokens share the probability") {
  for (float temperature : {0.0f, 1.0f}) {
    auto p = seeded(2);
    p.temperature = temperature;
    p.top_p = 0.9f;
    sequence_sampler s(p, {});
    auto r = s.next(std::vector<float>(1000, nan_value));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().status == status_code::internal);
    CHECK(r.error().message.find("NaN") != std::string::npos);
    CHECK_FALSE(s.next(std::vector<float>(10, -inf)).ok());
    CHECK_FALSE(s.next(std::vector<float>{}).ok());
    CHECK(s.generated() == 0); // a failed step records nothing
  }
  std::vector<float> some_nan{nan_value, 0.0f, nan_value, 0.5f, nan_value};
  auto p = seeded(3);
  p.logprobs = true;
  p.top_logprobs = 5;
  sequence_sampler s(p, {});
  for (int i = 0; i < 2000; ++i) {
    auto r = s.next(some_nan);
    REQUIRE(r.ok());
    CHECK((r->token == 1 || r->token == 3));
    REQUIRE(r->top_logprobs().size() == 2); // the NaNs are no alternatives
  }
  std::vector<float> with_inf{1.0f, inf, 3.0f, inf, nan_value};
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) {
    auto r = s.next(with_inf);
    REQUIRE(r.ok());
    ++seen[r->token];
    CHECK(*r->logprob == doctest::Approx(std::log(0.5)));
  }
  CHECK(seen.size() == 2);
  CHECK(seen[1] > 800);
  CHECK(seen[3] > 800);
}

// ---- Allocation ------------------------------------------------------------------

TEST_CASE("after the first token, sampling allocates nothing") {
  std::mt19937_64 rng(20);
  const auto logits = random_logits(rng, 32000, 3.0f);
  struct alloc_case {
    const char* name;
    sampling_params params;
  };
  std::vector<alloc_case> cases;
  auto with = [&](const char* name, auto edit) {
    sampling_params p = seeded(1);
    edit(p);
    cases.push_back({name, p});
  };
  with("greedy", [](auto& p) { p.temperature = 0.0f; });
  with("top-p", [](auto& p) { p.top_p = 0.9f; p.temperature = 0.8f; });
  with("top-k, min-p, logprobs", [](auto& p) {
    p.top_k = 50;
    p.min_p = 0.05f;
    p.logprobs = true;
    p.top_logprobs = 20;
  });
  with("penalties", [](auto& p) { p.repetition_penalty = 1.1f; p.frequency_penalty = 0.2f; });
  for (const auto& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    // A prompt of 10 distinct tokens sizes the table for 15: with what a
    // vocabulary of 8 adds, it never grows again.
    sequence_sampler s(c.params, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    const bool penalties = c.params.repetition_penalty != 1.0f;
    const std::vector<float> small(logits.begin(), logits.begin() + 8);
    take(s, penalties ? small : logits);
    int failed = 0;
    const uint64_t before = allocations.load();
    for (int i = 0; i < 100; ++i)
      failed += s.next(i % 2 || penalties ? small : logits).ok() ? 0 : 1;
    const uint64_t allocated = allocations.load() - before;
    CHECK(failed == 0);
    CHECK(allocated == 0);
  }
}
