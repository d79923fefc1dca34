#include "postprocess/stop_strings.hpp"

#include <algorithm>
#include <deque>

namespace caf_serving::postprocess {

namespace {

/// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates).
bool valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    std::size_t length = 0;
    uint32_t lowest = 0;
    uint32_t code = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      length = 2, lowest = 0x80, code = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      length = 3, lowest = 0x800, code = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      length = 4, lowest = 0x10000, code = b & 0x07;
    } else {
      return false;
    }
    if (i + length > text.size())
      return false;
    for (std::size_t j = 1; j < length; ++j) {
      const auto c = static_cast<unsigned char>(text[i + j]);
      if ((c & 0xC0) != 0x80)
        return false;
      code = (code << 6) | (c & 0x3F);
    }
    if (code < lowest || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
      return false;
    i += length;
  }
  return true;
}

} // namespace

std::optional<std::string> check(const stop_params& params) {
  for (std::size_t i = 0; i < params.stop.size(); ++i) {
    if (params.stop[i].empty())
      return "stop string " + std::to_string(i)
             + " is empty, which would end every sequence at once: remove it";
    if (!valid_utf8(params.stop[i]))
      return "stop string " + std::to_string(i)
             + " is not valid UTF-8: stop strings are matched against the generated text, "
               "which is";
  }
  if (params.max_tokens && *params.max_tokens == 0)
    return "max_tokens is 0 but must be at least 1 (leave it out to generate until the "
           "context is full)";
  if (params.max_tokens && params.min_tokens > *params.max_tokens)
    return "min_tokens is " + std::to_string(params.min_tokens) + " but max_tokens is "
           + std::to_string(*params.max_tokens) + ": min_tokens must not exceed max_tokens";
  return std::nullopt;
}

// ---- Stop strings --------------------------------------------------------------

stop_string_checker::stop_string_checker(const std::vector<std::string>& stops) : nodes_(1) {
  // The trie of the stop strings.
  for (std::size_t index = 0; index < stops.size(); ++index) {
    const auto& stop = stops[index];
    if (stop.empty())
      continue;
    uint32_t at = 0;
    for (char ch : stop) {
      const auto byte = static_cast<unsigned char>(ch);
      auto& edges = nodes_[at].edges;
      auto edge = std::find_if(edges.begin(), edges.end(),
                               [byte](const auto& e) { return e.first == byte; });
      if (edge != edges.end()) {
        at = edge->second;
        continue;
      }
      const auto child = static_cast<uint32_t>(nodes_.size());
      edges.emplace_back(byte, child);
      nodes_.emplace_back();
      nodes_[child].depth = nodes_[at].depth + 1;
      at = child;
    }
    if (nodes_[at].match_length == 0) { // the first of equal strings names it
      nodes_[at].match_length = nodes_[at].depth;
      nodes_[at].match_index = index;
    }
  }
  // Failure links, breadth first: a node's fail is the longest proper suffix of
  // its string that is in the trie. A node that ends no stop string itself
  // inherits the longest one ending at its fail.
  std::deque<uint32_t> queue;
  for (const auto& [byte, child] : nodes_[0].edges)
    queue.push_back(child);
  while (!queue.empty()) {
    const uint32_t at = queue.front();
    queue.pop_front();
    const uint32_t fail = nodes_[at].fail;
    if (nodes_[at].match_length == 0 && nodes_[fail].match_length > 0) {
      nodes_[at].match_length = nodes_[fail].match_length;
      nodes_[at].match_index = nodes_[fail].match_index;
    }
    for (const auto& [byte, child] : nodes_[at].edges) {
      nodes_[child].fail = step(fail, byte);
      queue.push_back(child);
    }
  }
}

uint32_t stop_string_checker::step(uint32_t state, unsigned char byte) const {
  for (;;) {
    for (const auto& [b, child] : nodes_[state].edges)
      if (b == byte)
        return child;
    if (state == 0)
      return 0;
    state = nodes_[state].fail;
  }
}

stop_scan stop_string_checker::feed(std::string_view chunk) {
  return scan(chunk, matching::ends_text);
}

stop_scan stop_string_checker::feed_before_min_tokens(std::string_view chunk) {
  return scan(chunk, matching::ignored);
}

stop_scan stop_string_checker::scan(std::string_view chunk, matching mode) {
  stop_scan out;
  if (stopped_) {
    out.stop = stopped_;
    return out;
  }
  // The automaton's string is a suffix of held_ + chunk: held_ is the longest
  // end of the text before `chunk` that begins a stop string.
  for (std::size_t i = 0; i < chunk.size(); ++i) {
    state_ = step(state_, static_cast<unsigned char>(chunk[i]));
    const auto& n = nodes_[state_];
    if (mode == matching::ends_text && n.match_length > 0) {
      const std::size_t end = held_.size() + i + 1;
      const std::size_t start = end - n.match_length;
      out.text = std::move(held_);
      out.text.append(chunk.substr(0, i + 1));
      out.text.resize(start);
      held_.clear();
      stopped_ = n.match_index;
      out.stop = stopped_;
      return out;
    }
  }
  const std::size_t keep = nodes_[state_].depth;
  std::string text = std::move(held_);
  text.append(chunk);
  held_.assign(text, text.size() - keep, keep);
  text.resize(text.size() - keep);
  out.text = std::move(text);
  return out;
}

std::string stop_string_checker::flush() {
  state_ = 0;
  std::string out;
  out.swap(held_);
  return out;
}

// ---- Tokens ----------------------------------------------------------------------

const char* to_string(finish_reason reason) {
  return reason == finish_reason::stop ? "stop" : "length";
}

std::optional<sequence_end> end_after_token(const stop_params& params,
                                            const_span<int32_t> eos_ids, uint32_t generated,
                                            int32_t token) {
  auto among = [token](const_span<int32_t> ids) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  if (generated >= params.min_tokens) {
    if (!params.ignore_eos && among(eos_ids))
      return sequence_end{finish_reason::stop, token};
    if (among(params.stop_token_ids))
      return sequence_end{finish_reason::stop, token};
  }
  if (params.max_tokens && generated >= *params.max_tokens)
    return sequence_end{finish_reason::length, std::nullopt};
  return std::nullopt;
}

std::vector<int32_t> ending_tokens(const stop_params& params, const_span<int32_t> eos_ids) {
  std::vector<int32_t> out;
  if (!params.ignore_eos)
    out.assign(eos_ids.begin(), eos_ids.end());
  out.insert(out.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

} // namespace caf_serving::postprocess
