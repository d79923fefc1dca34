/// cuda::plan_model: the CUDA backend's step selection as a dry run, without a
/// device (this test runs on machines without a GPU). The same checks choose
/// device or host steps as when an instance is built on a GPU (cuda/steps.hpp).

#include "cuda/cuda_backend.hpp"
#include "repository/model_repository.hpp"
#include "support/gpu_zoo.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <numeric>
#include <string>

using namespace caf_serving;
namespace fs = std::filesystem;

namespace {

const fs::path fixtures = CAF_SERVING_ONNX_FIXTURES;

result<cuda::plan_report> plan(const std::string& name, const std::string& buckets = "") {
  auto entry = repository::load_model_config(fixtures / "models", name, {true});
  REQUIRE(entry.config);
  model_config cfg = entry.config->config;
  if (!buckets.empty()) cfg.parameters["cuda_graph_batch_sizes"] = buckets;
  return cuda::plan_model({entry.version_dirs.back() / "model.onnx", cfg, {}});
}

size_t count(const cuda::plan_report::bucket& b, const std::string& kernel) {
  auto it = b.kernels.find(kernel);
  return it == b.kernels.end() ? 0 : it->second;
}

} // namespace

TEST_CASE("a convolutional network plans its convolutions and pools on the device") {
  auto r = plan("resnet_narrow_opset17", "1,4");
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
  // The buckets stop short of max_batch_size 8: 8 is planned too, uncaptured.
  REQUIRE(r->buckets.size() == 3);
  CHECK(r->buckets[0].rows == 1);
  CHECK(r->buckets[1].rows == 4);
  CHECK(r->buckets[2].rows == 8);
  CHECK(r->buckets[0].captured);
  CHECK(r->buckets[1].captured);
  CHECK_FALSE(r->buckets[2].captured);
  for (const auto& b : r->buckets) {
    CAPTURE(b.rows);
    CHECK(count(b, "cudnn_conv") > 0);
    CHECK(count(b, "cudnn_pool") > 0);
    size_t listed = std::accumulate(b.kernels.begin(), b.kernels.end(), size_t{0},
                                    [](size_t n, const auto& kv) { return n + kv.second; });
    CHECK(listed == b.steps);
    size_t host = 0;
    for (const auto& [kernel, n] : b.kernels)
      if (kernel.rfind("host:", 0) == 0) host += n;
    CHECK(host == b.host_nodes.size());
    CHECK(b.arena_bytes > 0);
  }
}

TEST_CASE("a node no device step takes is reported as a host step, by operator and name") {
  auto r = plan("op_argmax");
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
  REQUIRE(!r->buckets.empty());
  const auto& b = r->buckets.front();
  CHECK(count(b, "host:ArgMax") == 1);
  REQUIRE(b.host_nodes.size() == 1);
  CHECK(b.host_nodes[0].rfind("ArgMax '", 0) == 0);
}

TEST_CASE("planning needs no device and refuses what a GPU instance cannot run, saying why") {
  // Variable dimensions besides the batch: the same error as load_cuda_model's.
  auto r = plan("dyn_cnn_opset17");
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("variable dimension") != std::string::npos);
}

TEST_CASE("attention runs on the device: every fixture with FusedAttention, at every bucket") {
  // Padding masks [B,1,1,S] (BERT, DistilBERT, the contrib Attention's key
  // lengths), causal masks (constant [S,S] / [1,1,S,S]), no mask (ViT's MHA), and
  // ONNX's own Attention (23) with a float mask or is_causal.
  for (const char* name : {"pattern_attention_padding_dynamo", "pattern_attention_padding_torchscript17",
                           "pattern_attention_causal_dynamo", "pattern_attention_causal_torchscript17",
                           "pattern_mha_vit_torchscript17", "bert_2layer_opset13", "bert_2layer_opset17",
                           "distilbert_2layer_opset13", "contrib_attention",
                           "contrib_bert_2layer_ort_optimized", "opset21_transformer",
                           "op_attention_float_mask", "op_attention_4d_causal"}) {
    CAPTURE(name);
    auto r = plan(name, "1,3,8");
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
    REQUIRE(r->buckets.size() == 3);
    size_t layers = count(r->buckets[0], "attention");
    CHECK(layers >= 1);
    for (const auto& b : r->buckets) {
      CAPTURE(b.rows);
      CHECK(count(b, "attention") == layers);
      CHECK(count(b, "host:FusedAttention") == 0);
      for (const auto& n : b.host_nodes) CHECK(n.rfind("FusedAttention", 0) != 0);
    }
  }
}

TEST_CASE("the target transformers run every attention layer on the device, at every bucket") {
  // tests/gpu/zoo at real size (weights zeros: the plan depends on shapes only).
  // BERT-base, DistilBERT and MiniLM: padding masks, expanded to [B, 1, S, S] by
  // the export; GPT-2: causal and padding in one [B, 1, S, S] mask computed at run
  // time; ViT: none. At fp16/bf16 storage every layer takes the fused kernel
  // (MiniLM's head dimension is 32, the others' 64); at fp32 cuBLASLt-softmax-cuBLASLt.
  const fs::path root = fs::current_path() / "plan_model_zoo";
  for (auto [name, layers] : {std::pair{"bert_base", 12}, std::pair{"distilbert_base", 6},
                              std::pair{"minilm_l6", 6}, std::pair{"gpt2", 12},
                              std::pair{"vit_b_16", 12}}) {
    CAPTURE(name);
    auto dir = testing::stage_gpu_zoo_model(name, root);
    REQUIRE_MESSAGE(dir, (dir ? "" : dir.error().message));
    auto entry = repository::load_model_config(root, name, {true});
    REQUIRE(entry.config);
    for (const char* precision : {"fp32", "fp16", "bf16"}) {
      CAPTURE(precision);
      auto cfg = entry.config->config;
      cfg.parameters[cuda::precision_key] = precision;
      auto r = cuda::plan_model({*dir / "1/model.onnx", cfg, {}});
      REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
      REQUIRE(!r->buckets.empty());
      const bool fp32 = std::string(precision) == "fp32";
      for (const auto& b : r->buckets) {
        CAPTURE(b.rows);
        CHECK(count(b, "attention_fused") == (fp32 ? 0 : static_cast<size_t>(layers)));
        CHECK(count(b, "attention") == (fp32 ? static_cast<size_t>(layers) : 0));
        CHECK(count(b, "host:FusedAttention") == 0);
      }
    }
  }
}

TEST_CASE("cuda_graph_batch_sizes \"none\" captures nothing but still plans every size") {
  auto r = plan("resnet_narrow_opset17", "none");
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
  std::vector<uint32_t> rows;
  for (const auto& b : r->buckets) {
    rows.push_back(b.rows);
    CHECK_FALSE(b.captured);
    CHECK(count(b, "cudnn_conv") > 0);
  }
  CHECK(rows == std::vector<uint32_t>{1, 2, 4, 8});
}

TEST_CASE("grouped convolutions, every fused activation and Gemm plan on the device") {
  // Depthwise and grouped convolutions with Clip/HardSwish/ReLU (MobileNetV3's
  // blocks), Gemm classifier heads (transB, bias): none is a host step any more.
  for (const char* name : {"op_conv_group", "op_gemm", "resnet_narrow_opset13",
                           "resnet_narrow_opset17", "pattern_mobilenetv3_block_opset17",
                           "pattern_mbconv_block_opset17",
                           "zoo_mobilenet_v3_block_dynamo_opset18",
                           "zoo_mobilenet_v3_block_dynamo_opset20"}) {
    CAPTURE(name);
    auto r = plan(name, "1,8");
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
    for (const auto& b : r->buckets) {
      CAPTURE(b.rows);
      CHECK(count(b, "host:FusedConv") == 0);
      CHECK(count(b, "host:FusedGemm") == 0);
      CHECK(count(b, "cudnn_conv") + count(b, "cudnn_conv+epilogue") + count(b, "cublaslt") > 0);
    }
  }
  // The grouped convolution runs as cuDNN's convolution and the epilogue kernel.
  auto r = plan("op_conv_group", "1");
  REQUIRE(r);
  CHECK(count(r->buckets[0], "cudnn_conv+epilogue") == 1);
  // SiLU, Clip(0, 6) depthwise, Sigmoid, residual -> HardSwish and a grouped 3x3: all six
  // convolutions of the MBConv block take that path; the excitation's broadcast Mul is
  // an element-wise step (steps_elementwise.cpp).
  r = plan("pattern_mbconv_block_opset17", "1");
  REQUIRE(r);
  CHECK(count(r->buckets[0], "cudnn_conv+epilogue") == 6);
  CHECK(count(r->buckets[0], "cublaslt") == 1);
  CHECK(count(r->buckets[0], "binary") == 1);
  CHECK(r->buckets[0].host_nodes.empty());
}

TEST_CASE("no target model leaves a convolution or a GEMM on the host") {
  // Issue 20's models at real size (tests/gpu/zoo, weights staged as sparse
  // zeros: the plan depends on operators and shapes only). Before grouped
  // convolutions, the other activations and FusedGemm had device steps,
  // MobileNetV2 left 35 FusedConv on the host, EfficientNet-B0 65, and every
  // classifier head, ViT's and GPT-2's Gemms too.
  const fs::path root = fs::current_path() / "plan_model_zoo";
  auto models = testing::gpu_zoo_models();
  REQUIRE(models.size() >= 11);
  for (const auto& name : models) {
    CAPTURE(name);
    auto dir = testing::stage_gpu_zoo_model(name, root);
    REQUIRE_MESSAGE(dir, (dir ? "" : dir.error().message));
    auto entry = repository::load_model_config(root, name, {true});
    REQUIRE(entry.config);
    model_config cfg = entry.config->config;
    cfg.parameters["cuda_graph_batch_sizes"] = "1,8";
    auto r = cuda::plan_model({entry.version_dirs.back() / "model.onnx", cfg, {}});
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
    for (const auto& b : r->buckets) {
      CAPTURE(b.rows);
      for (const char* op : {"host:FusedConv", "host:FusedGemm", "host:FusedMatMul"}) {
        CAPTURE(op);
        CHECK(count(b, op) == 0);
      }
      CHECK(count(b, "cudnn_conv") + count(b, "cudnn_conv+epilogue") + count(b, "cublaslt") > 0);
    }
  }
  fs::remove_all(root);
}
