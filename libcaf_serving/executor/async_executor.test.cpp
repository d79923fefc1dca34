#include "executor/async_executor.hpp"

#include "executor/testing.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <variant>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::executor;
using testing::batch_fate;
using testing::latched_backend;
using testing::latched_config;

namespace {

model_config int_model() {
  model_config cfg;
  cfg.name = "latched";
  cfg.max_batch_size = 8;
  cfg.inputs = {{"INPUT0", datatype::int32, {4}}};
  cfg.outputs = {{"OUTPUT0", datatype::int32, {4}}};
  return cfg;
}

/// A batch of `rows` rows whose elements count up from `key` (its first).
batch_message make_batch(int32_t key, uint32_t rows = 1) {
  auto msg = batch_message::create();
  auto b = msg.builder();
  b.setBatchId(static_cast<uint64_t>(key) * 7 + 1);
  b.setModelName("latched");
  b.setRows(rows);
  auto in = b.initInputs(1)[0];
  in.setName("INPUT0");
  in.setDatatype(wire::DataType::INT32);
  auto shape = in.initShape(2);
  shape.set(0, rows);
  shape.set(1, 4);
  auto data = in.initData(rows * 16);
  for (uint32_t e = 0; e < rows * 4; ++e) {
    int32_t v = key + static_cast<int32_t>(e);
    std::memcpy(data.begin() + e * 4, &v, 4);
  }
  return msg;
}

/// The answers to run_batch requests, by key, in the order they arrived.
struct answers {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<int32_t, std::variant<batch_result_message, caf::error>> by_key;
  std::vector<int32_t> order;

  void add(int32_t key, std::variant<batch_result_message, caf::error> a) {
    std::lock_guard<std::mutex> guard(mutex);
    by_key.emplace(key, std::move(a));
    order.push_back(key);
    cv.notify_all();
  }

  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return order.size() >= n; });
  }

  size_t count() {
    std::lock_guard<std::mutex> guard(mutex);
    return order.size();
  }

  bool has(int32_t key) {
    std::lock_guard<std::mutex> guard(mutex);
    return by_key.count(key) > 0;
  }

  batch_result_message result(int32_t key) {
    std::lock_guard<std::mutex> guard(mutex);
    return std::get<batch_result_message>(by_key.at(key));
  }

  bool is_error(int32_t key) {
    std::lock_guard<std::mutex> guard(mutex);
    return std::holds_alternative<caf::error>(by_key.at(key));
  }

  caf::error error(int32_t key) {
    std::lock_guard<std::mutex> guard(mutex);
    return std::get<caf::error>(by_key.at(key));
  }
};

/// Sends batch `key` to `ex` from an actor of its own, as the scheduler does.
void ask(caf::actor_system& sys, const executor_actor& ex, int32_t key, answers& a,
         uint32_t rows = 1) {
  auto batch = make_batch(key, rows);
  sys.spawn([ex, batch, key, &a](caf::event_based_actor* self) {
    self->request(ex, caf::infinite, run_batch{batch, nullptr})
      .then([key, &a](batch_result_message& r) { a.add(key, r); },
            [key, &a](caf::error& e) { a.add(key, e); });
  });
}

/// Checks that `r` answers batch `key` of `rows` rows: its id, and every
/// element its input plus the backend's 1000.
void check_answers(batch_result_message r, int32_t key, uint32_t rows = 1) {
  auto res = r.reader();
  CHECK(res.getBatchId() == static_cast<uint64_t>(key) * 7 + 1);
  REQUIRE(res.getError().getStatus() == 0);
  REQUIRE(res.getOutputs().size() == 1);
  auto out = res.getOutputs()[0];
  CHECK(std::string(out.getName().cStr()) == "OUTPUT0");
  REQUIRE(out.getShape().size() == 2);
  CHECK(out.getShape()[0] == rows);
  auto data = out.getData();
  REQUIRE(data.size() == rows * 16);
  for (uint32_t e = 0; e < rows * 4; ++e) {
    int32_t v;
    std::memcpy(&v, data.begin() + e * 4, 4);
    CHECK(v == key + static_cast<int32_t>(e) + 1000);
  }
}

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;

  fixture() {
    cfg.set("scheduler.max-threads", size_t{2});
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

} // namespace

TEST_CASE("an asynchronous backend holds several batches at once and each answer is its own") {
  fixture f;
  auto be = std::make_shared<latched_backend>(int_model(), latched_config{});
  auto ex = spawn_executor(*f.sys, be, int_model());
  answers a;
  ask(*f.sys, ex, 10, a, 2);
  ask(*f.sys, ex, 20, a, 3);
  ask(*f.sys, ex, 30, a, 1);
  // None is released yet, so the executor took each next batch while the ones
  // before it were still computing.
  REQUIRE(be->wait_submitted(3));
  CHECK(be->held() == 3);
  CHECK(a.count() == 0);
  // Completed out of order: each is answered when it completes, with its own data.
  be->release(20);
  REQUIRE(a.wait_for(1));
  CHECK(a.has(20));
  be->release(30);
  REQUIRE(a.wait_for(2));
  be->release(10);
  REQUIRE(a.wait_for(3));
  CHECK(a.order == std::vector<int32_t>{20, 30, 10});
  check_answers(a.result(10), 10, 2);
  check_answers(a.result(20), 20, 3);
  check_answers(a.result(30), 30, 1);
  CHECK(be->held() == 0);
  caf::anon_send_exit(ex, caf::exit_reason::user_shutdown);
}

TEST_CASE("the stage times of an asynchronous batch come from the backend's own clock") {
  fixture f;
  auto be = std::make_shared<latched_backend>(int_model(), latched_config{});
  auto ex = spawn_executor(*f.sys, be, int_model());
  answers a;
  ask(*f.sys, ex, 5, a, 8);
  REQUIRE(be->wait_submitted(1));
  be->release(5);
  REQUIRE(a.wait_for(1));
  auto r = a.result(5).reader();
  auto [start, end] = be->reported_times(5);
  REQUIRE(start > 0);
  // The wait until the release is input staging (queued behind the device),
  // not inference: inference is exactly the backend's span.
  CHECK(r.getComputeInferNs() == end - start);
  CHECK(r.getComputeInputNs() >= 0);
  CHECK(r.getComputeOutputNs() >= 0);
  caf::anon_send_exit(ex, caf::exit_reason::user_shutdown);
}

TEST_CASE("a failing asynchronous batch fails alone") {
  fixture f;
  latched_config lc;
  lc.fail_on_submit[40] = batch_fate::exception;
  auto be = std::make_shared<latched_backend>(int_model(), lc);
  auto ex = spawn_executor(*f.sys, be, int_model());
  answers a;
  ask(*f.sys, ex, 10, a);
  ask(*f.sys, ex, 20, a);
  ask(*f.sys, ex, 30, a);
  REQUIRE(be->wait_submitted(3));
  be->release(20, batch_fate::error_value);
  be->release(30, batch_fate::exception);
  REQUIRE(a.wait_for(2));
  // A throw from submit fails its batch at once, the others still held.
  ask(*f.sys, ex, 40, a);
  REQUIRE(a.wait_for(3));
  CHECK(be->held() == 1);
  be->release(10);
  REQUIRE(a.wait_for(4));
  check_answers(a.result(10), 10);
  auto refused = a.result(20).reader();
  CHECK(refused.getError().getStatus() == static_cast<uint16_t>(status_code::bad_request));
  CHECK(std::string(refused.getError().getMessage().cStr()).find("refused") != std::string::npos);
  for (int32_t key : {30, 40}) {
    auto thrown = a.result(key).reader();
    CHECK(thrown.getError().getStatus() == static_cast<uint16_t>(status_code::internal));
    // The exception's text stays in the log; the answer names the model.
    std::string message = thrown.getError().getMessage().cStr();
    CHECK(message.find("model 'latched' failed") != std::string::npos);
    CHECK(message.find("threw") == std::string::npos);
    CHECK(thrown.getOutputs().size() == 0);
  }
  // The executor lives on.
  ask(*f.sys, ex, 50, a);
  REQUIRE(be->wait_submitted(4));
  be->release(50);
  REQUIRE(a.wait_for(5));
  check_answers(a.result(50), 50);
  caf::anon_send_exit(ex, caf::exit_reason::user_shutdown);
}

TEST_CASE("executor_broken from a completion stops the executor and answers every batch it held") {
  fixture f;
  auto be = std::make_shared<latched_backend>(int_model(), latched_config{});
  auto ex = spawn_executor(*f.sys, be, int_model());
  caf::scoped_actor self{*f.sys};
  self->monitor(ex);
  answers a;
  ask(*f.sys, ex, 10, a);
  ask(*f.sys, ex, 20, a);
  REQUIRE(be->wait_submitted(2));
  be->release(10, batch_fate::broken);
  REQUIRE(a.wait_for(2));
  // Both come back as a lost executor, which the scheduler sends elsewhere.
  for (int32_t key : {10, 20}) {
    REQUIRE(a.is_error(key));
    CHECK(a.error(key) == caf::sec::request_receiver_down);
  }
  bool down = false;
  self->receive([&](caf::down_msg& dm) { down = dm.source == ex.address(); });
  CHECK(down);
  // The batch still held completes later into an actor that is gone.
  be->release(20);
  REQUIRE(be->wait_completed(2));
}

TEST_CASE("executor_broken from submit stops the executor and answers every batch it held") {
  fixture f;
  latched_config lc;
  lc.fail_on_submit[30] = batch_fate::broken;
  auto be = std::make_shared<latched_backend>(int_model(), lc);
  auto ex = spawn_executor(*f.sys, be, int_model());
  caf::scoped_actor self{*f.sys};
  self->monitor(ex);
  answers a;
  ask(*f.sys, ex, 10, a);
  REQUIRE(be->wait_submitted(1));
  ask(*f.sys, ex, 30, a);
  REQUIRE(a.wait_for(2));
  CHECK(a.error(10) == caf::sec::request_receiver_down);
  CHECK(a.error(30) == caf::sec::request_receiver_down);
  bool down = false;
  self->receive([&](caf::down_msg& dm) { down = dm.source == ex.address(); });
  CHECK(down);
  be->release(10);
  REQUIRE(be->wait_completed(1));
}

TEST_CASE("an executor killed with batches in flight answers them, and their completions "
          "come later without harm") {
  fixture f;
  auto be = std::make_shared<latched_backend>(int_model(), latched_config{});
  auto ex = spawn_executor(*f.sys, be, int_model());
  answers a;
  ask(*f.sys, ex, 10, a, 4);
  ask(*f.sys, ex, 20, a, 4);
  REQUIRE(be->wait_submitted(2));
  caf::anon_send_exit(ex, caf::exit_reason::kill);
  REQUIRE(a.wait_for(2));
  CHECK(a.error(10) == caf::sec::request_receiver_down);
  CHECK(a.error(20) == caf::sec::request_receiver_down);
  // The backend still writes their outputs (into memory the completions keep).
  be->release(20);
  be->release(10);
  REQUIRE(be->wait_completed(2));
  CHECK(a.count() == 2);
}

TEST_CASE("an executor that owns its backend completes what it held when it is killed") {
  fixture f;
  std::mutex mutex;
  std::condition_variable cv;
  std::optional<std::pair<size_t, size_t>> destroyed;
  latched_config lc;
  lc.on_destroyed = [&](size_t submitted, size_t completed) {
    std::lock_guard<std::mutex> guard(mutex);
    destroyed = {submitted, completed};
    cv.notify_all();
  };
  auto be = std::make_shared<latched_backend>(int_model(), lc);
  auto* raw = be.get();
  auto ex = spawn_executor(*f.sys, std::move(be), int_model());
  answers a;
  ask(*f.sys, ex, 10, a);
  ask(*f.sys, ex, 20, a);
  ask(*f.sys, ex, 30, a);
  REQUIRE(raw->wait_submitted(3));
  raw->release(30);
  REQUIRE(a.wait_for(1));
  caf::anon_send_exit(ex, caf::exit_reason::kill);
  REQUIRE(a.wait_for(3));
  check_answers(a.result(30), 30);
  CHECK(a.error(10) == caf::sec::request_receiver_down);
  CHECK(a.error(20) == caf::sec::request_receiver_down);
  // The actor's end destroyed the backend, which completed the two it held.
  std::unique_lock<std::mutex> lock(mutex);
  REQUIRE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return destroyed.has_value(); }));
  CHECK(destroyed->first == 3);
  CHECK(destroyed->second == 3);
}

TEST_CASE("an asynchronous backend that does not block runs on CAF's workers alike") {
  fixture f;
  latched_config lc;
  lc.blocks = false;
  auto be = std::make_shared<latched_backend>(int_model(), lc);
  auto ex = spawn_executor(*f.sys, be, int_model());
  answers a;
  ask(*f.sys, ex, 10, a);
  ask(*f.sys, ex, 20, a);
  REQUIRE(be->wait_submitted(2));
  be->release(10);
  be->release(20);
  REQUIRE(a.wait_for(2));
  check_answers(a.result(10), 10);
  check_answers(a.result(20), 20);
  caf::anon_send_exit(ex, caf::exit_reason::user_shutdown);
}
