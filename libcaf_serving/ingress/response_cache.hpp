#pragma once
/// Triton's response cache: identical inference requests to a model that
/// enables it (`response_cache { enable: true }` in config.pbtxt) are answered
/// from memory instead of running the model again. One cache serves the whole
/// server (`--cache-config local,size=N`, Triton's flag); it sits in the
/// ingress, in front of the scheduler, so a hit never reaches the pipeline.
///
/// Usage (the ingress's infer path):
///
///   auto key = cache_key::of(request, pipeline);   // views into the request
///   if (auto hit = cache.find(key))
///     answer from hit->outputs;                     // the pipeline is skipped
///   else if (cache.admits(key))   // not when the key alone passes max_bytes
///     key.own();   // copies the viewed bytes: the request body is about to go
///     ... run the request; on success:
///     cache.insert(std::move(key), cached_response::copy_of(response_outputs));
///
/// Memory: max_bytes bounds what the cache holds. A request that missed also
/// holds a copy of its inputs (its key) until it is answered; that copy, one
/// per request in flight and bounded by --max-body-bytes, is not counted in
/// max_bytes.
///
/// What makes two requests identical: the same pipeline (model, version, and
/// the load that serves it: a reloaded model starts with no entries), the same
/// inputs by name with the same datatypes, shapes and bytes (whatever order the
/// request lists them in, and whether they came as JSON or binary data), and
/// the same requested outputs with the same classification count. Not part of
/// the key, because the cache holds the outputs before they are written out and
/// each request is written out by its own options: the request id, and the
/// binary_data / binary_data_output parameters. Priority and timeout do not
/// change a result either.
///
/// A hash collision never returns another request's answer: a lookup compares
/// the whole key (every input byte) before it answers. The comparison runs
/// outside the lock, so the lock is held for a few pointer operations only,
/// whatever the size of the tensors.

#include "core/datatype.hpp"
#include "ingress/kserve_codec.hpp"

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace caf_serving::ingress {

struct response_cache_config {
  /// Bytes the cache may hold: keys (their input bytes included), outputs and
  /// a fixed bookkeeping charge per entry (entry_overhead_bytes). 0: no cache.
  uint64_t max_bytes = 0;
};

/// What a request is identified by; see the header comment for what is in it.
class cache_key {
public:
  /// The key of `request` to the pipeline `owner` (a model version as loaded).
  /// Tensor bytes are viewed, not copied: the key is valid only while the
  /// request's data is, unless own() is called.
  static cache_key of(const infer_request& request, const std::shared_ptr<const void>& owner);

  /// Copies the viewed tensor bytes into the key, so that it outlives the
  /// request.
  void own();

  uint64_t hash() const { return hash_; }
  /// Bytes the key takes in the cache.
  size_t size() const { return header_.size() + data_bytes_; }
  /// Same pipeline, same description, same bytes.
  bool operator==(const cache_key& other) const;
  bool operator!=(const cache_key& other) const { return !(*this == other); }

  /// For tests of collisions: gives this key another hash.
  void force_hash_for_test(uint64_t hash) { hash_ = hash; }

private:
  uint64_t hash_ = 0;
  /// Compared by control block, so an unloaded pipeline's entries never match
  /// a new pipeline that happens to sit at the same address.
  std::weak_ptr<const void> owner_;
  /// Everything but the tensor bytes, each variable part prefixed by its length.
  std::string header_;
  /// The tensor bytes, as views (into the request, or into owned_).
  std::vector<std::string_view> data_;
  size_t data_bytes_ = 0;
  /// Behind a pointer so that copies and moves of the key keep the views valid.
  std::shared_ptr<const std::string> owned_;
};

/// One output of a cached answer, owned.
struct cached_output {
  std::string name;
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  std::string data;
};

/// A successful answer as the pipeline gave it, before it is written out.
struct cached_response {
  std::vector<cached_output> outputs;

  /// Copies the outputs of a response (which point into the pipeline's message).
  static cached_response copy_of(const std::vector<output_view>& outputs);
  /// Views of the outputs, for serialize_infer_response.
  std::vector<output_view> views() const;
  /// Bytes the outputs take in the cache.
  size_t size() const;
};

/// The server's response cache: least recently used entries go first once the
/// bytes would pass max_bytes. Safe to use from any number of threads.
class response_cache {
public:
  /// What every entry costs beyond its key and outputs (list node, index node,
  /// shared_ptr control block, allocation headers), so that many small entries
  /// cannot hold far more memory than max_bytes says.
  static constexpr size_t entry_overhead_bytes = 256;

  explicit response_cache(response_cache_config cfg);
  response_cache(const response_cache&) = delete;
  response_cache& operator=(const response_cache&) = delete;

  /// The answer cached for `key`, or null; a hit becomes the most recently used.
  std::shared_ptr<const cached_response> find(const cache_key& key);

  /// Caches `value` for `key` (which must own its bytes: cache_key::own),
  /// evicting the least recently used entries as needed. An entry larger than
  /// max_bytes on its own is not cached: returns false. An equal key already
  /// cached (two identical requests that missed at once) keeps its entry.
  bool insert(cache_key key, cached_response value);

  /// Whether an answer to `key` could be cached at all: false (and counted as
  /// too_large) when the key alone passes max_bytes, so that a miss need not
  /// copy a request body that will never be kept.
  bool admits(const cache_key& key);

  /// The cost of an entry in bytes, as insert counts it.
  static size_t charge(const cache_key& key, const cached_response& value);

  struct usage {
    uint64_t entries = 0;
    uint64_t bytes = 0;
    uint64_t max_bytes = 0;
    /// Entries dropped to make room.
    uint64_t evictions = 0;
    /// Answers not cached because they alone exceed max_bytes.
    uint64_t too_large = 0;
  };
  usage current() const;

  /// Prometheus text for the cache as a whole: caf_serving_cache_entries,
  /// caf_serving_cache_bytes, caf_serving_cache_max_bytes (gauges),
  /// caf_serving_cache_evictions and caf_serving_cache_too_large (counters).
  std::string prometheus() const;

private:
  struct entry {
    cache_key key;
    std::shared_ptr<const cached_response> value;
    size_t charge = 0;
  };
  using lru_list = std::list<std::shared_ptr<const entry>>;

  /// Moves `e` to the front if it is still cached. Lock held.
  void touch(const entry* e);

  const response_cache_config cfg_;
  mutable std::mutex mutex_;
  /// Most recently used first.
  lru_list lru_;
  std::unordered_multimap<uint64_t, lru_list::iterator> index_;
  uint64_t bytes_ = 0;
  uint64_t evictions_ = 0;
  uint64_t too_large_ = 0;
};

/// A fast non-cryptographic 64-bit hash of `bytes` (3 lanes of 128-bit multiplies);
/// collisions are harmless here because keys are compared in full.
uint64_t hash_bytes(std::string_view bytes, uint64_t seed);

} // namespace caf_serving::ingress
