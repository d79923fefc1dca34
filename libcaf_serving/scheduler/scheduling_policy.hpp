#pragma once
/// One interface through which the scheduler actor drives a model's batching
/// policy, whichever it is: the dynamic batcher (batching_policy.hpp) or, when
/// the model has a latency target, the latency-target policy (slo_policy.hpp).
/// The actor chooses one of the two adapters where it makes the policy, and
/// from then on never asks which it has: what differs between them is in the
/// decisions they return.
///
/// A plain object with the clock passed in, like the policies it adapts.
///
/// ## Usage (what the scheduler actor does)
///
/// ```
/// auto policy = model_has_target ? make_latency_target_policy(slo_cfg)
///                                : make_dynamic_batching_policy(cfg);
/// // a request arrives:
///   admitted, or answer rejected (rejection_error) or shed (503 + Retry-After);
///   then poll.
/// // poll (after every event):
///   answer every timed_out (rejection_error) and every late (shed);
///   batch_dispatch d -> form the batch; send it to d.executor, or, without
///                       one, to the executor predicted to finish it first;
///                       poll again at once;
///   wait_until w     -> tick at w.when; others: wait for the next event.
/// // an executor joins: run its warm_up_runs first.
/// ```

#include "scheduler/batching_policy.hpp"
#include "scheduler/executor_choice.hpp"
#include "scheduler/slo_policy.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

namespace caf_serving::scheduler {

/// What a policy decided about a request that arrived.
using admission = std::variant<admitted, rejected, shed>;

/// What the scheduler tells the policy when it asks what to do next.
struct poll_input {
  time_point now;
  /// Whether an executor that may take batches (not quarantined) has a free
  /// credit.
  bool executor_free = false;
  /// Every executor that may take batches (quarantined ones left out), with
  /// what it holds; a dispatch's `executor` indexes it. Filled only for a
  /// policy that plans_on_executors(): building it costs an allocation per
  /// executor, and the dynamic batcher reads executor_free alone.
  std::vector<executor_load> executors;
  /// Batches of a lost executor wait to be sent again because no executor has
  /// a credit for them: they go before any new batch.
  bool resends_waiting = false;
};

/// A batch to form now from the queued requests `ids`, in queue order.
struct batch_dispatch {
  std::vector<uint64_t> ids;
  uint32_t rows = 0;
  /// The executor the policy planned the batch on: an index into the poll's
  /// executors, one with a free credit. None: the scheduler sends it to the
  /// executor predicted to finish it first (executor_choice.hpp) as soon as one
  /// has a credit.
  std::optional<size_t> executor;
};

using policy_step = std::variant<batch_dispatch, wait_until, wait_for_executor, idle>;

struct policy_poll {
  /// Requests that waited past their queue timeout (the dynamic batcher, under
  /// REJECT); they left the queue: answer each with rejection_error.
  std::vector<rejected> timed_out;
  /// Requests that can no longer finish by their deadline (the latency-target
  /// policy); they left the queue: answer each as shed.
  std::vector<shed> late;
  policy_step next;
};

/// One synthetic batch a new executor runs before it serves requests: `rows`
/// rows of zeros, and whether its time is learnt.
struct warm_up_run {
  uint32_t rows = 1;
  bool learn = false;
};

class scheduling_policy {
public:
  virtual ~scheduling_policy() = default;

  /// Whether the policy plans batches on executors' loads (poll_input's and
  /// enqueue's `executors`); the scheduler builds them only for one that does.
  virtual bool plans_on_executors() const = 0;
  /// Queues a request that the server received at `received` and the scheduler
  /// got at `now` (received <= now), or answers it at once. `executors` as in
  /// poll_input (empty unless plans_on_executors()). Call poll() afterwards.
  virtual admission enqueue(const request_info& request, time_point received, time_point now,
                            const std::vector<executor_load>& executors)
    = 0;

  /// Takes out of the queue what may no longer wait, then decides what to do next.
  virtual policy_poll poll(const poll_input& in) = 0;

  /// The synthetic batches a new executor runs first, the next last; none when
  /// the policy does not plan from measured costs. `max_rows`: max(1, the
  /// model's max_batch_size).
  virtual std::vector<warm_up_run> warm_up_runs(uint32_t max_rows) const = 0;
};

/// Triton's dynamic batcher (batching_policy.hpp). Its dispatches leave the
/// executor to the scheduler, and it polls with no executor free while batches
/// wait to be sent again (timeouts still apply). No warm-up runs.
std::unique_ptr<scheduling_policy> make_dynamic_batching_policy(policy_config cfg);

/// The latency-target policy (slo_policy.hpp). Its dispatches name their
/// executor; while batches wait to be sent again it is not polled at all (it
/// waits for an executor: a freed credit polls again). A new executor first
/// runs batches of max_rows and of one row, each size twice (see the .cpp).
std::unique_ptr<scheduling_policy> make_latency_target_policy(slo_policy_config cfg);

} // namespace caf_serving::scheduler
