#pragma once
/// What an executor runs: a backend turns one batch's input tensors into its output
/// tensors. Later backends (ONNX on CPU, CUDA) implement the same interface; the
/// executor actor never knows which one it holds.

#include "core/datatype.hpp"
#include "core/error.hpp"
#include "core/model_config.hpp"

#include <cstdint>
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

class backend {
public:
  virtual ~backend() = default;
  /// True when a batch can take long enough (milliseconds) that it must not run on
  /// CAF's shared workers; the executor then runs on a thread of its own.
  virtual bool blocks() const = 0;
  /// Runs one batch. Expected failures (a shape the backend cannot run) are values.
  virtual std::variant<std::monostate, serving_error> execute(const batch_view& batch,
                                                              output_writer& out) = 0;
};

} // namespace caf_serving::executor
