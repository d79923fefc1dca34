/// caf-cuda-plan MODEL_DIR [--precision fp32|fp16|bf16]: the steps a KIND_GPU
/// instance of the ONNX model in MODEL_DIR (<repository>/<model>, newest version)
/// would run, per planned batch size, chosen without a device (cuda::plan_model):
/// which kernel runs each node, and every node left to a host step. --precision
/// overrides the config's `precision` parameter (gpu_options.hpp).

#include "cuda/cuda_backend.hpp"
#include "repository/model_repository.hpp"

#include <filesystem>
#include <iostream>
#include <string>

using namespace caf_serving;

int main(int argc, char** argv) {
  bool usage = argc != 2 && !(argc == 4 && std::string(argv[2]) == "--precision");
  if (usage || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cerr << "usage: caf-cuda-plan MODEL_DIR [--precision fp32|fp16|bf16]\n"
                 "  prints the CUDA backend's steps for MODEL_DIR/<newest version>/model.onnx\n"
                 "  at each planned batch size (parameter cuda_graph_batch_sizes), and every\n"
                 "  node that would run on the host; needs no GPU. --precision overrides the\n"
                 "  config's precision parameter\n";
    return usage ? 2 : 0;
  }
  std::filesystem::path dir = std::filesystem::absolute(argv[1]).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  auto entry = repository::load_model_config(dir.parent_path(), dir.filename().string(), {true});
  if (!entry.config) {
    std::cerr << "caf-cuda-plan: " << entry.config.error().message << "\n";
    return 1;
  }
  auto file = entry.version_dirs.back() / "model.onnx";
  auto cfg = entry.config->config;
  if (argc == 4) cfg.parameters[cuda::precision_key] = argv[3];
  auto report = cuda::plan_model({file, cfg, {}});
  if (!report) {
    std::cerr << "caf-cuda-plan: " << report.error().message << "\n";
    return 1;
  }
  size_t host = 0;
  for (const auto& b : report->buckets) {
    std::cout << "batch " << b.rows << (b.captured ? " (CUDA graph)" : " (direct launches)")
              << ": " << b.steps << " steps, " << b.host_nodes.size()
              << " on the host, activation arena " << b.arena_bytes << " bytes ("
              << to_string(report->storage) << " storage)\n";
    for (const auto& [kernel, count] : b.kernels)
      std::cout << "  " << kernel << " x" << count << "\n";
    for (const auto& n : b.host_nodes) std::cout << "  host: " << n << "\n";
    host += b.host_nodes.size();
  }
  return host == 0 ? 0 : 3;
}
