#include "onnx_cpu/cpu_level.hpp"

#include "cpu_isa.hpp"

#include <oneapi/dnnl/dnnl.hpp>

namespace caf_serving::onnx {

namespace {

const char* onednn_isa_name(int isa) {
  switch (static_cast<dnnl::cpu_isa>(isa)) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: break;
  }
  return "all";
}

} // namespace

cpu_level cpu_level_of(int isa, const std::string& engine_isa) {
  // dnnl_cpu_isa_t is a set of bits, each level holding the bits of those below.
  const int core = static_cast<int>(dnnl::cpu_isa::avx512_core);
  const int core_vnni = static_cast<int>(dnnl::cpu_isa::avx512_core_vnni);
  cpu_level l;
  l.onednn_isa = onednn_isa_name(isa);
  l.engine_isa = engine_isa;
  l.channel_block = (isa & core) == core ? 16 : 8;
  // AVX2 VNNI (vpdpbusd on 256 bits) counts as not exact: oneDNN 2.6 does not
  // take it for every int8 primitive, and no machine here has it to measure.
  l.int8_vnni = (isa & core_vnni) == core_vnni;
  return l;
}

std::string cpu_level::describe() const {
  return "oneDNN " + onednn_isa + ", engine kernels " + engine_isa + ", "
         + (channel_block == 16 ? "nChw16c" : "nChw8c") + ", "
         + (int8_vnni ? "int8 on VNNI" : "int8 exact path (no VNNI)");
}

std::string cpu_level::json() const {
  return "{\"onednn_isa\":\"" + onednn_isa + "\",\"engine_isa\":\"" + engine_isa
         + "\",\"channel_block\":" + std::to_string(channel_block)
         + ",\"int8_vnni\":" + (int8_vnni ? "true" : "false") + "}";
}

std::string cpu_level::prometheus_labels() const {
  return "onednn_isa=\"" + onednn_isa + "\",engine_isa=\"" + engine_isa + "\",channel_block=\""
         + std::to_string(channel_block) + "\",int8_vnni=\"" + (int8_vnni ? "true" : "false")
         + "\"";
}

const cpu_level& process_cpu_level() {
  static const cpu_level level = cpu_level_of(
    static_cast<int>(dnnl::get_effective_cpu_isa()),
    kernels::cpu::isa_level_name(kernels::cpu::engine_isa_level()));
  return level;
}

} // namespace caf_serving::onnx
