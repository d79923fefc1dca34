/// Encode throughput (MB/s of UTF-8 text) on the test corpus (testdata/), one
/// thread, each record encoded as one text, the tokenizer's word cache warm
/// after the first pass as it is in a serving process. Decode alongside.
///
/// usage: text-tokenizer-bench [--benchmark_filter=gpt2]
/// Compare with HF: tools/tokenizer_fixtures.py --bench (the same corpus).
#include "text/tokenizer.hpp"

#include <benchmark/benchmark.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace caf_serving::text;

namespace {

const std::string testdata = CAF_SERVING_TEXT_TESTDATA;

std::string read_gz(const std::string& name) {
  gzFile f = gzopen((testdata + "/" + name).c_str(), "rb");
  if (!f) {
    std::fprintf(stderr, "cannot open %s/%s\n", testdata.c_str(), name.c_str());
    std::exit(1);
  }
  std::string out;
  char buf[1 << 16];
  for (int n; (n = gzread(f, buf, sizeof(buf))) > 0;)
    out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> records = [] {
    std::vector<std::string> out;
    std::string all = read_gz("corpus.txt.gz");
    size_t begin = 0;
    for (size_t nul; (nul = all.find('\0', begin)) != std::string::npos; begin = nul + 1)
      out.push_back(all.substr(begin, nul - begin));
    out.push_back(all.substr(begin));
    return out;
  }();
  return records;
}

tokenizer load(const std::string& name) {
  auto tok = tokenizer::load(read_gz(name + ".tokenizer.json.gz"));
  if (!tok) {
    std::fprintf(stderr, "%s\n", tok.error().message.c_str());
    std::exit(1);
  }
  return std::move(*tok);
}

void encode_corpus(benchmark::State& state, const std::string& name) {
  auto tok = load(name);
  size_t bytes = 0;
  size_t ids = 0;
  for (auto _ : state) {
    for (const auto& text : corpus()) {
      auto out = tok.encode(text, encode_options{true});
      ids += out.size();
      bytes += text.size();
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["ids/s"] = benchmark::Counter(static_cast<double>(ids),
                                                benchmark::Counter::kIsRate);
}

void decode_corpus(benchmark::State& state, const std::string& name) {
  auto tok = load(name);
  std::vector<std::vector<int32_t>> encoded;
  for (const auto& text : corpus())
    encoded.push_back(tok.encode(text, encode_options{true}));
  size_t bytes = 0;
  for (auto _ : state) {
    for (const auto& ids : encoded) {
      auto text = tok.decode(ids, decode_options{false});
      bytes += text.size();
      benchmark::DoNotOptimize(text.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

} // namespace

BENCHMARK_CAPTURE(encode_corpus, gpt2, std::string{"gpt2"})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_corpus, llama3, std::string{"llama3"})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_corpus, qwen2, std::string{"qwen2"})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_corpus, llama2, std::string{"llama2"})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode_corpus, llama2_metaspace, std::string{"llama2_metaspace"})
  ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode_corpus, gpt2, std::string{"gpt2"})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode_corpus, llama2, std::string{"llama2"})->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
