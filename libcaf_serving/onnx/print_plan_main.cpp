/// caf-onnx-plan MODEL_DIR [BATCH]: prints the optimized execution plan that the
/// server builds for an ONNX model directory (<repo>/<model>, newest version).

#include "onnx/onnx_backend.hpp"
#include "repository/model_repository.hpp"

#include <cstdlib>
#include <iostream>

using namespace caf_serving;

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || std::string(argv[1]) == "--help") {
    std::cerr << "usage: caf-onnx-plan MODEL_DIR [BATCH]\n"
                 "  prints the optimized plan of MODEL_DIR/<newest version>/model.onnx at "
                 "BATCH rows (default 1)\n";
    return 2;
  }
  std::filesystem::path dir = std::filesystem::absolute(argv[1]).lexically_normal();
  if (dir.filename().empty())
    dir = dir.parent_path();
  int64_t batch = argc == 3 ? std::atoll(argv[2]) : 1;
  repository::scan_config sc;
  sc.allow_missing_io = true;
  auto entry = repository::load_model_config(dir.parent_path(), dir.filename().string(), sc);
  if (!entry.config) {
    std::cerr << "caf-onnx-plan: " << entry.config.error().message << "\n";
    return 1;
  }
  onnx::onnx_model_config cfg;
  cfg.config = entry.config->config;
  cfg.model_file = entry.version_dirs.back() / "model.onnx";
  auto text = onnx::describe_plan(cfg, batch);
  if (!text) {
    std::cerr << "caf-onnx-plan: " << text.error().message << "\n";
    return 1;
  }
  std::cout << *text;
  return 0;
}
