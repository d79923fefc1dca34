#include "check/kernel_cases.hpp"

#include <string>
#include <tuple>

namespace caf_serving::kernels {

const char* op_name(op o) {
  switch (o) {
    case op::epilogue:
      return "epilogue";
    case op::add_layer_norm:
      return "add_layer_norm";
    case op::softmax:
      return "softmax";
    case op::attention:
      return "attention";
    case op::gather:
      return "gather";
    case op::scatter:
      return "scatter";
    case op::convert:
      return "convert";
    case op::softmax_top_k:
      return "softmax_top_k";
    case op::binary:
      return "binary";
    case op::unary:
      return "unary";
    case op::where:
      return "where";
    case op::cast:
      return "cast";
    case op::permute:
      return "permute";
    case op::strided_copy:
      return "strided_copy";
    case op::gather_axis:
      return "gather_axis";
    case op::reduce:
      return "reduce";
  }
  return "?";
}

case_size matrix(std::size_t rows, std::size_t cols) {
  case_size s;
  s.rows = rows;
  s.cols = cols;
  return s;
}

case_size nchw(std::size_t n, std::size_t channels, std::size_t spatial) {
  case_size s = matrix(n, channels);
  s.inner = spatial;
  return s;
}

case_size heads(std::size_t batch, std::size_t heads, std::size_t seq) {
  case_size s;
  s.batch = batch;
  s.heads = heads;
  s.seq = seq;
  return s;
}

case_size top_k(std::size_t rows, std::size_t cols, std::size_t k) {
  case_size s = matrix(rows, cols);
  s.k = k;
  return s;
}

case_size scores(std::size_t batch, std::size_t heads, std::size_t queries, std::size_t keys) {
  case_size s = matrix(batch * heads * queries, keys);
  s.batch = batch;
  s.heads = heads;
  s.seq = queries;
  return s;
}

namespace {

// Tolerances. Inputs are generated already rounded to the case's type, so the
// reference and the kernel see identical inputs; what differs is the kernel's fp32
// arithmetic (fast exp, other summation order) and the final rounding of the output
// to the case's type: half an ulp, 2^-11 relative for fp16 and 2^-8 for bf16.
constexpr tolerance f32_elementwise{1e-5, 1e-5};
constexpr const char* f32_elementwise_why
  = "fp32 output: erff/tanhf and fused multiply-adds differ from the double reference "
    "by a few ulps (~1e-6 relative)";
constexpr tolerance f16_elementwise{1e-3, 1.5e-3};
constexpr const char* f16_elementwise_why
  = "fp16 output: one rounding (<= 4.9e-4 relative) plus a few fp32 ulps; the absolute "
    "term covers results near zero after cancellation with the residual";
constexpr tolerance bf16_elementwise{8e-3, 8e-3};
constexpr const char* bf16_elementwise_why
  = "bf16 output: one rounding (<= 3.9e-3 relative) plus a few fp32 ulps; the absolute "
    "term covers results near zero after cancellation with the residual";

std::vector<case_size> epilogue_sweep() {
  // 1x1 and 3x7 take the scalar path; 17x40 and 129x768 the vector path; 33x1000
  // has cols % 8 == 0 but a ragged count of vectors per block.
  return {matrix(1, 1), matrix(3, 7), matrix(17, 40), matrix(129, 768), matrix(33, 1000)};
}

std::vector<case_size> epilogue_bench() {
  return {matrix(8192, 4096)}; // a large FFN activation: 32M elements
}

std::vector<case_size> norm_sweep() {
  // Up to 1024 columns (% 8 == 0) a warp takes a row with 1 to 4 vectors per lane:
  // 8 (1), 264 (2, ragged), 520 (3, ragged), 768 (3), 1024 (4); 100 and 1027 take
  // the scalar block kernel, 4096 the vector block kernel.
  return {matrix(1, 8),   matrix(7, 100),  matrix(33, 264), matrix(9, 520),
          matrix(64, 768), matrix(6, 1024), matrix(3, 1027), matrix(5, 4096)};
}

std::vector<case_size> softmax_sweep() {
  // Up to 1024 columns a warp takes a row; longer rows take a block. Rows held in
  // registers use 1, 2 or 4 vectors per thread: 128 (1), 512 (2), 1000 (4, ragged);
  // 4096 with 256/128/1024 threads is a block row of 2/4/1 vectors, 5000 a ragged
  // one; 1 and 33 columns take the scalar kernel, 4096 and 5000 with 32 threads the
  // two-pass one.
  return {matrix(1, 1),   matrix(5, 33),   matrix(64, 128), matrix(7, 512),
          matrix(3, 1000), matrix(3, 4096), matrix(2, 5000)};
}

std::vector<case_size> scores_sweep() {
  // Attention scores with a broadcast mask: ragged keys, more keys than queries and
  // fewer (a causal mask then hides the first rows throughout), a warp row (<= 1024
  // keys) and a block row (1500).
  return {scores(1, 1, 1, 1),  scores(2, 3, 5, 7),     scores(2, 2, 9, 4),
          scores(2, 2, 17, 17), scores(3, 2, 9, 40), scores(2, 12, 16, 128),
          scores(1, 2, 3, 1500)};
}

std::vector<case_size> attention_sweep() {
  // Lengths that do and do not divide the 64-row/64-key tiles, up to 512.
  return {heads(1, 1, 1),  heads(2, 3, 17),  heads(1, 2, 64),  heads(2, 2, 100),
          heads(1, 2, 128), heads(1, 1, 257), heads(1, 1, 512)};
}

kernel_case epilogue_case(std::string name, dtype type, activation act, bool bias,
                          bool residual) {
  kernel_case c;
  c.name = std::move(name);
  c.operation = op::epilogue;
  c.type = type;
  c.act = act;
  c.bias = bias;
  c.residual = residual;
  c.tol = type == dtype::f32 ? f32_elementwise
          : type == dtype::f16 ? f16_elementwise
                               : bf16_elementwise;
  c.why = type == dtype::f32 ? f32_elementwise_why
          : type == dtype::f16 ? f16_elementwise_why
                               : bf16_elementwise_why;
  c.sweep = epilogue_sweep();
  return c;
}

kernel_case norm_case(std::string name, dtype type, bool residual) {
  kernel_case c;
  c.name = std::move(name);
  c.operation = op::add_layer_norm;
  c.type = type;
  c.residual = residual;
  // Outputs are O(1) (standardised, gamma in [0.5,1.5], beta in [-0.5,0.5]).
  if (type == dtype::f32) {
    c.tol = {2e-5, 2e-5};
    c.why = "fp32: mean and variance summed in fp32 over up to 4096 elements in another "
            "order than the double reference: ~1e-6 relative, with margin";
  } else if (type == dtype::f16) {
    c.tol = {2e-3, 2e-3};
    c.why = "fp16 output: one rounding of an O(1) value (<= 4.9e-4 relative, up to "
            "~1e-3 absolute near 2-4) plus fp32 statistics";
  } else {
    c.tol = {1.6e-2, 8e-3};
    c.why = "bf16 output: one rounding of an O(1) value (<= 3.9e-3 relative, ~1.6e-2 "
            "absolute near 4) plus fp32 statistics";
  }
  c.sweep = norm_sweep();
  return c;
}

kernel_case softmax_case(std::string name, dtype type, mask_kind mask) {
  kernel_case c;
  c.name = std::move(name);
  c.operation = op::softmax;
  c.type = type;
  c.mask = mask;
  if (type == dtype::f32) {
    c.tol = {1e-6, 2e-5};
    c.why = "fp32: __expf is within ~2 ulps plus 1 ulp per unit of |x|, and the sum "
            "is accumulated in another order: ~1e-5 relative for logits in [-8, 8]";
  } else if (type == dtype::f16) {
    c.tol = {5e-4, 2e-3};
    c.why = "fp16 output in [0,1]: one rounding (<= 2.4e-4 absolute at 0.5-1) plus "
            "the fp32 error above";
  } else {
    c.tol = {4e-3, 8e-3};
    c.why = "bf16 output in [0,1]: one rounding (<= 2e-3 absolute at 0.5-1) plus the "
            "fp32 error above";
  }
  c.sweep = softmax_sweep();
  return c;
}

/// A softmax of `type` with an additive mask stored in the same half type
/// (softmax_args::mask_type). The reference adds the mask values as rounded to
/// that type (-inf stays -inf), so the tolerance is the output's, as above.
kernel_case half_mask(kernel_case c) {
  c.mask_type = c.type;
  c.why += "; the mask stored in the same type, the reference adding its rounded values";
  return c;
}

/// A softmax over attention scores with an additive mask read in place through
/// strides: what the CUDA backend's FusedAttention step runs between its two
/// batched GEMMs (libcaf_serving/cuda/steps_attention.cpp), in fp32 or, at
/// precision fp16/bf16, on half scores (then half_mask: the mask is half too).
kernel_case scores_softmax_case(std::string name, softmax_mask_shape shape,
                                dtype type = dtype::f32) {
  kernel_case c = softmax_case(std::move(name), type, mask_kind::additive);
  c.mask_shape = shape;
  c.sweep = scores_sweep();
  return c;
}

kernel_case attention_case(std::string name, dtype type, int head_dim, bool padded) {
  kernel_case c;
  c.name = std::move(name);
  c.operation = op::attention;
  c.type = type;
  c.head_dim = head_dim;
  c.padded = padded;
  if (type == dtype::f16) {
    c.tol = {2e-3, 1e-2};
    c.why = "fp16: probabilities are rounded to fp16 before P·V (as every fused "
            "attention does), the output once more; outputs are averages of values in "
            "[-1,1], so 2e-3 absolute is ~4 fp16 ulps at 0.5";
  } else {
    c.tol = {1.2e-2, 2e-2};
    c.why = "bf16: probabilities are rounded to bf16 (3.9e-3 relative) before P·V, the "
            "output once more; 1.2e-2 absolute is ~3 bf16 ulps at 0.5";
  }
  c.sweep = attention_sweep();
  return c;
}

/// A fused attention case with an additive mask, laid out as the executor's
/// FusedAttention step launches it ([B, S, H*D], heads interleaved).
kernel_case masked_attention_case(std::string name, dtype type, int head_dim,
                                  attention_mask_shape mask, dtype mask_type) {
  kernel_case c = attention_case(std::move(name), type, head_dim, false);
  c.attention_mask = mask;
  c.attention_mask_type = mask_type;
  c.heads_interleaved = true;
  // The mask is added in fp32 to the fp32 score and the reference gets the same
  // (already rounded) mask values, so the unmasked case's tolerance holds; fully
  // masked rows are exact zeros in both.
  c.why += "; the mask adds no error (added in fp32, the reference has the same values)";
  // Batch rows 0 and 1 (row 1 the fully masked one) of ragged and tiled lengths,
  // three heads so that the interleaved head stride is not the row width.
  c.sweep = {heads(2, 3, 1), heads(2, 3, 17), heads(3, 2, 64), heads(2, 3, 100),
             heads(2, 2, 128), heads(2, 1, 257)};
  return c;
}

kernel_case convert_case(std::string name, dtype from, dtype to) {
  kernel_case c;
  c.name = std::move(name);
  c.operation = op::convert;
  c.type = from;
  c.convert_to = to;
  c.tol = {0, 0};
  c.why = "exact: the host and the device both round to nearest even, bit for bit";
  c.sweep = {matrix(1, 1), matrix(7, 1), matrix(8, 1), matrix(1000, 1), matrix(65539, 1)};
  c.bench = {matrix(std::size_t{1} << 26, 1)}; // 64M elements
  return c;
}

std::vector<kernel_case> build_table() {
  std::vector<kernel_case> t;
  // GEMM/convolution epilogues.
  t.push_back(epilogue_case("epilogue bias+gelu_erf+residual f32", dtype::f32,
                            activation::gelu_erf, true, true));
  t.push_back(epilogue_case("epilogue bias+gelu_erf+residual f16", dtype::f16,
                            activation::gelu_erf, true, true));
  t.back().bench = epilogue_bench();
  t.push_back(epilogue_case("epilogue bias+gelu_erf+residual bf16", dtype::bf16,
                            activation::gelu_erf, true, true));
  t.back().bench = epilogue_bench();
  t.push_back(epilogue_case("epilogue bias+gelu_tanh f16", dtype::f16,
                            activation::gelu_tanh, true, false));
  t.push_back(epilogue_case("epilogue bias+relu bf16", dtype::bf16, activation::relu, true,
                            false));
  t.push_back(epilogue_case("epilogue residual f32", dtype::f32, activation::none, false,
                            true));
  t.back().bench = epilogue_bench();
  {
    auto conv = epilogue_case("epilogue NCHW bias+relu+residual f16", dtype::f16,
                              activation::relu, true, true);
    // Per-channel bias over H*W: 49 (7x7, scalar path) and 56*56 (vector path).
    conv.sweep = {nchw(2, 5, 49), nchw(3, 16, 3136), nchw(1, 3, 1)};
    conv.bench = {nchw(32, 256, 56 * 56)};
    t.push_back(conv);
  }
  // Every other activation the engine fuses into FusedConv/FusedMatMul/FusedGemm, in
  // each datatype once, with parameters whose thresholds fall inside the inputs'
  // range (x + bias in [-4, 4]), so both sides of every clamp are checked.
  {
    struct act_case {
      const char* name;
      activation act;
      activation_params params;
      dtype type;
    };
    const act_case acts[] = {
      {"tanh", activation::tanh, {}, dtype::f32},
      {"sigmoid", activation::sigmoid, {}, dtype::f16},
      {"clip(-1,2)", activation::clip, {-1.0f, 2.0f}, dtype::f32},
      {"hard_swish", activation::hard_swish, {1.0f / 6, 0.5f}, dtype::f32},
      {"hard_swish", activation::hard_swish, {1.0f / 6, 0.5f}, dtype::bf16},
      {"hard_sigmoid", activation::hard_sigmoid, {0.2f, 0.5f}, dtype::f32},
      {"swish(1)", activation::swish, {1.0f, 0.0f}, dtype::f32},
      {"swish(1)", activation::swish, {1.0f, 0.0f}, dtype::f16},
      {"swish(1.702)", activation::swish, {1.702f, 0.0f}, dtype::bf16},
      {"leaky_relu(0.1)", activation::leaky_relu, {0.1f, 0.0f}, dtype::f32},
    };
    for (const auto& a : acts) {
      auto c = epilogue_case(std::string("epilogue bias+") + a.name + " " + dtype_name(a.type),
                             a.type, a.act, true, false);
      c.act_params = a.params;
      // EfficientNet's SiLU and MobileNetV3's hard-swish, at the size the GELU
      // epilogues are timed at: the extra arithmetic should cost no bandwidth.
      if ((a.act == activation::swish && a.type == dtype::f16)
          || (a.act == activation::hard_swish && a.type == dtype::bf16))
        c.bench = epilogue_bench();
      t.push_back(c);
    }
    // FusedConv's order: the residual before the activation, over NCHW channels.
    for (auto [act, params, name] :
         {std::tuple{activation::swish, activation_params{1.0f, 0.0f}, "swish"},
          std::tuple{activation::clip, activation_params{0.0f, 2.0f}, "clip(0,2)"}}) {
      auto c = epilogue_case(std::string("epilogue NCHW bias+residual+") + name + " f32",
                             dtype::f32, act, true, true);
      c.act_params = params;
      c.residual_first = true;
      c.sweep = {nchw(2, 5, 49), nchw(3, 16, 3136), nchw(1, 3, 1)};
      t.push_back(c);
    }
  }
  // Residual add + LayerNorm.
  t.push_back(norm_case("add_layer_norm f32", dtype::f32, true));
  t.push_back(norm_case("add_layer_norm f16", dtype::f16, true));
  t.back().bench = {matrix(16384, 4096), matrix(65536, 768)};
  t.push_back(norm_case("add_layer_norm bf16", dtype::bf16, true));
  t.back().bench = {matrix(16384, 4096)};
  t.push_back(norm_case("layer_norm f16", dtype::f16, false));
  // Row softmax.
  t.push_back(softmax_case("softmax f32", dtype::f32, mask_kind::none));
  t.push_back(softmax_case("softmax additive mask f16", dtype::f16, mask_kind::additive));
  t.push_back(softmax_case("softmax boolean mask bf16", dtype::bf16, mask_kind::boolean));
  t.push_back(softmax_case("softmax f16", dtype::f16, mask_kind::none));
  t.back().bench = {matrix(65536, 512), matrix(8192, 4096)};
  t.push_back(scores_softmax_case("softmax padding mask f32", softmax_mask_shape::padding));
  t.back().bench = {scores(32, 12, 128, 128)}; // BERT-base, seq 128, batch 32
  t.push_back(scores_softmax_case("softmax causal mask f32", softmax_mask_shape::causal));
  t.push_back(scores_softmax_case("softmax full mask f32", softmax_mask_shape::full));
  // Half masks (mask_type = type): the attention step's at precision fp16/bf16.
  t.push_back(half_mask(
    softmax_case("softmax additive f16 mask f16", dtype::f16, mask_kind::additive)));
  t.push_back(half_mask(
    softmax_case("softmax additive bf16 mask bf16", dtype::bf16, mask_kind::additive)));
  t.push_back(half_mask(scores_softmax_case("softmax padding f16 mask f16",
                                            softmax_mask_shape::padding, dtype::f16)));
  t.push_back(half_mask(scores_softmax_case("softmax causal bf16 mask bf16",
                                            softmax_mask_shape::causal, dtype::bf16)));
  // Fused attention. The bench sizes are the 2x-over-unfused targets: seq 128, 512.
  t.push_back(attention_case("attention d64 f16", dtype::f16, 64, false));
  t.back().bench = {heads(64, 16, 128), heads(16, 16, 512)};
  t.push_back(attention_case("attention d128 f16", dtype::f16, 128, false));
  t.back().bench = {heads(64, 16, 128), heads(16, 16, 512)};
  t.push_back(attention_case("attention d64 bf16", dtype::bf16, 64, false));
  t.back().bench = {heads(16, 16, 512)};
  t.push_back(attention_case("attention d128 bf16", dtype::bf16, 128, false));
  t.push_back(attention_case("attention d64 padded f16", dtype::f16, 64, true));
  t.push_back(attention_case("attention d128 padded bf16", dtype::bf16, 128, true));
  // Fused attention with the graphs' additive masks (issue 20): BERT/DistilBERT/MiniLM
  // padding (MiniLM's head dimension is 32), GPT-2's causal-and-padding [B,1,S,S],
  // a constant causal [S,S], a per-head mask; the mask stored as Q, K, V (half
  // storage) or in f32.
  using ams = attention_mask_shape;
  t.push_back(masked_attention_case("attention d64 padding mask f16", dtype::f16, 64,
                                    ams::padding, dtype::f16));
  t.back().bench = {heads(32, 12, 128)}; // BERT-base, batch 32
  t.push_back(masked_attention_case("attention d64 padding mask bf16", dtype::bf16, 64,
                                    ams::padding, dtype::bf16));
  t.push_back(masked_attention_case("attention d32 padding mask f16", dtype::f16, 32,
                                    ams::padding, dtype::f16));
  t.push_back(masked_attention_case("attention d32 padding mask bf16", dtype::bf16, 32,
                                    ams::padding, dtype::bf16));
  t.push_back(masked_attention_case("attention d64 causal+padding mask f16", dtype::f16, 64,
                                    ams::padding_causal, dtype::f16));
  t.back().bench = {heads(32, 12, 128)}; // GPT-2 small, batch 32
  t.push_back(masked_attention_case("attention d64 causal+padding mask bf16", dtype::bf16, 64,
                                    ams::padding_causal, dtype::bf16));
  t.push_back(masked_attention_case("attention d128 causal+padding f32 mask bf16", dtype::bf16,
                                    128, ams::padding_causal, dtype::f32));
  t.push_back(masked_attention_case("attention d64 causal mask f32 mask f16", dtype::f16, 64,
                                    ams::causal, dtype::f32));
  t.push_back(masked_attention_case("attention d128 per-head mask f16", dtype::f16, 128,
                                    ams::per_head, dtype::f16));
  t.push_back(masked_attention_case("attention d32 per-head mask bf16", dtype::bf16, 32,
                                    ams::per_head, dtype::bf16));
  // Serving edges.
  for (op o : {op::gather, op::scatter}) {
    kernel_case c;
    c.name = o == op::gather ? "gather" : "scatter";
    c.operation = o;
    c.tol = {0, 0};
    c.why = "exact: a copy";
    // Requests of 1 byte, ragged sizes (no 16-byte vector fits evenly), 64 KB.
    c.sweep = {matrix(1, 1), matrix(3, 100), matrix(16, 4099), matrix(7, 65536)};
    c.bench = {matrix(64, std::size_t{4} << 20)}; // 64 requests of up to 4 MiB
    t.push_back(c);
  }
  t.push_back(convert_case("convert f32->f16", dtype::f32, dtype::f16));
  t.push_back(convert_case("convert f32->bf16", dtype::f32, dtype::bf16));
  t.push_back(convert_case("convert f16->f32", dtype::f16, dtype::f32));
  t.push_back(convert_case("convert bf16->f32", dtype::bf16, dtype::f32));
  {
    kernel_case c;
    c.name = "softmax_top_k f32";
    c.operation = op::softmax_top_k;
    c.tol = {1e-7, 2e-5};
    c.why = "indices exact; probabilities as fp32 softmax (__expf, another summation "
            "order: ~1e-5 relative)";
    c.sweep = {top_k(1, 1, 1), top_k(4, 10, 3), top_k(16, 1000, 5), top_k(2, 32000, 10),
               top_k(3, 70, 64)};
    c.bench = {top_k(4096, 1000, 5)};
    t.push_back(c);
  }
  add_elementwise_cases(t);
  append_data_cases(t);
  return t;
}

} // namespace

const std::vector<kernel_case>& kernel_cases() {
  static const std::vector<kernel_case> table = build_table();
  return table;
}

} // namespace caf_serving::kernels
