#include "onnx_cpu/row_chunks.hpp"

namespace caf_serving::onnx {

matmul_work measure_matmul_work(const graph& g) {
  matmul_work w;
  double largest = 0;
  for (const auto& n : g.nodes) {
    if (n.outputs.empty() || n.outputs[0] < 0 || n.inputs.size() < 2)
      continue;
    const auto& y = g.values[n.outputs[0]].shape;
    const auto& a = g.values[n.inputs[0]].shape;
    const auto& wv = g.values[n.inputs[1]];
    if ((n.op == "FusedConv" || n.op == "Conv") && wv.shape.size() >= 3) {
      double per_output = 1;
      for (size_t i = 1; i < wv.shape.size(); ++i)
        per_output *= static_cast<double>(wv.shape[i]);
      w.conv_flop += 2.0 * static_cast<double>(element_count(y)) * per_output;
      continue;
    }
    bool matmul = n.op == "FusedMatMul" || n.op == "FusedGemm";
    if (!matmul || !wv.constant || a.empty() || y.empty())
      continue;
    int64_t k = n.op == "FusedGemm" && n.get_i("transA", 0) != 0 ? a[0] : a.back();
    if (k < 1)
      continue;
    double f = 2.0 * static_cast<double>(element_count(y)) * static_cast<double>(k);
    w.matmul_flop += f;
    if (f > largest) {
      largest = f;
      w.matmul_rows = element_count(a) / k;
    }
  }
  return w;
}

bool chunks_starve_matmuls(const matmul_work& chunk, int64_t min_rows) {
  return min_rows > 0 && chunk.matmul_flop > chunk.conv_flop && chunk.matmul_rows < min_rows;
}

} // namespace caf_serving::onnx
