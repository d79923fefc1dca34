#pragma once
/// The KV cache of a generative model's executor (issue 34): fixed-size blocks
/// from one budget, taken as sequences grow and given back when they end. The
/// scheduler's generation_policy keeps the same count of blocks and plans no
/// step that needs more than are free, so running out here is a bug, not an
/// expected failure.
///
/// A block holds `block_tokens` positions of every layer's keys and values:
/// [layer][key|value][kv head][position in block][head_dim] floats.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace caf_serving::executor {

struct kv_cache_layout {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_tokens = 16;
  uint32_t blocks = 0;
};

/// Bytes of one block of `layout`.
size_t kv_block_bytes(const kv_cache_layout& layout);

/// Unmaps a cache's storage (an anonymous mapping, so that it can take huge pages).
struct kv_storage_unmap {
  size_t bytes = 0;
  void operator()(float* p) const;
};

class kv_cache {
public:
  explicit kv_cache(kv_cache_layout layout);

  /// Makes `seq` hold positions [0, tokens): takes blocks as needed. False
  /// when too few are free (the caller's accounting is wrong).
  bool reserve(uint64_t seq, uint32_t tokens);
  /// Gives every block of `seq` back; nothing when it holds none.
  void release(uint64_t seq);

  /// The head_dim floats of `seq`'s key (`value` false) or value at
  /// `position` of `layer` and `head`; `position` must be reserved.
  float* row(uint64_t seq, uint32_t layer, bool value, uint32_t head, uint32_t position);
  const float* row(uint64_t seq, uint32_t layer, bool value, uint32_t head,
                   uint32_t position) const;

  const kv_cache_layout& layout() const { return layout_; }
  uint32_t free_blocks() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t used_blocks() const { return layout_.blocks - free_blocks(); }
  /// Positions `seq` holds room for (a multiple of block_tokens).
  uint32_t capacity(uint64_t seq) const;
  /// The blocks of `seq` in position order (empty when it holds none): its
  /// block table, as a paged attention reads it.
  const std::vector<uint32_t>& blocks(uint64_t seq) const;
  /// Every block's floats, block after block (kv_block_bytes() each); the
  /// memory never moves while the cache lives.
  float* data() { return storage_.get(); }
  size_t floats() const { return block_floats() * layout_.blocks; }

private:
  size_t block_floats() const;

  kv_cache_layout layout_;
  std::unique_ptr<float, kv_storage_unmap> storage_;
  std::vector<uint32_t> free_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> tables_;
};

} // namespace caf_serving::executor
