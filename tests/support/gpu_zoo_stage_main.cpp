/// caf-gpu-zoo-stage DEST [--weights zeros|pseudo-random] [--seed N] [MODEL...]
///
/// Stages the GPU target fixtures (tests/gpu/zoo) as a model repository in
/// DEST, without Python: a device run (scripts/gpu-check, benchmarks) gets
/// the real-sized models from the committed fixtures, since their weights
/// (2 GB) cannot travel with it. --weights pseudo-random (support/gpu_zoo.hpp)
/// gives deterministic weights of the real models' magnitudes; zeros (the
/// default) are for planning only. No MODEL: all of them.

#include "support/gpu_zoo.hpp"

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

using namespace caf_serving;

namespace {

int usage(int rc) {
  (rc == 0 ? std::cout : std::cerr)
    << "usage: caf-gpu-zoo-stage DEST [--weights zeros|pseudo-random] [--seed N] [MODEL...]\n"
       "  copies the GPU target fixtures (" << testing::gpu_zoo_dir().string() << ")\n"
       "  into the model repository DEST with a 1/weights.bin each: sparse zeros (default,\n"
       "  for planning) or deterministic pseudo-random values of the real weights' mean\n"
       "  and deviation (writes 2 GB for all). Models:";
  for (const auto& m : testing::gpu_zoo_models()) (rc == 0 ? std::cout : std::cerr) << " " << m;
  (rc == 0 ? std::cout : std::cerr) << "\n";
  return rc;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return usage(2);
  if (args[0] == "--help" || args[0] == "-h") return usage(0);
  std::string dest = args[0];
  testing::gpu_zoo_stage_config cfg;
  std::vector<std::string> models;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--weights" && i + 1 < args.size()) {
      const auto& w = args[++i];
      if (w == "zeros") cfg.weights = testing::zoo_weights::zeros;
      else if (w == "pseudo-random") cfg.weights = testing::zoo_weights::pseudo_random;
      else {
        std::cerr << "caf-gpu-zoo-stage: --weights is '" << w << "'; give zeros or pseudo-random\n";
        return 2;
      }
    } else if (args[i] == "--seed" && i + 1 < args.size()) {
      char* end = nullptr;
      cfg.seed = std::strtoull(args[++i].c_str(), &end, 10);
      if (args[i].empty() || *end != '\0') {
        std::cerr << "caf-gpu-zoo-stage: --seed is '" << args[i] << "'; give a number\n";
        return 2;
      }
    } else if (!args[i].empty() && args[i][0] == '-') {
      std::cerr << "caf-gpu-zoo-stage: unknown option '" << args[i] << "'\n";
      return usage(2);
    } else {
      models.push_back(args[i]);
    }
  }
  if (models.empty()) models = testing::gpu_zoo_models();
  for (const auto& m : models) {
    auto dir = testing::stage_gpu_zoo_model(m, dest, cfg);
    if (!dir) {
      std::cerr << "caf-gpu-zoo-stage: " << dir.error().message << "\n";
      return 1;
    }
    std::cout << dir->string() << "\n";
  }
  return 0;
}
