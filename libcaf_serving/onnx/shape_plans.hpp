#pragma once
/// Plans for models whose inputs have variable dimensions besides the batch
/// (a text model's sequence length, an image model's height and width): the
/// shapes known before the first request, and the cache of the plans compiled
/// for the others.
///
/// A model's plans are keyed by the full input shapes (batch included) and the
/// threads the plan's steps are split for. The plans compiled at load (every
/// batch size 1..max_batch_size of the fixed shape, or of each shape listed in
/// `expected_shapes` and in model_warmup) are pinned; the others live in one
/// shape_plan_cache per model, shared by its instances, bounded by a count
/// and by bytes (arena plus the constants the plan owns), least recently used
/// evicted first.
///
/// config.pbtxt's `parameters` key "expected_shapes" lists input shapes to
/// compile at load: shape sets separated by '|', each set a list of
/// `input:dims` separated by ';', dims separated by 'x' and without the batch
/// dimension (as config.pbtxt's dims), every input named once per set:
///
///     parameters { key: "expected_shapes"
///                  value: { string_value: "input_ids:128;attention_mask:128|input_ids:32;attention_mask:32" } }
///
/// Each set is compiled for every batch size 1..max_batch_size.

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "onnx/ir.hpp"

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace caf_serving::onnx {

/// One concrete shape per input name, without the batch dimension.
using shape_set = std::map<std::string, std::vector<int64_t>>;

/// Parses the "expected_shapes" syntax above. The error says what is wrong
/// and where; names and ranks are checked against the model later
/// (check_shape_set).
result<std::vector<shape_set>> parse_expected_shapes(const std::string& text);

/// Input names and their dims (without the batch dimension, -1 variable).
using input_dims = std::vector<std::pair<std::string, std::vector<int64_t>>>;

/// Checks that `set` names every input of `inputs` once, with its rank and
/// its fixed dims. The error names the input and both shapes.
result<shape_set> check_shape_set(const shape_set& set, const input_dims& inputs);

/// Whether any input of `cfg` has a variable dimension besides the batch.
bool has_variable_dims(const model_config& cfg);

/// The shape sets of parameters "expected_shapes" (`expected`) and of
/// cfg.warmup's samples that fit cfg's (completed) inputs: the shapes
/// compiled at load and pinned. The error names the expected_shapes set that
/// does not fit (a warmup sample that does not fails the load later, with
/// its own message).
result<std::vector<shape_set>> known_shape_sets(const model_config& cfg,
                                                const std::vector<shape_set>& expected);

/// Input shapes in `g`'s input order (which names cfg's inputs), `batch` in
/// front when cfg batches, every variable dimension from `set` when given,
/// else `fill`.
std::vector<std::vector<int64_t>> shapes_with(const graph& g, const model_config& cfg,
                                              int64_t batch, const shape_set* set, int64_t fill);

/// `g` specialized (passes.hpp) at batch 1 for cfg's input dims; with
/// variable dims, a second specialization with every variable dimension at
/// another size (the listed shapes first, then 32, 64, 16, 48, 8, 128), so
/// that the caller marks -1 the output dimensions that differ. The error
/// names the node that failed, or which inputs vary and that no two probes
/// worked.
result<std::pair<graph, std::optional<graph>>> probe_shapes(
  const graph& g, const model_config& cfg, const std::vector<shape_set>& expected);

/// "input_ids [2,7], attention_mask [2,7]": the shapes of a request, for errors.
std::string shapes_text(const std::vector<std::string>& names,
                        const std::vector<std::vector<int64_t>>& shapes);

/// Input shapes (batch included) and the threads a plan's steps are split for.
using plan_key = std::pair<std::vector<std::vector<int64_t>>, unsigned>;

/// Bounds of a shape_plan_cache.
struct shape_plan_cache_config {
  /// Plans at most (onnx_model_config::plan_cache_size).
  size_t max_plans = 8;
  /// Bytes at most, summed over the plans' plan_bytes
  /// (onnx_model_config::plan_cache_bytes).
  size_t max_bytes = size_t{1} << 30;
};

/// Plans compiled after load, shared by a model's instances; thread-safe.
/// Evicting a plan drops the cache's reference: an instance running it keeps
/// it alive until its batch ends.
template <class Plan>
class shape_plan_cache {
public:
  explicit shape_plan_cache(shape_plan_cache_config cfg) : cfg_(cfg) {
  }

  /// The plan for `key`, now the most recently used; null if there is none.
  std::shared_ptr<Plan> find(const plan_key& key) {
    std::lock_guard<std::mutex> guard(mu_);
    auto it = index_.find(key);
    if (it == index_.end())
      return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->plan;
  }

  /// Whether a plan of `bytes` can be cached at all (else it exceeds max_bytes alone).
  bool fits(size_t bytes) const {
    return bytes <= cfg_.max_bytes;
  }

  /// Adds `plan` as the most recently used, evicting the least recently used
  /// until both bounds hold. Returns the plan cached under `key`: another
  /// instance's when it got there first (the caller's is then dropped).
  /// Callers check fits() first.
  std::shared_ptr<Plan> insert(const plan_key& key, std::shared_ptr<Plan> plan, size_t bytes) {
    std::lock_guard<std::mutex> guard(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->plan;
    }
    while (!lru_.empty()
           && (lru_.size() + 1 > cfg_.max_plans || bytes_ + bytes > cfg_.max_bytes)) {
      bytes_ -= lru_.back().bytes;
      index_.erase(lru_.back().key);
      lru_.pop_back();
      ++evictions_;
    }
    lru_.push_front({key, plan, bytes});
    index_.emplace(key, lru_.begin());
    bytes_ += bytes;
    return plan;
  }

  size_t size() const {
    std::lock_guard<std::mutex> guard(mu_);
    return lru_.size();
  }

  /// Sum of the cached plans' bytes.
  size_t bytes() const {
    std::lock_guard<std::mutex> guard(mu_);
    return bytes_;
  }

  /// Plans evicted so far.
  size_t evictions() const {
    std::lock_guard<std::mutex> guard(mu_);
    return evictions_;
  }

  const shape_plan_cache_config& config() const {
    return cfg_;
  }

private:
  struct entry {
    plan_key key;
    std::shared_ptr<Plan> plan;
    size_t bytes = 0;
  };
  shape_plan_cache_config cfg_;
  mutable std::mutex mu_;
  std::list<entry> lru_; ///< most recently used first
  std::map<plan_key, typename std::list<entry>::iterator> index_;
  size_t bytes_ = 0;
  size_t evictions_ = 0;
};

} // namespace caf_serving::onnx
