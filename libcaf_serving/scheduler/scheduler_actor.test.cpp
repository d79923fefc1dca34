#include "scheduler/scheduler_actor.hpp"

#include "executor/builtin_backend.hpp"
#include "executor/testing.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

using namespace caf_serving;

namespace {

model_config identity_model(int max_batch, uint64_t delay_us, uint32_t queue) {
  model_config cfg;
  cfg.name = "id";
  cfg.max_batch_size = max_batch;
  cfg.inputs = {{"INPUT0", datatype::int32, {4}}};
  cfg.outputs = {{"OUTPUT0", datatype::int32, {4}}};
  cfg.parameters["function"] = "identity";
  cfg.parameters["delay_us"] = std::to_string(delay_us);
  cfg.dynamic_batching_enabled = true;
  cfg.dynamic_batching.max_queue_delay_us = 2000;
  cfg.dynamic_batching.default_queue_policy.max_queue_size = queue;
  return cfg;
}

/// Collects every response by request id; counts duplicates.
struct collector {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, std::vector<response_message>> by_id;
  size_t total = 0;

  void add(response_message r) {
    std::lock_guard<std::mutex> guard(mutex);
    by_id[r.reader().getId().cStr()].push_back(std::move(r));
    ++total;
    cv.notify_all();
  }

  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return total >= n; });
  }
};

struct collecting_sink : response_sink {
  explicit collecting_sink(collector& c) : c_(c) {}
  void deliver(response_message r) override { c_.add(std::move(r)); }
  collector& c_;
};

/// A request for identity_model whose one row holds the 4 int32 values from
/// `id` up.
infer_job make_job(int id, collector& c) {
  auto msg = request_message::create();
  auto b = msg.builder();
  b.setId(std::to_string(id));
  b.setModelName("id");
  b.setModelVersion(1);
  b.setRows(1);
  auto in = b.initInputs(1)[0];
  in.setName("INPUT0");
  in.setDatatype(wire::DataType::INT32);
  auto shape = in.initShape(2);
  shape.set(0, 1);
  shape.set(1, 4);
  int32_t values[4];
  for (int i = 0; i < 4; ++i)
    values[i] = id + i;
  std::memcpy(in.initData(16).begin(), values, 16);
  return {msg, std::make_shared<collecting_sink>(c)};
}

struct pipeline {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<model_stats> stats = std::make_shared<model_stats>("id", 1);
  scheduler::scheduler_actor sched;
  postprocess::postprocessor_actor first_postprocessor;
  executor::executor_actor first_executor;

  explicit pipeline(const model_config& model) {
    cfg.set("scheduler.max-threads", size_t{2});
    sys = std::make_unique<caf::actor_system>(cfg);
    scheduler::scheduler_config sc;
    sc.model = model;
    sc.policy = scheduler::make_policy_config(model, 64);
    sc.stats = stats;
    auto be = executor::make_builtin_backend(model);
    REQUIRE(be.ok());
    first_executor = executor::spawn_executor(*sys, *be, model);
    sc.executors.push_back(first_executor);
    sc.respawn_executor = [this, backend = *be, model] {
      return executor::spawn_executor(*sys, backend, model);
    };
    postprocess::postprocessor_config pc;
    pc.stats = stats;
    first_postprocessor = postprocess::spawn_postprocessor(*sys, pc);
    sc.postprocessor = first_postprocessor;
    sc.respawn_postprocessor = [this, pc] { return postprocess::spawn_postprocessor(*sys, pc); };
    sched = scheduler::spawn_scheduler(*sys, std::move(sc));
  }

  ~pipeline() {
    caf::anon_send(sched, drain_atom::value);
    sys->await_all_actors_done();
  }
};

} // namespace

TEST_CASE("every request is answered exactly once, with its own rows, in batches") {
  auto model = identity_model(8, 3000, 64);
  collector c;
  {
    pipeline p(model);
    for (int i = 0; i < 40; ++i)
      caf::anon_send(p.sched, make_job(i * 10, c));
    REQUIRE(c.wait_for(40));
    // A batch takes 3 ms, so requests pile up behind the first and go out together.
    CHECK(p.stats->execution_count.load() < 40);
    CHECK(p.stats->inference_count.load() == 40);
  }
  CHECK(c.total == 40);
  for (int i = 0; i < 40; ++i) {
    auto& rs = c.by_id[std::to_string(i * 10)];
    REQUIRE(rs.size() == 1);
    auto r = rs[0].reader();
    REQUIRE(r.getError().getStatus() == 0);
    auto out = r.getOutputs()[0].getData();
    REQUIRE(out.size() == 16);
    int32_t values[4];
    std::memcpy(values, out.begin(), 16);
    CHECK(values[0] == i * 10);
    CHECK(values[3] == i * 10 + 3);
    CHECK(r.getTimes().getComputeEndNs() >= r.getTimes().getComputeStartNs());
    CHECK(r.getTimes().getBatchFormedNs() >= r.getTimes().getEnqueuedNs());
  }
}

TEST_CASE("a full queue answers 503 at once and the rest are served") {
  auto model = identity_model(1, 20000, 2);
  model.dynamic_batching.max_queue_delay_us = 0;
  collector c;
  {
    pipeline p(model);
    for (int i = 0; i < 10; ++i)
      caf::anon_send(p.sched, make_job(i, c));
    REQUIRE(c.wait_for(10));
  }
  size_t ok = 0, full = 0;
  for (auto& [id, rs] : c.by_id) {
    REQUIRE(rs.size() == 1);
    auto e = rs[0].reader().getError();
    if (e.getStatus() == 0)
      ++ok;
    else if (e.getStatus() == 503 && e.getReason() == wire::FailureReason::QUEUE_FULL)
      ++full;
  }
  // One runs, two wait, and the queue holds no more than max_queue_size.
  CHECK(ok + full == 10);
  CHECK(full >= 6);
  CHECK(ok >= 2);
}

TEST_CASE("a killed post-processor or executor is replaced; later requests are answered") {
  auto model = identity_model(8, 0, 64);
  collector c;
  {
    pipeline p(model);
    caf::anon_send(p.sched, make_job(1, c));
    REQUIRE(c.wait_for(1));
    // As if an exception had escaped each: an abnormal exit that a linked
    // scheduler may trap (exit_reason::kill cannot be trapped).
    for (auto addr : {p.first_postprocessor.address(), p.first_executor.address()}) {
      auto ptr = caf::actor_cast<caf::strong_actor_ptr>(addr);
      ptr->enqueue(nullptr, caf::make_message_id(),
                   caf::make_message(caf::exit_msg{addr, caf::make_error(caf::sec::runtime_error)}),
                   nullptr);
    }
    // The scheduler learns of both deaths and starts new ones.
    for (int k = 0; k < 2000 && (p.stats->stage_restarts.load() < 1
                                 || p.stats->executor_restarts.load() < 1); ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(p.stats->stage_restarts.load() == 1);
    CHECK(p.stats->executor_restarts.load() == 1);
    CHECK(p.stats->healthy_executors.load() == 1);
    for (int i = 2; i <= 21; ++i)
      caf::anon_send(p.sched, make_job(i * 10, c));
    REQUIRE(c.wait_for(21));
  }
  CHECK(c.total == 21);
  for (int i = 2; i <= 21; ++i) {
    auto& rs = c.by_id[std::to_string(i * 10)];
    REQUIRE(rs.size() == 1);
    CHECK(rs[0].reader().getError().getStatus() == 0);
  }
}

TEST_CASE("an asynchronous executor is sent batches up to its credit window while earlier "
          "ones compute") {
  // max_batch_size 1: each request is a batch of its own.
  auto model = identity_model(1, 0, 64);
  executor::testing::latched_config lc;
  lc.add = 0; // identity: each response holds its own request's values
  auto be = std::make_shared<executor::testing::latched_backend>(model, lc);
  collector c;
  {
    caf::actor_system_config cfg;
    cfg.set("scheduler.max-threads", size_t{2});
    caf::actor_system sys{cfg};
    scheduler::scheduler_config sc;
    sc.model = model;
    sc.policy = scheduler::make_policy_config(model, 64);
    sc.stats = std::make_shared<model_stats>("id", 1);
    sc.executor_depth = be->pipeline_depth();
    sc.executors.push_back(executor::spawn_executor(sys, be, model));
    postprocess::postprocessor_config pc;
    pc.stats = sc.stats;
    sc.postprocessor = postprocess::spawn_postprocessor(sys, pc);
    auto sched = scheduler::spawn_scheduler(sys, std::move(sc));
    for (int id : {10, 20, 30})
      caf::anon_send(sched, make_job(id, c));
    // Two batches reach the backend before either completes; the third waits
    // in the queue for a credit.
    REQUIRE(be->wait_submitted(2));
    auto first_two = be->submitted_keys();
    REQUIRE(first_two.size() == 2);
    CHECK(c.total == 0);
    // The later one completes first and is answered first; its credit goes
    // to the third.
    be->release(first_two[1]);
    REQUIRE(c.wait_for(1));
    CHECK(c.by_id.count(std::to_string(first_two[1])) == 1);
    REQUIRE(be->wait_submitted(3));
    for (int key : be->submitted_keys())
      if (key != first_two[1])
        be->release(key);
    REQUIRE(c.wait_for(3));
    caf::anon_send(sched, drain_atom::value);
    sys.await_all_actors_done();
  }
  for (int id : {10, 20, 30}) {
    auto& rs = c.by_id[std::to_string(id)];
    REQUIRE(rs.size() == 1);
    auto r = rs[0].reader();
    REQUIRE(r.getError().getStatus() == 0);
    int32_t values[4];
    std::memcpy(values, r.getOutputs()[0].getData().begin(), 16);
    for (int e = 0; e < 4; ++e)
      CHECK(values[e] == id + e);
  }
}

namespace {

/// Answers like the identity model until `lost` is set; from then on every
/// batch breaks the executor, as a CUDA instance does after a sticky device
/// error (cuda/cuda_errors.hpp: executor::executor_broken, for good).
class losing_backend final : public executor::backend {
public:
  std::atomic<bool> lost{false};

  bool blocks() const override { return true; } // a thread of its own, as on a GPU
  std::variant<std::monostate, serving_error> execute(const executor::batch_view& batch,
                                                      executor::output_writer& out) override {
    if (lost.load())
      throw executor::executor_broken("injected: the device context is lost");
    const auto& in = batch.inputs.at(0);
    std::memcpy(out.allocate("OUTPUT0", in.dtype, in.shape, in.size), in.data, in.size);
    return {};
  }
};

/// Two instances that are not restarted when they stop (what model_manager
/// configures for KIND_GPU: no respawn_executor).
struct gpu_like_pipeline {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<model_stats> stats = std::make_shared<model_stats>("id", 1);
  std::vector<std::shared_ptr<losing_backend>> backends;
  scheduler::scheduler_actor sched;

  explicit gpu_like_pipeline(const model_config& model) {
    cfg.set("scheduler.max-threads", size_t{2});
    sys = std::make_unique<caf::actor_system>(cfg);
    scheduler::scheduler_config sc;
    sc.model = model;
    sc.policy = scheduler::make_policy_config(model, 64);
    sc.stats = stats;
    for (int i = 0; i < 2; ++i) {
      backends.push_back(std::make_shared<losing_backend>());
      sc.executors.push_back(executor::spawn_executor(*sys, backends.back(), model));
    }
    postprocess::postprocessor_config pc;
    pc.stats = stats;
    sc.postprocessor = postprocess::spawn_postprocessor(*sys, pc);
    sched = scheduler::spawn_scheduler(*sys, std::move(sc));
  }

  ~gpu_like_pipeline() {
    caf::anon_send(sched, drain_atom::value);
    sys->await_all_actors_done();
  }
};

uint16_t status_of(collector& c, int id) {
  std::lock_guard<std::mutex> guard(c.mutex);
  auto& rs = c.by_id[std::to_string(id)];
  REQUIRE(rs.size() == 1);
  return rs[0].reader().getError().getStatus();
}

std::string message_of(collector& c, int id) {
  std::lock_guard<std::mutex> guard(c.mutex);
  return c.by_id[std::to_string(id)].at(0).reader().getError().getMessage().cStr();
}

} // namespace

TEST_CASE("instances that lose their device stop being chosen; with none left, 503 at once") {
  auto model = identity_model(8, 0, 64);
  collector c;
  gpu_like_pipeline p(model);
  caf::anon_send(p.sched, make_job(0, c));
  REQUIRE(c.wait_for(1));
  CHECK(status_of(c, 0) == 0);
  CHECK(p.stats->healthy_executors.load() == 2);

  // One instance loses its device. Requests one at a time until its executor
  // has stopped: each is answered 200, the broken one's batch by the other
  // instance (retried once).
  p.backends[0]->lost = true;
  int sent = 1;
  while (p.stats->live_executors.load() == 2 && sent < 200) {
    caf::anon_send(p.sched, make_job(sent, c));
    REQUIRE(c.wait_for(static_cast<size_t>(++sent)));
  }
  CHECK(p.stats->live_executors.load() == 1);
  CHECK(p.stats->healthy_executors.load() == 1);
  for (int id = 1; id < sent; ++id)
    CHECK(status_of(c, id) == 0);
  CHECK(p.stats->executor_restarts.load() == 0); // not restarted: it stays out
  // The healthy instance serves everything from now on.
  for (int k = 0; k < 10; ++k)
    caf::anon_send(p.sched, make_job(sent + k, c));
  REQUIRE(c.wait_for(static_cast<size_t>(sent + 10)));
  for (int k = 0; k < 10; ++k)
    CHECK(status_of(c, sent + k) == 0);
  sent += 10;

  // The last instance loses its device: its batch cannot be run anywhere.
  p.backends[1]->lost = true;
  caf::anon_send(p.sched, make_job(sent, c));
  REQUIRE(c.wait_for(static_cast<size_t>(sent + 1)));
  CHECK(status_of(c, sent) >= 500);
  CHECK(p.stats->live_executors.load() == 0);
  CHECK(p.stats->healthy_executors.load() == 0);
  // Every later request is answered 503 at once, saying why: no hang.
  ++sent;
  caf::anon_send(p.sched, make_job(sent, c));
  REQUIRE(c.wait_for(static_cast<size_t>(sent + 1)));
  CHECK(status_of(c, sent) == 503);
  auto why = message_of(c, sent);
  CHECK(why.find("model 'id'") != std::string::npos);
  CHECK(why.find("no executor") != std::string::npos);
}

namespace {

/// A one-shot gate: a backend thread waits at it until the test opens it, and
/// the test can wait until a thread has arrived.
struct gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool arrived = false;
  bool open = false;

  void pass() {
    std::unique_lock<std::mutex> lock(mutex);
    arrived = true;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  bool wait_arrived() {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return arrived; });
  }
  void release() {
    std::lock_guard<std::mutex> guard(mutex);
    open = true;
    cv.notify_all();
  }
};

/// The identity model on a thread of its own; with a gate, its first batch
/// waits there, and then either answers or breaks the executor.
class gated_backend final : public executor::backend {
public:
  gated_backend(gate* g, bool break_after) : gate_(g), break_after_(break_after) {}

  bool blocks() const override { return true; }
  std::variant<std::monostate, serving_error> execute(const executor::batch_view& batch,
                                                      executor::output_writer& out) override {
    if (gate_) {
      auto* g = std::exchange(gate_, nullptr);
      g->pass();
      if (break_after_)
        throw executor::executor_broken("injected: broke after hanging");
    }
    const auto& in = batch.inputs.at(0);
    std::memcpy(out.allocate("OUTPUT0", in.dtype, in.shape, in.size), in.data, in.size);
    return {};
  }

private:
  gate* gate_;
  bool break_after_;
};

} // namespace

TEST_CASE("a hung executor's batch goes to its replacement; the hung attempt's late error "
          "does not touch it") {
  auto model = identity_model(8, 0, 64);
  collector c;
  gate first, second;
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{cfg};
  auto stats = std::make_shared<model_stats>("id", 1);
  scheduler::scheduler_config sc;
  sc.model = model;
  sc.policy = scheduler::make_policy_config(model, 64);
  sc.stats = stats;
  // Long enough that the replacement, which holds the batch only while the
  // first executor breaks and goes down, is not given up too on a loaded machine.
  sc.local_batch_timeout = std::chrono::milliseconds(1500);
  // The first executor hangs, then breaks; its replacement hangs, then answers.
  auto hung = executor::spawn_executor(sys, std::make_shared<gated_backend>(&first, true), model);
  sc.executors.push_back(hung);
  std::atomic<int> started{0};
  sc.respawn_executor = [&] {
    auto* g = started.fetch_add(1) == 0 ? &second : nullptr;
    return executor::spawn_executor(sys, std::make_shared<gated_backend>(g, false), model);
  };
  postprocess::postprocessor_config pc;
  pc.stats = stats;
  sc.postprocessor = postprocess::spawn_postprocessor(sys, pc);
  auto sched = scheduler::spawn_scheduler(sys, std::move(sc));
  {
    caf::scoped_actor watcher{sys};
    watcher->monitor(hung);
    caf::anon_send(sched, make_job(1, c));
    REQUIRE(first.wait_arrived());
    // Given up after 1.5 s: the batch is sent to a new executor, which holds it.
    REQUIRE(second.wait_arrived());
    CHECK(stats->executor_restarts.load() == 1);
    // The first executor's attempt now ends with an error (the executor
    // breaks); it reaches the scheduler before the replacement answers.
    first.release();
    watcher->receive([](caf::down_msg&) {});
    second.release();
    REQUIRE(c.wait_for(1));
    // Later requests are served, after the late error in the mailbox.
    for (int i = 2; i <= 5; ++i)
      caf::anon_send(sched, make_job(i, c));
    REQUIRE(c.wait_for(5));
  }
  CHECK(c.total == 5);
  for (int i = 1; i <= 5; ++i)
    CHECK(status_of(c, i) == 0);
  caf::anon_send(sched, drain_atom::value);
  sys.await_all_actors_done();
}
