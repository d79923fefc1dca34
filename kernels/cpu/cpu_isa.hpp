#pragma once
/// The instruction set the engine's own CPU kernels run at: the best this CPU
/// has, capped by ONEDNN_MAX_CPU_ISA, the variable oneDNN honours. One variable
/// thus puts oneDNN and the engine's kernels at one level, and a machine with
/// AVX-512 runs what an AVX2-only machine runs (the tests do, at every level).
///
///     if (engine_isa_level() >= isa_level::avx512) run_avx512(...); else run_portable(...);
///
/// No dependency on oneDNN: the variable's value is read here as oneDNN reads
/// it (SSE41, AVX, AVX2, AVX2_VNNI, AVX512_CORE, AVX512_CORE_VNNI, ..., ALL).

#include <optional>
#include <string_view>

namespace caf_serving::kernels::cpu {

/// The levels the engine's kernels are compiled for, in order.
enum class isa_level : int {
  baseline = 0, ///< x86-64's SSE2
  avx2 = 1,     ///< AVX2 (with FMA where the kernel says so)
  avx512 = 2,   ///< AVX-512F
};

/// The level of an ONEDNN_MAX_CPU_ISA value; nullopt where it caps nothing
/// (ALL, empty, or a name oneDNN does not know).
std::optional<isa_level> isa_level_cap(std::string_view onednn_max_cpu_isa);

/// The best level this CPU supports.
isa_level detected_isa_level();

/// detected_isa_level(), capped by ONEDNN_MAX_CPU_ISA; read once per process.
isa_level engine_isa_level();

/// "baseline", "avx2" or "avx512".
const char* isa_level_name(isa_level l);

} // namespace caf_serving::kernels::cpu
