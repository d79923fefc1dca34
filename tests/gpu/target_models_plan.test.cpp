/// Issue 20's target models (tests/gpu/zoo: ResNet-18/50, MobileNetV2/V3,
/// EfficientNet-B0, ViT-B/16, BERT-base, DistilBERT, MiniLM, GPT-2 at their real
/// sizes, weights stripped) planned by the CUDA backend's dry run
/// (cuda::plan_model): every node of every planned batch size must have a device
/// step, none a host step (its reference kernel between device copies), at
/// precision fp32, fp16 and bf16; with half storage the only conversions are the
/// edge ones (a StorageCast step, or the GEMM that writes a declared output in
/// fp32 itself), every arena value is half and the arena is smaller. Needs no
/// device: it runs wherever the CUDA backend builds.

#include "cuda/cuda_backend.hpp"
#include "repository/model_repository.hpp"
#include "support/gpu_zoo.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <iostream>
#include <string>

using namespace caf_serving;
namespace fs = std::filesystem;

namespace {

size_t kernel_count(const cuda::plan_report::bucket& b, const std::string& kernel) {
  auto it = b.kernels.find(kernel);
  return it == b.kernels.end() ? 0 : it->second;
}

/// Steps that convert between fp32 and a half type: the edge conversions
/// ("convert") and any step that converts itself ("cublaslt+convert": a GEMM
/// writing a declared fp32 output; "host:Op+convert").
size_t conversions(const cuda::plan_report::bucket& b) {
  size_t n = 0;
  for (const auto& [kernel, count] : b.kernels)
    if (kernel == "convert" || kernel.find("+convert") != std::string::npos) n += count;
  return n;
}

} // namespace

TEST_CASE("every target model plans with no host step at any batch size and precision") {
  auto root = fs::current_path() / "target_models_plan";
  auto models = testing::gpu_zoo_models();
  REQUIRE(models.size() == 11);
  std::cout << "model | batch | fp32 arena bytes | fp16 arena bytes | fp16 conversion steps\n";
  for (const auto& name : models) {
    CAPTURE(name);
    auto dir = testing::stage_gpu_zoo_model(name, root);
    REQUIRE_MESSAGE(dir, (dir ? "" : dir.error().message));
    auto entry = repository::load_model_config(root, name, {true});
    REQUIRE_MESSAGE(entry.config, (entry.config ? "" : entry.config.error().message));
    auto plan_at = [&](const char* precision) {
      auto cfg = entry.config->config;
      cfg.parameters[cuda::precision_key] = precision;
      return cuda::plan_model({entry.version_dirs.back() / "model.onnx", cfg, {}});
    };
    // The edge conversions half storage needs: one per fp32 input and output.
    size_t float_edges = 0;
    for (const auto* ts : {&entry.config->config.inputs, &entry.config->config.outputs})
      for (const auto& t : *ts) float_edges += t.dtype == datatype::fp32;
    auto fp32 = plan_at("fp32");
    REQUIRE_MESSAGE(fp32, (fp32 ? "" : fp32.error().message));
    REQUIRE(!fp32->buckets.empty());
    for (const auto& b : fp32->buckets) {
      CAPTURE(b.rows);
      std::cout << name << " batch " << b.rows << ": " << b.steps << " steps, "
                << b.host_nodes.size() << " on the host\n";
      for (const auto& n : b.host_nodes) std::cout << "  host: " << n << "\n";
      CHECK(b.steps > 0);
      CHECK(b.host_nodes.empty());
      CHECK(conversions(b) == 0);
    }
    // Half storage (issue 20): still no host step, conversions only at the
    // edges, every value in the arena stored in the half type, a smaller arena.
    for (const char* precision : {"fp16", "bf16"}) {
      CAPTURE(precision);
      auto half = plan_at(precision);
      REQUIRE_MESSAGE(half, (half ? "" : half.error().message));
      REQUIRE(half->buckets.size() == fp32->buckets.size());
      const auto half_name = std::string(to_string(half->storage));
      CHECK(half_name == (std::string(precision) == "fp16" ? "FP16" : "BF16"));
      for (size_t i = 0; i < half->buckets.size(); ++i) {
        const auto& b = half->buckets[i];
        CAPTURE(b.rows);
        for (const auto& n : b.host_nodes) std::cout << "  host at " << precision << ": " << n << "\n";
        CHECK(b.host_nodes.empty());
        // One conversion per fp32 edge: a StorageCast step, or fused into the
        // GEMM that writes the output (then no half copy of it in the arena).
        CHECK(conversions(b) == float_edges);
        CHECK(kernel_count(b, "convert") + kernel_count(b, "cublaslt+convert") == float_edges);
        CHECK(b.arena_types.count("FP32") == 0);
        CHECK(b.arena_types.count(half_name) == 1);
        // Every arena shrinks, GPT-2's too: its LM-head GEMM writes the
        // [B, 128, 50257] logits straight into the fp32 I/O slot, as at fp32.
        CHECK(b.arena_bytes < fp32->buckets[i].arena_bytes);
        if (std::string(precision) == "fp16")
          std::cout << name << " | " << b.rows << " | " << fp32->buckets[i].arena_bytes << " | "
                    << b.arena_bytes << " | " << conversions(b) << "\n";
      }
    }
  }
  fs::remove_all(root);
}
