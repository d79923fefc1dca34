#pragma once
/// Half-precision storage for a CUDA plan (issue 20, "half precision end to
/// end"): the pass that rewrites one planned batch size's optimized graph so
/// that with `precision` fp16 or bf16 every fp32 value between steps is stored
/// in that half type. Host side only (no CUDA here); tested without a GPU.
///
/// Why a pass over the graph, not a storage-type table beside it: every later
/// stage already reads a value's type from `onnx::value::dtype`. The memory
/// plan sizes the arena from it (half the bytes), the step families choose a
/// device step or a host step from it in a dry run exactly as on a device, and
/// the steps pass it to their kernels. One rewrite before the memory plan keeps
/// the three consistent; a side table would have to be consulted at each of them.
///
/// What the pass does, for storage type S (fp16 or bf16):
/// - every non-constant fp32 value that is not a graph input or a declared
///   output becomes S (and a Cast whose output it is now casts to S);
/// - every fp32 constant (weights, folded values) is replaced by its S copy,
///   rounded to nearest even, once: `cache` keeps the copies across the planned
///   sizes, so each weight is converted once at load and deduplicated on upload;
/// - each fp32 graph input gets one StorageCast node (fp32 -> S) first, and each
///   declared fp32 output one StorageCast node (S -> fp32) last: the wire format,
///   the I/O staging slots and the config's declared types do not change;
/// - except a declared fp32 output whose producer writes fp32 itself
///   (writes_fp32_output: a GEMM whose cuBLASLt D is fp32 while its A and W are
///   S): that node keeps writing the output slot, with its constant bias or C in
///   fp32 beside D, and no StorageCast follows it. Its half copy of the output
///   would otherwise sit in the arena: GPT-2's [B, 128, 50257] logits outweigh
///   all its other activations.
/// Integer and bool values (token ids, masks before their Cast, shapes) and
/// values already in a half type are left as they are.
///
/// Usage (graph_plan.cpp, between onnx::optimize and the memory plan):
///
///     auto narrowed = cuda::store_in_half(g, {datatype::fp16, &is_declared_output, &cache});
///     // narrowed[v]: value v was fp32 in the optimized graph and is stored in fp16

#include "core/datatype.hpp"
#include "onnx/ir.hpp"

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace caf_serving::cuda {

/// The engine-internal operator of an edge conversion (fp32 <-> fp16/bf16):
/// its device step is kernels/cuda/convert (kernel name "convert").
inline constexpr const char* storage_cast_op = "StorageCast";

/// Half copies of fp32 constants, by the constant they copy (kept alive, so an
/// address is never reused for another constant while the cache lives).
struct half_constants {
  std::map<const onnx::tensor_data*, std::pair<onnx::constant_ptr, onnx::constant_ptr>> copies;
};

struct storage_config {
  datatype storage = datatype::fp16; ///< fp16 or bf16
  /// Whether graph output `v` is declared by the model's config (lives in an I/O
  /// slot and crosses the wire in fp32); others live in the arena and are narrowed.
  std::function<bool(int)> declared_output;
  half_constants* cache = nullptr; ///< optional: shared across the planned sizes
};

/// Whether `n` (of `g`, before the rewrite: every float value fp32) can write
/// its output 0 in fp32 from A and W (inputs 0 and 1) stored in a half type:
/// FusedMatMul with a constant 2-D W, or FusedGemm over 2-D A, W and output,
/// each with no input besides A and W but constants (a bias or C, kept in fp32
/// for D's epilogue). These are the nodes the GEMM steps (steps_core.cpp,
/// steps_gemm.cpp) take with half A/W and fp32 C/D, as kernel "cublaslt+convert".
bool writes_fp32_output(const onnx::graph& g, const onnx::node& n);

/// Rewrites `g` as above. Returns, per value of the rewritten graph, whether it
/// was fp32 and is now stored in `cfg.storage` (the host fallback widens those
/// back to fp32 for the reference kernels).
std::vector<bool> store_in_half(onnx::graph& g, const storage_config& cfg);

/// `t` (fp32) rounded to `storage` (fp16 or bf16), nearest even; finite values
/// past that type's range saturate to its largest finite value (masks written as
/// x * finfo(float32).min stay finite), infinities and NaN stay as they are.
onnx::constant_ptr half_copy(const onnx::tensor_data& t, datatype storage);

} // namespace caf_serving::cuda
