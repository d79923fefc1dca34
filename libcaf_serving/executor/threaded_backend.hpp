#pragma once
/// A synchronous backend run as an asynchronous one (backend::submit): batches
/// queue to a thread of the wrapper's own, which runs them one after another
/// through the inner backend's execute() and completes each. It stands in for a
/// device with a pipeline (the builtin backend's `asynchronous` parameter), so
/// that the asynchronous executor, the scheduler's credit window and the whole
/// server can be exercised without a GPU.

#include "executor/backend.hpp"

#include <chrono>
#include <functional>
#include <memory>

namespace caf_serving::executor {

struct threaded_config {
  /// backend::pipeline_depth: batches submit() accepts before it waits.
  uint32_t pipeline_depth = 2;
  /// For tests of the credit window: a batch for which this is true is held on
  /// the thread until another batch has been submitted after it; if none comes
  /// within `hold_limit` it fails with an error saying so. Empty: none is held.
  std::function<bool(const batch_view&)> hold;
  std::chrono::milliseconds hold_limit{10000};
};

std::shared_ptr<backend> make_threaded_backend(std::shared_ptr<backend> inner,
                                               threaded_config config);

} // namespace caf_serving::executor
