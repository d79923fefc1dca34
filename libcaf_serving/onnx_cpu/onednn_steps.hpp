#pragma once
/// The steps of a compiled ONNX plan that run on oneDNN, and what they share:
/// convolutions (with the engine's 1x1 kernel and bands of rows on dense
/// copies), pooling, layout reorders and MatMul/Gemm; the layouts that keep
/// tensors in oneDNN's formats between them; and the store of reordered
/// weights that every plan of a model shares. Internal to the ONNX backend:
/// onnx_backend.cpp compiles plans from these and runs them.
///
///     weight_store weights;
///     dnnl_ctx ctx{dnnl::engine(dnnl::engine::kind::cpu, 0), &weights};
///     auto lay = assign_layouts(g);          // inserts reorders, marks layouts
///     step s = conv_step(ctx, g, g.nodes[i], threads, lay, mcfg);
///     for (int64_t item = 0; item < s.items; ++item) s.run(ptrs, item);

#include "onnx/ir.hpp"
#include "onnx_cpu/onnx_backend.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace caf_serving::onnx {

using dims_t = std::vector<int64_t>;

/// One step of a plan: `items` independent pieces of work that read and write
/// through the per-run pointer table; run(ptrs, item) does one piece.
struct step {
  std::string kernel; ///< for describe_plan
  int node = -1;
  int64_t items = 1;
  std::function<void(void** ptrs, int64_t item)> run;
};

/// Reordered weights shared by every plan and instance of one model. A model
/// compiles a plan per batch size (and per chunk size); without sharing, each
/// held its own reordered copy of every weight (measured: +340 MB per plan for
/// BERT-base). Entries are keyed by the weights' contents, so that weights
/// folded anew for each plan (BatchNorm into Conv) share too.
class weight_store {
public:
  /// The weights `w` (a view at `offset` bytes, described by `user`) in the
  /// layout `want`. Plans hold what this returns; an entry that no live plan
  /// holds any more is reordered again when asked for (oneDNN's Winograd
  /// layout depends on the batch, so plans of other sizes may want another).
  std::shared_ptr<const dnnl::memory> get(const dnnl::engine& eng, const constant_ptr& w,
                                          int64_t offset, const dnnl::memory::desc& user,
                                          const dnnl::memory::desc& want) {
    std::lock_guard<std::mutex> guard(mu_);
    uint64_t h = hash_of(w);
    entry* slot = nullptr;
    for (auto& e : entries_) {
      if (e.hash == h && e.bytes == w->bytes.size() && e.offset == offset && e.user == user
          && e.want == want) {
        if (auto held = e.mem.lock())
          return held;
        slot = &e;
        break;
      }
    }
    for (auto it = entries_.begin(); !slot && it != entries_.end(); ++it)
      if (it->mem.expired())
        slot = &*it;
    dnnl::memory src(user, eng, const_cast<uint8_t*>(w->bytes.data()) + offset);
    auto dst = std::make_shared<dnnl::memory>(want, eng);
    dnnl::stream s(eng);
    dnnl::reorder(src, *dst).execute(s, src, *dst);
    s.wait();
    entry e{h, w->bytes.size(), offset, user, want, dst};
    if (slot)
      *slot = e;
    else
      entries_.push_back(e);
    return dst;
  }

  /// Bytes of reordered weights that live plans hold.
  size_t bytes() const {
    std::lock_guard<std::mutex> guard(mu_);
    size_t n = 0;
    for (const auto& e : entries_)
      if (!e.mem.expired())
        n += e.want.get_size();
    return n;
  }

private:
  struct entry {
    uint64_t hash;
    size_t bytes;
    int64_t offset;
    dnnl::memory::desc user, want;
    std::weak_ptr<const dnnl::memory> mem;
  };

  /// A 64-bit hash of the contents, computed once per live tensor (a tensor
  /// that died may leave its address to another one: the weak pointer tells).
  uint64_t hash_of(const constant_ptr& w) {
    auto it = hashes_.find(w.get());
    if (it != hashes_.end() && !it->second.first.expired())
      return it->second.second;
    uint64_t h = 1469598103934665603ull ^ w->bytes.size();
    size_t words = w->bytes.size() / 8;
    const uint8_t* p = w->bytes.data();
    for (size_t i = 0; i < words; ++i) {
      uint64_t x;
      std::memcpy(&x, p + 8 * i, 8);
      h = (h ^ x) * 1099511628211ull;
      h ^= h >> 29;
    }
    for (size_t i = words * 8; i < w->bytes.size(); ++i)
      h = (h ^ p[i]) * 1099511628211ull;
    for (auto e = hashes_.begin(); e != hashes_.end();)
      e = e->second.first.expired() ? hashes_.erase(e) : std::next(e);
    hashes_[w.get()] = {w, h};
    return h;
  }

  mutable std::mutex mu_;
  std::vector<entry> entries_;
  std::map<const tensor_data*, std::pair<std::weak_ptr<const tensor_data>, uint64_t>> hashes_;
};

/// What compiling a step needs: the engine, and where reordered weights live.
struct dnnl_ctx {
  dnnl::engine eng;
  weight_store* weights = nullptr;
};

/// One argument of a oneDNN call: a view at a byte offset into a value of the
/// pointer table, or fixed memory (reordered weights).
struct dnnl_arg {
  int arg = 0; ///< DNNL_ARG_*
  dnnl::memory::desc md;
  int value = -1; ///< -1: `fixed`
  int64_t offset = 0;
  std::shared_ptr<const dnnl::memory> fixed; ///< shared with weight_store
};

/// One work item of a oneDNN step: a primitive over views of the step's tensors.
/// Primitives use a user scratchpad, so items of one step and steps of plans
/// running on different threads never share oneDNN's internal scratch memory.
struct dnnl_call {
  dnnl::primitive prim;
  std::vector<dnnl_arg> args;
  dnnl::memory::desc scratch;
};

/// How a 4-D NCHW-indexed tensor is stored. Convolution and pooling tensors are
/// kept in oneDNN's formats between those operators: blocked (channel blocks
/// outermost, so that a range of whole blocks is one dense tensor and a
/// convolution splits by output channels) where the channels are a multiple of
/// the block, NHWC otherwise; every other operator reads NCHW. The block is the
/// one oneDNN's fast kernels of this process's ISA read (cpu_level.hpp): 16
/// channels (nChw16c) with AVX-512, 8 (nChw8c) below.
enum class layout : uint8_t { nchw, nhwc, blocked };
using layout_map = std::vector<layout>;

/// What a step's kernel name ends with when oneDNN found no optimised kernel
/// for one of its primitives and runs its reference one (reference_note()).
inline constexpr const char* reference_kernel_note = " (oneDNN reference kernel)";

/// reference_kernel_note when `pd` is oneDNN's reference implementation, else "".
std::string reference_note(const dnnl::primitive_desc_base& pd);

/// Runs `c` with one data handle per argument (fixed arguments ignore theirs).
void run_call(const dnnl::engine& eng, const dnnl_call& c, const void* const* handles);

/// Primitive attributes with a user scratchpad (see dnnl_call).
dnnl::primitive_attr user_scratchpad_attr();

/// How many pieces a step of `work` units splits into for `threads` threads.
int64_t pieces_for(int64_t work, unsigned threads);

/// Splits [0, n) into about `pieces` ranges of whole `unit`s (range starts, then n).
std::vector<int64_t> split_range(int64_t n, int64_t pieces, int64_t unit, unsigned threads = 1);

/// Stores convolution and pooling tensors in oneDNN's layouts (`blocked`
/// false: NHWC only), inserting reorder nodes between layouts; records each
/// node's choice.
layout_map assign_layouts(graph& g, bool blocked = true);

/// The step of one node of each kind (the node's layouts as assign_layouts() chose).
step conv_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads,
               const layout_map& lay, const onnx_model_config& mcfg);
step pool_step(const dnnl_ctx& ctx, const graph& g, const node& n, const layout_map& lay,
               unsigned threads);
/// Whether pool_step() computes pooling node `n` as ONNX does, on a fast
/// kernel. Not an AveragePool with count_include_pad whose ceil_mode windows
/// reach past its end padding: ONNX counts padding only up to the padded
/// edge, oneDNN all of it. Nor a dilated window: oneDNN has only its
/// reference kernel for those. The engine's reference kernel runs both.
bool pool_runs_on_onednn(const graph& g, const node& n);
step reorder_step(const dnnl_ctx& ctx, const graph& g, const node& n, const layout_map& lay);
/// Mul of a 4-D tensor by one value per image and channel, which assign_layouts()
/// left in the tensor's layout (the node has src_layout).
step channel_scale_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads);
step matmul_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads,
                 bool trans_w);

} // namespace caf_serving::onnx
