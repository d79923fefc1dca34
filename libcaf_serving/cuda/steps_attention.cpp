/// FusedAttention(Q, K, V, M?) [num_heads, scale, nan_to_zero] as a device step
/// (onnx/ops_nn.hpp defines it), on one of two paths, chosen by
/// choose_attention_kernel (attention_plan.hpp; the plan names the step):
///
/// - "attention_fused": at fp16/bf16 storage, self-attention (Sq = Sk) with head
///   dimension 32, 64 or 128 runs kernels/cuda/attention, one FlashAttention-style
///   launch over every (batch row, head): Q, K, V and the output read and written
///   in place in [B, S, H*D] (head stride D, row stride H*D), the mask read in
///   place through the strides below (any mask this step takes: [B,1,1,Sk]
///   padding, [Sq,Sk] or [1,1,Sq,Sk] causal, the exports' [B,1,Sq,Sk] causal and/or
///   padding, full [B,H,Sq,Sk]), scores and softmax in fp32 registers, P rounded to
///   the half type before P·V as every fused attention does. No scores in the
///   workspace, so no limit on Sq * Sk. The five target transformers (BERT-base,
///   DistilBERT, MiniLM d32, GPT-2, ViT-B/16) take it at every layer.
/// - "attention": otherwise (fp32, cross-attention, other head dimensions), per
///   (batch row, head) pair, scores = scale * Q_h K_h^T on cuBLASLt,
///   softmax(scores + M) on the engine's softmax kernel, and P_h V_h on cuBLASLt,
///   written straight into the output's [B, Sq, H*D] layout:
///
/// - The GEMMs are strided-batched cuBLASLt calls that read the heads in place
///   (a head is D columns of the [B, S, H*D] rows, leading dimension H*D): one
///   call per head over the chunk's batch rows, or one per batch row over its
///   heads, whichever is fewer (attention_plan.hpp). No pointer arrays, nothing
///   allocated per batch; every descriptor and algorithm is chosen here, at load,
///   so the launches are capturable.
/// - The scores live in the instance's workspace (step_context::workspace,
///   workspace_bytes). Steps run one after another on one stream, so while this
///   step runs it owns the workspace: the first attention_scores_bytes hold the
///   scores of a chunk of pairs, and the last attention_gemm_workspace_bytes are
///   the workspace of its own cuBLASLt calls. The cuBLASLt matmuls and cuDNN
///   convolutions of the other steps use the whole workspace when they run. Pairs
///   whose scores exceed the scores part are processed chunk after chunk
///   (GEMM, softmax, GEMM per chunk).
///
/// On both paths:
/// - The mask is read in place through strides, 0 on its broadcast dimensions.
/// - A row whose mask is -inf throughout gives zeros (the softmax kernel's and the
///   fused kernel's rule), which is nan_to_zero's result; without nan_to_zero the
///   reference kernel gives NaN there (and the CPU backend's softmax finite
///   values): no model the passes write relies on that row. A row with a NaN score
///   (NaN in Q or K) stays NaN here, where nan_to_zero's reference would give zeros.
///
/// Stays on the host (its reference kernel): tensors not all fp32 or all the
/// storage type (mask included); Q, K, V not
/// [B, S, H*D] with H*D divisible by num_heads, K and V of one shape and Q's
/// batch and width; a mask that does not broadcast to [B, H, Sq, Sk] or is
/// constant along the keys; on the cuBLASLt path, one pair's scores larger than
/// the scores part of the workspace (Sq * Sk > ~15.7M at fp32, ~31M at half);
/// and, on a device, no cuBLASLt algorithm for a product (not expected for fp32).
///
/// At precision fp16/bf16 (gpu_options.hpp) Q, K, V, the mask, the output and,
/// on the cuBLASLt path, the scores are stored in that type: the GEMMs take half
/// A/B/C with CUBLAS_COMPUTE_32F (fp32 accumulation), the softmax reads half
/// scores and the half additive mask and computes in fp32, then stores P in the
/// half type, as ONNX Runtime's unfused fp16 attention does.

#include "cuda/steps.hpp"

#include "cuda/attention.hpp"
#include "cuda/attention_plan.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/softmax.hpp"

#include <array>
#include <map>

namespace caf_serving::cuda {

namespace k = caf_serving::kernels;

namespace {

/// The workspace split while an attention step runs (see above).
constexpr size_t attention_gemm_workspace_bytes = size_t{4} << 20;
constexpr size_t attention_scores_bytes = workspace_bytes - attention_gemm_workspace_bytes;

/// What the checks find out about a node the step takes.
struct attention_geometry {
  int64_t batch = 0, q_len = 0, k_len = 0, heads = 0, head_dim = 0, width = 0;
  int mask = -1;
  std::array<int64_t, 4> mask_strides{0, 0, 0, 0};
  std::vector<attention_chunk> chunks;
};

/// The checks that decide device or host (before any dry-run return).
std::optional<attention_geometry> geometry_of(const step_builder& b, const onnx::node& n) {
  auto in = [&](size_t i) { return step_builder::in(n, i); };
  if (in(0) < 0 || in(1) < 0 || in(2) < 0 || step_builder::out(n, 0) < 0) return std::nullopt;
  const auto& qs = b.shape(in(0));
  const auto& ks = b.shape(in(1));
  const auto& vs = b.shape(in(2));
  if (qs.size() != 3 || ks.size() != 3 || ks != vs || ks[0] != qs[0] || ks[2] != qs[2])
    return std::nullopt;
  if (b.shape(step_builder::out(n, 0)) != qs) return std::nullopt;
  attention_geometry a;
  a.batch = qs[0];
  a.q_len = qs[1];
  a.k_len = ks[1];
  a.width = qs[2];
  a.heads = n.get_i("num_heads", 1);
  if (a.batch < 1 || a.q_len < 1 || a.k_len < 1 || a.heads < 1 || a.width % a.heads != 0)
    return std::nullopt;
  a.head_dim = a.width / a.heads;
  if (in(3) >= 0) {
    auto st = attention_mask_strides(b.shape(in(3)), {a.batch, a.heads, a.q_len, a.k_len});
    if (!st) return std::nullopt;
    a.mask = in(3);
    a.mask_strides = *st;
  }
  // On the cuBLASLt path the scores are stored in the tensors' type (fp32, or
  // the half storage type); empty when one pair's scores do not fit.
  int64_t pair_bytes =
    a.q_len * a.k_len * static_cast<int64_t>(element_size(b.g.values[in(0)].dtype));
  a.chunks = plan_attention_chunks(a.batch, a.heads,
                                   static_cast<int64_t>(attention_scores_bytes) / pair_bytes);
  return a;
}

/// The step on kernels/cuda/attention: one launch, Q, K, V, the mask and the
/// output read and written in place ([B, S, H*D]: a head is D columns of rows
/// H*D long). Nothing when an operand is not 16-byte aligned, which cp.async
/// needs (the arena aligns every value to 256 bytes, so not expected).
std::optional<gpu_step> build_fused_attention(step_builder& b, const onnx::node& n,
                                              const attention_geometry& a) {
  const datatype type = b.g.values[step_builder::out(n, 0)].dtype;
  k::attention_args args;
  args.type = kernel_dtype(type);
  args.q = b.ptrs[step_builder::in(n, 0)];
  args.k = b.ptrs[step_builder::in(n, 1)];
  args.v = b.ptrs[step_builder::in(n, 2)];
  args.o = b.ptrs[step_builder::out(n, 0)];
  for (const void* p : {args.q, args.k, args.v, static_cast<const void*>(args.o)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return std::nullopt;
  args.strides = {a.q_len * a.width, a.head_dim, a.width};
  args.batch = static_cast<int>(a.batch);
  args.heads = static_cast<int>(a.heads);
  args.seq = static_cast<int>(a.q_len);
  args.head_dim = static_cast<int>(a.head_dim);
  args.softmax_scale = n.get_f("scale", 1.0f);
  if (a.mask >= 0)
    args.mask = {b.ptrs[a.mask], kernel_dtype(type), a.mask_strides[0], a.mask_strides[1],
                 a.mask_strides[2]};
  return gpu_step{"attention_fused", false,
                  [args](cudaStream_t st) { k::launch_attention(args, st); }};
}

/// A product's cuBLASLt descriptors and algorithm, chosen once.
struct lt_gemm {
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
  cublasLtMatmulAlgo_t algo{};

  lt_gemm() = default;
  lt_gemm(const lt_gemm&) = delete;
  lt_gemm& operator=(const lt_gemm&) = delete;
  ~lt_gemm() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(desc);
  }
};

/// One launch: a product's descriptors over fixed pointers.
struct gemm_call {
  const lt_gemm* gemm = nullptr;
  float alpha = 1.f;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
};

/// The largest power of two (at most 256) dividing the address of every batch of
/// an operand: what cuBLASLt may assume of its alignment.
uint32_t alignment_of(const void* p, int64_t stride_elements, int64_t count, size_t element) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256;
  if (count > 1) bits |= static_cast<uint64_t>(stride_elements) * element;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                                   int64_t count, int64_t stride) {
  cublasLtMatrixLayout_t l{};
  CAF_CUDA_CHECK(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  if (count > 1) {
    auto n = static_cast<int32_t>(count);
    CAF_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n,
                                                    sizeof n));
    CAF_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(
      l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

/// The descriptors and the heuristic's first algorithm for `s` with operands at
/// least `align` bytes aligned (A, B, C); null when cuBLASLt has none.
std::shared_ptr<lt_gemm> make_gemm(step_context& ctx, const lt_data_types& t, const gemm_shape& s,
                                   std::array<uint32_t, 3> align) {
  auto g = std::make_shared<lt_gemm>();
  CAF_CUDA_CHECK(cublasLtMatmulDescCreate(&g->desc, t.compute, t.scale));
  cublasOperation_t ta = s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CAF_CUDA_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                sizeof ta));
  g->a = s.transpose_a ? make_layout(t.inputs, s.k, s.m, s.lda, s.count, s.stride_a)
                       : make_layout(t.inputs, s.m, s.k, s.lda, s.count, s.stride_a);
  g->b = make_layout(t.inputs, s.k, s.n, s.ldb, s.count, s.stride_b);
  g->c = make_layout(t.output, s.m, s.n, s.ldc, s.count, s.stride_c);
  cublasLtMatmulPreference_t pref;
  CAF_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = attention_gemm_workspace_bytes;
  CAF_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  for (auto [attr, bytes] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]}})
    CAF_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  auto status = cublasLtMatmulAlgoGetHeuristic(ctx.lt, g->desc, g->a, g->b, g->c, g->c, pref, 1,
                                               &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return nullptr;
  g->algo = heur.algo;
  return g;
}

/// The work of one chunk of pairs, in launch order.
struct chunk_work {
  std::vector<gemm_call> scores; ///< scale * Q_h K_h^T into the workspace
  k::softmax_args softmax;       ///< in place, with the mask
  std::vector<gemm_call> output; ///< P_h V_h into the output
};

/// The step over tensors of element type T (float, or uint16_t for fp16/bf16).
template <class T>
std::optional<gpu_step> build_attention(step_builder& b, const onnx::node& n,
                                        const attention_geometry& a) {
  const datatype type = b.g.values[step_builder::out(n, 0)].dtype;
  const lt_data_types types = lt_types(type, type, b.ctx->compute);
  basic_attention_operands<T> op;
  op.batch = a.batch;
  op.q_len = a.q_len;
  op.k_len = a.k_len;
  op.heads = a.heads;
  op.head_dim = a.head_dim;
  op.q = static_cast<const T*>(b.ptrs[step_builder::in(n, 0)]);
  op.k = static_cast<const T*>(b.ptrs[step_builder::in(n, 1)]);
  op.v = static_cast<const T*>(b.ptrs[step_builder::in(n, 2)]);
  op.mask = a.mask >= 0 ? static_cast<const T*>(b.ptrs[a.mask]) : nullptr;
  op.mask_strides = a.mask_strides;
  op.out = static_cast<T*>(b.ptrs[step_builder::out(n, 0)]);
  op.scores = static_cast<T*>(b.ctx->workspace);
  op.scale = n.get_f("scale", 1.0f);
  auto launches = plan_attention_launches(op, a.chunks);

  // One set of descriptors per distinct shape, for the alignment every call of
  // that shape guarantees.
  std::map<std::array<int64_t, 11>, std::array<uint32_t, 3>> align;
  for (const auto& l : launches)
    for (const auto* calls : {&l.scores, &l.output})
      for (const auto& c : *calls) {
        std::array<uint32_t, 3> al{alignment_of(c.a, c.shape.stride_a, c.shape.count, sizeof(T)),
                                   alignment_of(c.b, c.shape.stride_b, c.shape.count, sizeof(T)),
                                   alignment_of(c.c, c.shape.stride_c, c.shape.count, sizeof(T))};
        auto [it, fresh] = align.emplace(c.shape.key(), al);
        if (!fresh)
          for (size_t i = 0; i < al.size(); ++i) it->second[i] = std::min(it->second[i], al[i]);
      }
  std::map<std::array<int64_t, 11>, std::shared_ptr<lt_gemm>> gemms;
  for (const auto& l : launches)
    for (const auto* calls : {&l.scores, &l.output})
      for (const auto& c : *calls) {
        auto key = c.shape.key();
        if (gemms.count(key)) continue;
        auto g = make_gemm(*b.ctx, types, c.shape, align.at(key));
        if (!g) return std::nullopt; // no algorithm: the reference kernel on the host
        gemms[key] = g;
        b.ctx->keep.push_back(g);
      }

  auto work = std::make_shared<std::vector<chunk_work>>();
  for (const auto& l : launches) {
    chunk_work w;
    auto bind = [&](const basic_attention_gemm<T>& g) {
      return gemm_call{gemms.at(g.shape.key()).get(), g.alpha, g.a, g.b, g.c};
    };
    for (const auto& g : l.scores) w.scores.push_back(bind(g));
    for (const auto& g : l.output) w.output.push_back(bind(g));
    const auto& sm = l.softmax;
    w.softmax.type = kernel_dtype(type);
    w.softmax.input = sm.scores;
    w.softmax.output = sm.scores;
    w.softmax.rows = static_cast<size_t>(sm.rows);
    w.softmax.cols = static_cast<size_t>(sm.cols);
    if (sm.mask) {
      w.softmax.mask = k::mask_kind::additive;
      w.softmax.mask_type = kernel_dtype(type); // the mask is stored as the scores
      w.softmax.mask_data = sm.mask;
      w.softmax.mask_layout = {static_cast<size_t>(sm.heads), static_cast<size_t>(sm.queries),
                               static_cast<size_t>(sm.outer), static_cast<size_t>(sm.head),
                               static_cast<size_t>(sm.query)};
    }
    work->push_back(w);
  }
  b.ctx->keep.push_back(work);
  auto lt = b.ctx->lt;
  void* gemm_workspace = static_cast<uint8_t*>(b.ctx->workspace) + attention_scores_bytes;
  return gpu_step{"attention", false, [lt, work, gemm_workspace](cudaStream_t st) {
    const float zero = 0.f;
    auto run = [&](const gemm_call& g) {
      CAF_CUDA_CHECK(cublasLtMatmul(lt, g.gemm->desc, &g.alpha, g.a, g.gemm->a, g.b, g.gemm->b,
                                    &zero, g.c, g.gemm->c, g.c, g.gemm->c, &g.gemm->algo,
                                    gemm_workspace, attention_gemm_workspace_bytes, st));
    };
    for (const auto& w : *work) {
      for (const auto& g : w.scores) run(g);
      k::launch_softmax(w.softmax, st);
      for (const auto& g : w.output) run(g);
    }
  }};
}

std::optional<gpu_step> attention_step(step_builder& b, const onnx::node& n) {
  auto geo = geometry_of(b, n);
  if (!geo) return std::nullopt;
  const bool half = b.g.values[step_builder::out(n, 0)].dtype != datatype::fp32;
  auto kernel = choose_attention_kernel(
    {half, geo->batch, geo->heads, geo->q_len, geo->k_len, geo->head_dim});
  if (kernel == attention_kernel::fused) {
    if (b.dry()) return b.planned("attention_fused");
    if (auto fused = build_fused_attention(b, n, *geo)) return fused;
  }
  if (geo->chunks.empty()) return std::nullopt; // one pair's scores exceed the workspace
  if (b.dry()) return b.planned("attention");
  if (!half) return build_attention<float>(b, n, *geo);
  return build_attention<uint16_t>(b, n, *geo);
}

} // namespace

/// FusedAttention on fp32 tensors, or on tensors in the storage type.
std::vector<device_kernel> attention_steps() {
  return {{"FusedAttention", {}, "attention", float_storage(attention_step)}};
}

} // namespace caf_serving::cuda
