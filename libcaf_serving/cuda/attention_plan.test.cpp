/// The arithmetic of the CUDA FusedAttention step: mask strides over the scores,
/// the chunks of (batch row, head) pairs that fit the workspace, and the
/// launches, run here on the host (cuBLASLt's strided-batched column-major GEMM
/// and the masked softmax, each by its definition) against FusedAttention's
/// reference kernel. No device.

#include "cuda/attention_plan.hpp"
#include "onnx/op_registry.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <utility>

using namespace caf_serving;
using namespace caf_serving::cuda;

using strides = std::array<int64_t, 4>;

TEST_CASE("half-storage self-attention with head dimension 32, 64 or 128 takes the fused kernel") {
  auto choose = [](attention_kernel_query q) { return choose_attention_kernel(q); };
  const auto fused = attention_kernel::fused, gemm = attention_kernel::gemm_softmax_gemm;
  // BERT-base / GPT-2 (d 64), MiniLM (d 32), a d-128 model, ViT's 197 tokens.
  for (int64_t d : {32, 64, 128}) {
    CAPTURE(d);
    CHECK(choose({true, 32, 12, 128, 128, d}) == fused);
    CHECK(choose({true, 1, 12, 197, 197, d}) == fused);
    CHECK(choose({false, 32, 12, 128, 128, d}) == gemm); // fp32: the kernel is 16-bit only
  }
  for (int64_t d : {16, 80, 96, 256}) {
    CAPTURE(d);
    CHECK(choose({true, 32, 12, 128, 128, d}) == gemm);
  }
  CHECK(choose({true, 2, 4, 16, 24, 64}) == gemm);     // keys of another length
  CHECK(choose({true, 65536, 1, 8, 8, 64}) == gemm);   // past the grid's batch rows
  CHECK(choose({true, 1, 65536, 8, 8, 64}) == gemm);   // past the grid's heads
  CHECK(choose({true, 1, 1, 100000, 100000, 64}) == fused); // no scores to fit anywhere
}

TEST_CASE("an attention mask's shape reads as strides over [B, H, Sq, Sk], 0 where it broadcasts") {
  const std::array<int64_t, 4> scores{2, 12, 16, 16};
  CHECK(attention_mask_strides({2, 1, 1, 16}, scores) == strides{16, 0, 0, 1});   // padding
  CHECK(attention_mask_strides({1, 1, 16, 16}, scores) == strides{0, 0, 16, 1});  // causal
  CHECK(attention_mask_strides({16, 16}, scores) == strides{0, 0, 16, 1});        // causal, 2-D
  CHECK(attention_mask_strides({2, 12, 16, 16}, scores)
        == strides{12 * 256, 256, 16, 1});                                         // full
  CHECK(attention_mask_strides({16}, scores) == strides{0, 0, 0, 1});
  CHECK(attention_mask_strides({1, 12, 1, 16}, scores) == strides{0, 16, 0, 1});
  // Another key length than query length (cross-attention).
  CHECK(attention_mask_strides({2, 1, 1, 7}, {2, 3, 5, 7}) == strides{7, 0, 0, 1});
  // One key: the key stride does not matter.
  CHECK(attention_mask_strides({2, 1, 1, 1}, {2, 3, 5, 1}) == strides{1, 0, 0, 0});
}

TEST_CASE("masks the device step does not read are refused") {
  const std::array<int64_t, 4> scores{2, 12, 16, 16};
  CHECK_FALSE(attention_mask_strides({3, 1, 1, 16}, scores));    // batch neither 2 nor 1
  CHECK_FALSE(attention_mask_strides({2, 1, 1, 8}, scores));     // keys
  CHECK_FALSE(attention_mask_strides({1, 2, 1, 1, 16}, scores)); // rank 5
  CHECK_FALSE(attention_mask_strides({2, 1, 16, 1}, scores));    // constant along the keys
}

namespace {

/// Every (batch row, head) pair exactly once, in memory order, each chunk within
/// `max_pairs`; returns the number of chunks.
size_t check_cover(int64_t batch, int64_t heads, int64_t max_pairs) {
  CAPTURE(batch);
  CAPTURE(heads);
  CAPTURE(max_pairs);
  auto chunks = plan_attention_chunks(batch, heads, max_pairs);
  std::set<std::pair<int64_t, int64_t>> seen;
  int64_t next = 0; // pair index b * heads + h expected next
  int64_t fewest_rows = batch, most_rows = 0, fewest_heads = heads, most_heads = 0;
  for (const auto& c : chunks) {
    CHECK(c.pairs() <= max_pairs);
    CHECK(c.pairs() >= 1);
    CHECK((c.heads == heads || c.batches == 1)); // laid out [batches, heads, ...]
    CHECK(c.batch * heads + c.head == next);
    for (int64_t b = c.batch; b < c.batch + c.batches; ++b)
      for (int64_t h = c.head; h < c.head + c.heads; ++h) CHECK(seen.insert({b, h}).second);
    next += c.pairs();
    fewest_rows = std::min(fewest_rows, c.batches);
    most_rows = std::max(most_rows, c.batches);
    fewest_heads = std::min(fewest_heads, c.heads);
    most_heads = std::max(most_heads, c.heads);
  }
  CHECK(most_rows - fewest_rows <= 1); // balanced
  CHECK(most_heads - fewest_heads <= 1);
  CHECK(next == batch * heads);
  CHECK(seen.size() == static_cast<size_t>(batch * heads));
  return chunks.size();
}

} // namespace

TEST_CASE("the pairs are cut into as few chunks as fit, balanced, each within the budget") {
  // Everything fits: one chunk, its GEMMs batched over the 12 heads of one row.
  CHECK(check_cover(1, 12, 1000) == 1);
  auto one = plan_attention_chunks(1, 12, 1000);
  CHECK_FALSE(one[0].per_head());
  // BERT-base at batch 128: one chunk, one strided call per head over 128 rows.
  CHECK(check_cover(128, 12, 1536) == 1);
  CHECK(plan_attention_chunks(128, 12, 1536)[0].per_head());
  // Whole rows, balanced: 10 rows of 12 heads at 3 rows per chunk -> 4 chunks 3,3,2,2.
  CHECK(check_cover(10, 12, 36) == 4);
  auto rows = plan_attention_chunks(10, 12, 40);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].batches == 3);
  CHECK(rows[3].batches == 2);
  // A row does not fit: its heads in pieces (12 heads at 5 -> 4, 4, 4).
  CHECK(check_cover(2, 12, 5) == 6);
  CHECK(plan_attention_chunks(2, 12, 5)[0].heads == 4);
  CHECK(check_cover(3, 7, 1) == 21);
  for (int64_t b : {1, 2, 7, 64})
    for (int64_t h : {1, 3, 12, 16})
      for (int64_t m : {1, 2, 5, 12, 13, 100, 5000}) check_cover(b, h, m);
  CHECK(plan_attention_chunks(4, 12, 0).empty()); // one pair's scores do not fit
}

namespace {

/// cuBLASLt's strided-batched GEMM by its definition (column-major, element
/// (r, c) of a matrix with leading dimension ld at r + c * ld; beta 0).
void run_gemm(const attention_gemm& g) {
  const auto& s = g.shape;
  for (int64_t i = 0; i < s.count; ++i) {
    const float* a = g.a + i * s.stride_a;
    const float* b = g.b + i * s.stride_b;
    float* c = g.c + i * s.stride_c;
    for (int64_t m = 0; m < s.m; ++m)
      for (int64_t n = 0; n < s.n; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < s.k; ++k)
          acc += double(s.transpose_a ? a[k + m * s.lda] : a[m + k * s.lda]) * b[k + n * s.ldb];
        c[m + n * s.ldc] = static_cast<float>(g.alpha * acc);
      }
  }
}

/// The softmax kernel's contract (kernels/cuda/softmax.hpp with mask_strides): a
/// row whose every element is -inf gives zeros.
void run_softmax(const attention_softmax& sm) {
  for (int64_t r = 0; r < sm.rows; ++r) {
    float* row = sm.scores + r * sm.cols;
    if (sm.mask) {
      int64_t q = r % sm.queries, t = r / sm.queries;
      const float* m = sm.mask + (t / sm.heads) * sm.outer + (t % sm.heads) * sm.head + q * sm.query;
      for (int64_t c = 0; c < sm.cols; ++c) row[c] += m[c];
    }
    float mx = *std::max_element(row, row + sm.cols);
    double sum = 0;
    for (int64_t c = 0; c < sm.cols; ++c) sum += mx == -INFINITY ? 0 : std::exp(double(row[c]) - mx);
    for (int64_t c = 0; c < sm.cols; ++c)
      row[c] = sum > 0 ? static_cast<float>(std::exp(double(row[c]) - mx) / sum) : 0.f;
  }
}

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// FusedAttention's reference kernel (onnx/ops_nn.cpp): Q, K, V of one length.
std::vector<float> reference(int64_t b, int64_t s, int64_t h, int64_t d, float scale,
                             std::vector<float>& q, std::vector<float>& k, std::vector<float>& v,
                             std::vector<float>* mask, const std::vector<int64_t>& mask_shape) {
  onnx::node n{"FusedAttention", "a", {0, 1, 2}, {3}, {}};
  n.set_i("num_heads", h);
  n.set_f("scale", scale);
  n.set_i("nan_to_zero", 1);
  std::vector<onnx::tensor_ref> ins{{datatype::fp32, {b, s, h * d}, q.data()},
                                    {datatype::fp32, {b, s, h * d}, k.data()},
                                    {datatype::fp32, {b, s, h * d}, v.data()}};
  if (mask) {
    n.inputs.push_back(4);
    ins.push_back({datatype::fp32, mask_shape, mask->data()});
  }
  std::vector<float> y(q.size());
  onnx::run_reference(n, ins, {{datatype::fp32, {b, s, h * d}, y.data()}});
  return y;
}

/// The launches for [b, s, h*d] with `mask_shape` (empty: none) and at most
/// `max_pairs` pairs a chunk, run on the host; the largest difference from the
/// reference kernel.
double launches_against_reference(int64_t b, int64_t s, int64_t h, int64_t d,
                                  std::vector<int64_t> mask_shape, int64_t max_pairs) {
  std::mt19937 rng(static_cast<unsigned>(b * 1000 + s * 100 + h * 10 + max_pairs));
  size_t n = static_cast<size_t>(b * s * h * d);
  auto q = random_values(n, rng), k = random_values(n, rng), v = random_values(n, rng);
  std::vector<float> mask;
  attention_operands op{b, s, s, h, d, q.data(), k.data(), v.data()};
  if (!mask_shape.empty()) {
    size_t count = 1;
    for (auto x : mask_shape) count *= static_cast<size_t>(x);
    mask = random_values(count, rng);
    for (size_t i = 0; i < count; i += 3) mask[i] = -INFINITY;
    if (count >= static_cast<size_t>(s)) // the first mask row hides every key
      std::fill(mask.begin(), mask.begin() + s, -INFINITY);
    auto st = attention_mask_strides(mask_shape, {b, h, s, s});
    REQUIRE(st);
    op.mask = mask.data();
    op.mask_strides = *st;
  }
  std::vector<float> out(n, NAN), scores(static_cast<size_t>(max_pairs * s * s), NAN);
  op.out = out.data();
  op.scores = scores.data();
  op.scale = 0.7f;
  auto chunks = plan_attention_chunks(b, h, max_pairs);
  for (const auto& l : plan_attention_launches(op, chunks)) {
    for (const auto& g : l.scores) run_gemm(g);
    run_softmax(l.softmax);
    for (const auto& g : l.output) run_gemm(g);
  }
  auto want = reference(b, s, h, d, 0.7f, q, k, v, mask.empty() ? nullptr : &mask, mask_shape);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::abs(out[i] - want[i])));
  return worst; // NaN (an element never written) compares false below
}

} // namespace

TEST_CASE("the launches compute FusedAttention: every mask shape, chunking and GEMM direction") {
  // max_pairs: everything in one chunk; whole rows per chunk (GEMMs per head over
  // rows when rows >= heads); a row's heads in pieces (GEMMs per row over heads).
  for (int64_t max_pairs : {1, 2, 3, 6, 100})
    for (auto mask : std::vector<std::vector<int64_t>>{
           {}, {3, 1, 1, 5}, {5, 5}, {1, 1, 5, 5}, {3, 2, 5, 5}, {1, 2, 1, 5}}) {
      CAPTURE(max_pairs);
      CAPTURE(mask.size());
      CHECK(launches_against_reference(3, 5, 2, 4, mask, max_pairs) < 1e-5);
    }
  // Rows outnumbering heads (per-head GEMMs over 6 rows), and one head.
  CHECK(launches_against_reference(6, 4, 2, 3, {6, 1, 1, 4}, 12) < 1e-5);
  CHECK(launches_against_reference(6, 4, 2, 3, {6, 1, 1, 4}, 4) < 1e-5);
  CHECK(launches_against_reference(2, 7, 1, 8, {7, 7}, 1) < 1e-5);
}

TEST_CASE("the launches handle keys of another length than the queries") {
  // Q [2, 3, 2*4], K and V [2, 5, 2*4]: against the definition, per pair.
  const int64_t b = 2, sq = 3, sk = 5, h = 2, d = 4, hd = h * d;
  std::mt19937 rng(7);
  auto q = random_values(b * sq * hd, rng), k = random_values(b * sk * hd, rng),
       v = random_values(b * sk * hd, rng), mask = random_values(b * sk, rng);
  mask[1] = -INFINITY;
  for (int64_t max_pairs : {1, 4}) {
    CAPTURE(max_pairs);
    std::vector<float> out(q.size(), NAN), scores(max_pairs * sq * sk, NAN);
    attention_operands op{b, sq, sk, h, d, q.data(), k.data(), v.data(), mask.data(),
                          *attention_mask_strides({b, 1, 1, sk}, {b, h, sq, sk}),
                          out.data(), scores.data(), 0.5f};
    for (const auto& l : plan_attention_launches(op, plan_attention_chunks(b, h, max_pairs))) {
      for (const auto& g : l.scores) run_gemm(g);
      run_softmax(l.softmax);
      for (const auto& g : l.output) run_gemm(g);
    }
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t i = 0; i < sq; ++i) {
          std::vector<double> p(sk);
          double mx = -INFINITY, sum = 0;
          for (int64_t j = 0; j < sk; ++j) {
            double acc = 0;
            for (int64_t e = 0; e < d; ++e)
              acc += double(q[(bi * sq + i) * hd + hi * d + e]) * k[(bi * sk + j) * hd + hi * d + e];
            p[j] = 0.5 * acc + mask[bi * sk + j];
            mx = std::max(mx, p[j]);
          }
          for (auto& x : p) sum += (x = std::exp(x - mx));
          for (int64_t e = 0; e < d; ++e) {
            double o = 0;
            for (int64_t j = 0; j < sk; ++j) o += p[j] / sum * v[(bi * sk + j) * hd + hi * d + e];
            CHECK(std::abs(out[(bi * sq + i) * hd + hi * d + e] - o) < 1e-5);
          }
        }
  }
}

TEST_CASE("half storage plans the same launches in elements: offsets scale by the element size") {
  // The 16-bit instantiation (fp16/bf16 storage) against the float one the cases
  // above check numerically: every operand at the same element offset from its
  // tensor, every shape and stride alike.
  const int64_t b = 3, sq = 4, sk = 6, h = 4, d = 8;
  std::vector<float> f(1 << 12);
  std::vector<uint16_t> u(1 << 12);
  auto fp = [&](size_t at) { return f.data() + at; };
  auto up = [&](size_t at) { return u.data() + at; };
  auto strides = *attention_mask_strides({b, 1, 1, sk}, {b, h, sq, sk});
  attention_operands of{b, sq, sk, h, d, fp(0), fp(100), fp(300), fp(500), strides, fp(600),
                        fp(900), 0.25f};
  basic_attention_operands<uint16_t> oh{b, sq, sk, h, d, up(0), up(100), up(300), up(500),
                                        strides, up(600), up(900), 0.25f};
  for (int64_t max_pairs : {1, 5, 12}) {
    CAPTURE(max_pairs);
    auto chunks = plan_attention_chunks(b, h, max_pairs);
    auto lf = plan_attention_launches(of, chunks);
    auto lh = plan_attention_launches(oh, chunks);
    REQUIRE(lf.size() == lh.size());
    auto same = [&](const auto& x, const auto& y) {
      CHECK(x.shape.key() == y.shape.key());
      CHECK(x.alpha == y.alpha);
      CHECK(x.a - f.data() == y.a - u.data());
      CHECK(x.b - f.data() == y.b - u.data());
      CHECK(x.c - f.data() == y.c - u.data());
    };
    for (size_t i = 0; i < lf.size(); ++i) {
      REQUIRE(lf[i].scores.size() == lh[i].scores.size());
      REQUIRE(lf[i].output.size() == lh[i].output.size());
      for (size_t j = 0; j < lf[i].scores.size(); ++j) same(lf[i].scores[j], lh[i].scores[j]);
      for (size_t j = 0; j < lf[i].output.size(); ++j) same(lf[i].output[j], lh[i].output[j]);
      CHECK(lf[i].softmax.scores - f.data() == lh[i].softmax.scores - u.data());
      CHECK(lf[i].softmax.mask - f.data() == lh[i].softmax.mask - u.data());
      CHECK(lf[i].softmax.rows == lh[i].softmax.rows);
      CHECK(lf[i].softmax.cols == lh[i].softmax.cols);
    }
  }
}
