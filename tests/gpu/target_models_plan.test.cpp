/// Issue 20's target models (tests/gpu/zoo: ResNet-18/50, MobileNetV2/V3,
/// EfficientNet-B0, ViT-B/16, BERT-base, DistilBERT, MiniLM, GPT-2 at their real
/// sizes, weights stripped) planned by the CUDA backend's dry run
/// (cuda::plan_model): every node of every planned batch size must have a device
/// step, none a host step (its reference kernel between device copies). Needs no
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

TEST_CASE("every target model plans with no host step at any batch size") {
  auto root = fs::current_path() / "target_models_plan";
  auto models = testing::gpu_zoo_models();
  REQUIRE(models.size() == 11);
  for (const auto& name : models) {
    CAPTURE(name);
    auto dir = testing::stage_gpu_zoo_model(name, root);
    REQUIRE_MESSAGE(dir, (dir ? "" : dir.error().message));
    auto entry = repository::load_model_config(root, name, {true});
    REQUIRE_MESSAGE(entry.config, (entry.config ? "" : entry.config.error().message));
    auto report = cuda::plan_model({entry.version_dirs.back() / "model.onnx",
                                    entry.config->config, {}});
    REQUIRE_MESSAGE(report, (report ? "" : report.error().message));
    REQUIRE(!report->buckets.empty());
    for (const auto& b : report->buckets) {
      CAPTURE(b.rows);
      std::cout << name << " batch " << b.rows << ": " << b.steps << " steps, "
                << b.host_nodes.size() << " on the host\n";
      for (const auto& n : b.host_nodes) std::cout << "  host: " << n << "\n";
      CHECK(b.steps > 0);
      CHECK(b.host_nodes.empty());
    }
  }
  fs::remove_all(root);
}
