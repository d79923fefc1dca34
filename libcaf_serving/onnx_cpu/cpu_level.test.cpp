/// The ISA levels the ONNX CPU backend runs at: oneDNN's effective ISA and the
/// engine's kernels' level follow one cap (ONEDNN_MAX_CPU_ISA), and the
/// choices made from them (channel block, exact int8 path) follow the level.
/// CTest runs this uncapped and capped at AVX2 and AVX512_CORE.

#include "onnx_cpu/cpu_level.hpp"

#include "cpu_isa.hpp"

#include <doctest/doctest.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdlib>
#include <string>

using namespace caf_serving;
using namespace caf_serving::onnx;
namespace kc = caf_serving::kernels::cpu;

TEST_CASE("ONEDNN_MAX_CPU_ISA's names cap the engine's kernels at the matching level") {
  CHECK(kc::isa_level_cap("AVX2") == kc::isa_level::avx2);
  CHECK(kc::isa_level_cap("AVX2_VNNI") == kc::isa_level::avx2);
  CHECK(kc::isa_level_cap("AVX512_CORE") == kc::isa_level::avx512);
  CHECK(kc::isa_level_cap("AVX512_CORE_VNNI") == kc::isa_level::avx512);
  CHECK(kc::isa_level_cap("AVX512_CORE_AMX") == kc::isa_level::avx512);
  CHECK(kc::isa_level_cap("SSE41") == kc::isa_level::baseline);
  CHECK(kc::isa_level_cap("AVX") == kc::isa_level::baseline);
  CHECK_FALSE(kc::isa_level_cap("ALL").has_value());
  CHECK_FALSE(kc::isa_level_cap("").has_value());
}

TEST_CASE("the channel block and the int8 path follow oneDNN's ISA") {
  auto at = [](dnnl::cpu_isa isa) { return cpu_level_of(static_cast<int>(isa), "x"); };
  CHECK(at(dnnl::cpu_isa::avx2).channel_block == 8);
  CHECK_FALSE(at(dnnl::cpu_isa::avx2).int8_vnni);
  CHECK(at(dnnl::cpu_isa::avx2_vnni).channel_block == 8);
  CHECK_FALSE(at(dnnl::cpu_isa::avx2_vnni).int8_vnni);
  CHECK(at(dnnl::cpu_isa::avx512_core).channel_block == 16);
  CHECK_FALSE(at(dnnl::cpu_isa::avx512_core).int8_vnni); // Skylake-SP: no VNNI
  CHECK(at(dnnl::cpu_isa::avx512_core_vnni).int8_vnni);
  CHECK(at(dnnl::cpu_isa::avx512_core_bf16).int8_vnni);
  CHECK(at(dnnl::cpu_isa::avx512_core_amx).channel_block == 16);
  CHECK(at(dnnl::cpu_isa::avx512_core_amx).int8_vnni);
  CHECK(at(dnnl::cpu_isa::avx512_core_amx).onednn_isa == "avx512_core_amx");
  CHECK(at(dnnl::cpu_isa::sse41).channel_block == 8);
  CHECK(at(dnnl::cpu_isa::avx512_core).json()
        == "{\"onednn_isa\":\"avx512_core\",\"engine_isa\":\"x\",\"channel_block\":16,"
           "\"int8_vnni\":false}");
}

TEST_CASE("this process runs at most at the level ONEDNN_MAX_CPU_ISA names, in oneDNN and the "
          "engine's kernels alike") {
  const auto& level = process_cpu_level();
  INFO(level.describe());
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  std::string c = cap ? cap : "";
  auto engine = kc::engine_isa_level();
  CHECK(engine <= kc::detected_isa_level());
  CHECK(level.engine_isa == kc::isa_level_name(engine));
  auto detected = kc::detected_isa_level();
  if (c == "AVX2" && detected >= kc::isa_level::avx2) {
    CHECK(level.onednn_isa == "avx2");
    CHECK(level.engine_isa == "avx2");
    CHECK(level.channel_block == 8);
    CHECK_FALSE(level.int8_vnni);
  } else if (c == "AVX512_CORE" && detected == kc::isa_level::avx512) {
    CHECK(level.onednn_isa == "avx512_core");
    CHECK(level.engine_isa == "avx512");
    CHECK(level.channel_block == 16);
    CHECK_FALSE(level.int8_vnni);
  }
  // oneDNN at AVX-512 and the engine's kernels below it (or the other way)
  // would pick layouts one of them has no fast kernel for.
  CHECK((level.channel_block == 16) == (engine == kc::isa_level::avx512));
}
