#include "ingress/http_server.hpp"

#include <doctest/doctest.h>

using caf_serving::failure_reason;
using caf_serving::ingress::client_error_message;
using caf_serving::ingress::with_triton_phrase;

TEST_CASE("a full queue and a queue timeout begin with Triton's words") {
  CHECK(with_triton_phrase(failure_reason::queue_full, "the queue is full (4 requests)")
        == "Exceeds maximum queue size: the queue is full (4 requests)");
  CHECK(with_triton_phrase(failure_reason::timeout, "request waited 50 us")
        == "Request timeout expired: request waited 50 us");
  CHECK(with_triton_phrase(failure_reason::timeout, "Request timeout expired: x")
        == "Request timeout expired: x");
  CHECK(with_triton_phrase(failure_reason::internal, "boom") == "boom");
  CHECK(with_triton_phrase(failure_reason::unavailable, "unloaded") == "unloaded");
}

TEST_CASE("a pipeline error a client may read passes as it is") {
  std::string m = "input 'x' has shape [1,3] but the model expects [-1,4]";
  CHECK(client_error_message(m, "simple") == m);
  CHECK(client_error_message("model 'simple': the queue is full (--max-queue-size 4); retry later",
                             "simple")
        == "model 'simple': the queue is full (--max-queue-size 4); retry later");
}

TEST_CASE("CAF and kj internals in a pipeline error become a pointer to the server log") {
  // What the scheduler wrote when an executor failed: actor_system::render().
  for (const char* internal :
       {"executor failed (attempt 2): error(4, caf::sec::request_receiver_down)",
        "lost: system_error(sec::broken_promise)",
        "node down: exit_reason::user_shutdown",
        "kj/async-io-unix.c++:1234: disconnected: connection reset",
        "libcaf_serving/executor/executor_actor.cpp:88: boom"}) {
    CAPTURE(internal);
    auto m = client_error_message(internal, "simple");
    CHECK(m == "internal error while running model 'simple'; see the server log");
  }
}
