#include "ingress/answer_inbox.hpp"

#include <doctest/doctest.h>
#include <kj/async.h>

#include <string>
#include <thread>
#include <vector>

using namespace caf_serving;
using caf_serving::ingress::answer_cell;
using caf_serving::ingress::answer_inbox;

namespace {

response_message answer_with_id(int id) {
  auto msg = response_message::create();
  msg.builder().setId(std::to_string(id));
  return msg;
}

std::string id_of(kj::Maybe<response_message>& m) {
  KJ_IF_MAYBE (r, m)
    return r->reader().getId().cStr();
  return "(none)";
}

} // namespace

TEST_CASE("answers posted from other threads reach their own requests; a burst wakes the "
          "loop once") {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  auto inbox = std::make_shared<answer_inbox>();
  auto running = inbox->run().eagerlyEvaluate(nullptr);
  constexpr int n = 64;
  std::vector<std::shared_ptr<answer_cell>> cells;
  std::vector<kj::Promise<kj::Maybe<response_message>>> promises;
  for (int i = 0; i < n; ++i) {
    auto [cell, promise] = answer_inbox::make_cell();
    cells.push_back(std::move(cell));
    promises.push_back(kj::mv(promise));
  }
  // One burst from another thread, as a post-processor delivers a batch,
  // while the loop does not look.
  std::thread poster([&] {
    for (int i = n - 1; i >= 0; --i)
      inbox->post(std::move(cells[static_cast<size_t>(i)]), answer_with_id(i));
  });
  poster.join();
  for (int i = 0; i < n; ++i) {
    auto got = promises[static_cast<size_t>(i)].wait(ws);
    CHECK(id_of(got) == std::to_string(i));
  }
  CHECK(inbox->wakes() == 1);

  // Answers posted while the loop is taking the last lot are not lost.
  std::vector<kj::Promise<kj::Maybe<response_message>>> more;
  std::vector<std::shared_ptr<answer_cell>> later;
  for (int i = 0; i < 200; ++i) {
    auto [cell, promise] = answer_inbox::make_cell();
    later.push_back(std::move(cell));
    more.push_back(kj::mv(promise));
  }
  std::thread trickle([&] {
    for (int i = 0; i < 200; ++i) {
      inbox->post(std::move(later[static_cast<size_t>(i)]), answer_with_id(1000 + i));
      if (i % 7 == 0)
        std::this_thread::yield();
    }
  });
  for (int i = 0; i < 200; ++i) {
    auto got = more[static_cast<size_t>(i)].wait(ws);
    CHECK(id_of(got) == std::to_string(1000 + i));
  }
  trickle.join();
}

TEST_CASE("a request that is gone is skipped; after close() answers are dropped") {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  auto inbox = std::make_shared<answer_inbox>();
  auto running = inbox->run().eagerlyEvaluate(nullptr);
  auto [gone_cell, gone] = answer_inbox::make_cell();
  auto [kept_cell, kept] = answer_inbox::make_cell();
  { auto dropped = kj::mv(gone); } // the client left: its promise is dropped
  inbox->post(std::move(gone_cell), answer_with_id(1));
  inbox->post(std::move(kept_cell), answer_with_id(2));
  auto got = kept.wait(ws);
  CHECK(id_of(got) == "2");

  auto [late_cell, late] = answer_inbox::make_cell();
  running = kj::READY_NOW;
  inbox->close();
  inbox->post(std::move(late_cell), answer_with_id(3));
  // Not answered: its fulfiller went with the dropped answer (in the server,
  // the request was gone before close()).
  CHECK_THROWS(late.wait(ws));
}
