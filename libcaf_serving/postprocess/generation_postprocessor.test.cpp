#include "postprocess/generation_postprocessor.hpp"

#include "postprocess/generation_postprocessor_actor.hpp"
#include "text/tokenizer.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace caf_serving;
using postprocess::generation_postprocessor;

namespace {

/// tiny_gpt2's tokenizer: 512 byte-level BPE ids, id 0 is <|endoftext|>.
std::shared_ptr<const text::tokenizer> gpt2_tokenizer() {
  auto tok = text::tokenizer::load_file(CAF_SERVING_TOKENIZER_JSON);
  REQUIRE(tok.ok());
  return std::make_shared<const text::tokenizer>(std::move(*tok));
}

constexpr uint32_t vocab = 512;
constexpr int32_t eos = 0;

/// A row of logits that depends only on (key, step): what the model would
/// give one sequence at one step, whatever shares the batch.
std::vector<float> row_for(uint64_t key, uint32_t step) {
  std::mt19937_64 rng(key * 1000003u + step);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(vocab);
  for (auto& v : row)
    v = normal(rng);
  row[eos] = -50.0f; // the test ends sequences itself
  return row;
}

/// The reference greedy choice: the first index of the largest value.
int32_t argmax(const std::vector<float>& row) {
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[best])
      best = i;
  return static_cast<int32_t>(best);
}

generation_sequence make_sequence(uint64_t id, float temperature, std::optional<uint64_t> seed,
                                  uint32_t max_tokens) {
  generation_sequence s;
  s.id = id;
  s.prompt = {100 + static_cast<int32_t>(id), 200, 300};
  s.sampling.temperature = temperature;
  s.sampling.seed = seed;
  s.stop.max_tokens = max_tokens;
  return s;
}

/// The logits of one step: `keys[i]`'s row at `steps[i]` for sequence `seqs[i]`.
generation_logits make_logits(const std::vector<uint64_t>& seqs,
                              const std::vector<uint64_t>& keys,
                              const std::vector<uint32_t>& steps) {
  auto values = std::make_shared<std::vector<float>>();
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto row = row_for(keys[i], steps[i]);
    values->insert(values->end(), row.begin(), row.end());
  }
  return {seqs, values, vocab};
}

std::string decode_after_prompt(const text::tokenizer& tok, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& generated) {
  auto all = prompt;
  all.insert(all.end(), generated.begin(), generated.end());
  auto before = tok.decode(prompt);
  return tok.decode(all).substr(before.size());
}

} // namespace

TEST_CASE("greedy rows take the argmax; the text is the decoded tokens; max_tokens ends with "
          "length") {
  auto tok = gpt2_tokenizer();
  generation_postprocessor post{{tok, {eos}}};
  constexpr uint32_t steps = 6;
  std::vector<uint64_t> ids{1, 2, 3};
  for (auto id : ids)
    post.open(make_sequence(id, 0.0f, std::nullopt, steps));
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::string> text;
  for (uint32_t step = 0; step < steps; ++step) {
    auto samples = post.sample(make_logits(ids, ids, {step, step, step}));
    REQUIRE_FALSE(samples.error);
    REQUIRE(samples.rows.size() == ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto& r = samples.rows[i];
      CHECK(r.seq == ids[i]);
      CHECK_FALSE(r.error);
      CHECK_FALSE(r.logprob); // not asked for
      CHECK(r.token == argmax(row_for(ids[i], step)));
      tokens[r.seq].push_back(r.token);
      text[r.seq] += r.text;
      if (step + 1 < steps) {
        CHECK_FALSE(r.finish_reason);
      } else {
        REQUIRE(r.finish_reason);
        CHECK(*r.finish_reason == "length");
      }
    }
  }
  CHECK(post.open_sequences() == 0);
  for (auto id : ids)
    CHECK(text[id]
          == decode_after_prompt(*tok, make_sequence(id, 0, std::nullopt, 1).prompt, tokens[id]));
}

TEST_CASE("a seeded sequence draws the same tokens whatever rows share its steps") {
  auto tok = gpt2_tokenizer();
  constexpr uint32_t steps = 24;
  constexpr uint64_t seeded = 7;
  auto alone = [&] {
    generation_postprocessor post{{tok, {eos}}};
    post.open(make_sequence(seeded, 1.0f, 1234, 1000));
    std::vector<int32_t> out;
    for (uint32_t step = 0; step < steps; ++step) {
      auto samples = post.sample(make_logits({seeded}, {seeded}, {step}));
      REQUIRE(samples.rows.size() == 1);
      out.push_back(samples.rows[0].token);
    }
    return out;
  }();
  // Sampled, not greedy: at temperature 1 over 512 ids some draws differ from
  // the argmax (else this test could not tell sampling from greedy).
  int differ = 0;
  for (uint32_t step = 0; step < steps; ++step)
    differ += alone[step] != argmax(row_for(seeded, step));
  CHECK(differ > 0);

  generation_postprocessor post{{tok, {eos}}};
  post.open(make_sequence(seeded, 1.0f, 1234, 1000));
  post.open(make_sequence(8, 1.0f, 99, 1000));
  post.open(make_sequence(9, 0.7f, std::nullopt, 1000));
  std::vector<int32_t> crowded;
  for (uint32_t step = 0; step < steps; ++step) {
    // Other rows change from step to step, and so does where ours sits.
    std::vector<uint64_t> seqs = step % 2 ? std::vector<uint64_t>{8, seeded, 9}
                                          : std::vector<uint64_t>{9, 8, seeded};
    std::vector<uint64_t> keys;
    for (auto s : seqs)
      keys.push_back(s == seeded ? seeded : s * 77 + step);
    auto samples = post.sample(make_logits(seqs, keys, {step, step, step}));
    REQUIRE(samples.rows.size() == 3);
    for (const auto& r : samples.rows)
      if (r.seq == seeded)
        crowded.push_back(r.token);
  }
  CHECK(crowded == alone);
}

TEST_CASE("an end-of-sequence token ends with stop and no text; closed rows are skipped") {
  auto tok = gpt2_tokenizer();
  generation_postprocessor post{{tok, {eos}}};
  auto s = make_sequence(1, 0.0f, std::nullopt, 100);
  s.sampling.logprobs = true;
  s.sampling.top_logprobs = 2;
  post.open(s);
  post.open(make_sequence(2, 0.0f, std::nullopt, 100));
  post.open(make_sequence(3, 0.0f, std::nullopt, 100));
  post.close(3);
  auto values = std::make_shared<std::vector<float>>(3 * vocab, 0.0f);
  (*values)[0 * vocab + eos] = 5.0f; // row 0 (seq 1): the end
  (*values)[0 * vocab + 42] = 4.0f;
  (*values)[1 * vocab + 65] = 1.0f; // row 1 (seq 2): id 65
  auto samples = post.sample({{1, 2, 3}, values, vocab});
  REQUIRE(samples.rows.size() == 2); // seq 3 was closed
  const auto& end = samples.rows[0];
  CHECK(end.seq == 1);
  CHECK(end.token == eos);
  REQUIRE(end.finish_reason);
  CHECK(*end.finish_reason == "stop");
  CHECK(end.text.empty());
  // log-softmax of the raw row, computed here: 5 against 4 and 510 zeros.
  double z = std::exp(5.0) + std::exp(4.0) + 510.0;
  REQUIRE(end.logprob);
  CHECK(*end.logprob == doctest::Approx(5.0 - std::log(z)).epsilon(1e-5));
  REQUIRE(end.top_logprobs.size() == 2);
  CHECK(end.top_logprobs[1].first == 42);
  CHECK(end.top_logprobs[1].second == doctest::Approx(4.0 - std::log(z)).epsilon(1e-5));
  CHECK(samples.rows[1].seq == 2);
  CHECK(samples.rows[1].token == 65);
  CHECK(samples.rows[1].text == tok->decode({65}));
  CHECK_FALSE(samples.rows[1].finish_reason);
  CHECK(post.open_sequences() == 1);
}

TEST_CASE("the actor answers a step as the plain object does, and stops cleanly") {
  auto tok = gpt2_tokenizer();
  generation_postprocessor reference{{tok, {eos}}};
  std::vector<uint64_t> ids{4, 5};
  for (auto id : ids)
    reference.open(make_sequence(id, 1.0f, id * 11, 50));
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{cfg};
  auto actor = postprocess::spawn_generation_postprocessor(sys, {tok, {eos}});
  caf::scoped_actor self{sys};
  for (auto id : ids)
    self->send(actor, generation_open_atom::value,
               std::shared_ptr<const generation_sequence>(
                 std::make_shared<generation_sequence>(make_sequence(id, 1.0f, id * 11, 50))));
  for (uint32_t step = 0; step < 5; ++step) {
    auto logits = make_logits(ids, ids, {step, step});
    auto expected = reference.sample(logits);
    self->request(actor, caf::infinite, generation_sample_atom::value, logits)
      .receive(
        [&](generation_samples& got) {
          REQUIRE(got.rows.size() == expected.rows.size());
          for (size_t i = 0; i < got.rows.size(); ++i) {
            CHECK(got.rows[i].seq == expected.rows[i].seq);
            CHECK(got.rows[i].token == expected.rows[i].token);
            CHECK(got.rows[i].text == expected.rows[i].text);
          }
        },
        [&](caf::error& e) { FAIL(sys.render(e)); });
  }
  self->send_exit(actor, caf::exit_reason::user_shutdown);
}
