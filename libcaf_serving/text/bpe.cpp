#include "text/bpe.hpp"

#include "text/unicode.hpp"

#include <cstdio>
#include <queue>

namespace caf_serving::text {

result<std::unique_ptr<bpe_model>> bpe_model::create(bpe_config config) {
  std::unique_ptr<bpe_model> m{new bpe_model()};
  m->byte_fallback_ = config.byte_fallback;
  m->fuse_unk_ = config.fuse_unk;
  m->ignore_merges_ = config.ignore_merges;
  m->vocab_.reserve(config.vocab.size());
  for (auto& [text, id] : config.vocab)
    m->vocab_.emplace(m->token_texts_.emplace_back(std::move(text)), id);
  const auto& vocab = m->vocab_;
  auto find = [&](std::string_view s) -> std::optional<int32_t> {
    auto it = vocab.find(s);
    return it == vocab.end() ? std::nullopt : std::optional<int32_t>{it->second};
  };
  m->merges_.reserve(config.merges.size());
  for (size_t rank = 0; rank < config.merges.size(); ++rank) {
    const auto& [a, b] = config.merges[rank];
    auto ia = find(a);
    auto ib = find(b);
    auto merged = find(a + b);
    if (!ia || !ib || !merged)
      return bad_request("tokenizer.json: BPE merge " + std::to_string(rank) + " (\"" + a
                         + "\" \"" + b + "\") names a token that is not in model.vocab ("
                         + (!ia ? a : !ib ? b : a + b) + "); the file is inconsistent");
    // A later duplicate of a pair keeps the first (lowest) rank, as HF does.
    m->merges_.try_emplace(pair_key(*ia, *ib), merge{static_cast<uint32_t>(rank), *merged});
  }
  if (config.unk_token) {
    m->unk_id_ = find(*config.unk_token);
    if (!m->unk_id_)
      return bad_request("tokenizer.json: model.unk_token \"" + *config.unk_token
                         + "\" is not in model.vocab");
  }
  if (config.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto id = find(name);
      if (!id) {
        m->byte_ids_.clear();
        break;
      }
      m->byte_ids_.push_back(*id);
    }
  }
  return std::move(m);
}

std::vector<int32_t> bpe_model::tokenize(std::string_view word) const {
  bool cacheable = word.size() <= cache_max_word_bytes;
  if (cacheable) {
    std::lock_guard<std::mutex> guard{cache_mutex_};
    if (auto it = cache_.find(std::string{word}); it != cache_.end())
      return it->second;
  }
  auto ids = merge_word(word);
  if (cacheable) {
    std::lock_guard<std::mutex> guard{cache_mutex_};
    if (cache_.size() < cache_capacity)
      cache_.try_emplace(std::string{word}, ids);
  }
  return ids;
}

std::vector<int32_t> bpe_model::merge_word(std::string_view word) const {
  const auto& vocab = vocab_;
  if (ignore_merges_)
    if (auto it = vocab.find(word); it != vocab.end())
      return {it->second};

  // The word's initial symbols: a doubly linked list over a vector.
  struct symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool gone;
  };
  std::vector<symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, false});
  };
  std::optional<int32_t> pending_unk; // fuse_unk joins a run of unknown characters
  for (size_t pos = 0; pos < word.size();) {
    size_t len = next_utf8(word, pos).size;
    std::string_view ch = word.substr(pos, len);
    pos += len;
    if (auto it = vocab.find(ch); it != vocab.end()) {
      if (pending_unk)
        add(*std::exchange(pending_unk, std::nullopt));
      add(it->second);
      continue;
    }
    if (!byte_ids_.empty()) {
      for (char b : ch)
        add(byte_ids_[static_cast<uint8_t>(b)]);
      continue;
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_)
        add(*pending_unk);
      pending_unk = unk_id_;
    }
    // Without an unk token, HF drops the character.
  }
  if (pending_unk)
    add(*pending_unk);
  if (symbols.empty())
    return {};
  symbols.back().next = -1;

  struct candidate {
    uint32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<candidate, std::vector<candidate>, std::greater<>> queue;
  auto consider = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0)
      return;
    auto it = merges_.find(pair_key(symbols[left].id, symbols[symbols[left].next].id));
    if (it != merges_.end())
      queue.push({it->second.rank, left, it->second.id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i)
    consider(i);
  while (!queue.empty()) {
    auto top = queue.top();
    queue.pop();
    auto& left = symbols[top.pos];
    if (left.gone || left.next < 0)
      continue;
    auto it = merges_.find(pair_key(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.id != top.id)
      continue; // stale: one side was merged with something else since
    auto& right = symbols[left.next];
    left.id = top.id;
    right.gone = true;
    left.next = right.next;
    if (left.next >= 0)
      symbols[left.next].prev = top.pos;
    consider(left.prev);
    consider(top.pos);
  }
  std::vector<int32_t> ids;
  for (int32_t i = 0; i >= 0; i = symbols[i].next)
    ids.push_back(symbols[i].id);
  return ids;
}

} // namespace caf_serving::text
