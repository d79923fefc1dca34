#include "cpu_isa.hpp"

#include <algorithm>
#include <cstdlib>

namespace caf_serving::kernels::cpu {

std::optional<isa_level> isa_level_cap(std::string_view v) {
  auto starts = [&](std::string_view p) { return v.substr(0, p.size()) == p; };
  // oneDNN compares the upper-case names; its AVX512 levels all include AVX-512F.
  if (starts("AVX512"))
    return isa_level::avx512;
  if (starts("AVX2"))
    return isa_level::avx2;
  if (v == "SSE41" || v == "AVX")
    return isa_level::baseline;
  return std::nullopt;
}

isa_level detected_isa_level() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f"))
    return isa_level::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return isa_level::avx2;
  return isa_level::baseline;
}

isa_level engine_isa_level() {
  static const isa_level level = [] {
    isa_level l = detected_isa_level();
    const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
    if (!cap)
      cap = std::getenv("DNNL_MAX_CPU_ISA"); // the older name, which oneDNN 2.x reads too
    if (auto c = isa_level_cap(cap ? cap : ""))
      l = std::min(l, *c);
    return l;
  }();
  return level;
}

const char* isa_level_name(isa_level l) {
  switch (l) {
    case isa_level::avx512: return "avx512";
    case isa_level::avx2: return "avx2";
    case isa_level::baseline: break;
  }
  return "baseline";
}

} // namespace caf_serving::kernels::cpu
