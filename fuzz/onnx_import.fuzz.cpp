/// The ONNX importer on model files as the repository would read them
/// (<model>/<version>/model.onnx), from the small operator fixtures mutated.
///
/// Beyond "no crash, no sanitizer report": every failure is a 400 that names the
/// file, and an imported graph is consistent: every node's inputs and outputs
/// and every graph input and output name a value of the graph, and every
/// constant holds exactly its shape's bytes.

#include "onnx/importer.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

using namespace caf_serving;
using namespace caf_serving::onnx;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "onnx_import: invariant broken: %s\n", what);
    std::abort();
  }
}

bool is_value(const graph& g, int v) {
  return v >= 0 && static_cast<size_t>(v) < g.values.size();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto g = import_model_bytes(bytes, "fuzzed/1/model.onnx");
  if (!g) {
    check(g.error().status == status_code::bad_request, "a bad model is a 400");
    check(g.error().message.rfind("fuzzed/1/model.onnx: ", 0) == 0, "the message names the file");
    return 0;
  }
  for (const auto& n : g->nodes) {
    for (int v : n.inputs)
      check(v == -1 || is_value(*g, v), "a node input is a value or absent");
    for (int v : n.outputs)
      check(v == -1 || is_value(*g, v), "a node output is a value or absent");
  }
  for (int v : g->inputs)
    check(is_value(*g, v), "a graph input is a value");
  for (int v : g->outputs)
    check(is_value(*g, v), "a graph output is a value");
  for (const auto& v : g->values)
    if (v.constant)
      check(v.constant->bytes.size()
              == static_cast<size_t>(v.constant->elements()) * element_size(v.constant->dtype),
            "a constant holds exactly its shape's bytes");
  return 0;
}
