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

/// A request for identity_model whose one row holds `width` int32 values from
/// `id` up.
infer_job make_job(int id, collector& c, unsigned width = 4) {
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
  shape.set(1, width);
  std::vector<int32_t> values(width);
  for (unsigned i = 0; i < width; ++i)
    values[i] = id + static_cast<int32_t>(i);
  auto data = in.initData(4 * width);
  std::memcpy(data.begin(), values.data(), 4 * width);
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

TEST_CASE("gather_batch concatenates rows; a lone request's bytes are copied when small, else referenced") {
  auto model = identity_model(8, 0, 64);
  collector c;
  std::vector<batched_job> jobs{{make_job(1, c), 0, 0}, {make_job(5, c), 0, 0}};
  auto two_msg = scheduler::gather_batch(model, 7, jobs);
  REQUIRE(two_msg.ok());
  auto two = two_msg->reader();
  CHECK(two.getBatchId() == 7);
  CHECK(two.getRows() == 2);
  CHECK(two.getInputs()[0].getShape()[0] == 2);
  CHECK(two.getInputs()[0].getData().size() == 32);
  int32_t values[8];
  std::memcpy(values, two.getInputs()[0].getData().begin(), 32);
  CHECK(values[0] == 1);
  CHECK(values[4] == 5);

  // 16 bytes: copied into the room left in the batch's first segment (an
  // external segment costs more).
  std::vector<batched_job> one{{make_job(9, c), 0, 0}};
  auto single = scheduler::gather_batch(model, 8, one);
  REQUIRE(single.ok());
  auto small = single->reader().getInputs()[0].getData();
  CHECK(small.begin() != one[0].job.request.reader().getInputs()[0].getData().begin());
  REQUIRE(small.size() == 16);
  std::memcpy(values, small.begin(), 16);
  CHECK(values[0] == 9);
  CHECK(values[3] == 12);
  CHECK(single->segment_count() == 1);

  // 4 KiB: more than the batch's first segment has room for; referenced.
  const unsigned wide = 1024;
  model.inputs[0].dims = {static_cast<int64_t>(wide)};
  std::vector<batched_job> large{{make_job(3, c, wide), 0, 0}};
  auto referenced = scheduler::gather_batch(model, 9, large);
  REQUIRE(referenced.ok());
  CHECK(referenced->reader().getInputs()[0].getData().begin()
        == large[0].job.request.reader().getInputs()[0].getData().begin());
  CHECK(referenced->segment_count() == 2);
}

TEST_CASE("gather_batch sizes the batch's first segment from what it holds") {
  // Cap'n Proto zeroes the whole first segment: a fixed 2 KiB on top of every
  // batch was a memset per request. The hint now fits the contents, and they
  // still fit in one segment.
  auto model = identity_model(8, 0, 64);
  collector c;
  std::vector<batched_job> one{{make_job(9, c), 0, 0}};
  auto single = scheduler::gather_batch(model, 8, one);
  REQUIRE(single.ok());
  // The lone request's small bytes are copied into the first segment.
  CHECK(single->segment_count() == 1);
  CHECK(single->first_segment_bytes() < 1024);

  std::vector<batched_job> jobs;
  for (int i = 0; i < 8; ++i)
    jobs.push_back({make_job(i, c), 0, 0});
  auto eight = scheduler::gather_batch(model, 9, jobs);
  REQUIRE(eight.ok());
  CHECK(eight->segment_count() == 1);
  size_t data = eight->reader().getInputs()[0].getData().size();
  CHECK(eight->first_segment_bytes() < data + 1024);
}

TEST_CASE("gather_batch refuses requests of different shapes instead of mixing them") {
  auto model = identity_model(8, 0, 64);
  model.inputs[0].dims = {-1};
  collector c;
  auto narrow = make_job(1, c);
  auto wide = make_job(5, c);
  // Rebuild the second request with shape [1,2]: same bytes would not fit.
  auto msg = request_message::create();
  msg.builder().setId("5");
  msg.builder().setRows(1);
  auto in = msg.builder().initInputs(1)[0];
  in.setName("INPUT0");
  in.setDatatype(wire::DataType::INT32);
  auto shape = in.initShape(2);
  shape.set(0, 1);
  shape.set(1, 2);
  in.initData(8);
  wide.request = msg;
  std::vector<batched_job> jobs{{narrow, 0, 0}, {wide, 0, 0}};
  auto batch = scheduler::gather_batch(model, 9, jobs);
  REQUIRE_FALSE(batch.ok());
  CHECK(batch.error().status == status_code::internal);
  CHECK(batch.error().message.find("[1,4] and [1,2]") != std::string::npos);
  // And the shape key tells them apart, while equal shapes share one.
  CHECK(scheduler::shape_class_of(model, narrow.request.reader())
        != scheduler::shape_class_of(model, wide.request.reader()));
  CHECK(scheduler::shape_class_of(model, narrow.request.reader())
        == scheduler::shape_class_of(model, make_job(7, c).request.reader()));
  // A model whose shapes cannot vary keys every request 0.
  CHECK(scheduler::shape_class_of(identity_model(8, 0, 64), narrow.request.reader()) == 0);
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

/// A request of `rows` rows of `length` int64 ids (value = 100 * row + position + 1).
infer_job sequence_job(int id, uint32_t rows, int64_t length, collector& c) {
  auto msg = request_message::create();
  auto b = msg.builder();
  b.setId(std::to_string(id));
  b.setModelName("seq");
  b.setModelVersion(1);
  b.setRows(rows);
  auto in = b.initInputs(1)[0];
  in.setName("ids");
  in.setDatatype(wire::DataType::INT64);
  auto shape = in.initShape(2);
  shape.set(0, rows);
  shape.set(1, length);
  std::vector<int64_t> values;
  for (uint32_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < length; ++p)
      values.push_back(100 * r + p + 1);
  auto data = in.initData(static_cast<unsigned>(values.size() * 8));
  std::memcpy(data.begin(), values.data(), data.size());
  return {msg, std::make_shared<collecting_sink>(c)};
}

model_config sequence_model() {
  model_config m;
  m.name = "seq";
  m.max_batch_size = 8;
  m.dynamic_batching_enabled = true;
  m.inputs = {{"ids", datatype::int64, {-1}}};
  m.outputs = {{"out", datatype::int64, {-1}}};
  m.parameters["padded_batching"] = "ids:1:-7";
  return m;
}

} // namespace

TEST_CASE("gather_batch pads shorter sequences to the longest with the pad value") {
  auto model = sequence_model();
  auto padding = scheduler::read_padded_batching(model);
  REQUIRE(padding.ok());
  collector c;
  std::vector<batched_job> jobs{{sequence_job(1, 1, 3, c), 0, 0},
                                {sequence_job(2, 2, 5, c), 0, 0},
                                {sequence_job(3, 1, 2, c), 0, 0}};
  // Without padding these shapes may not share a batch.
  CHECK_FALSE(scheduler::gather_batch(model, 1, jobs).ok());
  auto msg = scheduler::gather_batch(model, 1, jobs, *padding);
  REQUIRE(msg.ok());
  auto in = msg->reader().getInputs()[0];
  REQUIRE(in.getShape().size() == 2);
  CHECK(in.getShape()[0] == 4);
  CHECK(in.getShape()[1] == 5);
  REQUIRE(in.getData().size() == 4 * 5 * 8);
  std::vector<int64_t> got(20);
  std::memcpy(got.data(), in.getData().begin(), 160);
  std::vector<int64_t> want{1, 2, 3, -7, -7,        // request 1, padded 3 -> 5
                            1, 2, 3, 4, 5,           // request 2, row 0
                            101, 102, 103, 104, 105, // request 2, row 1
                            1, 2, -7, -7, -7};       // request 3, padded 2 -> 5
  CHECK(got == want);
  // Equal lengths are not padded, and the key leaves the padded dim out.
  CHECK(scheduler::shape_class_of(model, jobs[0].job.request.reader(), *padding)
        == scheduler::shape_class_of(model, jobs[2].job.request.reader(), *padding));
  CHECK(scheduler::shape_class_of(model, jobs[0].job.request.reader())
        != scheduler::shape_class_of(model, jobs[2].job.request.reader()));
  CHECK(scheduler::padded_length(*padding, jobs[1].job.request.reader()) == 5);
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
