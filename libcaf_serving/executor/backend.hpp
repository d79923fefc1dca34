#pragma once
/// What an executor runs: a backend turns one batch's input tensors into its output
/// tensors. Later backends (ONNX on CPU, CUDA) implement the same interface; the
/// executor actor never knows which one it holds.

#include "core/datatype.hpp"
#include "core/error.hpp"
#include "core/model_config.hpp"

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace caf_serving::executor {

/// A read-only tensor: raw little-endian elements (BYTES: 4-byte length + bytes).
struct tensor_view {
  std::string_view name;
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape; ///< includes the batch dimension when the model batches
  const uint8_t* data = nullptr;
  size_t size = 0;
};

/// Where a backend writes an output. The executor hands out memory inside the
/// outgoing BatchResult message, so outputs are written once and never copied.
class output_writer {
public:
  virtual ~output_writer() = default;
  /// Returns `bytes` writable bytes for output `name` (one of the model's outputs).
  virtual uint8_t* allocate(std::string_view name, datatype dtype,
                            const std::vector<int64_t>& shape, size_t bytes) = 0;
};

struct batch_view {
  uint32_t rows = 0; ///< batch dimension; 1 for a model that does not batch
  std::vector<tensor_view> inputs; ///< in the model's input order
};

/// Thrown by a backend whose instance can run no more batches (its state is
/// broken, e.g. a sticky device error). The executor actor stops; the scheduler
/// answers or re-sends its batch and starts a new executor for the instance.
/// Any other exception fails only the batch it was thrown from.
class executor_broken : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// How an asynchronous backend's batch ended (backend::submit).
struct batch_completion {
  /// As execute() returns it: nothing, or an expected failure of this batch.
  std::variant<std::monostate, serving_error> status;
  /// What execute() would have thrown: executor_broken stops the executor (and
  /// fails every batch it holds), anything else fails this batch alone.
  std::exception_ptr thrown;
  /// The backend's own clock (now_ns) for when this batch's compute began (after
  /// the batches ahead of it, with its inputs in place) and when its outputs were
  /// in place; 0 where the backend cannot tell. The executor reports the stage
  /// times from them: compute_input up to the start, compute_infer between.
  int64_t compute_start_ns = 0;
  int64_t compute_end_ns = 0;
};

/// Called exactly once per submitted batch (backend::submit).
using completion_handler = std::function<void(batch_completion)>;

class backend {
public:
  virtual ~backend() = default;
  /// True when a batch can take long enough (milliseconds) that it must not run on
  /// CAF's shared workers; the executor then runs on a thread of its own.
  virtual bool blocks() const = 0;
  /// Runs one batch. Expected failures (a shape the backend cannot run) are values.
  virtual std::variant<std::monostate, serving_error> execute(const batch_view& batch,
                                                              output_writer& out) = 0;

  // -- asynchronous backends (optional) ---------------------------------------
  //
  // A backend that overlaps consecutive batches (a GPU copying batch N+1 in while
  // it computes batch N) says so with asynchronous(); the executor actor then
  // calls submit() instead of execute(), keeps several batches in flight, and
  // answers each when its completion arrives. Synchronous backends implement
  // none of this.

  /// True when submit() is implemented and the executor should use it.
  virtual bool asynchronous() const { return false; }
  /// How many batches the backend can usefully hold at once (its pipeline
  /// depth): the scheduler gives the instance's executor at least this many
  /// credits (server/model_manager.cpp). 1 for a synchronous backend.
  virtual uint32_t pipeline_depth() const { return 1; }
  /// Starts one batch and returns, usually before it has run. `batch` (and the
  /// memory it points to) and `out` stay valid until `done` is called; `out` may
  /// be written from any thread until then. Unless submit throws, `done` is
  /// called exactly once, when the outputs are written or the batch failed, from
  /// a thread of the backend's own, never a CAF worker; a backend destroyed
  /// with batches submitted calls their completions (with an error) before its
  /// destructor returns. If submit throws (as execute would), `done` is never
  /// called. Submit may wait while the backend holds pipeline_depth() batches.
  virtual void submit(const batch_view& batch, output_writer& out, completion_handler done);
};

inline void backend::submit(const batch_view&, output_writer&, completion_handler) {
  throw std::logic_error("submit() called on a backend that is not asynchronous");
}

} // namespace caf_serving::executor
