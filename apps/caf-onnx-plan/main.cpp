/// caf-onnx-plan MODEL_DIR [BATCH [THREADS]]: prints the optimized execution plan
/// that the server builds for an ONNX model directory (<repo>/<model>, newest
/// version). `caf-serving --print-plan MODEL` prints the same.

#include "server/print_plan.hpp"

#include <cstdlib>
#include <iostream>

using namespace caf_serving;

int main(int argc, char** argv) {
  const char* usage = "usage: caf-onnx-plan MODEL_DIR [BATCH [THREADS]]\n"
                      "  prints the optimized plan of MODEL_DIR/<newest version>/model.onnx at "
                      "BATCH rows (default 1), split for THREADS compute threads (default 1)\n";
  if (argc >= 2 && std::string(argv[1]) == "--help") {
    std::cout << usage;
    return 0;
  }
  if (argc < 2 || argc > 4) {
    std::cerr << usage;
    return 2;
  }
  std::filesystem::path dir = std::filesystem::absolute(argv[1]).lexically_normal();
  if (dir.filename().empty())
    dir = dir.parent_path();
  server::print_plan_request req;
  req.repository = dir.parent_path();
  req.model = dir.filename().string();
  req.batch = argc >= 3 ? std::atoll(argv[2]) : 1;
  req.threads = argc >= 4 ? static_cast<unsigned>(std::atoi(argv[3])) : 1;
  if (req.batch < 1 || req.threads < 1) {
    std::cerr << "caf-onnx-plan: BATCH and THREADS are counts of at least 1\n";
    return 2;
  }
  auto text = server::describe_model_plan(req);
  if (!text) {
    std::cerr << "caf-onnx-plan: " << text.error().message << "\n";
    return 1;
  }
  std::cout << *text;
  return 0;
}
