#pragma once
/// The `builtin` backend: small models computed directly, selected by the model's
/// `parameters { key: "function" ... }` in config.pbtxt. They exist so that the
/// pipeline, batching and protocol can be served and tested without a model file.
///
/// Functions:
/// - `identity`: OUTPUTi = INPUTi for every input i (any datatype, BYTES too). The
///   optional parameter `delay_us` makes each batch take that long (on a thread
///   of its own), to stand in for a slow model in tests and demonstrations;
///   `delay_per_item_us` adds that much per batch row, so that a batch of n
///   costs delay_us + n * delay_per_item_us: a GPU-like cost curve for the
///   batching and latency-target benchmarks. `delay_mode` is "sleep" (the
///   default: the batch waits without holding a core, like a GPU) or "spin"
///   (a busy wait of that much CPU time: it holds a core, like a CPU kernel).
///   The optional parameters `fault` ("error", "throw", "crash" or "hang") and
///   `fault_marker` (an FP32 value) fault every batch whose first input holds
///   the marker: an error value, an exception from execute, a broken
///   executor (executor_broken), or a batch that takes 30 s. `load_delay_us` makes loading the model take
///   that long. They exist for the supervision and model-control tests.
///   `asynchronous: "true"` runs the batches as an asynchronous backend
///   (threaded_backend.hpp: a thread of its own, `pipeline_depth` batches at
///   once, default 2), like a GPU's pipeline; then `fault: "hold"` holds a
///   marked batch until another batch has been submitted after it (10 s at
///   most, then it fails), which shows whether the executor is given batches
///   while one computes.
/// - `add_sub`:  OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 or FP32).

#include "core/error.hpp"
#include "executor/backend.hpp"

namespace caf_serving::executor {

/// Checks that `config` describes a model the builtin backend can compute, and
/// builds it; the error names what does not fit.
result<std::shared_ptr<backend>> make_builtin_backend(const model_config& config);

} // namespace caf_serving::executor
