/// The remote-executor proxy's timeouts (remote_executor.hpp), in one process: a
/// stand-in for the remote executor holds batches until told to answer, so a batch
/// can outlive its deadline and be answered late.

#include "cluster/remote_executor.hpp"

#include "executor/builtin_backend.hpp"
#include "executor/executor_actor.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <deque>

using namespace caf_serving;
using namespace std::chrono_literals;

namespace {

using release_atom = caf::atom_constant<caf::atom("release")>;

model_config identity_model() {
  model_config m;
  m.name = "identity";
  m.backend = "builtin";
  m.max_batch_size = 64;
  tensor_config in;
  in.name = "INPUT0";
  in.dtype = datatype::fp32;
  in.dims = {4};
  auto out = in;
  out.name = "OUTPUT0";
  m.inputs = {in};
  m.outputs = {out};
  m.parameters["function"] = "identity";
  return m;
}

run_batch make_batch(uint32_t rows) {
  auto m = batch_message::create(rows * 16 + 1024);
  auto b = m.builder();
  b.setRows(rows);
  b.initRequestRows(1).set(0, rows);
  auto t = b.initInputs(1)[0];
  t.setName("INPUT0");
  t.setDatatype(wire::DataType::FP32);
  auto s = t.initShape(2);
  s.set(0, rows);
  s.set(1, 4);
  auto d = t.initData(rows * 16);
  std::memset(d.begin(), 0, d.size());
  return run_batch{m, nullptr};
}

struct held_state {
  std::deque<std::pair<caf::response_promise, run_batch>> held;
  /// Answer at once instead of holding.
  bool pass_through = false;
};

/// Holds each batch until a release_atom (or, in pass-through mode, answers at
/// once) by running it on a real identity executor.
caf::actor spawn_holding_executor(caf::actor_system& sys, executor::executor_actor real) {
  return sys.spawn([real](caf::stateful_actor<held_state>* self) -> caf::behavior {
    return {
      [self, real](run_batch& b) -> caf::result<batch_result_message> {
        if (self->state.pass_through)
          return self->delegate(real, std::move(b));
        auto rp = self->make_response_promise();
        self->state.held.emplace_back(rp, std::move(b));
        return caf::result<batch_result_message>{caf::delegated<batch_result_message>{}};
      },
      [self, real](release_atom, bool pass_through) {
        self->state.pass_through = pass_through;
        for (auto& [rp, b] : self->state.held)
          rp.delegate(real, std::move(b));
        self->state.held.clear();
      },
    };
  });
}

} // namespace

TEST_CASE("the deadline follows the prediction, with a floor, and a fallback when unmeasured") {
  cluster::remote_timeout_config cfg;
  cfg.unmeasured = 10s;
  cfg.factor = 4;
  cfg.floor = 100ms;
  CHECK(cluster::remote_deadline_ns(cfg, 0, 0) == 10'000'000'000);
  CHECK(cluster::remote_deadline_ns(cfg, 0, 1'000'000) == 100'000'000); // 4 ms < floor
  CHECK(cluster::remote_deadline_ns(cfg, 20'000'000, 30'000'000) == 200'000'000);
}

TEST_CASE("a batch past its deadline runs elsewhere and its late answer is dropped") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{cfg};
  auto mc = identity_model();
  auto real = executor::spawn_executor(sys, *executor::make_builtin_backend(mc), mc);
  auto remote = spawn_holding_executor(sys, real);
  cluster::remote_executor_config rc;
  rc.remote = remote;
  rc.node = "w";
  rc.model = "identity";
  rc.timeout.unmeasured = 300ms; // nothing measured yet: this is the deadline
  rc.timeout.factor = 1000;
  rc.timeout.floor = 1ms;
  rc.counters = std::make_shared<cluster::node_counters>();
  auto proxy = cluster::spawn_remote_executor(sys, rc);
  caf::scoped_actor self{sys};

  // The held batch is answered executor_lost once past its deadline.
  bool lost = false;
  self->request(proxy, caf::infinite, make_batch(2))
    .receive([&](batch_result_message&) {}, [&](caf::error& e) { lost = executor_was_lost(e); });
  CHECK(lost);
  CHECK(rc.counters->timed_out == 1);
  CHECK(rc.counters->in_flight == 0);

  // The next batch waits in the proxy (the worker still holds one) until the
  // worker answers; then it goes out, and the late answer before it is dropped.
  auto next = self->request(proxy, 10s, make_batch(3));
  self->send(remote, release_atom::value, true);
  bool ok = false;
  std::move(next).receive(
    [&](batch_result_message& r) { ok = r.reader().getOutputs().size() == 1; },
    [&](caf::error& e) { FAIL("unexpected error: " << sys.render(e)); });
  CHECK(ok);
  CHECK(rc.counters->late_dropped == 1);
  CHECK(rc.counters->timed_out == 1);
  CHECK(rc.counters->batches == 2);
  self->send_exit(proxy, caf::exit_reason::user_shutdown);
  self->send_exit(remote, caf::exit_reason::user_shutdown);
  self->send_exit(real, caf::exit_reason::user_shutdown);
}
