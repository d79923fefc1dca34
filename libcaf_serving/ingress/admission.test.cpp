#include "ingress/admission.hpp"

#include "core/clock.hpp"
#include "support/shm_object.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

/// A scheduler that answers each request at once, as an identity model's
/// pipeline would: its inputs come back as outputs, named OUTPUT<i>.
scheduler::scheduler_actor::behavior_type echo_scheduler() {
  return {
    [](infer_job& job) {
      auto in = job.request.reader();
      auto msg = response_message::create(1024);
      auto b = msg.builder();
      b.setId(in.getId());
      auto outputs = b.initOutputs(in.getInputs().size());
      for (unsigned i = 0; i < in.getInputs().size(); ++i) {
        auto from = in.getInputs()[i];
        auto to = outputs[i];
        to.setName("OUTPUT" + std::to_string(i));
        to.setDatatype(from.getDatatype());
        to.setShape(from.getShape());
        to.setData(from.getData());
      }
      job.sink->deliver(std::move(msg));
    },
    [](tick_atom) {},
    [](drain_atom) {},
    [](scheduler::add_executor_atom, const scheduler::executor_entry&) {},
  };
}

/// An identity model of one FP32 input of 4 values, without batching.
std::shared_ptr<server::model_pipeline> identity_model(caf::actor_system& sys, bool cached) {
  auto p = std::make_shared<server::model_pipeline>();
  p->config.name = "identity";
  p->config.inputs = {{"INPUT0", datatype::fp32, {4}}};
  p->config.outputs = {{"OUTPUT0", datatype::fp32, {4}}};
  p->config.response_cache_enabled = cached;
  p->version = 1;
  p->stats = std::make_shared<model_stats>("identity", 1);
  p->scheduler = sys.spawn(echo_scheduler);
  return p;
}

infer_request request_of(std::vector<float> values, std::vector<int64_t> shape = {4}) {
  infer_request r;
  r.id = "r1";
  infer_input in;
  in.name = "INPUT0";
  in.dtype = datatype::fp32;
  in.shape = std::move(shape);
  in.owned.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  in.data = in.owned;
  r.inputs.push_back(std::move(in));
  r.outputs.push_back({"OUTPUT0", false, 0, std::nullopt});
  return r;
}

uint64_t failures(const model_stats& stats, failure_reason reason) {
  return stats.failures[static_cast<size_t>(reason)].load();
}

/// Takes the one answer a request gets.
class promised_sink final : public response_sink {
public:
  explicit promised_sink(std::promise<response_message> p) : promise_(std::move(p)) {}
  void deliver(response_message r) override { promise_.set_value(std::move(r)); }

private:
  std::promise<response_message> promise_;
};

struct fixture {
  caf::actor_system_config sys_cfg;
  caf::actor_system sys{sys_cfg};
  admission_config cfg;

  fixture() {
    cfg.shared_memory = std::make_shared<shared_memory_registry>(shared_memory_config{});
    cfg.cache = std::make_shared<response_cache>(response_cache_config{1 << 20});
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "a request that fails validation is refused, counted as a bad "
                           "request, and no message is built") {
  auto model = identity_model(sys, false);
  auto outcome = admit(cfg, model, request_of({1, 2, 3}, {3}), now_ns());
  auto* e = std::get_if<serving_error>(&outcome);
  REQUIRE(e);
  CHECK(e->status == status_code::bad_request);
  CHECK(e->message.find("INPUT0") != std::string::npos);
  CHECK(failures(*model->stats, failure_reason::bad_request) == 1);
  CHECK(model->stats->success.count.load() == 0);
}

TEST_CASE_FIXTURE(fixture, "an input in a shared-memory region that is not registered is "
                           "refused with Triton's 404 and counted") {
  auto model = identity_model(sys, false);
  auto request = request_of({1, 2, 3, 4});
  request.inputs[0].owned.clear();
  request.inputs[0].data = {};
  request.inputs[0].shared_memory = shared_memory_ref{"no_such_region", 0, 16};
  auto outcome = admit(cfg, model, std::move(request), now_ns());
  auto* e = std::get_if<serving_error>(&outcome);
  REQUIRE(e);
  CHECK(e->status == status_code::not_found);
  CHECK(e->message.find("Unable to find shared memory region: 'no_such_region'")
        != std::string::npos);
  CHECK(failures(*model->stats, failure_reason::bad_request) == 1);
}

TEST_CASE_FIXTURE(fixture, "an admitted request goes to the scheduler with its sink, and its "
                           "answer is read, counted once, and stored for the next one") {
  auto model = identity_model(sys, true);
  int64_t received = now_ns();
  auto request = request_of({1, 2, 3, 4});
  request.parameters["timing"] = "true";
  auto outcome = admit(cfg, model, std::move(request), received);
  auto* admitted = std::get_if<admitted_request>(&outcome);
  REQUIRE(admitted);
  // The message holds the inputs (the one copy); the answer keeps the rest.
  auto in = admitted->message.reader();
  CHECK(std::string(in.getId().cStr()) == "r1");
  REQUIRE(in.getInputs().size() == 1);
  CHECK(in.getInputs()[0].getData().size() == 16);
  CHECK(in.getTimes().getReceivedNs() == received);
  auto& answer = admitted->answer;
  CHECK(answer.request.inputs.empty());
  CHECK(answer.request.id == "r1");
  CHECK(answer.timing);
  CHECK(answer.miss.cache != nullptr);
  CHECK(answer.miss.key.has_value());

  std::promise<response_message> promised;
  auto answered = promised.get_future();
  submit(*model, std::move(admitted->message),
         std::make_shared<promised_sink>(std::move(promised)));
  REQUIRE(answered.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto msg = answered.get();
  auto view = read_answer(msg, answer, *model, received);
  REQUIRE(view.ok());
  REQUIRE(view->outputs.size() == 1);
  float values[4];
  std::memcpy(values, view->outputs[0].data.data(), sizeof(values));
  CHECK(values[3] == 4.0f);
  CHECK(view->parameters.size() == 6); // timing: the stage times
  record_answer(answer, *model->stats, view->outputs, received);
  CHECK(model->stats->success.count.load() == 1);
  CHECK(model->stats->cache_miss.count.load() == 1);

  SUBCASE("the same request again is a cache hit, answered without the pipeline") {
    auto again = admit(cfg, model, request_of({1, 2, 3, 4}), now_ns());
    auto* hit = std::get_if<cache_hit>(&again);
    REQUIRE(hit);
    auto cached = cached_answer(*hit, *model->stats, now_ns());
    REQUIRE(cached.outputs.size() == 1);
    CHECK(cached.outputs[0].data == view->outputs[0].data);
    CHECK(cached.parameters.empty()); // no timing asked for
    record_answer(hit->answer, *model->stats, cached.outputs, now_ns());
    CHECK(model->stats->cache_hit.count.load() == 1);
    CHECK(model->stats->cache_miss.count.load() == 1);
    CHECK(model->stats->success.count.load() == 2);
  }
  SUBCASE("another request misses") {
    auto other = admit(cfg, model, request_of({5, 6, 7, 8}), now_ns());
    CHECK(std::holds_alternative<admitted_request>(other));
  }
}

TEST_CASE_FIXTURE(fixture, "an input in shared memory is read from its region into the "
                           "message, and such a request does not use the response cache") {
  shared_memory_config shm_cfg;
  shm_cfg.allow_client_shm = true;
  auto regions = std::make_shared<shared_memory_registry>(shm_cfg);
  support::shm_object region(64);
  region.put(0, std::vector<float>{9, 8, 7, 6});
  REQUIRE(regions->register_system("in", region.key, 0, 64));
  cfg.shared_memory = regions;
  auto model = identity_model(sys, true);
  auto request = request_of({1, 2, 3, 4});
  request.inputs[0].owned.clear();
  request.inputs[0].data = {};
  request.inputs[0].shared_memory = shared_memory_ref{"in", 0, 16};
  auto outcome = admit(cfg, model, std::move(request), now_ns());
  REQUIRE(std::holds_alternative<admitted_request>(outcome));
  auto& admitted = std::get<admitted_request>(outcome);
  auto data = admitted.message.reader().getInputs()[0].getData();
  float first = 0;
  std::memcpy(&first, data.begin(), sizeof(first));
  CHECK(first == 9.0f);
  CHECK_FALSE(admitted.answer.shared_memory.empty());
  CHECK(admitted.answer.miss.cache == nullptr);
  CHECK(model->stats->cache_miss.count.load() == 0);
}

TEST_CASE_FIXTURE(fixture, "a pipeline's error answer is counted, with Triton's phrase first "
                           "and no internals") {
  auto model = identity_model(sys, false);
  auto outcome = admit(cfg, model, request_of({1, 2, 3, 4}), now_ns());
  REQUIRE(std::holds_alternative<admitted_request>(outcome));
  auto& answer = std::get<admitted_request>(outcome).answer;
  auto msg = response_message::create(512);
  auto err = msg.builder().initError();
  err.setStatus(503);
  err.setMessage("the queue is full (4 requests)");
  err.setReason(wire::FailureReason::QUEUE_FULL);
  auto view = read_answer(msg, answer, *model, now_ns());
  REQUIRE_FALSE(view.ok());
  CHECK(view.error().status == status_code::unavailable);
  CHECK(view.error().message == "Exceeds maximum queue size: the queue is full (4 requests)");
  CHECK(failures(*model->stats, failure_reason::queue_full) == 1);
}

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
