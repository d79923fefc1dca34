#include "cuda/attention_plan.hpp"

#include <algorithm>
#include <limits>

namespace caf_serving::cuda {

attention_kernel choose_attention_kernel(const attention_kernel_query& q) {
  constexpr int64_t grid_limit = 65535; // the kernel's grid: y = heads, z = batch rows
  bool fused = q.half_storage && q.q_len == q.k_len
               && (q.head_dim == 32 || q.head_dim == 64 || q.head_dim == 128)
               && q.batch <= grid_limit && q.heads <= grid_limit
               && q.q_len <= std::numeric_limits<int>::max();
  return fused ? attention_kernel::fused : attention_kernel::gemm_softmax_gemm;
}

std::optional<std::array<int64_t, 4>> attention_mask_strides(const std::vector<int64_t>& mask,
                                                             const std::array<int64_t, 4>& scores) {
  if (mask.size() > 4) return std::nullopt;
  std::array<int64_t, 4> full{1, 1, 1, 1};
  std::copy(mask.begin(), mask.end(), full.end() - static_cast<std::ptrdiff_t>(mask.size()));
  std::array<int64_t, 4> st{0, 0, 0, 0};
  int64_t s = 1;
  for (int i = 3; i >= 0; --i) {
    if (full[i] != 1 && full[i] != scores[i]) return std::nullopt;
    st[i] = full[i] == 1 ? 0 : s;
    s *= full[i];
  }
  if (scores[3] > 1 && st[3] != 1) return std::nullopt;
  return st;
}

std::vector<attention_chunk> plan_attention_chunks(int64_t batch, int64_t heads,
                                                   int64_t max_pairs) {
  std::vector<attention_chunk> out;
  if (max_pairs < 1 || batch < 1 || heads < 1) return out;
  // `count` split into `n` parts of sizes differing by at most one, larger first.
  auto part = [](int64_t count, int64_t n, int64_t i) { return count / n + (i < count % n); };
  if (max_pairs >= heads) { // whole batch rows
    int64_t per = max_pairs / heads, n = (batch + per - 1) / per;
    for (int64_t i = 0, b = 0; i < n; b += part(batch, n, i++))
      out.push_back({b, part(batch, n, i), 0, heads});
    return out;
  }
  int64_t n = (heads + max_pairs - 1) / max_pairs;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0, h = 0; i < n; h += part(heads, n, i++))
      out.push_back({b, 1, h, part(heads, n, i)});
  return out;
}

template <class T>
std::vector<basic_attention_launches<T>>
plan_attention_launches(const basic_attention_operands<T>& op,
                        const std::vector<attention_chunk>& chunks) {
  const int64_t sq = op.q_len, sk = op.k_len, d = op.head_dim, hd = op.heads * op.head_dim;
  const int64_t pair = sq * sk;
  std::vector<basic_attention_launches<T>> out;
  for (const auto& c : chunks) {
    basic_attention_launches<T> w;
    // Pairs (bi, hi .. ) or (bi .., hi), `count` of them, the Q/O and K/V operands
    // advancing by `qo_stride` and `kv_stride`, the scores by `scores_stride`.
    auto add = [&](int64_t bi, int64_t hi, int64_t count, int64_t qo_stride, int64_t kv_stride,
                   int64_t scores_stride) {
      T* s = op.scores + ((bi - c.batch) * c.heads + hi - c.head) * pair;
      gemm_shape g1{true, sk, sq, d, hd, hd, sk, count, kv_stride, qo_stride, scores_stride};
      w.scores.push_back({g1, op.scale, op.k + bi * sk * hd + hi * d, op.q + bi * sq * hd + hi * d, s});
      gemm_shape g2{false, d, sq, sk, hd, sk, hd, count, kv_stride, scores_stride, qo_stride};
      w.output.push_back({g2, 1.f, op.v + bi * sk * hd + hi * d, s, op.out + bi * sq * hd + hi * d});
    };
    if (c.per_head()) // one call per head over the chunk's batch rows
      for (int64_t h = c.head; h < c.head + c.heads; ++h)
        add(c.batch, h, c.batches, sq * hd, sk * hd, c.heads * pair);
    else // one call per batch row over the chunk's heads
      for (int64_t bi = c.batch; bi < c.batch + c.batches; ++bi)
        add(bi, c.head, c.heads, d, d, pair);
    auto& sm = w.softmax;
    sm.scores = op.scores;
    sm.rows = c.pairs() * sq;
    sm.cols = sk;
    if (op.mask) {
      const auto& ms = op.mask_strides;
      sm.mask = op.mask + c.batch * ms[0] + c.head * ms[1];
      sm.heads = c.heads;
      sm.queries = sq;
      sm.outer = ms[0];
      sm.head = ms[1];
      sm.query = ms[2];
    }
    out.push_back(std::move(w));
  }
  return out;
}

template std::vector<basic_attention_launches<float>>
plan_attention_launches(const basic_attention_operands<float>&, const std::vector<attention_chunk>&);
template std::vector<basic_attention_launches<uint16_t>>
plan_attention_launches(const basic_attention_operands<uint16_t>&,
                        const std::vector<attention_chunk>&);

} // namespace caf_serving::cuda
