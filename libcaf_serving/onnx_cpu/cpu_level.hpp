#pragma once
/// The instruction sets the ONNX CPU backend runs at in this process, and the
/// choices that follow from them: oneDNN's effective ISA (the best for this
/// CPU, capped by ONEDNN_MAX_CPU_ISA) and the engine's own kernels' level
/// (kernels/cpu/cpu_isa.hpp, the same cap).
///
/// - Convolution and pooling tensors are kept in blocks of `channel_block`
///   channels: 16 where oneDNN runs AVX-512 (nChw16c), else 8 (nChw8c), the
///   layouts oneDNN's optimised kernels of that ISA read. A 16-channel layout on
///   an AVX2 machine runs oneDNN's reference kernels (ResNet-50's first
///   convolution: 3.0 s).
/// - `int8_vnni` is false without VNNI (AVX-512 VNNI or AMX): oneDNN's int8
///   kernels then multiply u8 by s8 with vpmaddubsw, whose 16-bit sums of two
///   products saturate, and halve (round) INT8 weights for s8 sources; the
///   int8 steps then take the exact path (quant_steps.hpp).
///
///     const auto& level = process_cpu_level();
///     log("CPU: " + level.describe());

#include <cstdint>
#include <string>

namespace caf_serving::onnx {

struct cpu_level {
  std::string onednn_isa;     ///< oneDNN's effective ISA: "avx2", "avx512_core_amx", ...
  std::string engine_isa;     ///< the engine's kernels: "baseline", "avx2", "avx512"
  int64_t channel_block = 16; ///< 16 or 8
  bool int8_vnni = true;      ///< oneDNN's int8 runs on VNNI or AMX (exact products)

  /// "oneDNN avx2, engine kernels avx2, nChw8c, int8 exact path (no VNNI)".
  std::string describe() const;
  /// {"onednn_isa":"avx2","engine_isa":"avx2","channel_block":8,"int8_vnni":false}
  std::string json() const;
  /// The same as Prometheus labels: onednn_isa="avx2",engine_isa="avx2",...
  std::string prometheus_labels() const;
};

/// The level of a oneDNN ISA (dnnl::cpu_isa's value) and an engine kernels' level name.
cpu_level cpu_level_of(int onednn_isa, const std::string& engine_isa);

/// This process's level; computed once (oneDNN reads its cap once too).
const cpu_level& process_cpu_level();

} // namespace caf_serving::onnx
