#include "onnx/ops_contrib.hpp"

#include "core/external_memory.hpp"
#include "onnx/paged_attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

namespace caf_serving::onnx {

namespace {

using namespace ops_internal;
/// onnxruntime registers SimplifiedLayerNormalization (RMSNorm, which T5's optimized models
/// use) in the default ONNX domain, version 1, though ONNX does not define it: it keeps that
/// name in node::op, unprefixed.
constexpr const char* default_domain_rms = "SimplifiedLayerNormalization";

/// The additive mask [B, 1, 1, L] (0 or mask_filter_value) of Attention's mask_index
/// ([B] key lengths or [B, L] 1/0), which lower_contrib_ops() gives FusedAttention; the
/// engine's own operator, never imported (the importer prefixes every contrib op).
constexpr const char* attention_mask_op = "com.microsoft.AttentionMask (engine)";

bool has_in(const node& n, size_t i) {
  return n.inputs.size() > i && n.inputs[i] >= 0;
}

bool has_out(const node& n, size_t i) {
  return n.outputs.size() > i && n.outputs[i] >= 0;
}

// ------------------------------------------------------------------ kernels

/// onnxruntime's FastGelu: the tanh approximation of GELU.
float gelu_tanh(float x) {
  return x * (0.5f + 0.5f * std::tanh(x * (0.7978845608028654f + 0.035677408136300125f * x * x)));
}

/// Reads element `i` of an integer (or bool) tensor as int64.
int64_t int_at(const tensor_ref& t, int64_t i) {
  switch (t.dtype) {
    case datatype::int32: return t.as<int32_t>()[i];
    case datatype::int64: return t.as<int64_t>()[i];
    case datatype::bool_: return t.as<bool>()[i] ? 1 : 0;
    default: return static_cast<int64_t>(t.as<float>()[i]);
  }
}

/// Normalizes each row of `x` (rows x width) into `y`: LayerNorm (mean and
/// variance) or, with `simplified`, RMSNorm (root mean square, no mean); then
/// scale by gamma and add beta. Writes each row's mean and 1/stddev where asked.
void norm_rows(const float* x, int64_t rows, int64_t width, const float* gamma,
               const float* beta, float eps, bool simplified, float* y, float* mean_out,
               float* inv_out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = x + r * width;
    double mean = 0, var = 0;
    if (!simplified) {
      for (int64_t i = 0; i < width; ++i) mean += p[i];
      mean /= static_cast<double>(width);
    }
    for (int64_t i = 0; i < width; ++i) var += (p[i] - mean) * (p[i] - mean);
    var /= static_cast<double>(width);
    double inv = 1.0 / std::sqrt(var + eps);
    float* o = y + r * width;
    for (int64_t i = 0; i < width; ++i)
      o[i] = static_cast<float>((p[i] - mean) * inv) * gamma[i] + (beta ? beta[i] : 0.f);
    if (mean_out)
      mean_out[r] = static_cast<float>(mean);
    if (inv_out)
      inv_out[r] = static_cast<float>(inv);
  }
}

/// Multi-head scaled dot-product attention over projected Q [B, S, N*dk],
/// K [B, L, N*dk], V [B, L, N*dv] into out [B, S, N*dv]. `mask(b, h, i, j)`
/// gives the additive term of each score (0, a mask_filter_value, a bias).
/// Each head's two products run on OpenBLAS, reading the heads in place.
template <class Mask>
void attend(const float* q, const float* k, const float* v, int64_t B, int64_t S, int64_t L,
            int64_t N, int64_t dk, int64_t dv, float scale, Mask mask, float* out) {
  std::vector<float> scores(static_cast<size_t>(S * L));
  const int ldq = static_cast<int>(N * dk), ldv = static_cast<int>(N * dv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < N; ++h) {
      const float* qh = q + b * S * N * dk + h * dk;
      const float* kh = k + b * L * N * dk + h * dk;
      const float* vh = v + b * L * N * dv + h * dv;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(S),
                  static_cast<int>(L), static_cast<int>(dk), scale, qh, ldq, kh, ldq, 0.f,
                  scores.data(), static_cast<int>(L));
      for (int64_t i = 0; i < S; ++i) {
        float* row = scores.data() + i * L;
        float mx = -INFINITY;
        for (int64_t j = 0; j < L; ++j) {
          row[j] += mask(b, h, i, j);
          mx = std::max(mx, row[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < L; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        for (int64_t j = 0; j < L; ++j) row[j] = static_cast<float>(row[j] / sum);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(S),
                  static_cast<int>(dv), static_cast<int>(L), 1.f, scores.data(),
                  static_cast<int>(L), vh, ldv, 0.f, out + b * S * N * dv + h * dv, ldv);
    }
}

/// Attention's and MultiHeadAttention's mask of keys, as onnxruntime reads it:
/// [B] key lengths (keys from the length on are masked), [2B] lengths then
/// starts, [B, L] or [B, S, L] 1 = attend / 0 = masked, [B, 1, M, M] a causal
/// window of which the first S x L corner counts. Masked scores get
/// `filter` (set, not added, so causal and padding do not add up).
struct key_mask {
  const tensor_ref* m = nullptr;
  int64_t B = 0, S = 0, L = 0;
  bool causal = false;
  float filter = -10000.0f;

  bool masked(int64_t b, int64_t i, int64_t j) const {
    if (causal && j > i + (L - S))
      return true;
    if (!m)
      return false;
    const auto& s = m->shape;
    if (s.size() == 1) {
      int64_t end = int_at(*m, b);
      int64_t start = s[0] == 2 * B ? int_at(*m, B + b) : 0;
      return j >= end || j < start;
    }
    if (s.size() == 2)
      return int_at(*m, b * L + j) == 0;
    if (s.size() == 3)
      return int_at(*m, (b * S + i) * L + j) == 0;
    int64_t M = s[3];
    return int_at(*m, (b * M + i) * M + j) == 0; // [B, 1, M, M]
  }
};

/// The additive attention bias [B or 1, N or 1, S, L] at (b, h, i, j), or 0.
float bias_at(const tensor_ref* bias, int64_t b, int64_t h, int64_t i, int64_t j, int64_t S,
              int64_t L) {
  if (!bias)
    return 0.f;
  int64_t bb = bias->shape[0] == 1 ? 0 : b, hh = bias->shape[1] == 1 ? 0 : h;
  return bias->as<float>()[((bb * bias->shape[1] + hh) * S + i) * L + j];
}

/// C[M, N] = alpha * op(A) x op(B) for one pair of row-major matrices, op a
/// transpose or not (OpenBLAS).
void gemm(const float* a, const float* b, float* c, int64_t M, int64_t K, int64_t N, bool ta,
          bool tb, float alpha) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, a,
              static_cast<int>(ta ? M : K), b, static_cast<int>(tb ? K : N), 0.f, c,
              static_cast<int>(N));
}

// ------------------------------------------------------------------ checks

std::string shape_of(const graph& g, const node& n, size_t i) {
  return shape_string(g.values[n.inputs[i]].shape);
}

/// Each present input among `which` is fp32.
std::optional<std::string> need_float(const graph& g, const node& n,
                                      std::initializer_list<size_t> which) {
  for (size_t i : which)
    if (has_in(n, i) && g.values[n.inputs[i]].dtype != datatype::fp32)
      return "input " + std::to_string(i) + " ('" + g.values[n.inputs[i]].name + "') is "
             + std::string(to_string(g.values[n.inputs[i]].dtype))
             + "; the engine runs this operator on FP32 only (export the model in fp32)";
  return std::nullopt;
}

/// Each present input among `which` is an integer (INT32, as onnxruntime wants, or INT64).
std::optional<std::string> need_int(const graph& g, const node& n,
                                    std::initializer_list<size_t> which) {
  for (size_t i : which)
    if (has_in(n, i)) {
      auto t = g.values[n.inputs[i]].dtype;
      if (t != datatype::int32 && t != datatype::int64)
        return "input " + std::to_string(i) + " ('" + g.values[n.inputs[i]].name + "') is "
               + std::string(to_string(t)) + "; it must be INT32";
    }
  return std::nullopt;
}

/// SkipLayerNormalization (`Skip`), SkipSimplifiedLayerNormalization (`Skip`,
/// `Simplified`: RMSNorm) and the default domain's SimplifiedLayerNormalization.
template <bool Skip, bool Simplified>
infer_result infer_layernorms(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]].shape;
  if (x.empty())
    return std::string("input 0 is a scalar; it needs a last axis to normalize");
  int64_t width = x.back();
  constexpr bool skip = Skip;
  if (skip) {
    if (auto e = need_float(g, n, {0, 1, 2, 3, 4}))
      return *e;
    const auto& s = g.values[n.inputs[1]].shape;
    auto b = broadcast_shapes(x, s);
    if (!b || *b != x)
      return "skip " + shape_of(g, n, 1) + " does not broadcast to input " + shape_string(x);
  } else if (auto e = need_float(g, n, {0, 1})) {
    return *e;
  }
  size_t gamma = skip ? 2 : 1;
  std::vector<size_t> vectors{gamma};
  if (skip)
    vectors = Simplified ? std::vector<size_t>{2, 3} : std::vector<size_t>{2, 3, 4};
  for (size_t i : vectors)
    if (has_in(n, i) && g.values[n.inputs[i]].shape != std::vector<int64_t>{width}
        && element_count(g.values[n.inputs[i]].shape) != width)
      return "input " + std::to_string(i) + " has shape " + shape_of(g, n, i)
             + " but the normalized axis has " + std::to_string(width) + " elements";
  if (!skip && n.get_i("axis", -1) != -1 && norm_axis(n.get_i("axis", -1), x.size())
                                                != static_cast<int64_t>(x.size()) - 1)
    return "attribute 'axis' is " + std::to_string(n.get_i("axis", -1))
           + "; the engine normalizes over the last axis only";
  std::vector<int64_t> rows_shape(x.begin(), x.end() - 1);
  rows_shape.push_back(1);
  std::vector<inferred> out{{datatype::fp32, x}};
  if (skip) {
    // output, mean, inv_std_var, input_skip_bias_sum
    out.push_back({datatype::fp32, rows_shape});
    out.push_back({datatype::fp32, rows_shape});
    out.push_back({datatype::fp32, x});
  } else {
    out.push_back({datatype::fp32, rows_shape}); // inv_std_var
  }
  out.resize(std::max<size_t>(1, std::min(out.size(), n.outputs.size())));
  return out;
}

infer_result infer_attention(const graph& g, const node& n) {
  if (auto e = need_float(g, n, {0, 1, 2, 5}))
    return *e;
  if (auto e = need_int(g, n, {3}))
    return *e;
  const auto& x = g.values[n.inputs[0]].shape;
  const auto& w = g.values[n.inputs[1]].shape;
  if (x.size() != 3 || w.size() != 2 || w[0] != x[2])
    return "input " + shape_string(x) + " and weights " + shape_string(w)
           + " are not [batch, sequence, hidden] and [hidden, 3 * hidden]";
  int64_t heads = n.get_i("num_heads", 0);
  auto sizes = n.get_ints("qkv_hidden_sizes", {w[1] / 3, w[1] / 3, w[1] / 3});
  if (heads <= 0 || sizes.size() != 3 || sizes[0] != sizes[1]
      || sizes[0] + sizes[1] + sizes[2] != w[1] || sizes[0] % heads || sizes[2] % heads)
    return "weights " + shape_string(w) + " do not split into Q, K, V of num_heads "
           + std::to_string(heads) + " heads (qkv_hidden_sizes " + shape_string(sizes) + ")";
  if (has_in(n, 2) && element_count(g.values[n.inputs[2]].shape) != w[1])
    return "bias " + shape_of(g, n, 2) + " does not have " + std::to_string(w[1]) + " elements";
  int64_t B = x[0], S = x[1];
  if (has_in(n, 3)) {
    const auto& m = g.values[n.inputs[3]].shape;
    bool ok = (m.size() == 1 && (m[0] == B || m[0] == 2 * B))
              || (m.size() == 2 && m[0] == B && m[1] == S)
              || (m.size() == 3 && m[0] == B && m[1] == S && m[2] == S)
              || (m.size() == 4 && m[0] == B && m[1] == 1 && m[2] == m[3] && m[2] >= S);
    if (!ok)
      return "mask_index " + shape_string(m) + " is none of [batch], [2 * batch], [batch, "
             "sequence], [batch, sequence, sequence], [batch, 1, max, max] for input "
             + shape_string(x);
  }
  if (has_in(n, 5)) {
    const auto& a = g.values[n.inputs[5]].shape;
    if (a.size() != 4 || (a[0] != 1 && a[0] != B) || (a[1] != 1 && a[1] != heads) || a[2] != S
        || a[3] != S)
      return "attention_bias " + shape_string(a) + " is not [batch or 1, num_heads or 1, "
             "sequence, sequence]";
  }
  return std::vector<inferred>{{datatype::fp32, {B, S, sizes[2]}}};
}

infer_result infer_mha(const graph& g, const node& n) {
  if (auto e = need_float(g, n, {0, 1, 2, 3, 5}))
    return *e;
  if (auto e = need_int(g, n, {4}))
    return *e;
  const auto& q = g.values[n.inputs[0]].shape;
  const auto& k = g.values[n.inputs[1]].shape;
  const auto& v = g.values[n.inputs[2]].shape;
  int64_t heads = n.get_i("num_heads", 0);
  if (q.size() != 3 || k.size() != 3 || v.size() != 3 || k[0] != q[0] || v[0] != q[0]
      || k[1] != v[1] || k[2] != q[2] || heads <= 0 || q[2] % heads || v[2] % heads)
    return "query " + shape_string(q) + ", key " + shape_string(k) + ", value " + shape_string(v)
           + " are not [batch, sequence, num_heads * head_size] with num_heads "
           + std::to_string(heads) + " (the engine does not run packed or BNSH key/value)";
  int64_t B = q[0], S = q[1], L = k[1];
  if (has_in(n, 3) && element_count(g.values[n.inputs[3]].shape) != q[2] + k[2] + v[2])
    return "bias " + shape_of(g, n, 3) + " does not have " + std::to_string(q[2] + k[2] + v[2])
           + " elements (query, key and value hidden sizes)";
  if (has_in(n, 4)) {
    const auto& m = g.values[n.inputs[4]].shape;
    bool ok = (m.size() == 1 && (m[0] == B || m[0] == 2 * B))
              || (m.size() == 2 && m[0] == B && m[1] == L)
              || (m.size() == 3 && m[0] == B && m[1] == S && m[2] == L);
    if (!ok)
      return "key_padding_mask " + shape_string(m) + " is none of [batch], [2 * batch], "
             "[batch, kv_sequence], [batch, sequence, kv_sequence]";
  }
  if (has_in(n, 5)) {
    const auto& a = g.values[n.inputs[5]].shape;
    if (a.size() != 4 || (a[0] != 1 && a[0] != B) || (a[1] != 1 && a[1] != heads) || a[2] != S
        || a[3] != L)
      return "attention_bias " + shape_string(a) + " is not [batch or 1, num_heads or 1, "
             "sequence, kv_sequence]";
  }
  return std::vector<inferred>{{datatype::fp32, {B, S, v[2]}}};
}

infer_result infer_embed(const graph& g, const node& n) {
  if (auto e = need_int(g, n, {0, 1, 7, 8}))
    return *e;
  if (auto e = need_float(g, n, {2, 3, 4, 5, 6}))
    return *e;
  const auto& ids = g.values[n.inputs[0]].shape;
  const auto& word = g.values[n.inputs[2]].shape;
  const auto& pos = g.values[n.inputs[3]].shape;
  if (ids.size() != 2 || word.size() != 2 || pos.size() != 2 || pos[1] != word[1])
    return "input_ids " + shape_string(ids) + ", word_embedding " + shape_string(word)
           + ", position_embedding " + shape_string(pos) + " are not [batch, sequence], "
           "[vocab, hidden], [positions, hidden]";
  int64_t H = word[1];
  if (!has_in(n, 8) && pos[0] < ids[1])
    return "position_embedding " + shape_string(pos) + " has fewer rows than the sequence "
           + std::to_string(ids[1]);
  for (size_t i : {1, 7, 8})
    if (has_in(n, i) && g.values[n.inputs[i]].shape != ids
        && !(i == 8 && g.values[n.inputs[i]].shape == std::vector<int64_t>{1, ids[1]}))
      return "input " + std::to_string(i) + " " + shape_of(g, n, i)
             + " does not have input_ids' shape " + shape_string(ids);
  if (has_in(n, 1) != has_in(n, 4))
    return std::string("segment_ids and segment_embedding must be given together");
  if (has_in(n, 4) && g.values[n.inputs[4]].shape.size() != 2)
    return "segment_embedding " + shape_of(g, n, 4) + " is not [segments, hidden]";
  for (size_t i : {5, 6})
    if (element_count(g.values[n.inputs[i]].shape) != H)
      return "input " + std::to_string(i) + " " + shape_of(g, n, i) + " does not have "
             + std::to_string(H) + " elements";
  std::vector<inferred> out{{datatype::fp32, {ids[0], ids[1], H}},
                            {datatype::int32, {ids[0]}},
                            {datatype::fp32, {ids[0], ids[1], H}}};
  out.resize(std::max<size_t>(1, std::min(out.size(), n.outputs.size())));
  return out;
}

// ------------------------------------------------------------------ checks

/// The refusal of attribute `a` of com.microsoft `name` when it is not `ok`.
std::optional<std::string> refuse_attr(const node& n, const char* name, const char* a,
                                       int64_t ok) {
  if (n.get_i(a, ok) == ok)
    return std::nullopt;
  return "attribute '" + std::string(a) + "' is " + std::to_string(n.get_i(a, ok))
         + ", which the engine does not implement for com.microsoft " + name;
}

std::optional<std::string> check_attention(const graph&, const node& n, int64_t) {
  if (has_in(n, 4) || has_in(n, 6) || has_out(n, 1))
    return std::string("Attention with past/present key-value state (a decoder's cache) is "
                       "not implemented; export the model without cache (use_cache=False)");
  for (const char* a : {"do_rotary", "past_present_share_buffer"})
    if (auto e = refuse_attr(n, "Attention", a, 0))
      return *e + "; optimize the model without it";
  return std::nullopt;
}

std::optional<std::string> check_mha(const graph&, const node& n, int64_t) {
  if (!has_in(n, 1) || !has_in(n, 2))
    return std::string("MultiHeadAttention with packed query/key/value (key or value "
                       "omitted) is not implemented; optimize the model with "
                       "disable_packed_qkv/disable_packed_kv");
  for (size_t i = 6; i < n.inputs.size(); ++i)
    if (has_in(n, i))
      return "MultiHeadAttention input " + std::to_string(i) + " (past state or cache "
             "positions) is not implemented; export the model without cache";
  if (has_out(n, 1) || has_out(n, 2) || has_out(n, 3))
    return std::string("MultiHeadAttention's present key/value outputs are not implemented; "
                       "export the model without cache (use_cache=False)");
  return std::nullopt;
}

std::optional<std::string> check_fused_matmul(const graph&, const node& n, int64_t) {
  for (const char* a : {"transBatchA", "transBatchB"})
    if (auto e = refuse_attr(n, "FusedMatMul", a, 0))
      return *e + "; only transA and transB are";
  return std::nullopt;
}

std::optional<std::string> check_embed(const graph&, const node& n, int64_t) {
  if (has_out(n, 1) && n.get_i("mask_index_type", 1) != 1)
    return "attribute 'mask_index_type' is " + std::to_string(n.get_i("mask_index_type", 1))
           + " with the mask_index output used; the engine computes mask_index_type 1 only";
  return std::nullopt;
}

// ------------------------------------------------------------------ inference

std::vector<inferred> one_fp32(std::vector<int64_t> s) {
  return {{datatype::fp32, std::move(s)}};
}

/// Gelu, QuickGelu, FastGelu, BiasGelu: X's shape; B, if given, one vector of
/// X's last axis.
infer_result infer_gelus(const graph& g, const node& n) {
  const auto& x = g.values[n.inputs[0]];
  if (auto e = need_float(g, n, {0, 1}))
    return *e;
  if (has_in(n, 1)) {
    const auto& b = g.values[n.inputs[1]].shape;
    if (b.size() != 1 || x.shape.empty() || b[0] != x.shape.back())
      return "bias " + shape_string(b) + " is not one vector of input's last axis "
             + shape_string(x.shape);
  }
  return one_fp32(x.shape);
}

infer_result infer_fused_matmul(const graph& g, const node& n) {
  if (auto e = need_float(g, n, {0, 1}))
    return *e;
  auto a = g.values[n.inputs[0]].shape, b = g.values[n.inputs[1]].shape;
  if (a.size() < 2 || b.size() < 2)
    return "inputs " + shape_string(a) + " and " + shape_string(b)
           + " must have two axes or more";
  if (n.get_i("transA", 0))
    std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (n.get_i("transB", 0))
    std::swap(b[b.size() - 1], b[b.size() - 2]);
  auto batch = broadcast_shapes({a.begin(), a.end() - 2}, {b.begin(), b.end() - 2});
  if (a.back() != b[b.size() - 2] || !batch)
    return "inputs " + shape_string(a) + " and " + shape_string(b)
           + " (after transA/transB) do not multiply";
  batch->push_back(a[a.size() - 2]);
  batch->push_back(b.back());
  return one_fp32(*batch);
}

infer_result infer_attention_mask(const graph& g, const node& n) {
  return one_fp32({g.values[n.inputs[0]].shape[0], 1, 1, n.get_i("keys", 1)});
}

// ------------------------------------------------------------------ kernels

/// onnxruntime's QuickGelu: x * sigmoid(alpha * x).
float quick_gelu(float v, float alpha) {
  return v / (1.0f + std::exp(-alpha * v));
}

/// FastGelu (the tanh approximation).
float fast_gelu(float v, float) {
  return gelu_tanh(v);
}

/// Gelu and BiasGelu (erf).
float erf_gelu(float v, float) {
  return gelu_erf(v);
}

/// F(X + B, alpha), B (if given) broadcast along the last axis.
template <float (*F)(float, float)>
void run_gelus(const node& n, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  int64_t count = y.elements();
  const float* x = in[0].as<float>();
  const float* b = in.size() > 1 && in[1].data ? in[1].as<float>() : nullptr;
  int64_t nb = b ? in[1].elements() : 1;
  float alpha = n.get_f("alpha", 1.702f);
  float* o = y.as<float>();
  for (int64_t i = 0; i < count; ++i)
    o[i] = F(x[i] + (b ? b[i % nb] : 0.f), alpha);
}

void run_fused_matmul(const node& n, const std::vector<tensor_ref>& in,
                      const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  bool ta = n.get_i("transA", 0) != 0, tb = n.get_i("transB", 0) != 0;
  float alpha = n.get_f("alpha", 1.0f);
  const auto &as = in[0].shape, &bs = in[1].shape;
  int64_t M = y.shape[y.shape.size() - 2], N = y.shape.back();
  int64_t K = ta ? as[as.size() - 2] : as.back();
  shape_t batch(y.shape.begin(), y.shape.end() - 2);
  shape_t abatch(as.begin(), as.end() - 2), bbatch(bs.begin(), bs.end() - 2);
  auto ast = broadcast_strides(abatch, batch), bst = broadcast_strides(bbatch, batch);
  int64_t i = 0;
  broadcast_loop<2>(batch.empty() ? shape_t{1} : batch,
                    batch.empty() ? std::array<shape_t, 2>{shape_t{0}, shape_t{0}}
                                  : std::array<shape_t, 2>{ast, bst},
                    [&](int64_t, const std::array<int64_t, 2>& off) {
                      gemm(in[0].as<float>() + off[0] * M * K,
                           in[1].as<float>() + off[1] * K * N, y.as<float>() + i * M * N, M, K,
                           N, ta, tb, alpha);
                      ++i;
                    });
}

/// The output `i`'s floats, or nullptr when it is omitted.
float* out_data(const std::vector<tensor_ref>& out, size_t i) {
  return out.size() > i && out[i].data ? out[i].as<float>() : nullptr;
}

/// The layer normalizations of infer_layernorms().
template <bool Skip, bool Simplified>
void run_layernorms(const node& n, const std::vector<tensor_ref>& in,
                    const std::vector<tensor_ref>& out) {
  auto has = [&](size_t i) { return in.size() > i && in[i].data != nullptr; };
  constexpr bool skip = Skip, simplified = Simplified;
  const auto& y = out[0];
  int64_t width = in[0].shape.back(), rows = in[0].elements() / std::max<int64_t>(width, 1);
  float eps = n.get_f("epsilon", 1e-5f);
  const float* x = in[0].as<float>();
  std::vector<float> sum;
  if (skip) {
    // input + skip (broadcast) + bias, which output 3 also returns.
    sum.resize(static_cast<size_t>(in[0].elements()));
    int64_t ns = in[1].elements();
    size_t bias_at = simplified ? 3 : 4;
    const float* bias = has(bias_at) ? in[bias_at].as<float>() : nullptr;
    for (int64_t i = 0; i < in[0].elements(); ++i)
      sum[i] = x[i] + in[1].as<float>()[i % ns] + (bias ? bias[i % width] : 0.f);
    x = sum.data();
    if (float* s = out_data(out, 3))
      std::copy(sum.begin(), sum.end(), s);
  }
  const float* gamma = in[skip ? 2 : 1].as<float>();
  const float* beta = !simplified && skip && has(3) ? in[3].as<float>() : nullptr;
  norm_rows(x, rows, width, gamma, beta, eps, simplified, y.as<float>(),
            skip ? out_data(out, 1) : nullptr, skip ? out_data(out, 2) : out_data(out, 1));
}

/// Attention (X, W, B projected here), or MultiHeadAttention (`Mha`: Q, K, V
/// projected already, with a bias).
template <bool Mha>
void run_attention(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  auto has = [&](size_t i) { return in.size() > i && in[i].data != nullptr; };
  constexpr bool mha = Mha;
  const auto& y = out[0];
  int64_t B = in[0].shape[0], S = in[0].shape[1], N = n.get_i("num_heads", 1);
  int64_t L = mha ? in[1].shape[1] : S;
  int64_t qk = mha ? in[0].shape[2] : 0, vh = y.shape[2];
  std::vector<float> q, k, v;
  if (mha) {
    // Inputs already projected; the bias (if any) is added to each.
    const float* bias = has(3) ? in[3].as<float>() : nullptr;
    auto biased = [&](const tensor_ref& t, int64_t offset) {
      std::vector<float> r(t.as<float>(), t.as<float>() + t.elements());
      int64_t w = t.shape.back();
      if (bias)
        for (size_t i = 0; i < r.size(); ++i) r[i] += bias[offset + static_cast<int64_t>(i) % w];
      return r;
    };
    q = biased(in[0], 0);
    k = biased(in[1], qk);
    v = biased(in[2], 2 * qk);
  } else {
    // Project: [B*S, D] x [D, q+k+v] + bias, then split the columns.
    int64_t D = in[0].shape[2], W = in[1].shape[1];
    qk = (W - vh) / 2;
    std::vector<float> qkv(static_cast<size_t>(B * S * W));
    gemm(in[0].as<float>(), in[1].as<float>(), qkv.data(), B * S, D, W, false, false, 1.0f);
    q.resize(B * S * qk);
    k.resize(B * S * qk);
    v.resize(B * S * vh);
    for (int64_t r = 0; r < B * S; ++r)
      for (int64_t c = 0; c < W; ++c) {
        float val = qkv[r * W + c] + (has(2) ? in[2].as<float>()[c] : 0.f);
        if (c < qk)
          q[r * qk + c] = val;
        else if (c < 2 * qk)
          k[r * qk + c - qk] = val;
        else
          v[r * vh + c - 2 * qk] = val;
      }
  }
  int64_t dk = qk / N, dv = vh / N;
  float scale = n.get_f("scale", 0.f);
  if (scale == 0.f)
    scale = 1.0f / std::sqrt(static_cast<float>(dk));
  key_mask km;
  km.m = has(mha ? 4 : 3) ? &in[mha ? 4 : 3] : nullptr;
  km.B = B;
  km.S = S;
  km.L = L;
  km.causal = n.get_i("unidirectional", 0) != 0;
  km.filter = n.get_f("mask_filter_value", -10000.0f);
  const tensor_ref* bias = has(5) ? &in[5] : nullptr;
  attend(q.data(), k.data(), v.data(), B, S, L, N, dk, dv, scale,
         [&](int64_t b, int64_t h, int64_t i, int64_t j) {
           return (km.masked(b, i, j) ? km.filter : 0.f) + bias_at(bias, b, h, i, j, S, L);
         },
         y.as<float>());
}

void run_attention_mask(const node& n, const std::vector<tensor_ref>& in,
                        const std::vector<tensor_ref>& out) {
  const auto& y = out[0];
  key_mask km;
  km.m = &in[0];
  km.B = in[0].shape[0];
  km.L = y.shape[3];
  km.S = km.L;
  float filter = n.get_f("mask_filter_value", -10000.0f);
  for (int64_t b = 0; b < km.B; ++b)
    for (int64_t j = 0; j < km.L; ++j)
      y.as<float>()[b * km.L + j] = km.masked(b, 0, j) ? filter : 0.f;
}

void run_embed(const node& n, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out) {
  auto has = [&](size_t i) { return in.size() > i && in[i].data != nullptr; };
  const auto& y = out[0];
  int64_t B = in[0].shape[0], S = in[0].shape[1], H = in[2].shape[1];
  int64_t V = in[2].shape[0], P = in[3].shape[0], T = has(4) ? in[4].shape[0] : 0;
  std::vector<float> sum(static_cast<size_t>(B * S * H));
  auto clamp = [](int64_t i, int64_t n) { return std::min(std::max<int64_t>(i, 0), n - 1); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      int64_t w = clamp(int_at(in[0], b * S + s), V);
      int64_t p = s;
      if (has(8))
        p = int_at(in[8], in[8].shape[0] == 1 ? s : b * S + s);
      p = clamp(p, P);
      float* o = sum.data() + (b * S + s) * H;
      for (int64_t h = 0; h < H; ++h)
        o[h] = in[2].as<float>()[w * H + h] + in[3].as<float>()[p * H + h];
      if (has(1)) {
        int64_t t = clamp(int_at(in[1], b * S + s), T);
        for (int64_t h = 0; h < H; ++h) o[h] += in[4].as<float>()[t * H + h];
      }
    }
  norm_rows(sum.data(), B * S, H, in[5].as<float>(), in[6].as<float>(),
            n.get_f("epsilon", 1e-12f), false, y.as<float>(), nullptr, nullptr);
  if (out.size() > 1 && out[1].data)
    for (int64_t b = 0; b < B; ++b) {
      // mask_index: the number of ones of each row of the mask (0 without one).
      int32_t c = 0;
      if (has(7))
        for (int64_t s = 0; s < S; ++s) c += int_at(in[7], b * S + s) != 0 ? 1 : 0;
      out[1].as<int32_t>()[b] = c;
    }
  if (float* e = out_data(out, 2))
    std::copy(sum.begin(), sum.end(), e);
}

// ------------------------------------------------------------------ onnxruntime-genai's operators

/// GroupQueryAttention's inputs (onnxruntime's docs/ContribOperators.md).
enum gqa_input : size_t {
  gqa_query, gqa_key, gqa_value, gqa_past_key, gqa_past_value, gqa_seqlens_k,
  gqa_total_length, gqa_cos, gqa_sin, gqa_position_ids, gqa_attention_bias, gqa_head_sink
};

/// The head size of a GroupQueryAttention: query [B, S, N * head], or packed
/// [B, S, (N + 2 * kv_heads) * head] when key and value are omitted.
int64_t gqa_head_size(const node& n, int64_t query_width) {
  int64_t heads = n.get_i("num_heads", 0), kv = n.get_i("kv_num_heads", 0);
  return has_in(n, gqa_key) ? query_width / heads : query_width / (heads + 2 * kv);
}

std::optional<std::string> check_gqa(const graph&, const node& n, int64_t) {
  const char* op = "GroupQueryAttention";
  if (auto e = refuse_attr(n, op, "local_window_size", -1))
    return *e + " (sliding-window attention); export the model without a local window";
  for (const char* a : {"smooth_softmax", "qk_output"})
    if (auto e = refuse_attr(n, op, a, 0))
      return *e;
  if (n.get_f("softcap", 0.f) != 0.f)
    return "attribute 'softcap' is " + std::to_string(n.get_f("softcap", 0.f))
           + ", which the engine does not implement for com.microsoft GroupQueryAttention";
  for (size_t i : {gqa_position_ids, gqa_attention_bias, gqa_head_sink})
    if (has_in(n, i))
      return "input " + std::to_string(i) + " (position_ids, attention_bias or head_sink) of "
             "GroupQueryAttention is not implemented; export the model without it (the "
             "positions follow from seqlens_k)";
  if (has_out(n, 3))
    return std::string("GroupQueryAttention's output_qk is not implemented");
  return std::nullopt;
}

infer_result infer_gqa(const graph& g, const node& n) {
  if (auto e = need_float(g, n, {gqa_query, gqa_key, gqa_value, gqa_past_key, gqa_past_value,
                                 gqa_cos, gqa_sin}))
    return *e;
  if (auto e = need_int(g, n, {gqa_seqlens_k, gqa_total_length}))
    return *e;
  int64_t heads = n.get_i("num_heads", 0), kv = n.get_i("kv_num_heads", 0);
  if (heads <= 0 || kv <= 0 || heads % kv != 0)
    return "num_heads " + std::to_string(heads) + " and kv_num_heads " + std::to_string(kv)
           + " must be positive, num_heads a multiple of kv_num_heads";
  if (!has_in(n, gqa_seqlens_k) || !has_in(n, gqa_total_length))
    return std::string("GroupQueryAttention needs seqlens_k (input 5) and "
                       "total_sequence_length (input 6)");
  const auto& q = g.values[n.inputs[gqa_query]].shape;
  if (q.size() != 3)
    return "query " + shape_of(g, n, gqa_query) + " is not [batch, sequence, hidden]";
  if (has_in(n, gqa_key) != has_in(n, gqa_value))
    return std::string("key and value must be both given or both omitted (packed query)");
  const int64_t B = q[0], S = q[1], head = gqa_head_size(n, q[2]);
  const int64_t width = has_in(n, gqa_key) ? heads * head : (heads + 2 * kv) * head;
  if (head <= 0 || q[2] != width)
    return "query " + shape_of(g, n, gqa_query) + " does not split into "
           + std::to_string(heads) + (has_in(n, gqa_key) ? "" : " + 2 * " + std::to_string(kv))
           + " heads";
  for (size_t i : {gqa_key, gqa_value})
    if (has_in(n, i) && g.values[n.inputs[i]].shape != std::vector<int64_t>{B, S, kv * head})
      return "input " + std::to_string(i) + " " + shape_of(g, n, i) + " is not [" +
             std::to_string(B) + ", " + std::to_string(S) + ", " + std::to_string(kv * head)
             + "]";
  if (has_in(n, gqa_past_key) != has_in(n, gqa_past_value))
    return std::string("past_key and past_value must be both given or both omitted");
  int64_t past = 0;
  if (has_in(n, gqa_past_key)) {
    const auto& pk = g.values[n.inputs[gqa_past_key]].shape;
    if (pk.size() != 4 || pk[0] != B || pk[1] != kv || pk[3] != head
        || g.values[n.inputs[gqa_past_value]].shape != pk)
      return "past_key " + shape_of(g, n, gqa_past_key) + " and past_value "
             + shape_of(g, n, gqa_past_value) + " are not both [" + std::to_string(B) + ", "
             + std::to_string(kv) + ", past, " + std::to_string(head) + "]";
    past = pk[2];
  }
  if (n.get_i("do_rotary", 0) != 0) {
    if (!has_in(n, gqa_cos) || !has_in(n, gqa_sin))
      return std::string("do_rotary is 1 but cos_cache or sin_cache is missing");
    const auto& c = g.values[n.inputs[gqa_cos]].shape;
    if (c.size() != 2 || g.values[n.inputs[gqa_sin]].shape != c || 2 * c[1] > head)
      return "cos_cache " + shape_of(g, n, gqa_cos) + " and sin_cache "
             + shape_of(g, n, gqa_sin) + " are not both [positions, rotary_dim / 2] with "
             "rotary_dim <= head size " + std::to_string(head);
  }
  // The present cache holds max(total_sequence_length, past) positions; where
  // total_sequence_length is not known before the run (the builder computes it from
  // the attention mask's shape, which specialize() folds), it is past + sequence.
  auto total = const_ints(g, n.inputs[gqa_total_length]);
  int64_t present = total.size() == 1 ? std::max(total[0], past) : past + S;
  std::vector<inferred> out{{datatype::fp32, {B, S, heads * head}},
                            {datatype::fp32, {B, kv, present, head}},
                            {datatype::fp32, {B, kv, present, head}}};
  out.resize(std::max<size_t>(1, std::min(out.size(), n.outputs.size())));
  return out;
}

/// Rotates the first `rotary_dim` elements of `x` (one head) in place to `position`,
/// as onnxruntime's RotaryEmbedding: halves (x[i], x[i + rotary_dim / 2]) or, with
/// `interleaved`, neighbours (x[2i], x[2i + 1]) turn by cos/sin[position][i].
void rotate(float* x, int64_t rotary_dim, const float* cos, const float* sin, bool interleaved) {
  const int64_t half = rotary_dim / 2;
  std::vector<float> in(x, x + rotary_dim);
  for (int64_t i = 0; i < rotary_dim; ++i) {
    int64_t c, j;
    float sign;
    if (interleaved) {
      c = i / 2;
      j = i % 2 == 0 ? i + 1 : i - 1;
      sign = i % 2 == 0 ? -1.f : 1.f;
    } else {
      c = i % half;
      j = (i + half) % rotary_dim;
      sign = i < half ? -1.f : 1.f;
    }
    x[i] = in[i] * cos[c] + sign * in[j] * sin[c];
  }
}

/// Replaces each of `n` scores by exp(score - max) and returns their sum (in
/// double): a softmax's numerators and denominator.
double exp_in_place(float* scores, int64_t n, float max) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - max);
    sum += scores[j];
  }
  return sum;
}

/// GroupQueryAttention as onnxruntime computes it on the CPU. Row b's valid past is
/// positions [0, past_b) of past_key/past_value with past_b = seqlens_k[b] + 1 - S
/// (0 for a first prompt, where S equals total_sequence_length); its new keys and
/// values (rotated to positions past_b + j) follow at [past_b, past_b + S) of the
/// present cache, whose other positions are zero; query j attends to present
/// positions [0, past_b + j]. The attention mask itself is never read.
void run_gqa(const node& n, const std::vector<tensor_ref>& in,
             const std::vector<tensor_ref>& out) {
  auto has = [&](size_t i) { return in.size() > i && in[i].data != nullptr; };
  const int64_t B = in[gqa_query].shape[0], S = in[gqa_query].shape[1];
  const int64_t N = n.get_i("num_heads", 1), kv = n.get_i("kv_num_heads", 1);
  const int64_t head = gqa_head_size(n, in[gqa_query].shape[2]);
  const bool packed = !has(gqa_key);
  const int64_t past = has(gqa_past_key) ? in[gqa_past_key].shape[2] : 0;
  const int64_t present = out.size() > 1 && out[1].data ? out[1].shape[2] : past + S;
  const int64_t total = int_at(in[gqa_total_length], 0);
  const bool first_prompt = S == total;
  const float attr_scale = n.get_f("scale", 0.f);
  const float scale = attr_scale != 0.f ? attr_scale : 1.f / std::sqrt(static_cast<float>(head));
  const bool rotary = n.get_i("do_rotary", 0) != 0;
  const bool interleaved = n.get_i("rotary_interleaved", 0) != 0;
  const int64_t rotary_dim = rotary ? 2 * in[gqa_cos].shape[1] : 0;

  // Q [B, S, N, head], K and V [B, S, kv, head], copied out of the packed or separate inputs.
  const int64_t stride = packed ? (N + 2 * kv) * head : 0;
  std::vector<float> q(static_cast<size_t>(B * S * N * head));
  std::vector<float> k(static_cast<size_t>(B * S * kv * head)), v(k.size());
  for (int64_t t = 0; t < B * S; ++t) {
    const float* row = in[gqa_query].as<float>() + t * (packed ? stride : N * head);
    std::copy(row, row + N * head, q.begin() + t * N * head);
    const float* kr = packed ? row + N * head : in[gqa_key].as<float>() + t * kv * head;
    const float* vr = packed ? row + (N + kv) * head : in[gqa_value].as<float>() + t * kv * head;
    std::copy(kr, kr + kv * head, k.begin() + t * kv * head);
    std::copy(vr, vr + kv * head, v.begin() + t * kv * head);
  }
  std::vector<int64_t> past_len(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    int64_t length = int_at(in[gqa_seqlens_k], b) + 1;
    past_len[b] = first_prompt ? 0 : std::clamp<int64_t>(length - S, 0, past);
    if (!rotary)
      continue;
    for (int64_t s = 0; s < S; ++s) {
      // onnxruntime gives a first prompt's padding (past the row's length) position 1.
      int64_t pos = first_prompt ? (s < length ? s : 1) : past_len[b] + s;
      pos = std::clamp<int64_t>(pos, 0, in[gqa_cos].shape[0] - 1);
      const float* c = in[gqa_cos].as<float>() + pos * (rotary_dim / 2);
      const float* sn = in[gqa_sin].as<float>() + pos * (rotary_dim / 2);
      for (int64_t h = 0; h < N; ++h)
        rotate(&q[((b * S + s) * N + h) * head], rotary_dim, c, sn, interleaved);
      for (int64_t h = 0; h < kv; ++h)
        rotate(&k[((b * S + s) * kv + h) * head], rotary_dim, c, sn, interleaved);
    }
  }
  // The present caches [B, kv, present, head].
  std::vector<float> own_k, own_v;
  float* pk = out.size() > 1 && out[1].data ? out[1].as<float>() : nullptr;
  float* pv = out.size() > 2 && out[2].data ? out[2].as<float>() : nullptr;
  const size_t cache = static_cast<size_t>(B * kv * present * head);
  if (!pk) {
    own_k.resize(cache);
    pk = own_k.data();
  }
  if (!pv) {
    own_v.resize(cache);
    pv = own_v.data();
  }
  std::fill(pk, pk + cache, 0.f);
  std::fill(pv, pv + cache, 0.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < kv; ++h) {
      const int64_t base = (b * kv + h) * present * head;
      if (past_len[b] > 0) {
        const int64_t from = (b * kv + h) * past * head;
        std::copy(in[gqa_past_key].as<float>() + from,
                  in[gqa_past_key].as<float>() + from + past_len[b] * head, pk + base);
        std::copy(in[gqa_past_value].as<float>() + from,
                  in[gqa_past_value].as<float>() + from + past_len[b] * head, pv + base);
      }
      for (int64_t s = 0; s < S && past_len[b] + s < present; ++s) {
        const int64_t src = ((b * S + s) * kv + h) * head;
        std::copy(&k[src], &k[src] + head, pk + base + (past_len[b] + s) * head);
        std::copy(&v[src], &v[src] + head, pv + base + (past_len[b] + s) * head);
      }
    }
  // Causal attention of each query head over its key-value head's cache.
  float* y = out[0].as<float>();
  std::vector<float> scores(static_cast<size_t>(present));
  const int64_t group = N / kv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < N; ++h) {
      const float* keys = pk + (b * kv + h / group) * present * head;
      const float* values = pv + (b * kv + h / group) * present * head;
      for (int64_t s = 0; s < S; ++s) {
        const float* qs = &q[((b * S + s) * N + h) * head];
        const int64_t length = std::min(past_len[b] + s + 1, present);
        float mx = -INFINITY;
        for (int64_t j = 0; j < length; ++j) {
          float dot = 0.f;
          for (int64_t d = 0; d < head; ++d) dot += qs[d] * keys[j * head + d];
          scores[j] = dot * scale;
          mx = std::max(mx, scores[j]);
        }
        const double sum = exp_in_place(scores.data(), length, mx);
        float* o = y + (b * S + s) * N * head + h * head;
        std::fill(o, o + head, 0.f);
        for (int64_t j = 0; j < length; ++j) {
          const float p = static_cast<float>(scores[j] / sum);
          for (int64_t d = 0; d < head; ++d) o[d] += p * values[j * head + d];
        }
      }
    }
}

/// PagedGroupQueryAttention's inputs (onnx/paged_attention.hpp).
enum paged_input : size_t {
  paged_query, paged_key, paged_value, paged_table, paged_context, paged_cos, paged_sin
};

infer_result infer_paged_gqa(const graph& g, const node& n) {
  if (auto e = need_float(g, n, {paged_query, paged_key, paged_value, paged_cos, paged_sin}))
    return *e;
  if (auto e = need_int(g, n, {paged_table, paged_context}))
    return *e;
  const int64_t heads = n.get_i("num_heads", 0), kv = n.get_i("kv_num_heads", 0);
  if (heads <= 0 || kv <= 0 || heads % kv != 0)
    return std::string("num_heads and kv_num_heads must be positive, num_heads a multiple "
                       "of kv_num_heads");
  if (n.get_i("block_tokens", 0) <= 0 || n.get_i("kv_pool", 0) <= 0 || n.get_i("layers", 0) <= 0
      || n.get_i("layer", -1) < 0 || n.get_i("layer", -1) >= n.get_i("layers", 0))
    return std::string("block_tokens, kv_pool, layer and layers must name a layer of a cache");
  const auto& q = g.values[n.inputs[paged_query]].shape;
  if (q.size() != 3)
    return "query " + shape_of(g, n, paged_query) + " is not [batch, sequence, hidden]";
  const int64_t B = q[0], S = q[1], head = gqa_head_size(n, q[2]);
  if (head <= 0)
    return "query " + shape_of(g, n, paged_query) + " does not split into heads";
  const auto& table = g.values[n.inputs[paged_table]].shape;
  const auto& context = g.values[n.inputs[paged_context]].shape;
  if (table.size() != 2 || table[0] != B || context != std::vector<int64_t>{B, 1})
    return "kv_block_table " + shape_of(g, n, paged_table) + " and kv_context_lens "
           + shape_of(g, n, paged_context) + " are not [" + std::to_string(B) + ", blocks] and ["
           + std::to_string(B) + ", 1]";
  return std::vector<inferred>{{datatype::fp32, {B, S, heads * head}},
                               {datatype::fp32, {B, kv, S, head}},
                               {datatype::fp32, {B, kv, S, head}}};
}

/// The dot product of `a` and `b` (`n` floats) in four partial sums, which
/// the compiler turns into one vector register's lanes (a plain running sum
/// may not be reordered, so it stays scalar).
float dot4(const float* a, const float* b, int64_t n) {
  float p[4] = {0.f, 0.f, 0.f, 0.f};
  int64_t d = 0;
  for (; d + 4 <= n; d += 4)
    for (int i = 0; i < 4; ++i)
      p[i] += a[d + i] * b[d + i];
  for (; d < n; ++d)
    p[0] += a[d] * b[d];
  return (p[0] + p[1]) + (p[2] + p[3]);
}

/// Per-thread scratch of run_paged_gqa_rows() and paged_row_reference(),
/// grown to the largest row seen: a steady state allocates nothing.
template <class T>
T* grown(std::vector<T>& v, int64_t size) {
  if (static_cast<int64_t>(v.size()) < size)
    v.resize(static_cast<size_t>(size));
  return v.data();
}

} // namespace

void paged_row_reference(const paged_row& r) {
  const int64_t S = r.new_positions, N = r.heads, kv = r.kv_heads, head = r.head_dim;
  const int64_t bt = r.block_tokens, group = N / kv;
  thread_local std::vector<float> score_space;
  thread_local std::vector<const float*> key_space, value_space;
  float* scores = grown(score_space, r.context + S);
  const float** keys = grown(key_space, r.context + S);
  const float** values = grown(value_space, r.context + S);
  for (int64_t hk = 0; hk < kv; ++hk) {
    // Where each position's key and value of this KV head are: the cache, then the new ones.
    for (int64_t j = 0; j < r.context + S; ++j) {
      if (j < r.context) {
        const float* at = r.pool + r.blocks[j / bt] * r.block_floats + (hk * bt + j % bt) * head;
        keys[j] = at + r.key_offset;
        values[j] = at + r.value_offset;
      } else {
        keys[j] = r.new_keys + ((j - r.context) * kv + hk) * head;
        values[j] = r.new_values + ((j - r.context) * kv + hk) * head;
      }
    }
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
      for (int64_t s = 0; s < S; ++s) {
        const float* qs = r.q + (s * N + h) * head;
        const int64_t length = r.context + s + 1;
        float mx = -INFINITY;
        for (int64_t j = 0; j < length; ++j) {
          scores[j] = dot4(qs, keys[j], head) * r.scale;
          mx = std::max(mx, scores[j]);
        }
        const double sum = exp_in_place(scores, length, mx);
        float* o = r.y + (s * N + h) * head;
        std::fill(o, o + head, 0.f);
        for (int64_t j = 0; j < length; ++j) {
          const float p = static_cast<float>(scores[j] / sum);
          const float* value = values[j];
          for (int64_t d = 0; d < head; ++d) o[d] += p * value[d];
        }
      }
  }
}

void run_paged_gqa_rows(const node& n, const std::vector<tensor_ref>& in,
                        const std::vector<tensor_ref>& out, const paged_gqa_rows& rows) {
  const int64_t first = rows.first, last = rows.last;
  const int64_t S = in[paged_query].shape[1];
  const int64_t N = n.get_i("num_heads", 1), kv = n.get_i("kv_num_heads", 1);
  const bool packed = in.size() <= paged_key || in[paged_key].data == nullptr;
  const int64_t head = in[paged_query].shape[2] / (packed ? N + 2 * kv : N);
  const int64_t layer = n.get_i("layer", 0), layers = n.get_i("layers", 1);
  const int64_t block_tokens = n.get_i("block_tokens", 16);
  const int64_t width = in[paged_table].shape[1];
  const float attr_scale = n.get_f("scale", 0.f);
  const float scale = attr_scale != 0.f ? attr_scale : 1.f / std::sqrt(static_cast<float>(head));
  const bool rotary = n.get_i("do_rotary", 0) != 0;
  const bool interleaved = n.get_i("rotary_interleaved", 0) != 0;
  const int64_t rotary_dim = rotary ? 2 * in[paged_cos].shape[1] : 0;
  // One block: [layer][key|value][kv head][position][head] floats.
  const int64_t block_floats = layers * 2 * kv * block_tokens * head;
  const int64_t key_at = layer * 2 * kv * block_tokens * head;
  const int64_t value_at = key_at + kv * block_tokens * head;

  int64_t longest = 0;
  for (int64_t b = first; b < last; ++b) {
    int64_t context = int_at(in[paged_context], b);
    if (context < 0 || context > width * block_tokens)
      throw std::runtime_error("PagedGroupQueryAttention: row " + std::to_string(b) + " has "
                               + std::to_string(context) + " cached positions, more than "
                               "its block table's " + std::to_string(width * block_tokens));
    longest = std::max(longest, context);
  }
  const float* pool = nullptr;
  int64_t blocks = 0;
  if (longest > 0) {
    auto memory = find_external_memory(static_cast<uint64_t>(n.get_i("kv_pool", 0)));
    if (!memory)
      throw std::runtime_error("PagedGroupQueryAttention: no KV cache is bound to its handle");
    pool = memory->base;
    blocks = static_cast<int64_t>(memory->floats) / block_floats;
  }

  // Row b's Q [S, N, head], new K and V [S, kv, head] and block ids.
  const int64_t stride = packed ? (N + 2 * kv) * head : 0;
  thread_local std::vector<float> q_space, k_space, v_space;
  thread_local std::vector<int32_t> block_space;
  float* q = grown(q_space, S * N * head);
  float* k = grown(k_space, S * kv * head);
  float* v = grown(v_space, S * kv * head);
  int32_t* row_blocks = grown(block_space, (longest + block_tokens - 1) / block_tokens);
  for (int64_t b = first; b < last; ++b) {
    const int64_t context = int_at(in[paged_context], b);
    for (int64_t i = 0; i * block_tokens < context; ++i) {
      int64_t block = int_at(in[paged_table], b * width + i);
      if (block < 0 || block >= blocks)
        throw std::runtime_error("PagedGroupQueryAttention: row " + std::to_string(b)
                                 + "'s block " + std::to_string(block) + " is not one of the "
                                 "cache's " + std::to_string(blocks));
      row_blocks[i] = static_cast<int32_t>(block);
    }
    for (int64_t s = 0; s < S; ++s) {
      const int64_t t = b * S + s;
      const float* row = in[paged_query].as<float>() + t * (packed ? stride : N * head);
      std::copy(row, row + N * head, q + s * N * head);
      const float* kr = packed ? row + N * head : in[paged_key].as<float>() + t * kv * head;
      const float* vr =
        packed ? row + (N + kv) * head : in[paged_value].as<float>() + t * kv * head;
      std::copy(kr, kr + kv * head, k + s * kv * head);
      std::copy(vr, vr + kv * head, v + s * kv * head);
      if (!rotary)
        continue;
      int64_t pos = std::clamp<int64_t>(context + s, 0, in[paged_cos].shape[0] - 1);
      const float* c = in[paged_cos].as<float>() + pos * (rotary_dim / 2);
      const float* sn = in[paged_sin].as<float>() + pos * (rotary_dim / 2);
      for (int64_t h = 0; h < N; ++h)
        rotate(&q[(s * N + h) * head], rotary_dim, c, sn, interleaved);
      for (int64_t h = 0; h < kv; ++h)
        rotate(&k[(s * kv + h) * head], rotary_dim, c, sn, interleaved);
    }
    // The new positions, [B, kv, S, head], for the runner to write into the cache.
    for (size_t o : {size_t{1}, size_t{2}})
      if (float* dst = out_data(out, o))
        for (int64_t h = 0; h < kv; ++h)
          for (int64_t s = 0; s < S; ++s) {
            const float* src = (o == 1 ? k : v) + (s * kv + h) * head;
            std::copy(src, src + head, dst + ((b * kv + h) * S + s) * head);
          }
    paged_row r;
    r.q = q;
    r.new_keys = k;
    r.new_values = v;
    r.pool = context > 0 ? pool : nullptr;
    r.blocks = row_blocks;
    r.context = context;
    r.new_positions = S;
    r.heads = N;
    r.kv_heads = kv;
    r.head_dim = head;
    r.block_tokens = block_tokens;
    r.block_floats = block_floats;
    r.key_offset = key_at;
    r.value_offset = value_at;
    r.scale = scale;
    r.y = out[0].as<float>() + b * S * N * head;
    rows.attend(r);
  }
}

namespace {

/// GroupQueryAttention over the cache's blocks (onnx/paged_attention.hpp), all rows.
void run_paged_gqa(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out) {
  run_paged_gqa_rows(n, in, out, 0, in[paged_query].shape[0]);
}

/// MatMulNBits' inputs.
enum nbits_input : size_t { nbits_a, nbits_b, nbits_scales, nbits_zero_points, nbits_g_idx,
                            nbits_bias };

std::optional<std::string> check_matmul_nbits(const graph& g, const node& n, int64_t) {
  if (n.get_i("bits", 4) != 4)
    return "attribute 'bits' is " + std::to_string(n.get_i("bits", 4)) + "; the engine runs "
           "4-bit MatMulNBits only (quantize the model with int4 weights)";
  if (has_in(n, nbits_g_idx))
    return std::string("MatMulNBits' g_idx (act-order, GPTQ's desc_act) is not implemented; "
                       "quantize without act-order");
  int64_t block = n.get_i("block_size", 0);
  if (block < 16 || (block & (block - 1)) != 0)
    return "attribute 'block_size' is " + std::to_string(block)
           + "; it must be a power of two of at least 16";
  if (has_in(n, nbits_zero_points)) {
    auto t = g.values[n.inputs[nbits_zero_points]].dtype;
    if (t != datatype::uint8 && t != datatype::fp32)
      return "zero_points are " + std::string(to_string(t))
             + "; the engine takes packed UINT8 or FP32 (as the scales) zero points";
  }
  return std::nullopt;
}

infer_result infer_matmul_nbits(const graph& g, const node& n) {
  if (auto e = need_float(g, n, {nbits_a, nbits_scales, nbits_bias}))
    return *e;
  const int64_t K = n.get_i("K", 0), N = n.get_i("N", 0), block = n.get_i("block_size", 0);
  if (K <= 0 || N <= 0 || block <= 0)
    return std::string("MatMulNBits needs positive attributes K, N and block_size");
  const auto& a = g.values[n.inputs[nbits_a]].shape;
  if (a.empty() || a.back() != K)
    return "input A " + shape_of(g, n, nbits_a) + " does not end in K = " + std::to_string(K);
  const int64_t blocks = (K + block - 1) / block;
  if (!has_in(n, nbits_b) || g.values[n.inputs[nbits_b]].dtype != datatype::uint8
      || element_count(g.values[n.inputs[nbits_b]].shape) != N * blocks * (block / 2))
    return "input B " + (has_in(n, nbits_b) ? shape_of(g, n, nbits_b) : std::string("(none)"))
           + " is not UINT8 [N, blocks, block_size / 2] = [" + std::to_string(N) + ", "
           + std::to_string(blocks) + ", " + std::to_string(block / 2) + "]";
  if (!has_in(n, nbits_scales) || element_count(g.values[n.inputs[nbits_scales]].shape)
                                     != N * blocks)
    return "scales must hold N * blocks = " + std::to_string(N * blocks) + " values";
  if (has_in(n, nbits_zero_points)) {
    const auto& zp = g.values[n.inputs[nbits_zero_points]];
    int64_t want = zp.dtype == datatype::uint8 ? N * ((blocks + 1) / 2) : N * blocks;
    if (element_count(zp.shape) != want)
      return "zero_points " + shape_of(g, n, nbits_zero_points) + " must hold "
             + std::to_string(want) + " values";
  }
  if (has_in(n, nbits_bias) && element_count(g.values[n.inputs[nbits_bias]].shape) != N)
    return "bias " + shape_of(g, n, nbits_bias) + " must hold N = " + std::to_string(N)
           + " values";
  std::vector<int64_t> y(a.begin(), a.end() - 1);
  y.push_back(N);
  return std::vector<inferred>{{datatype::fp32, y}};
}

/// MatMulNBits' weight dequantized, [N, K] row-major: element k of row n is
/// (q - zero_point) * scale of its block, q the 4-bit value at nibble k % block_size
/// of the block (low nibble first), the zero point 8 when none is given.
std::vector<float> dequantize_nbits(const node& n, const tensor_ref& b, const tensor_ref& scales,
                                    const tensor_ref* zero_points) {
  const int64_t K = n.get_i("K", 0), N = n.get_i("N", 0), block = n.get_i("block_size", 0);
  const int64_t blocks = (K + block - 1) / block, blob = block / 2;
  const bool packed_zp = zero_points && zero_points->dtype == datatype::uint8;
  const int64_t zp_row = (blocks + 1) / 2;
  std::vector<float> w(static_cast<size_t>(N * K));
  const uint8_t* q = b.as<uint8_t>();
  for (int64_t r = 0; r < N; ++r)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const float scale = scales.as<float>()[r * blocks + blk];
      float zp = 8.f;
      if (packed_zp) {
        uint8_t z = zero_points->as<uint8_t>()[r * zp_row + blk / 2];
        zp = static_cast<float>(blk % 2 ? z >> 4 : z & 0x0F);
      } else if (zero_points) {
        zp = zero_points->as<float>()[r * blocks + blk];
      }
      const uint8_t* bytes = q + (r * blocks + blk) * blob;
      for (int64_t t = 0; t < block && blk * block + t < K; ++t) {
        uint8_t nib = t % 2 ? bytes[t / 2] >> 4 : bytes[t / 2] & 0x0F;
        w[r * K + blk * block + t] = (static_cast<float>(nib) - zp) * scale;
      }
    }
  return w;
}

/// MatMulNBits: Y = A x dequantized(B)^T (+ bias), in FP32 whatever accuracy_level
/// asks (level 4 quantizes A to int8 in onnxruntime; the engine does not).
void run_matmul_nbits(const node& n, const std::vector<tensor_ref>& in,
                      const std::vector<tensor_ref>& out) {
  auto has = [&](size_t i) { return in.size() > i && in[i].data != nullptr; };
  const int64_t K = n.get_i("K", 0), N = n.get_i("N", 0), M = in[nbits_a].elements() / K;
  auto w = dequantize_nbits(n, in[nbits_b], in[nbits_scales],
                            has(nbits_zero_points) ? &in[nbits_zero_points] : nullptr);
  float* y = out[0].as<float>();
  gemm(in[nbits_a].as<float>(), w.data(), y, M, K, N, false, true, 1.f);
  if (has(nbits_bias))
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < N; ++c) y[m * N + c] += in[nbits_bias].as<float>()[c];
}

// ------------------------------------------------------------------ lowering

/// Columns [from, from + width) of a constant [rows, cols] matrix (or [cols] vector).
constant_ptr columns(const tensor_data& t, int64_t from, int64_t width) {
  int64_t cols = t.shape.back(), rows = t.elements() / cols;
  auto r = make_tensor(datatype::fp32, t.shape.size() == 1 ? std::vector<int64_t>{width}
                                                            : std::vector<int64_t>{rows, width});
  for (int64_t i = 0; i < rows; ++i)
    std::copy(t.as<float>() + i * cols + from, t.as<float>() + i * cols + from + width,
              r->as_mut<float>() + i * width);
  return r;
}

/// Attention with constant weights and bias, Q, K and V of one size, no causal mask,
/// no attention_bias, and no mask or a [B] (key lengths) or [B, L] mask, as three
/// MatMul + Add (bias) and FusedAttention, so that the epilogue fusion and the
/// engine's attention step run it; false (nothing changed) for any other.
bool lower_attention(graph& g, const node& n, std::vector<node>& out) {
  // Copies: adding values below moves g.values.
  const value w = g.values[n.inputs[1]];
  if (!w.constant || !has_in(n, 2) || !g.values[n.inputs[2]].constant || has_in(n, 5)
      || n.get_i("unidirectional", 0) != 0 || n.has("qkv_hidden_sizes") || w.shape.size() != 2)
    return false;
  int64_t S = g.values[n.inputs[0]].shape[1], H = w.shape[1] / 3;
  if (has_in(n, 3)) {
    const auto& m = g.values[n.inputs[3]].shape;
    int64_t B = g.values[n.inputs[0]].shape[0];
    if (!((m.size() == 1 && m[0] == B) || (m.size() == 2 && m[1] == S)))
      return false;
  }
  const value y = g.values[n.outputs[0]];
  const constant_ptr bias = g.values[n.inputs[2]].constant;
  std::vector<int> qkv;
  for (int part = 0; part < 3; ++part) {
    std::string tag = std::string(1, "qkv"[part]);
    int wv = g.add_constant(n.name + "/w" + tag, columns(*w.constant, part * H, H));
    int bv = g.add_constant(n.name + "/b" + tag,
                            columns(*bias, part * H, H));
    int prod = g.add_value(n.name + "/" + tag + "_matmul", datatype::fp32, y.shape, true);
    int sum = g.add_value(n.name + "/" + tag, datatype::fp32, y.shape, true);
    out.push_back(node{"MatMul", n.name + "/" + tag + "_matmul", {n.inputs[0], wv}, {prod}, {}});
    out.push_back(node{"Add", n.name + "/" + tag + "_bias", {prod, bv}, {sum}, {}});
    qkv.push_back(sum);
  }
  if (has_in(n, 3)) {
    int mask = g.add_value(n.name + "/mask", datatype::fp32, {y.shape[0], 1, 1, S}, true);
    node m{attention_mask_op, n.name + "/mask", {n.inputs[3]}, {mask}, {}};
    m.set_i("keys", S);
    m.set_f("mask_filter_value", n.get_f("mask_filter_value", -10000.0f));
    out.push_back(std::move(m));
    qkv.push_back(mask);
  }
  float scale = n.get_f("scale", 0.f);
  node att{"FusedAttention", n.name + "/attention", qkv, {n.outputs[0]}, {}};
  att.set_i("num_heads", n.get_i("num_heads", 1));
  att.set_f("scale", scale != 0.f ? scale : 1.0f / std::sqrt(static_cast<float>(H / n.get_i("num_heads", 1))));
  out.push_back(std::move(att));
  return true;
}

/// A value like `like`'s, for an intermediate sum of `n`'s lowering.
int temp_like(graph& g, const node& n, int like, const std::string& suffix) {
  auto v = g.values[like];
  return g.add_value(n.name + suffix, v.dtype, v.shape, true);
}

/// Gelu(X) as FusedGelu(X).
bool lower_gelu(graph&, const node& n, std::vector<node>& out) {
  out.push_back(node{"FusedGelu", n.name + "/gelu", {n.inputs[0]}, {n.outputs[0]}, {}});
  return true;
}

/// BiasGelu(X, B) as Add(X, B) and FusedGelu.
bool lower_bias_gelu(graph& g, const node& n, std::vector<node>& out) {
  int sum = temp_like(g, n, n.outputs[0], "/bias");
  out.push_back(node{"Add", n.name + "/add_bias", {n.inputs[0], n.inputs[1]}, {sum}, {}});
  out.push_back(node{"FusedGelu", n.name + "/gelu", {sum}, {n.outputs[0]}, {}});
  return true;
}

/// SkipLayerNormalization without its mean and inv_std_var outputs as Add(X,
/// bias), Add(skip) (the input_skip_bias_sum output) and FusedLayerNorm.
bool lower_skip_layernorm(graph& g, const node& n, std::vector<node>& out) {
  if (has_out(n, 1) || has_out(n, 2))
    return false;
  int x = n.inputs[0];
  if (has_in(n, 4)) {
    int biased = temp_like(g, n, x, "/bias");
    out.push_back(node{"Add", n.name + "/add_bias", {x, n.inputs[4]}, {biased}, {}});
    x = biased;
  }
  int sum = has_out(n, 3) ? n.outputs[3] : temp_like(g, n, n.inputs[0], "/skip");
  out.push_back(node{"Add", n.name + "/add_skip", {x, n.inputs[1]}, {sum}, {}});
  std::vector<int> ins{sum, n.inputs[2]};
  if (has_in(n, 3))
    ins.push_back(n.inputs[3]);
  node ln{"FusedLayerNorm", n.name + "/layernorm", ins, {n.outputs[0]}, {}};
  ln.set_f("epsilon", n.get_f("epsilon", 1e-5f));
  out.push_back(std::move(ln));
  return true;
}

/// How lower_contrib_ops() rewrites a node into the engine's operators
/// (appended to `out`); false: it keeps the node (nothing appended).
using lowering = bool (*)(graph& g, const node& n, std::vector<node>& out);

/// The contrib operators that the engine's own operators compute alike.
const std::map<std::string, lowering>& lowerings() {
  static const std::map<std::string, lowering> all{
    {std::string(contrib_prefix) + "Attention", &lower_attention},
    {std::string(contrib_prefix) + "BiasGelu", &lower_bias_gelu},
    {std::string(contrib_prefix) + "Gelu", &lower_gelu},
    {std::string(contrib_prefix) + "SkipLayerNormalization", &lower_skip_layernorm},
  };
  return all;
}

} // namespace

const op_table& contrib_operator_table() {
  // Version 1 of each: onnxruntime versions the domain as a whole.
  static const op_table ops = [] {
    const op_table bare{
      {"Attention", {1}, &infer_attention, &run_attention<false>, &check_attention},
      {"BiasGelu", {1}, &infer_gelus, &run_gelus<erf_gelu>},
      {"EmbedLayerNormalization", {1}, &infer_embed, &run_embed, &check_embed},
      {"FastGelu", {1}, &infer_gelus, &run_gelus<fast_gelu>},
      {"FusedMatMul", {1}, &infer_fused_matmul, &run_fused_matmul, &check_fused_matmul},
      {"Gelu", {1}, &infer_gelus, &run_gelus<erf_gelu>},
      {"GroupQueryAttention", {1}, &infer_gqa, &run_gqa, &check_gqa},
      {"MatMulNBits", {1}, &infer_matmul_nbits, &run_matmul_nbits, &check_matmul_nbits},
      {"MultiHeadAttention", {1}, &infer_mha, &run_attention<true>, &check_mha},
      {"QuickGelu", {1}, &infer_gelus, &run_gelus<quick_gelu>},
      {"SkipLayerNormalization", {1}, &infer_layernorms<true, false>,
       &run_layernorms<true, false>},
      {"SkipSimplifiedLayerNormalization", {1}, &infer_layernorms<true, true>,
       &run_layernorms<true, true>},
    };
    op_table t;
    for (auto e : bare) {
      e.op = contrib_prefix + e.op;
      t.push_back(std::move(e));
    }
    t.push_back({default_domain_rms, {1}, &infer_layernorms<false, true>,
                 &run_layernorms<false, true>});
    return t;
  }();
  return ops;
}

const op_table& contrib_engine_table() {
  static const op_table ops{
    {attention_mask_op, {}, &infer_attention_mask, &run_attention_mask},
    {paged_gqa_op, {}, &infer_paged_gqa, &run_paged_gqa},
  };
  return ops;
}

void lower_contrib_ops(graph& g) {
  std::vector<node> out;
  out.reserve(g.nodes.size());
  for (auto& n : g.nodes) {
    auto lower = lowerings().find(n.op);
    if (lower == lowerings().end() || !lower->second(g, n, out))
      out.push_back(std::move(n));
  }
  g.nodes = std::move(out);
}

} // namespace caf_serving::onnx
