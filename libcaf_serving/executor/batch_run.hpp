#pragma once
/// The pieces of running one batch that the synchronous and the asynchronous
/// executor share: reading the Batch message into views, the result message the
/// outputs are written into, and turning how the backend ended into that result
/// (errors, missing outputs, stage times). Internal to executor/.

#include "core/model_config.hpp"
#include "core/pipeline_messages.hpp"
#include "executor/backend.hpp"

#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::executor {

/// Hands out each output's memory inside the result message (output_writer).
class message_output_writer final : public output_writer {
public:
  message_output_writer(const model_config& cfg, capnp::List<wire::Tensor>::Builder outputs);

  uint8_t* allocate(std::string_view name, datatype dtype, const std::vector<int64_t>& shape,
                    size_t bytes) override;

  /// The first declared output the backend did not write, or nullptr.
  const tensor_config* missing() const;

private:
  const model_config& cfg_;
  capnp::List<wire::Tensor>::Builder outputs_;
  std::vector<bool> written_;
};

/// One batch ready for a backend: its inputs as views into the Batch message
/// (which must outlive it) and the result that its outputs go into. Not movable
/// once made: the writer refers into the result.
struct prepared_batch {
  uint64_t batch_id = 0;
  /// When the executor took the batch (now_ns).
  int64_t start_ns = 0;
  batch_view view;
  batch_result_message result;
  std::unique_ptr<message_output_writer> writer;
};

/// Reads `batch` into views and makes its result, sized from what it will hold.
/// `cfg` must outlive the returned batch (its writer refers to it).
std::unique_ptr<prepared_batch> prepare_batch(const model_config& cfg,
                                              const wire::Batch::Reader& batch);

/// How the backend ended a batch, for finish_batch.
struct batch_end {
  std::variant<std::monostate, serving_error> status;
  /// The text of what the backend threw (not executor_broken); empty: nothing.
  std::string thrown;
  /// When the backend's compute began and ended (now_ns).
  int64_t infer_start_ns = 0;
  int64_t infer_end_ns = 0;
};

/// The batch's result: its outputs, or the error that fails it (a throw is
/// logged and becomes a 500 naming the model, its text kept out of the answer),
/// with the stage times: compute_input up to infer_start, compute_infer until
/// infer_end, compute_output from then until now.
batch_result_message finish_batch(prepared_batch& batch, const model_config& cfg, batch_end end);

/// The text of a thrown exception (kj, std or unknown). Rethrows executor_broken.
std::string thrown_text(std::exception_ptr thrown);

} // namespace caf_serving::executor
