#include "postprocess/stop_strings.hpp"

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::postprocess;

namespace {

// ---- The reference: the whole text at once ----------------------------------

/// What the text sends and which stop string ends it: at the first end
/// position where some stop string ends, the longest one ending there.
struct reference_result {
  std::string text;
  std::optional<std::size_t> stop;
};

reference_result reference_stop(const std::string& text, const std::vector<std::string>& stops) {
  for (std::size_t end = 1; end <= text.size(); ++end) {
    std::optional<std::size_t> best;
    for (std::size_t j = 0; j < stops.size(); ++j) {
      const auto& s = stops[j];
      if (s.empty() || s.size() > end || text.compare(end - s.size(), s.size(), s) != 0)
        continue;
      if (!best || s.size() > stops[*best].size())
        best = j;
    }
    if (best)
      return {text.substr(0, end - stops[*best].size()), best};
  }
  return {text, std::nullopt};
}

/// The longest end of `text` that begins some stop string: what must be held back.
std::size_t reference_hold(const std::string& text, const std::vector<std::string>& stops) {
  std::size_t hold = 0;
  for (const auto& s : stops)
    for (std::size_t n = 1; n <= std::min(s.size(), text.size()); ++n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0)
        hold = std::max(hold, n);
  return hold;
}

/// Characters of one to four bytes, so that splits and matches meet multi-byte ones.
const std::vector<std::string> alphabet{"a", "b", "c", " ", "\n", "\xC3\xA9" /* é */,
                                        "\xE4\xB8\x96" /* 世 */, "\xE7\x95\x8C" /* 界 */,
                                        "\xF0\x9F\x99\x82" /* 🙂 */};

std::vector<std::string> random_characters(std::mt19937_64& rng, std::size_t n,
                                           std::size_t letters) {
  std::uniform_int_distribution<std::size_t> pick(0, letters - 1);
  std::vector<std::string> out(n);
  for (auto& c : out)
    c = alphabet[pick(rng)];
  return out;
}

std::string join(const std::vector<std::string>& characters, std::size_t from, std::size_t to) {
  std::string out;
  for (std::size_t i = from; i < to; ++i)
    out += characters[i];
  return out;
}

} // namespace

// ---- check -------------------------------------------------------------------

TEST_CASE("check: empty or malformed stop strings and impossible token counts are named") {
  CHECK_FALSE(check(stop_params{}));
  stop_params p;
  p.stop = {"ok", ""};
  REQUIRE(check(p));
  CHECK(check(p)->find("stop string 1 is empty") != std::string::npos);
  p.stop = {"\xC3"}; // a lead byte alone
  REQUIRE(check(p));
  CHECK(check(p)->find("stop string 0 is not valid UTF-8") != std::string::npos);
  p.stop = {"\xED\xA0\x80"}; // a surrogate
  CHECK(check(p));
  p.stop = {"\xC0\xAF"}; // overlong
  CHECK(check(p));
  p.stop = {"\xF0\x9F\x99\x82", "\xE4\xB8\x96"};
  CHECK_FALSE(check(p));
  p.max_tokens = 0;
  REQUIRE(check(p));
  CHECK(check(p)->find("max_tokens is 0") != std::string::npos);
  p.max_tokens = 5;
  p.min_tokens = 6;
  REQUIRE(check(p));
  CHECK(check(p)->find("min_tokens is 6 but max_tokens is 5") != std::string::npos);
  p.min_tokens = 5;
  CHECK_FALSE(check(p));
}

// ---- Stop strings against the whole-text reference -----------------------------

TEST_CASE("stop strings: randomized texts, stops and chunk splits give the reference's text, "
          "and hold back exactly what could begin a stop string") {
  std::mt19937_64 rng(31);
  int stopped = 0, at_start = 0, spanning = 0;
  for (int round = 0; round < 3000; ++round) {
    CAPTURE(round);
    // Few letters make matches and overlaps frequent.
    const std::size_t letters = 3 + static_cast<std::size_t>(round % 7);
    std::vector<std::string> stops;
    const int stop_count = 1 + round % 4;
    for (int j = 0; j < stop_count; ++j) {
      const auto chars = random_characters(rng, 1 + rng() % 4, letters);
      stops.push_back(join(chars, 0, chars.size()));
    }
    const auto chars = random_characters(rng, rng() % 40, letters);
    const std::string text = join(chars, 0, chars.size());
    const auto ref = reference_stop(text, stops);
    stopped += ref.stop.has_value();
    at_start += ref.stop && ref.text.empty();

    for (int split = 0; split < 4; ++split) {
      stop_string_checker checker{stops};
      std::string sent;
      std::optional<std::size_t> stop;
      std::size_t at = 0;
      int chunks = 0;
      while (at < chars.size()) {
        const std::size_t n = std::min<std::size_t>(rng() % (split == 0 ? 2 : 6), chars.size() - at);
        const auto scan = checker.feed(join(chars, at, at + n));
        at += n;
        ++chunks;
        sent += scan.text;
        if (scan.stop) {
          stop = scan.stop;
          spanning += chunks > 1 && n > 0;
          break;
        }
        // Held back: exactly the longest end of the text that begins a stop string.
        const std::string fed = join(chars, 0, at);
        CHECK(checker.held() == reference_hold(fed, stops));
        CHECK(sent == fed.substr(0, fed.size() - checker.held()));
      }
      if (!stop)
        sent += checker.flush();
      CHECK(sent == ref.text);
      CHECK(stop == ref.stop);
      // Once stopped, later chunks send nothing.
      if (stop) {
        const auto after = checker.feed("abc");
        CHECK(after.text.empty());
        CHECK(after.stop == stop);
      }
    }
  }
  // The rounds meet what they are meant to.
  CHECK(stopped > 1000);
  CHECK(at_start > 100);
  CHECK(spanning > 100);
}

TEST_CASE("stop strings: overlapping ones end at the first to complete, the longest there") {
  struct stop_case {
    std::vector<std::string> stops;
    std::string text;
    std::string sent;
    std::optional<std::size_t> stop;
  };
  const std::vector<stop_case> cases{
    {{"abcd", "bc"}, "xabcde", "xa", 1},   // "bc" completes before "abcd"
    {{"bc", "abc"}, "xabcx", "x", 1},      // both complete at 'c': the longer starts first
    {{"aa"}, "baaa", "b", 0},
    {{"ab", "b"}, "ab", "", 0},            // at the very start
    {{"\n\n"}, "one\ntwo\n\nthree", "one\ntwo", 0},
    {{"世界"}, "hello 世界!", "hello ", 0},
    {{"🙂"}, "no stop here", "no stop here", std::nullopt},
    {{"abab"}, "abaabab", "aba", 0},       // a failed start inside a later match
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    // Byte by byte is not a legal split (chunks are whole characters), so the
    // cases are fed whole and one character at a time where ASCII.
    stop_string_checker whole{c.stops};
    auto scan = whole.feed(c.text);
    std::string sent = scan.text;
    if (!scan.stop)
      sent += whole.flush();
    CHECK(sent == c.sent);
    CHECK(scan.stop == c.stop);
  }
}

TEST_CASE("stop strings: a stop string spread over many chunks, and text released as soon as "
          "it cannot begin one") {
  stop_string_checker checker{std::vector<std::string>{"STOP here"}};
  CHECK(checker.feed("Say ST").text == "Say ");
  CHECK(checker.held() == 2);
  CHECK(checker.feed("OP").text.empty());
  CHECK(checker.feed("!").text == "STOP!"); // "STOP!" cannot begin it
  CHECK(checker.feed("STOP h").text.empty());
  auto scan = checker.feed("ere and after");
  CHECK(scan.text.empty());
  CHECK(scan.stop == 0u);
  CHECK(checker.flush().empty());

  stop_string_checker none{std::vector<std::string>{}};
  CHECK(none.feed("anything").text == "anything");
  CHECK(none.held() == 0);
}

TEST_CASE("stop strings before min_tokens are held back but end nothing") {
  stop_string_checker checker{std::vector<std::string>{"end", "nd!"}};
  auto a = checker.feed_before_min_tokens("the end");
  CHECK_FALSE(a.stop);
  CHECK(a.text == "the ");
  // min_tokens reached: a stop string completing now ends the text, even one
  // that began in the text fed before.
  auto b = checker.feed("!");
  CHECK(b.stop == 1u);
  CHECK(b.text == "e"); // "the " went before

  stop_string_checker late{std::vector<std::string>{"end"}};
  CHECK(late.feed_before_min_tokens("end").text.empty());
  CHECK(late.feed("ing").text == "ending"); // the "end" before min_tokens does not count
  CHECK_FALSE(late.stopped());
}

// ---- Tokens ----------------------------------------------------------------------

TEST_CASE("end_after_token: EOS and stop ids end with \"stop\", max_tokens with \"length\", "
          "min_tokens and ignore_eos respected") {
  const std::vector<int32_t> eos{2, 7};
  stop_params p;
  p.max_tokens = 10;
  p.stop_token_ids = {5};
  // Nothing special: continue.
  CHECK_FALSE(end_after_token(p, eos, 1, 3));
  // EOS, either of the model's.
  auto e = end_after_token(p, eos, 1, 7);
  REQUIRE(e);
  CHECK(e->reason == finish_reason::stop);
  CHECK(e->token == 7);
  CHECK(std::string(to_string(e->reason)) == "stop");
  // A stop id.
  e = end_after_token(p, eos, 4, 5);
  REQUIRE(e);
  CHECK(e->reason == finish_reason::stop);
  CHECK(e->token == 5);
  // The 10th token: length; but an EOS as the 10th is a stop.
  e = end_after_token(p, eos, 10, 3);
  REQUIRE(e);
  CHECK(e->reason == finish_reason::length);
  CHECK_FALSE(e->token);
  CHECK(std::string(to_string(e->reason)) == "length");
  CHECK(end_after_token(p, eos, 10, 2)->reason == finish_reason::stop);
  // min_tokens: not before the 3rd token.
  p.min_tokens = 3;
  CHECK_FALSE(end_after_token(p, eos, 2, 2));
  CHECK_FALSE(end_after_token(p, eos, 2, 5));
  CHECK(end_after_token(p, eos, 3, 2));
  // ignore_eos: EOS ids go on, stop ids still end.
  p.ignore_eos = true;
  CHECK_FALSE(end_after_token(p, eos, 5, 2));
  CHECK(end_after_token(p, eos, 5, 5));
  CHECK(end_after_token(p, eos, 10, 2)->reason == finish_reason::length);
  // No max_tokens: only ids end it.
  p.max_tokens.reset();
  CHECK_FALSE(end_after_token(p, eos, 100000, 3));

  p.ignore_eos = false;
  CHECK(ending_tokens(p, eos) == std::vector<int32_t>{2, 5, 7});
  p.ignore_eos = true;
  CHECK(ending_tokens(p, eos) == std::vector<int32_t>{5});
}

TEST_CASE("min_tokens: the sampler never draws an ending id before min_tokens") {
  // The model wants EOS (id 0) far more than anything else.
  const std::vector<float> logits{8.0f, 0.0f, 0.5f, -1.0f};
  const std::vector<int32_t> eos{0};
  stop_params stop;
  stop.min_tokens = 4;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    sampling_params p;
    p.seed = seed;
    sequence_sampler s(p, {});
    s.suppress(ending_tokens(stop, eos), stop.min_tokens);
    for (uint32_t generated = 1;; ++generated) {
      auto r = s.next(logits);
      REQUIRE(r.ok());
      const auto end = end_after_token(stop, eos, generated, r->token);
      if (generated < stop.min_tokens) {
        CHECK(r->token != 0);
        CHECK_FALSE(end);
      } else if (r->token == 0) {
        CHECK(end);
        break;
      }
      REQUIRE(generated < 100);
    }
  }
}
