#include "scheduler/slo_policy.hpp"

#include "scheduler/executor_book.hpp"

#include <doctest/doctest.h>

#include <array>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>

using namespace caf_serving;
using namespace caf_serving::scheduler;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

const time_point t0{std::chrono::seconds{1000}};

time_point at_ms(double ms) {
  return t0 + nanoseconds{static_cast<int64_t>(ms * 1e6)};
}

slo_policy_config config(int max_batch, int target_ms, int margin_us = 1000) {
  slo_policy_config c;
  c.base.max_batch_size = max_batch;
  c.base.dynamic_batching_enabled = true;
  c.base.max_queue_size_default = 1000;
  c.base.max_batch_bytes = 0;
  c.target = milliseconds{target_ms};
  c.margin = microseconds{margin_us};
  return c;
}

/// A cost model that knows a fixed + per-row cost exactly, at every size.
batch_cost_model exact(int64_t fixed_ns, int64_t per_row_ns, uint32_t max_rows) {
  batch_cost_model m;
  for (uint32_t r = 1; r <= max_rows; ++r)
    m.observe(r, fixed_ns + per_row_ns * r);
  return m;
}

request_info req(uint64_t id, uint64_t timeout_us = 0, uint32_t priority = 0,
                 uint64_t shape_class = 0) {
  request_info r;
  r.id = id;
  r.timeout_us = timeout_us;
  r.priority = priority;
  r.shape_class = shape_class;
  return r;
}

std::vector<executor_load> idle_executor(const batch_cost_model& m) {
  return {{&m, {}, 0, 1}};
}

} // namespace

TEST_CASE("latency_target_ms: absent, a number of milliseconds, or a clear error") {
  model_config m;
  m.name = "m";
  CHECK_FALSE(read_latency_target(m)->has_value());
  m.parameters["latency_target_ms"] = "50";
  CHECK(**read_latency_target(m) == microseconds{50000});
  m.parameters["latency_target_ms"] = "2.5";
  CHECK(**read_latency_target(m) == microseconds{2500});
  for (const char* bad : {"0", "-3", "fast", "", "50ms"}) {
    m.parameters["latency_target_ms"] = bad;
    auto r = read_latency_target(m);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("latency_target_ms") != std::string::npos);
    CHECK(r.error().message.find("positive number of milliseconds") != std::string::npos);
  }
  CHECK(default_slo_margin(milliseconds{50}) == microseconds{2500});
  CHECK(default_slo_margin(milliseconds{4}) == microseconds{1000});
  CHECK(default_slo_margin(microseconds{1000}) == microseconds{500});
}

TEST_CASE("dispatch timing: a free executor takes the first batch at once") {
  slo_policy p{config(8, 50)};
  auto cost = exact(10'000'000, 1'000'000, 8); // 10 ms + 1 ms a row
  auto ex = idle_executor(cost);
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(1), at_ms(0), at_ms(0), ex)));
  // Waiting on a free executor for a fuller batch only delays every later
  // batch (the old policy waited until 37 ms, and at high load the next batch
  // then had no room left inside the target).
  auto r = p.poll(at_ms(0), ex);
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  auto d = std::get<slo_dispatch>(r.next);
  CHECK(d.ids == std::vector<uint64_t>{1});
  CHECK(d.predicted_ns == 11'000'000);
  CHECK(p.queued() == 0);
  CHECK(std::holds_alternative<idle>(p.poll(at_ms(0), ex).next));
}

TEST_CASE("dispatch timing: a busy executor with a free credit gets the next batch one margin "
          "before it is free, grown meanwhile") {
  slo_policy p{config(8, 50)};
  auto cost = exact(10'000'000, 1'000'000, 8);
  // A batch of 4 (14 ms) running for 2 ms: free at 12 ms; room for 2 batches.
  std::vector<executor_load> busy{{&cost, {4}, 2'000'000, 2}};
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(1), at_ms(0), at_ms(0), busy)));
  auto r = p.poll(at_ms(0), busy);
  REQUIRE(std::holds_alternative<wait_until>(r.next));
  CHECK(std::get<wait_until>(r.next).when == at_ms(12 - 1));
  // A second request joins the waiting batch.
  busy[0].oldest_elapsed_ns = 5'000'000;
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(2), at_ms(3), at_ms(3), busy)));
  r = p.poll(at_ms(3), busy);
  REQUIRE(std::holds_alternative<wait_until>(r.next));
  CHECK(std::get<wait_until>(r.next).when == at_ms(11));
  busy[0].oldest_elapsed_ns = 13'000'000;
  r = p.poll(at_ms(11), busy);
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  CHECK(std::get<slo_dispatch>(r.next).ids == std::vector<uint64_t>{1, 2});
  CHECK(std::get<slo_dispatch>(r.next).rows == 2);
}

TEST_CASE("dispatch timing: a full batch goes at once; no credit means wait for the executor") {
  slo_policy p{config(4, 50)};
  auto cost = exact(10'000'000, 1'000'000, 4);
  std::vector<executor_load> busy{{&cost, {4}, 2'000'000, 1}};
  for (uint64_t id = 1; id <= 4; ++id)
    REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(id), at_ms(0), at_ms(0), busy)));
  CHECK(std::holds_alternative<wait_for_executor>(p.poll(at_ms(0), busy).next));
  auto free = idle_executor(cost);
  auto r = p.poll(at_ms(12), free);
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  CHECK(std::get<slo_dispatch>(r.next).rows == 4);
}

TEST_CASE("dispatch timing: an executor never measured gets batches at once") {
  slo_policy p{config(8, 50)};
  batch_cost_model unmeasured;
  auto ex = idle_executor(unmeasured);
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(1), at_ms(0), at_ms(0), ex)));
  auto r = p.poll(at_ms(0), ex);
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  CHECK(std::get<slo_dispatch>(r.next).ids == std::vector<uint64_t>{1});
}

TEST_CASE("no executor to plan on: requests are queued and wait for one") {
  slo_policy p{config(4, 50)};
  std::vector<executor_load> none;
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(1), at_ms(0), at_ms(0), none)));
  CHECK(std::holds_alternative<wait_for_executor>(p.poll(at_ms(0), none).next));
  CHECK(p.queued() == 1);
}

TEST_CASE("EDF: the earliest deadline goes first within a level, a higher level before it") {
  slo_policy_config c = config(1, 50, 0);
  c.base.dynamic_batching.priority_levels = 2;
  c.base.dynamic_batching.default_priority_level = 2;
  slo_policy p{c};
  auto cost = exact(1'000'000, 0, 1); // 1 ms a batch of one
  std::vector<executor_load> busy{{&cost, {1}, 0, 1}};
  // Level 2: A without timeout (deadline 50), B with 20 ms (deadline 21).
  p.enqueue(req(1), at_ms(0), at_ms(0), busy);
  p.enqueue(req(2, 20'000), at_ms(1), at_ms(1), busy);
  // Level 1: C, deadline 52, still before both.
  p.enqueue(req(3, 0, 1), at_ms(2), at_ms(2), busy);
  REQUIRE(p.queued() == 3);
  std::vector<uint64_t> order;
  auto free = idle_executor(cost);
  for (int i = 0; i < 3; ++i) {
    auto r = p.poll(at_ms(2), free);
    // Batches of one are full: each goes at once.
    REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
    order.push_back(std::get<slo_dispatch>(r.next).ids.at(0));
  }
  CHECK(order == std::vector<uint64_t>{3, 2, 1});
}

TEST_CASE("admission: under overload the request that would finish late is shed at once") {
  slo_policy p{config(4, 50)};
  auto cost = exact(10'000'000, 1'000'000, 4); // a batch of 4: 14 ms
  auto ex = idle_executor(cost);
  // 49 ms usable: three batches of four (42 ms) fit, the thirteenth request not.
  for (uint64_t id = 1; id <= 12; ++id)
    REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(id), at_ms(0), at_ms(0), ex)));
  auto r = p.enqueue(req(13), at_ms(0), at_ms(0), ex);
  REQUIRE(std::holds_alternative<shed>(r));
  const auto& s = std::get<shed>(r);
  CHECK(s.id == 13);
  CHECK(s.message == "request shed: predicted completion 53 ms > latency target 50 ms "
                     "(queue 12 requests ahead); retry later");
  CHECK(s.retry_after_s >= 1);
  CHECK(p.queued() == 12);
}

TEST_CASE("admission: a request whose own timeout is tighter is shed against it") {
  slo_policy p{config(4, 50)};
  auto cost = exact(10'000'000, 1'000'000, 4);
  auto ex = idle_executor(cost);
  auto r = p.enqueue(req(1, 5'000), at_ms(0), at_ms(0), ex);
  REQUIRE(std::holds_alternative<shed>(r));
  CHECK(std::get<shed>(r).message.find("> request timeout 5.0 ms") != std::string::npos);
  // With room for it (11 ms + margin 1 ms <= 20 ms), it is admitted.
  auto ok = p.enqueue(req(2, 20'000), at_ms(0), at_ms(0), ex);
  REQUIRE(std::holds_alternative<admitted>(ok));
  // Behind a batch of 4 (14 ms) it would finish at 25 ms: past its timeout.
  std::vector<executor_load> busy{{&cost, {4}, 0, 2}};
  r = p.enqueue(req(3, 20'000), at_ms(0), at_ms(0), busy);
  REQUIRE(std::holds_alternative<shed>(r));
  CHECK(std::get<shed>(r).message.find("> request timeout 20 ms") != std::string::npos);
}

TEST_CASE("admission: a request that would make queued ones late is shed") {
  slo_policy p{config(1, 50, 0)};
  auto cost = exact(10'000'000, 0, 1);
  auto ex = idle_executor(cost);
  // Four batches of 10 ms for deadlines at 50 ms: the last finishes at 40.
  for (uint64_t id = 1; id <= 4; ++id)
    REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(id), at_ms(0), at_ms(0), ex)));
  // A request due at 15 ms fits first (finishes at 10) but pushes the fourth
  // to 50 ms... which still meets 50; a second such one would push it to 60.
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(5, 15'000), at_ms(0), at_ms(0), ex)));
  auto r = p.enqueue(req(6, 25'000), at_ms(0), at_ms(0), ex);
  REQUIRE(std::holds_alternative<shed>(r));
  CHECK(std::get<shed>(r).message.find("miss their deadline") != std::string::npos);
}

TEST_CASE("admission: queue bound and oversized requests are rejected as with the dynamic batcher") {
  auto c = config(4, 50);
  c.base.max_queue_size_default = 2;
  slo_policy p{c};
  batch_cost_model unmeasured;
  auto ex = idle_executor(unmeasured);
  CHECK(std::holds_alternative<admitted>(p.enqueue(req(1), at_ms(0), at_ms(0), ex)));
  CHECK(std::holds_alternative<admitted>(p.enqueue(req(2), at_ms(0), at_ms(0), ex)));
  auto full = p.enqueue(req(3), at_ms(0), at_ms(0), ex);
  REQUIRE(std::holds_alternative<rejected>(full));
  CHECK(std::get<rejected>(full).reason == reject_reason::queue_full);
  auto big = req(4);
  big.rows = 5;
  auto r = p.enqueue(big, at_ms(0), at_ms(0), ex);
  REQUIRE(std::holds_alternative<rejected>(r));
  CHECK(std::get<rejected>(r).reason == reject_reason::too_many_rows);
}

TEST_CASE("poll sheds a queued request that can no longer finish in time") {
  slo_policy p{config(4, 50)};
  auto cost = exact(10'000'000, 1'000'000, 4);
  auto ex = idle_executor(cost);
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(1), at_ms(0), at_ms(0), ex)));
  // The executor took a long batch elsewhere meanwhile (its cost drifted):
  // 45 ms still to go, so request 1 cannot finish by 49 ms.
  batch_cost_model slow = exact(80'000'000, 0, 4);
  std::vector<executor_load> busy{{&slow, {4}, 35'000'000, 1}};
  auto r = p.poll(at_ms(5), busy);
  REQUIRE(r.expired.size() == 1);
  CHECK(r.expired[0].id == 1);
  CHECK(r.expired[0].message.find("can no longer finish in time") != std::string::npos);
  CHECK(std::holds_alternative<idle>(r.next));
  CHECK(p.queued() == 0);
}

TEST_CASE("several executors: a batch goes where it is predicted to finish first") {
  slo_policy p{config(4, 50)};
  auto slow = exact(20'000'000, 1'000'000, 4);
  auto fast = exact(5'000'000, 1'000'000, 4);
  std::vector<executor_load> ex{{&slow, {}, 0, 1}, {&fast, {}, 0, 1}};
  for (uint64_t id = 1; id <= 4; ++id)
    p.enqueue(req(id), at_ms(0), at_ms(0), ex);
  auto r = p.poll(at_ms(0), ex);
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  CHECK(std::get<slo_dispatch>(r.next).executor == 1);
  // Three batches queued on the fast one (27 ms): the slow one finishes first now.
  ex[1].depth = 4;
  ex[1].in_flight_rows = {4, 4, 4};
  for (uint64_t id = 5; id <= 8; ++id)
    p.enqueue(req(id), at_ms(0), at_ms(0), ex);
  r = p.poll(at_ms(0), ex);
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  CHECK(std::get<slo_dispatch>(r.next).executor == 0);
}

namespace {

/// The random event test's world: exact costs, executors that run their batches
/// in order, and an independent account of every request.
struct simulation {
  struct executor_sim {
    int64_t fixed_ns;
    int64_t per_row_ns;
    uint32_t depth;
    batch_cost_model cost;
    /// What the cost model does not see: the answer arrives this long after
    /// the compute ends (hops, mailboxes, a scheduler that falls behind), and
    /// the executor takes no batch meanwhile.
    int64_t hidden_ns = 0;
    lateness_tracker lateness;
    /// Batches sent and not finished: rows, start and end times (ns from t0).
    struct running {
      uint32_t rows;
      int64_t start;
      int64_t end;
      std::vector<uint64_t> ids;
    };
    std::vector<running> batches;
  };
  struct request_state {
    request_info info;
    uint32_t level;
    int64_t received;
    int64_t deadline;
    uint64_t seq;
    enum { queued, refused, dispatched, expired, finished } where = queued;
  };

  std::mt19937_64 rng;
  slo_policy_config cfg;
  std::vector<executor_sim> executors;
  std::map<uint64_t, request_state> requests;
  std::set<std::tuple<uint32_t, int64_t, uint64_t, uint64_t>> queue; // level, deadline, seq, id
  int64_t now = 0;
  std::optional<int64_t> timer;
  /// Requests of two shape classes (which never share a batch), or of one.
  bool two_classes = false;
  /// Every request of one row, no timeout or priority of its own.
  bool plain_requests = false;
  size_t dispatched_rows = 0;
  size_t dispatched_batches = 0, shed_at_once = 0, expired = 0, served = 0;
  /// Feed the executors' lateness back to the policy (executor_load::lateness_ns).
  bool feedback = true;
  /// Admitted requests answered past their deadline (only with hidden costs).
  size_t served_late = 0;
  /// On/off arrivals: Poisson at the load for burst_on_ns, then nothing for
  /// burst_off_ns, and again (0: steady Poisson).
  int64_t burst_on_ns = 0, burst_off_ns = 0;
  /// Rows of each dispatched batch, in order.
  std::vector<uint32_t> batch_rows;

  /// One executor of `depth` that costs `fixed_ns` + `per_row_ns` a row, max
  /// batch `max_batch`, every request of one row due at the target.
  struct fixed_world {
    int64_t fixed_ns;
    int64_t per_row_ns;
    int max_batch;
    int target_ms;
    int margin_us;
    uint32_t depth;
  };
  simulation(uint64_t seed, fixed_world w) : rng(seed), plain_requests(true) {
    cfg = config(w.max_batch, w.target_ms, w.margin_us);
    cfg.base.max_queue_size_default = 1000;
    executor_sim e;
    e.fixed_ns = w.fixed_ns;
    e.per_row_ns = w.per_row_ns;
    e.depth = w.depth;
    e.cost = exact(e.fixed_ns, e.per_row_ns, static_cast<uint32_t>(w.max_batch));
    executors.push_back(std::move(e));
  }

  explicit simulation(uint64_t seed) : rng(seed) {
    std::uniform_int_distribution<int> batch_pick(0, 2), ex_count(1, 3), depth_pick(1, 2);
    int max_batch = std::array<int, 3>{{1, 4, 8}}[static_cast<size_t>(batch_pick(rng))];
    int target_ms = std::uniform_int_distribution<int>(20, 80)(rng);
    cfg = config(max_batch, target_ms, 0);
    cfg.base.max_queue_size_default = 64;
    cfg.base.dynamic_batching.priority_levels = 2;
    cfg.base.dynamic_batching.default_priority_level = 2;
    int n = ex_count(rng);
    for (int i = 0; i < n; ++i) {
      executor_sim e;
      e.fixed_ns = std::uniform_int_distribution<int64_t>(1'000'000, 10'000'000)(rng);
      e.per_row_ns = std::uniform_int_distribution<int64_t>(0, 1'000'000)(rng);
      e.depth = static_cast<uint32_t>(depth_pick(rng));
      e.cost = exact(e.fixed_ns, e.per_row_ns, static_cast<uint32_t>(max_batch));
      executors.push_back(std::move(e));
    }
  }

  time_point tp(int64_t ns) const { return t0 + nanoseconds{ns}; }

  std::vector<executor_load> loads() const {
    std::vector<executor_load> out;
    for (const auto& e : executors) {
      executor_load l{&e.cost, {}, 0, e.depth};
      l.lateness_ns = feedback ? e.lateness.quantile_ns() : 0;
      for (const auto& b : e.batches)
        l.in_flight_rows.push_back(b.rows);
      if (!e.batches.empty())
        l.oldest_elapsed_ns = std::max<int64_t>(now - e.batches.front().start, 0);
      out.push_back(std::move(l));
    }
    return out;
  }

  void on_dispatch(const slo_dispatch& d) {
    ++dispatched_batches;
    dispatched_rows += d.rows;
    batch_rows.push_back(d.rows);
    REQUIRE(d.executor < executors.size());
    auto& e = executors[d.executor];
    REQUIRE(e.batches.size() < e.depth); // only an executor with credit
    REQUIRE_FALSE(d.ids.empty());
    uint32_t rows = 0;
    uint64_t shape = requests.at(d.ids[0]).info.shape_class;
    for (auto id : d.ids) {
      auto& r = requests.at(id);
      REQUIRE(r.where == request_state::queued); // never twice, never unknown
      CHECK(r.info.shape_class == shape);
      rows += r.info.rows;
    }
    CHECK(rows == d.rows);
    CHECK(rows <= static_cast<uint32_t>(std::max(cfg.base.max_batch_size, 1)));
    int64_t start = e.batches.empty() ? now : std::max(now, e.batches.back().end);
    int64_t end = start + e.fixed_ns + e.per_row_ns * rows + e.hidden_ns;
    CHECK(d.predicted_ns == e.fixed_ns + e.per_row_ns * rows);
    for (auto id : d.ids) {
      auto& r = requests.at(id);
      // The cost model is exact: no admitted request finishes past its deadline.
      if (e.hidden_ns == 0)
        CHECK_MESSAGE(end <= r.deadline, "request " << id << " finishes at " << end
                                                    << " ns, deadline " << r.deadline);
      served_late += end > r.deadline ? 1 : 0;
      r.where = request_state::dispatched;
      queue.erase(std::make_tuple(r.level, r.deadline, r.seq, id));
    }
    e.batches.push_back({rows, start, end, d.ids});
  }

  void poll() {
    for (;;) {
      auto r = policy->poll(tp(now), loads());
      for (const auto& s : r.expired) {
        auto& st = requests.at(s.id);
        REQUIRE(st.where == request_state::queued);
        st.where = request_state::expired;
        queue.erase(std::make_tuple(st.level, st.deadline, st.seq, s.id));
        ++expired;
      }
      if (auto* d = std::get_if<slo_dispatch>(&r.next)) {
        on_dispatch(*d);
        CHECK(policy->queued() == queue.size());
        continue;
      }
      CHECK(policy->queued() == queue.size());
      timer.reset();
      if (auto* w = std::get_if<wait_until>(&r.next)) {
        CHECK(w->when > tp(now));
        timer = (w->when - t0).count();
      }
      if (std::holds_alternative<idle>(r.next))
        CHECK(queue.empty());
      return;
    }
  }

  void arrive(uint64_t id) {
    std::uniform_int_distribution<int> coin(0, 3), prio(0, 2), shape(0, 1);
    request_info info = req(id);
    if (plain_requests)
      info.rows = 1;
    else if (coin(rng) == 0)
      info.timeout_us = std::uniform_int_distribution<uint64_t>(
        2'000, static_cast<uint64_t>(cfg.target.count()))(rng);
    if (!plain_requests) {
      info.priority = static_cast<uint32_t>(prio(rng));
      info.shape_class = two_classes ? static_cast<uint64_t>(shape(rng)) : 0;
      info.rows = cfg.base.max_batch_size >= 2 && coin(rng) == 0 ? 2 : 1;
    }
    request_state st;
    st.info = info;
    st.level = info.priority == 0 ? 2 : info.priority;
    st.received = now;
    int64_t budget = cfg.target.count() * 1000;
    if (info.timeout_us != 0)
      budget = std::min<int64_t>(budget, static_cast<int64_t>(info.timeout_us) * 1000);
    st.deadline = now + budget;
    st.seq = id;
    auto r = policy->enqueue(info, tp(now), tp(now), loads());
    if (std::holds_alternative<admitted>(r)) {
      queue.insert({st.level, st.deadline, st.seq, id});
    } else {
      st.where = request_state::refused;
      ++shed_at_once;
      if (auto* s = std::get_if<shed>(&r)) {
        CHECK(s->id == id);
        CHECK(s->retry_after_s >= 1);
      }
    }
    requests.emplace(id, st);
    poll();
  }

  /// Runs `count` arrivals at `load` times the fastest executor's full-batch rate.
  void run(size_t count, double load) {
    policy = std::make_unique<slo_policy>(cfg);
    double capacity = 0; // rows per ns
    for (const auto& e : executors)
      capacity += cfg.base.max_batch_size > 0
                    ? static_cast<double>(cfg.base.max_batch_size)
                        / static_cast<double>(e.fixed_ns + e.per_row_ns * cfg.base.max_batch_size)
                    : 1.0 / static_cast<double>(e.fixed_ns + e.per_row_ns);
    std::exponential_distribution<double> gap(capacity * load);
    int64_t next_arrival = 0;
    uint64_t next_id = 1;
    for (;;) {
      int64_t next_end = INT64_MAX;
      for (const auto& e : executors)
        if (!e.batches.empty())
          next_end = std::min(next_end, e.batches.front().end);
      bool arrivals_left = next_id <= count;
      int64_t next = std::min({arrivals_left ? next_arrival : INT64_MAX, next_end,
                               timer.value_or(INT64_MAX)});
      if (next == INT64_MAX)
        break;
      now = next;
      if (next_end == now) {
        for (auto& e : executors)
          if (!e.batches.empty() && e.batches.front().end == now) {
            const auto& b = e.batches.front();
            e.lateness.observe(b.end - (b.start + e.cost.predict(b.rows)));
            for (auto id : e.batches.front().ids)
              requests.at(id).where = request_state::finished;
            served += e.batches.front().ids.size();
            e.batches.erase(e.batches.begin());
          }
        poll();
      } else if (arrivals_left && next_arrival == now) {
        arrive(next_id++);
        next_arrival = now + static_cast<int64_t>(gap(rng)) + 1;
        if (burst_on_ns > 0) {
          // An arrival that falls into the silence moves to the next burst.
          int64_t period = burst_on_ns + burst_off_ns;
          if (next_arrival % period >= burst_on_ns)
            next_arrival = (next_arrival / period + 1) * period;
        }
      } else {
        poll();
      }
    }
    // Nothing lost: every request was refused, expired or served, once.
    CHECK(queue.empty());
    CHECK(policy->queued() == 0);
    for (const auto& [id, r] : requests)
      CHECK_MESSAGE((r.where == request_state::refused || r.where == request_state::expired
                     || r.where == request_state::finished),
                    "request " << id << " was never answered");
    CHECK(shed_at_once + expired + served == count);
    for (const auto& [id, r] : requests)
      if (r.info.timeout_us == 0) {
        ++plain;
        plain_served += r.where == request_state::finished ? 1 : 0;
      }
  }

  /// Requests without a timeout of their own (due at the target), and how
  /// many of them were served.
  size_t plain = 0, plain_served = 0;

  std::unique_ptr<slo_policy> policy;
};

} // namespace

TEST_CASE("random event sequences: nothing dispatched twice or lost, no admitted request late") {
  size_t total_served = 0, total_shed = 0, total_expired = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    for (double load : {0.5, 1.0, 3.0}) {
      CAPTURE(seed);
      CAPTURE(load);
      simulation sim{seed};
      sim.two_classes = seed % 2 == 1;
      sim.run(1500, load);
      total_served += sim.served;
      total_shed += sim.shed_at_once;
      total_expired += sim.expired;
      if (load <= 0.5 && !sim.two_classes) {
        // At half of capacity nearly every request due at the target is
        // served (one with a tight timeout of its own may be shed). With two
        // classes the capacity is lower: each class pays the fixed cost.
        CAPTURE(sim.plain);
        CHECK(sim.plain_served * 100 >= sim.plain * 95);
      }
    }
  }
  // The runs at 3x capacity shed: the check above is not vacuous.
  CHECK(total_shed > 0);
  CHECK(total_served > 0);
  // With exact costs a plan rarely shifts enough to shed an admitted request.
  CHECK(total_expired * 100 <= total_served);
  MESSAGE("served " << total_served << ", shed at once " << total_shed
                    << ", shed after admission " << total_expired);
}

namespace {

/// The benchmark's model: 10 ms + 1 ms a row, max batch 16, target 50 ms with
/// the default margin (2.5 ms), one executor.
simulation::fixed_world bench_world(uint32_t depth) {
  return {10'000'000, 1'000'000, 16, 50, 2500, depth};
}

} // namespace

TEST_CASE("steady load below capacity, exact costs: nothing is shed and batches grow") {
  for (uint32_t depth : {1u, 2u}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      CAPTURE(depth);
      CAPTURE(seed);
      simulation sim{seed, bench_world(depth)};
      sim.run(3000, 0.8);
      double mean_batch = static_cast<double>(sim.dispatched_rows)
                          / static_cast<double>(std::max<size_t>(sim.dispatched_batches, 1));
      MESSAGE("80%: served " << sim.served << " shed " << sim.shed_at_once << " expired "
                             << sim.expired << " mean batch " << mean_batch);
      // Poisson bursts leave a few requests no room (one that arrives just
      // after a batch of 16 went waits for it and then its own); the old
      // policy shed 25-50% here, splitting the queue into batches of 1-3.
      CHECK(sim.served * 100 >= 3000 * 97);
      // At 80% of the full-batch rate, batches of 1 would cost 9x capacity:
      // only batches of many rows keep up.
      CHECK(mean_batch >= 6);
    }
  }
}

TEST_CASE("load at and above capacity, exact costs: about capacity is served in time") {
  for (uint32_t depth : {1u, 2u}) {
    for (double load : {1.0, 1.5, 3.0}) {
      CAPTURE(depth);
      CAPTURE(load);
      simulation sim{7, bench_world(depth)};
      sim.run(6000, load);
      // Served requests per second of the offered time, against the
      // full-batch rate (16 rows per 26 ms).
      double offered_s = 6000 / (load * 16 / 0.026);
      double goodput = static_cast<double>(sim.served) / offered_s;
      MESSAGE(load << "x: served " << sim.served << " shed " << sim.shed_at_once << " expired "
                   << sim.expired << " goodput " << goodput << "/s of " << 16 / 0.026);
      CHECK(goodput >= 0.8 * 16 / 0.026);
      // Past capacity nearly every batch is full: the open batch is priced
      // at its expected size (0.87 of capacity when it was priced at its
      // rows of the moment, its batches of 1 to 15 rows).
      if (load >= 1.5)
        CHECK(goodput >= 0.95 * 16 / 0.026);
    }
  }
}

TEST_CASE("on/off bursts at 3x capacity, exact costs: near the most goodput possible, in full "
          "batches") {
  for (uint32_t depth : {1u, 2u}) {
    CAPTURE(depth);
    simulation sim{7, bench_world(depth)};
    sim.burst_on_ns = 200'000'000;
    sim.burst_off_ns = 600'000'000;
    sim.run(6000, 3.0);
    // The most any scheduler serves in time: full batches back to back from
    // each burst's start until its last request's deadline.
    double capacity = 16 / 0.026;
    double offered_s = 6000 / (3.0 * capacity) * (800.0 / 200.0);
    double goodput = static_cast<double>(sim.served) / offered_s;
    double bound = capacity * (200.0 + 50.0) / 800.0;
    std::map<uint32_t, int> sizes;
    for (auto r : sim.batch_rows) ++sizes[r];
    std::ostringstream hist;
    for (auto [r, n] : sizes) hist << r << ":" << n << " ";
    MESSAGE("bursts: served " << sim.served << " shed " << sim.shed_at_once << " expired "
                              << sim.expired << " goodput " << goodput << "/s, bound " << bound
                              << "; batches " << hist.str());
    // 0.74 (depth 1) and 0.78 (depth 2) of the bound when the open batch was
    // priced at its rows of the moment; 0.87 and 0.88 at its expected size.
    CHECK(goodput >= 0.83 * bound);
    // No admitted request finishes late with exact costs (on_dispatch checks
    // each), and most batches are full.
    CHECK(sizes[16] * 2 > static_cast<int>(sim.batch_rows.size()));
  }
}

TEST_CASE("after a burst has drained, a lone request on the idle executor is served at once") {
  // The old policy held a lone request until one margin before its latest
  // start; a timer that fired a little late on a loaded machine, or a cost
  // model that grew meanwhile (the burst's last batches measured slower), then
  // shed it at the door on an idle server ("predicted completion 51 ms >
  // latency target 50 ms").
  slo_policy p{config(16, 50, 2500)};
  auto cost = exact(10'000'000, 1'000'000, 16);
  std::vector<executor_load> ex{{&cost, {}, 0, 1}};
  // A burst of 40 at t=0: served in batches while the executor is free, the
  // rest shed.
  double t = 0;
  size_t admitted_count = 0;
  for (uint64_t id = 1; id <= 40; ++id)
    admitted_count += std::holds_alternative<admitted>(p.enqueue(req(id), at_ms(0), at_ms(0), ex));
  CHECK(admitted_count >= 16);
  for (int guard = 0; guard < 100 && p.queued() > 0; ++guard) {
    auto r = p.poll(at_ms(t), ex);
    if (auto* d = std::get_if<slo_dispatch>(&r.next)) {
      // It runs to completion, measured 20% slower than predicted.
      t += 1.2 * static_cast<double>(d->predicted_ns) / 1e6;
      cost.observe(d->rows, static_cast<int64_t>(1.2 * static_cast<double>(d->predicted_ns)));
      continue;
    }
    if (auto* w = std::get_if<wait_until>(&r.next))
      t = static_cast<double>((w->when - t0).count()) / 1e6;
  }
  REQUIRE(p.queued() == 0);
  // Idle now; one request a while later.
  t += 100;
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(100), at_ms(t), at_ms(t), ex)));
  auto r = p.poll(at_ms(t), ex);
  CHECK(r.expired.empty());
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  CHECK(std::get<slo_dispatch>(r.next).ids == std::vector<uint64_t>{100});
}

TEST_CASE("admission cost: a request at the end of a long queue visits no queued request; "
          "the queue is cut again once per dispatch, not per arrival") {
  // A long queue: a generous target and a busy executor (no credit), so that
  // nothing leaves it. The first version planned the whole queue twice for
  // every arrival (2 x 800 visits here) and once more at every poll.
  slo_policy p{config(8, 60'000)};
  auto cost = exact(1'000'000, 100'000, 8);
  std::vector<executor_load> busy{{&cost, {8}, 0, 1}};
  for (uint64_t id = 1; id <= 800; ++id)
    REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(id), at_ms(0), at_ms(0), busy)));
  auto visited = p.entries_visited();
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(801), at_ms(0), at_ms(0), busy)));
  CHECK(p.entries_visited() == visited);
  // A poll with nothing expired looks at the head of each level only.
  auto r = p.poll(at_ms(1), busy);
  CHECK(std::holds_alternative<wait_for_executor>(r.next));
  CHECK(p.entries_visited() - visited <= 1);
  // A dispatch takes 8 requests out: the next decision cuts the queue again
  // (793 visits), the arrivals after it none.
  auto idle_ex = idle_executor(cost);
  r = p.poll(at_ms(2), idle_ex);
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  CHECK(std::get<slo_dispatch>(r.next).ids.size() == 8);
  visited = p.entries_visited();
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(802), at_ms(2), at_ms(2), busy)));
  CHECK(p.entries_visited() - visited == 793);
  visited = p.entries_visited();
  for (uint64_t id = 803; id <= 850; ++id)
    REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(id), at_ms(2), at_ms(2), busy)));
  CHECK(p.entries_visited() == visited);
  CHECK(p.queued() == 842);
}

TEST_CASE("prediction-error feedback: answers later than the cost model predicts widen the "
          "margins, so admitted requests stay inside the target") {
  // The bench world (10 ms + 1 ms a row, target 50 ms, a credit window of 1)
  // with 4 ms per batch the cost model never sees: the answer's trip back and
  // the scheduler's turnaround on shared cores. Without feedback the policy
  // plans every batch 4 ms too early and admits requests that finish late.
  for (double load : {0.8, 1.5, 3.0}) {
    CAPTURE(load);
    size_t late[2] = {0, 0}, served[2] = {0, 0};
    for (bool feedback : {false, true}) {
      simulation sim{11, bench_world(1)};
      sim.executors[0].hidden_ns = 4'000'000;
      sim.feedback = feedback;
      sim.run(4000, load);
      late[feedback] = sim.served_late;
      served[feedback] = sim.served;
      MESSAGE(std::string(feedback ? "feedback" : "no feedback") << ": served " << sim.served << " late "
                                                    << sim.served_late << " shed "
                                                    << sim.shed_at_once << " expired "
                                                    << sim.expired);
    }
    // With feedback: at most the few answered before the lateness was learnt.
    CHECK(late[1] * 100 <= served[1]);
    if (load > 1)
      CHECK(late[0] * 100 > served[0] * 5);
  }
}

TEST_CASE("probe: when every request would be shed, an executor idle for a while still gets one "
          "request a probe interval, so predictions that say too slow are measured again") {
  slo_policy p{config(4, 20)};
  auto cost = exact(30'000'000, 0, 4); // measured in a slow spell: 30 ms > 20 ms
  std::vector<executor_load> idle_long{{&cost, {}, 0, 1}};
  idle_long[0].idle_ns = 2'000'000'000;
  // Before: shed, and with nothing running nothing is measured again, ever.
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(1), at_ms(0), at_ms(0), idle_long)));
  auto r = p.poll(at_ms(0), idle_long);
  CHECK(r.expired.empty());
  REQUIRE(std::holds_alternative<slo_dispatch>(r.next));
  CHECK(std::get<slo_dispatch>(r.next).ids == std::vector<uint64_t>{1});
  // While it runs, the others are shed as predicted.
  std::vector<executor_load> busy{{&cost, {1}, 0, 1}};
  CHECK(std::holds_alternative<shed>(p.enqueue(req(2), at_ms(1), at_ms(1), busy)));
  // Idle again, but within the interval of the last probe: shed.
  CHECK(std::holds_alternative<shed>(p.enqueue(req(3), at_ms(500), at_ms(500), idle_long)));
  // An executor that answered recently is not probed either.
  std::vector<executor_load> just_idle{{&cost, {}, 0, 1}};
  just_idle[0].idle_ns = 5'000'000;
  CHECK(std::holds_alternative<shed>(p.enqueue(req(4), at_ms(1100), at_ms(1100), just_idle)));
  // A second later: the next probe.
  CHECK(std::holds_alternative<admitted>(p.enqueue(req(5), at_ms(1100), at_ms(1100), idle_long)));
  CHECK(p.queued() == 1);
}

TEST_CASE("feedback is capped: answers far later than predicted widen the margins by at most a "
          "quarter of the target, so a lone request is still served") {
  slo_policy p{config(4, 50)};
  auto cost = exact(10'000'000, 1'000'000, 4);
  std::vector<executor_load> ex{{&cost, {}, 0, 1}};
  ex[0].lateness_ns = 60'000'000; // stalls of 60 ms on starved cores
  // 11 ms + at most 12.5 ms + margin 1 ms: admitted (uncapped: 71 ms, shed).
  REQUIRE(std::holds_alternative<admitted>(p.enqueue(req(1), at_ms(0), at_ms(0), ex)));
  // Behind it the queue still sheds by what it holds: 4 rows a batch, 14 ms
  // each, so requests 2-4 join the first batch and the next batches' chain
  // plus the capped feedback passes 49 ms after two more batches.
  size_t admitted_count = 1;
  for (uint64_t id = 2; id <= 20; ++id)
    admitted_count += std::holds_alternative<admitted>(p.enqueue(req(id), at_ms(0), at_ms(0), ex));
  CHECK(admitted_count == 8);
}
