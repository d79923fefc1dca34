/// The CUDA backend's FusedAttention step (libcaf_serving/cuda/steps_attention.cpp)
/// on its own, at the sizes the fixtures do not reach. At fp32 (cuBLASLt-softmax-
/// cuBLASLt): BERT-base's heads (64
/// columns, 12 heads, 128 tokens) at batch 1 (GEMMs per batch row over the
/// heads) and 16 (per head over the rows), a causal mask, a full mask with a
/// row masked throughout, keys of another length than the queries, and scores
/// larger than the workspace's scores part, cut into chunks of whole rows and of
/// one row's heads. Each runs directly against FusedAttention's reference kernel
/// (fp32 tolerance 1e-4 relative to the output's norm, as cuda_backend.test.cpp:
/// both products run CUBLAS_COMPUTE_32F), then captured into a CUDA graph and
/// replayed over a poisoned output, which must give the same bytes. At fp16 and
/// bf16 storage (the fused kernel, kernels/cuda/attention): BERT-base with its
/// [B,1,1,S] padding mask, BERT/GPT-2's exported [B,1,S,S] mask (causal and left
/// padding, rows masked throughout), a constant causal [S,S], MiniLM's 32-column
/// heads, ViT's 197 unmasked tokens, and cross-attention on the cuBLASLt path;
/// the reference runs on the half-rounded inputs. Part of gpu.cuda_backend.test
/// (its main skips without a device).

#include "cpu/half.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/steps.hpp"
#include "onnx/op_registry.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace caf_serving;
using namespace caf_serving::cuda;

namespace {

struct attention_size {
  int64_t batch = 1, q_len = 1, k_len = 1, heads = 1, head_dim = 1;
  std::vector<int64_t> mask; ///< empty: none
  datatype storage = datatype::fp32; ///< every tensor's type and the instance's storage
  const char* kernel = "attention";  ///< the step the plan must choose
};

/// Host floats in `t` (fp32, fp16 or bf16) and back; round() is the round trip.
std::vector<uint8_t> encode(datatype t, const std::vector<float>& x) {
  namespace k = caf_serving::kernels;
  std::vector<uint8_t> out(x.size() * element_size(t));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == datatype::fp32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      uint16_t bits = t == datatype::fp16 ? k::to_fp16(x[i]).bits : k::to_bf16(x[i]).bits;
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}
std::vector<float> decode(datatype t, const std::vector<uint8_t>& bytes) {
  namespace k = caf_serving::kernels;
  std::vector<float> out(bytes.size() / element_size(t));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == datatype::fp32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      out[i] = t == datatype::fp16 ? k::to_float(k::fp16_bits{bits}) : k::to_float(k::bf16_bits{bits});
    }
  }
  return out;
}

/// FusedAttention by its definition in double, for keys of another length than
/// the queries (the reference kernel takes one length).
std::vector<float> by_definition(const attention_size& s, const std::vector<float>& q,
                                 const std::vector<float>& k, const std::vector<float>& v,
                                 const std::vector<float>& m, float scale) {
  const int64_t hd = s.heads * s.head_dim, d = s.head_dim;
  std::vector<float> out(q.size());
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.q_len; ++i) {
        std::vector<double> p(s.k_len);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < s.k_len; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d; ++e)
            acc += double(q[(b * s.q_len + i) * hd + h * d + e]) * k[(b * s.k_len + j) * hd + h * d + e];
          p[j] = scale * acc + (m.empty() ? 0.0 : m[b * s.k_len + j]); // [B,1,1,Sk] only
          mx = std::max(mx, p[j]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < d; ++e) {
          double o = 0;
          for (int64_t j = 0; j < s.k_len; ++j) o += p[j] / sum * v[(b * s.k_len + j) * hd + h * d + e];
          out[(b * s.q_len + i) * hd + h * d + e] = static_cast<float>(o);
        }
      }
  return out;
}

struct device_buffer {
  void* p = nullptr;
  explicit device_buffer(size_t bytes) { CAF_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1))); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(p); }
};

void run_case(const attention_size& s) {
  CAPTURE(s.batch);
  CAPTURE(s.q_len);
  CAPTURE(s.k_len);
  CAPTURE(s.heads);
  CAPTURE(s.head_dim);
  CAPTURE(s.mask.size());
  const std::string storage(to_string(s.storage));
  CAPTURE(storage);
  const int64_t hd = s.heads * s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  std::mt19937 rng(static_cast<unsigned>(s.batch * 7919 + s.q_len * 31 + s.k_len));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto round = [&](const std::vector<float>& x) { return decode(s.storage, encode(s.storage, x)); };
  auto random = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = dist(rng);
    return round(x);
  };
  auto q = random(s.batch * s.q_len * hd), k = random(s.batch * s.k_len * hd),
       v = random(s.batch * s.k_len * hd);
  std::vector<float> mask;
  if (!s.mask.empty()) {
    size_t n = 1;
    for (auto x : s.mask) n *= static_cast<size_t>(x);
    mask.assign(n, 0.f);
    const bool causal = s.mask.size() == 2;
    // [B, 1, Sq, Sk] as the transformers exports write it: causal and padding at once.
    const bool exported = s.mask.size() == 4 && s.mask[1] == 1 && s.mask[2] > 1;
    for (size_t i = 0; i < n; ++i) {
      size_t col = i % static_cast<size_t>(s.mask.back()), row = i / s.mask.back();
      if (causal)
        mask[i] = col > row % static_cast<size_t>(s.q_len) ? -INFINITY : 0.f;
      else if (exported) { // batch row b left-padded by 3 * (b % 3) keys: its first rows see none
        size_t query = row % static_cast<size_t>(s.q_len), b = row / static_cast<size_t>(s.q_len);
        mask[i] = col > query || col < 3 * (b % 3) ? -INFINITY : 0.f;
      }
      else if (s.mask.size() == 4 && s.mask[1] > 1) // full: random, one row hidden throughout
        mask[i] = row == 1 ? -INFINITY : dist(rng);
      else // padding: each batch row's tail, as BERT's -10000 and torch's -inf
        mask[i] = col * 4 >= static_cast<size_t>(s.mask.back()) * (3 - row % 3) ? (row % 2 ? -INFINITY : -10000.f) : 0.f;
    }
    mask = round(mask);
  }

  onnx::graph g;
  int qv = g.add_value("q", s.storage, {s.batch, s.q_len, hd}, true);
  int kv = g.add_value("k", s.storage, {s.batch, s.k_len, hd}, true);
  int vv = g.add_value("v", s.storage, {s.batch, s.k_len, hd}, true);
  std::vector<int> ins{qv, kv, vv};
  if (!mask.empty()) ins.push_back(g.add_value("m", s.storage, s.mask, true));
  int yv = g.add_value("y", s.storage, {s.batch, s.q_len, hd}, true);
  auto& n = g.add_node("FusedAttention", "attention", ins, {yv});
  n.set_i("num_heads", s.heads);
  n.set_f("scale", scale);
  n.set_i("nan_to_zero", 1);

  // Expected: the reference kernel (fp32, on the rounded inputs) where Q and K
  // have one length.
  std::vector<float> want;
  if (s.q_len == s.k_len) {
    std::vector<onnx::tensor_ref> in{{datatype::fp32, g.values[qv].shape, q.data()},
                                     {datatype::fp32, g.values[kv].shape, k.data()},
                                     {datatype::fp32, g.values[vv].shape, v.data()}};
    if (!mask.empty()) in.push_back({datatype::fp32, s.mask, mask.data()});
    want.resize(q.size());
    onnx::run_reference(n, in, {{datatype::fp32, g.values[yv].shape, want.data()}});
  } else {
    want = by_definition(s, q, k, v, mask, scale);
  }

  step_context ctx;
  CAF_CUDA_CHECK(cublasLtCreate(&ctx.lt));
  device_buffer workspace(workspace_bytes);
  ctx.workspace = workspace.p;
  std::vector<std::unique_ptr<device_buffer>> bufs;
  std::vector<void*> ptrs(g.values.size(), nullptr);
  auto upload = [&](int value, const std::vector<float>& host) {
    auto bytes = encode(s.storage, host);
    bufs.push_back(std::make_unique<device_buffer>(bytes.size()));
    ptrs[value] = bufs.back()->p;
    CAF_CUDA_CHECK(cudaMemcpy(ptrs[value], bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  };
  upload(qv, q);
  upload(kv, k);
  upload(vv, v);
  if (!mask.empty()) upload(ins[3], mask);
  upload(yv, std::vector<float>(want.size(), NAN));
  {
    step_builder b{&ctx, g, ptrs, {}, 0, s.storage};
    b.build();
    REQUIRE(b.steps.size() == 1);
    REQUIRE(b.steps[0].kernel == s.kernel);
    cudaStream_t stream;
    CAF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const size_t out_bytes = want.size() * element_size(s.storage);
    auto download = [&] {
      std::vector<uint8_t> got(out_bytes);
      CAF_CUDA_CHECK(cudaStreamSynchronize(stream));
      CAF_CUDA_CHECK(cudaMemcpy(got.data(), ptrs[yv], got.size(), cudaMemcpyDeviceToHost));
      return got;
    };
    b.steps[0].launch(stream);
    auto direct_bytes = download();
    auto direct = decode(s.storage, direct_bytes);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff += (double(direct[i]) - want[i]) * (double(direct[i]) - want[i]);
      norm += double(want[i]) * want[i];
    }
    // fp32: 1e-4 (both products CUBLAS_COMPUTE_32F). fp16: the probabilities and
    // the output are rounded to fp16 (2^-11 relative each), 2e-3 of the norm is
    // ~4 of those; bf16 (2^-8 relative), 1.5e-2 likewise.
    const double tolerance = s.storage == datatype::fp32   ? 1e-4
                             : s.storage == datatype::fp16 ? 2e-3
                                                           : 1.5e-2;
    CHECK(std::sqrt(diff / std::max(norm, 1e-30)) < tolerance); // NaN fails too
    // Rows masked throughout give exact zeros (nan_to_zero's result), on either path.
    size_t not_zero = 0;
    for (size_t i = 0; i < want.size(); ++i) not_zero += want[i] == 0.f && direct[i] != 0.f;
    CHECK(not_zero == 0);

    // Captured and replayed over a poisoned output: the same bytes.
    cudaGraph_t graph = nullptr;
    CAF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    b.steps[0].launch(stream);
    CAF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    CAF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CAF_CUDA_CHECK(cudaMemsetAsync(ptrs[yv], 0xff, out_bytes, stream));
    CAF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    auto replayed = download();
    CHECK(replayed == direct_bytes);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  cublasLtDestroy(ctx.lt);
}

} // namespace

TEST_CASE("the attention step at BERT-base's, causal, full-mask and cross-attention sizes") {
  if (visible_devices() == 0) return;
  run_case({1, 128, 128, 12, 64, {1, 1, 1, 128}});    // GEMMs per row over 12 heads
  run_case({16, 128, 128, 12, 64, {16, 1, 1, 128}});  // per head over 16 rows
  run_case({2, 64, 64, 4, 32, {64, 64}});             // causal
  run_case({2, 16, 16, 4, 16, {2, 4, 16, 16}});       // full, one row hidden throughout
  run_case({2, 16, 24, 4, 16, {2, 1, 1, 24}});        // keys longer than queries
  run_case({3, 20, 20, 3, 8, {}});                    // no mask, 32-byte head columns
}

TEST_CASE("the attention step in chunks: scores larger than the workspace's scores part") {
  if (visible_devices() == 0) return;
  // 64 x 12 pairs of 160 x 160 scores (75 MiB): two chunks of 32 whole rows.
  run_case({64, 160, 160, 12, 16, {64, 1, 1, 160}});
  // One row's 4 pairs of 2048 x 2048 (16 MiB each): its heads in two chunks.
  run_case({1, 2048, 2048, 4, 16, {2048, 2048}});
}

TEST_CASE("the fused attention step at fp16/bf16: BERT-base padding, GPT-2 causal, MiniLM, ViT") {
  if (visible_devices() == 0) return;
  for (datatype half : {datatype::fp16, datatype::bf16}) {
    const char* fused = "attention_fused";
    run_case({16, 128, 128, 12, 64, {16, 1, 1, 128}, half, fused});  // BERT-base, [B,1,1,S]
    run_case({8, 128, 128, 12, 64, {8, 1, 128, 128}, half, fused});  // GPT-2: causal + padding
    run_case({1, 128, 128, 12, 64, {128, 128}, half, fused});        // constant causal [S,S]
    run_case({4, 128, 128, 12, 32, {4, 1, 128, 128}, half, fused});  // MiniLM's 32 columns
    run_case({2, 197, 197, 12, 64, {}, half, fused});                // ViT-B/16, no mask
    run_case({2, 16, 24, 4, 16, {2, 1, 1, 24}, half, "attention"});  // cross: cuBLASLt, half
  }
}
