#include "postprocess/generation_postprocessor.hpp"

#include "postprocess/sampling.hpp"
#include "postprocess/stop_strings.hpp"
#include "text/tokenizer.hpp"

#include <cassert>

namespace caf_serving::postprocess {

/// One sequence's sampler, detokenizer and stop checks.
struct generation_postprocessor::sequence {
  sequence(const generation_sequence& s, const text::tokenizer& tok)
      : params(s), sampler(params.sampling, {params.prompt.data(), params.prompt.size()}),
        detok(tok, params.prompt, text::decode_options{params.skip_special_tokens}),
        stops(params.stop.stop) {}

  generation_sequence params;
  sequence_sampler sampler;
  text::detokenizer detok;
  stop_string_checker stops;
  uint32_t generated = 0;
};

generation_postprocessor::generation_postprocessor(generation_postprocessor_config config)
    : config_(std::move(config)) {}

generation_postprocessor::~generation_postprocessor() = default;
generation_postprocessor::generation_postprocessor(generation_postprocessor&&) noexcept = default;
generation_postprocessor&
generation_postprocessor::operator=(generation_postprocessor&&) noexcept = default;

void generation_postprocessor::open(const generation_sequence& seq) {
  assert(seq.stop.max_tokens.has_value());
  auto s = std::make_unique<sequence>(seq, *config_.tokenizer);
  // End-of-sequence and stop ids cannot be drawn before min_tokens.
  if (seq.stop.min_tokens > 0)
    s->sampler.suppress(
      ending_tokens(seq.stop, {config_.eos_ids.data(), config_.eos_ids.size()}),
      seq.stop.min_tokens);
  bool fresh = sequences_.emplace(seq.id, std::move(s)).second;
  assert(fresh && "a sequence was opened twice");
  (void) fresh;
}

void generation_postprocessor::close(uint64_t id) { sequences_.erase(id); }

size_t generation_postprocessor::open_sequences() const { return sequences_.size(); }

generation_samples generation_postprocessor::sample(const generation_logits& logits) {
  generation_samples out;
  out.rows.reserve(logits.seqs.size());
  for (size_t row = 0; row < logits.seqs.size(); ++row) {
    auto it = sequences_.find(logits.seqs[row]);
    if (it == sequences_.end())
      continue; // closed while its step ran
    out.rows.push_back(
      next(*it->second, logits.values->data() + row * logits.vocab, logits.vocab));
    const auto& r = out.rows.back();
    if (r.finish_reason || r.error)
      sequences_.erase(it);
  }
  return out;
}

generation_sample generation_postprocessor::next(sequence& s, const float* row, uint32_t vocab) {
  generation_sample out;
  out.seq = s.params.id;
  auto pick = s.sampler.next({row, vocab});
  if (!pick) {
    out.error = pick.error();
    return out;
  }
  out.token = pick->token;
  ++s.generated;
  if (s.params.sampling.logprobs) {
    out.logprob = pick->logprob.value_or(0.0f);
    for (const auto& t : pick->top_logprobs())
      out.top_logprobs.emplace_back(t.token, t.logprob);
  }
  // The end of the text: what the stop checks held back, unless a stop
  // string ended it.
  auto finish = [&](std::string reason) {
    if (!s.stops.stopped()) {
      auto tail = s.stops.feed(s.detok.flush());
      out.text += tail.text;
      out.text += s.stops.flush();
    }
    out.finish_reason = std::move(reason);
  };
  const auto& stop = s.params.stop;
  auto ended = end_after_token(stop, {config_.eos_ids.data(), config_.eos_ids.size()},
                               s.generated, out.token);
  if (ended && ended->token) {
    // An end-of-sequence or stop token: counted, not shown.
    finish(to_string(ended->reason));
    return out;
  }
  std::string piece = s.detok.push(out.token);
  auto scan = s.generated < stop.min_tokens ? s.stops.feed_before_min_tokens(piece)
                                            : s.stops.feed(piece);
  out.text += scan.text;
  if (scan.stop) {
    if (s.params.include_stop_str_in_output)
      out.text += stop.stop[*scan.stop];
    finish("stop");
  } else if (ended) {
    finish(to_string(ended->reason));
  }
  return out;
}

} // namespace caf_serving::postprocess
