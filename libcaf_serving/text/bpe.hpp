#pragma once
/// Hugging Face's BPE model: a word's characters (or, with byte_fallback,
/// their <0xXX> byte tokens) merged pair by pair in the order of the merge
/// ranks, lowest first and leftmost first among equals.

#include "core/error.hpp"

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace caf_serving::text {

/// Token text to id; the keys view strings a bpe_model owns.
using vocab_map = std::unordered_map<std::string_view, int32_t>;

struct bpe_config {
  std::vector<std::pair<std::string, int32_t>> vocab;
  /// In rank order: merges[0] is applied first.
  std::vector<std::pair<std::string, std::string>> merges;
  std::optional<std::string> unk_token;
  bool byte_fallback = false;
  bool fuse_unk = false;
  /// A word that is itself in the vocabulary is that one token, merges or not.
  bool ignore_merges = false;
};

class bpe_model {
public:
  /// Fails when a merge names a token (or makes one) that is not in the
  /// vocabulary, or the unk token is not in it.
  static result<std::unique_ptr<bpe_model>> create(bpe_config config);

  /// The ids of one word (text in the vocabulary's own alphabet, e.g. after
  /// ByteLevel's mapping). Thread-safe; recent words are cached.
  std::vector<int32_t> tokenize(std::string_view word) const;

  const vocab_map& vocab() const { return vocab_; }
  std::optional<int32_t> unk_id() const { return unk_id_; }

private:
  bpe_model() = default;
  std::vector<int32_t> merge_word(std::string_view word) const;

  struct merge {
    uint32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::deque<std::string> token_texts_; ///< what vocab_'s keys view (a deque never moves them)
  vocab_map vocab_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::unordered_map<uint64_t, merge> merges_;
  std::optional<int32_t> unk_id_;
  std::vector<int32_t> byte_ids_; ///< <0xXX> ids when byte_fallback and all 256 exist

  /// Words up to cache_max_word_bytes, cache_capacity of them at most; once
  /// full, the cache keeps what it has (as HF's does).
  static constexpr size_t cache_capacity = 10'000;
  static constexpr size_t cache_max_word_bytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

} // namespace caf_serving::text
