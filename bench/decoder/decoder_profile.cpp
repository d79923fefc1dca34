// Where a decoding step's time goes (issue 35): loads a generative model's
// ONNX file as the server does (a torch export's attention rewritten into
// GroupQueryAttention, then paged), prefills `rows` sequences of `context`
// tokens, times `steps` decoding steps of all of them and a greedy pick over
// their logits, and prints the backend's per-operator profile of the steps.
//
//   decoder-profile MODEL_DIR [--rows N] [--context N] [--steps N] [--threads N]
//
// MODEL_DIR holds model.onnx (and genai_config.json for onnxruntime-genai's
// builds): a model version folder such as bench/generate's caf/llama/1.
#include "core/external_memory.hpp"
#include "executor/decoder_runner.hpp"
#include "onnx/importer.hpp"
#include "onnx/paged_attention.hpp"
#include "onnx/passes_decoder.hpp"
#include "onnx_cpu/onnx_backend.hpp"

#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

using namespace caf_serving;
using clock_t_ = std::chrono::steady_clock;

namespace {

int usage(const char* why) {
  std::cerr << (why ? std::string(why) + "\n" : std::string())
            << "usage: decoder-profile MODEL_DIR [--rows N] [--context N] [--steps N] "
               "[--threads N]\n"
               "  MODEL_DIR: a version folder with model.onnx (and genai_config.json for "
               "onnxruntime-genai's builds)\n";
  return why ? 2 : 0;
}

double ms_since(clock_t_::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_t_::now() - t).count();
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2)
    return usage("no MODEL_DIR");
  std::string dir = argv[1];
  if (dir == "--help" || dir == "-h")
    return usage(nullptr);
  uint32_t rows = 64, context = 192, steps = 20, threads = 2;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc)
      return usage(("'" + a + "' needs a value").c_str());
    uint32_t v = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    if (v == 0)
      return usage(("'" + a + "' needs a positive integer").c_str());
    if (a == "--rows") rows = v;
    else if (a == "--context") context = v;
    else if (a == "--steps") steps = v;
    else if (a == "--threads") threads = v;
    else return usage(("unknown option '" + a + "'").c_str());
  }
  const uint32_t block_tokens = 16;
  onnx::onnx_model_config cfg;
  cfg.model_file = std::filesystem::path(dir) / "model.onnx";
  cfg.config.name = "profiled";
  cfg.config.max_batch_size = static_cast<int>(rows);
  cfg.plan_cache_size = 64;
  cfg.threads = threads;
  cfg.profile = true;
  auto g = onnx::import_model(cfg.model_file);
  if (!g) {
    std::cerr << g.error().message << "\n";
    return 1;
  }
  executor::decoder_hints hints;
  std::optional<executor::cache_dims> genai;
  auto genai_file = std::filesystem::path(dir) / "genai_config.json";
  if (std::filesystem::exists(genai_file)) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.load(genai_file.string()).get(doc)) {
      std::cerr << genai_file << " does not parse\n";
      return 1;
    }
    auto d = doc["model"]["decoder"];
    auto u = [](simdjson::simdjson_result<simdjson::dom::element> e) {
      int64_t v = 0;
      return e.get(v) ? 0u : static_cast<uint32_t>(v);
    };
    genai = executor::cache_dims{u(d["num_hidden_layers"]), u(d["num_key_value_heads"]),
                                 u(d["head_size"]), u(doc["model"]["vocab_size"])};
    hints = {executor::past_layout::left_aligned, genai->head_dim};
  } else {
    auto r = onnx::rewrite_decoder_attention(*g);
    std::cout << "torch export: attention of " << r.layers << " layers as GroupQueryAttention"
              << (r.layers ? "" : " (" + r.refused + ")") << "\n";
    if (r.layers)
      hints.layout = executor::past_layout::left_aligned;
  }
  const uint64_t pool = new_external_memory_handle();
  auto paged = onnx::rewrite_paged_attention(*g, {pool, block_tokens});
  std::cout << "paged attention: " << paged.layers << " layers"
            << (paged.layers ? "" : " (" + paged.refused + ")") << "\n";
  std::cout << "logits of the last position only: "
            << (onnx::last_position_logits(*g) ? "yes" : "no") << "\n";
  if (genai) {
    genai->paged = paged.layers > 0;
    cfg.config = executor::with_cache_dims(cfg.config, *genai);
  }
  auto model = onnx::load_onnx_graph(std::move(*g), cfg);
  if (!model) {
    std::cerr << model.error().message << "\n";
    return 1;
  }
  auto sig = executor::find_decoder_signature(model->config, hints);
  if (!sig) {
    std::cerr << sig.error().message << "\n";
    return 1;
  }
  const uint32_t per_sequence = (context + steps + 1 + block_tokens - 1) / block_tokens;
  executor::kv_cache_layout layout{sig->layers(), sig->kv_heads, sig->head_dim, block_tokens,
                                   rows * per_sequence};
  executor::decoder_runner runner(*sig, model->make_instance(), layout,
                                  {32, rows, sig->paged ? pool : 0});
  std::vector<int32_t> prompt(context);
  for (uint32_t i = 0; i < context; ++i)
    prompt[i] = static_cast<int32_t>(1 + (i * 7) % std::max(2u, sig->vocab - 1));
  auto started = clock_t_::now();
  for (uint32_t r = 0; r < rows; ++r) {
    auto done = runner.run({{r, 0, prompt.data(), context, false}});
    if (!done) {
      std::cerr << done.error().message << "\n";
      return 1;
    }
  }
  std::cout << "prefill: " << rows << " x " << context << " tokens in " << ms_since(started)
            << " ms\n";
  std::vector<int32_t> next(rows, 3);
  double decode_ms = 0, pick_ms = 0;
  for (uint32_t s = 0; s < steps; ++s) {
    std::vector<executor::decoder_step_item> step;
    for (uint32_t r = 0; r < rows; ++r)
      step.push_back({r, context + s, &next[r], 1, true});
    auto t = clock_t_::now();
    auto logits = runner.run(step);
    decode_ms += ms_since(t);
    if (!logits) {
      std::cerr << logits.error().message << "\n";
      return 1;
    }
    t = clock_t_::now();
    for (uint32_t r = 0; r < rows; ++r) {
      const float* row = logits->data() + size_t{r} * sig->vocab;
      next[r] = static_cast<int32_t>(std::max_element(row, row + sig->vocab) - row);
    }
    pick_ms += ms_since(t);
  }
  std::cout << "decode: " << steps << " steps of " << rows << " rows at context " << context
            << ": " << decode_ms / steps << " ms a step (" << rows * steps * 1000.0 / decode_ms
            << " tokens/s), greedy pick " << pick_ms / steps << " ms a step; " << threads
            << " thread(s)\n\n"
            << model->profile_report();
  return 0;
}
