#pragma once
/// Answers on their way from the pipeline's threads to one HTTP event loop.
///
/// Each request used to get a kj cross-thread promise: every answer was one
/// cross-thread event, one eventfd write and, when the loop slept, one wake-up,
/// although a post-processor delivers a batch's answers in one burst. An inbox
/// takes answers from any thread and wakes its loop only when it was not
/// already woken: the loop takes everything that arrived since it last looked
/// in one turn.

#include "core/pipeline_messages.hpp"

#include <kj/async.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace caf_serving::ingress {

/// One request's end of its answer: the fulfiller of the promise the request
/// waits on. Created, fulfilled and destroyed on the loop's thread; a sink
/// holds a reference only to hand it back through post().
struct answer_cell {
  kj::Own<kj::PromiseFulfiller<kj::Maybe<response_message>>> fulfiller;
};

class answer_inbox {
public:
  /// A cell for a new request and the promise it fulfils (loop thread).
  static std::pair<std::shared_ptr<answer_cell>, kj::Promise<kj::Maybe<response_message>>>
  make_cell();

  /// Takes answers until the returned promise is dropped (loop thread).
  kj::Promise<void> run();

  /// Any thread: `answer` for the request of `cell`, which the call takes
  /// over (so that the last reference to it is dropped on the loop's thread).
  /// Dropped after close().
  void post(std::shared_ptr<answer_cell> cell, response_message answer);

  /// Loop thread, once its requests are gone: what is still queued is
  /// dropped, and so is whatever is posted later.
  void close();

  /// Times the loop was woken (a test's view of the batching).
  uint64_t wakes() const { return wakes_; }

private:
  struct item {
    std::shared_ptr<answer_cell> cell;
    response_message answer;
  };

  std::mutex mutex_;
  std::vector<item> items_;
  /// Fulfilled to wake the loop; replaced each time the loop has looked.
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> bell_;
  bool rung_ = false;
  bool closed_ = false;
  /// The loop's own: what it takes in one turn (its space is kept).
  std::vector<item> taken_;
  uint64_t wakes_ = 0;
};

} // namespace caf_serving::ingress
