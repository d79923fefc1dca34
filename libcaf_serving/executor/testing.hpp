#pragma once
/// Test doubles of executor backends, for the executor's and the scheduler's
/// tests only (nothing in the server uses them).
///
/// latched_backend: an asynchronous backend (backend::submit) that holds every
/// batch it is given until the test releases it, then completes it from a thread
/// of its own, as a GPU backend's completion thread would. A batch is known by
/// its key: the first int32 element of its first input. Released as `ok`, each
/// output i is input i (int32) plus `add`, element by element.

#include "core/clock.hpp"
#include "executor/backend.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace caf_serving::executor::testing {

/// How a released (or submitted) batch ends.
enum class batch_fate {
  ok,
  /// An expected failure: a serving_error value (bad_request).
  error_value,
  /// An exception that fails this batch alone.
  exception,
  /// executor_broken: the executor stops.
  broken,
};

struct latched_config {
  uint32_t pipeline_depth = 2;
  bool blocks = true;
  int32_t add = 1000;
  /// Keys whose submit throws instead of queueing (exception or broken).
  std::map<int32_t, batch_fate> fail_on_submit;
  /// Called at the end of the destructor with the batches submitted and the
  /// completions called in all (equal: none was lost).
  std::function<void(size_t submitted, size_t completed)> on_destroyed;
};

class latched_backend final : public backend {
public:
  latched_backend(model_config model, latched_config cfg)
      : model_(std::move(model)), cfg_(std::move(cfg)), worker_([this] { run(); }) {}

  /// Stops the completion thread; batches still held complete with an error
  /// (the contract of backend::submit).
  ~latched_backend() override {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
    if (cfg_.on_destroyed)
      cfg_.on_destroyed(submitted_keys_.size(), completed_);
  }

  bool blocks() const override { return cfg_.blocks; }
  bool asynchronous() const override { return true; }
  uint32_t pipeline_depth() const override { return cfg_.pipeline_depth; }

  std::variant<std::monostate, serving_error> execute(const batch_view&, output_writer&) override {
    throw std::logic_error("latched_backend is asynchronous: the executor must call submit");
  }

  void submit(const batch_view& batch, output_writer& out, completion_handler done) override {
    int32_t key = key_of(batch);
    auto fault = cfg_.fail_on_submit.find(key);
    if (fault != cfg_.fail_on_submit.end()) {
      if (fault->second == batch_fate::broken)
        throw executor_broken("latched_backend: broken on submit of batch " + std::to_string(key));
      throw std::runtime_error("latched_backend: submit of batch " + std::to_string(key)
                               + " failed");
    }
    {
      std::lock_guard<std::mutex> guard(mutex_);
      held_.push_back({key, &batch, &out, std::move(done)});
      submitted_keys_.push_back(key);
    }
    cv_.notify_all();
  }

  // -- what the test drives and observes --------------------------------------

  /// Completes the held batch `key` (now or once it is submitted) as `fate`.
  void release(int32_t key, batch_fate fate = batch_fate::ok) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      releases_.push_back({key, fate});
    }
    cv_.notify_all();
  }

  /// Waits (up to 20 s) until `n` batches were submitted in all.
  bool wait_submitted(size_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(20),
                        [&] { return submitted_keys_.size() >= n; });
  }

  /// Waits (up to 20 s) until `n` completions were called in all.
  bool wait_completed(size_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return completed_ >= n; });
  }

  std::vector<int32_t> submitted_keys() {
    std::lock_guard<std::mutex> guard(mutex_);
    return submitted_keys_;
  }

  size_t completed() {
    std::lock_guard<std::mutex> guard(mutex_);
    return completed_;
  }

  /// Batches submitted and not completed.
  size_t held() {
    std::lock_guard<std::mutex> guard(mutex_);
    return held_.size();
  }

  /// The (start, end) times reported for batch `key` (0, 0 before it completed).
  std::pair<int64_t, int64_t> reported_times(int32_t key) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = times_.find(key);
    return it == times_.end() ? std::pair<int64_t, int64_t>{0, 0} : it->second;
  }

private:
  struct held_batch {
    int32_t key;
    const batch_view* batch;
    output_writer* out;
    completion_handler done;
  };

  static int32_t key_of(const batch_view& batch) {
    int32_t key = 0;
    if (!batch.inputs.empty() && batch.inputs[0].size >= sizeof key)
      std::memcpy(&key, batch.inputs[0].data, sizeof key);
    return key;
  }

  batch_completion complete(const held_batch& b, batch_fate fate) {
    batch_completion c;
    switch (fate) {
    case batch_fate::ok: {
      c.compute_start_ns = now_ns();
      for (size_t i = 0; i < model_.outputs.size() && i < b.batch->inputs.size(); ++i) {
        const auto& in = b.batch->inputs[i];
        auto* dst = b.out->allocate(model_.outputs[i].name, in.dtype, in.shape, in.size);
        for (size_t e = 0; e + sizeof(int32_t) <= in.size; e += sizeof(int32_t)) {
          int32_t v;
          std::memcpy(&v, in.data + e, sizeof v);
          v += cfg_.add;
          std::memcpy(dst + e, &v, sizeof v);
        }
      }
      c.compute_end_ns = now_ns();
      break;
    }
    case batch_fate::error_value:
      c.status = serving_error{status_code::bad_request,
                               "latched_backend: batch " + std::to_string(b.key) + " is refused",
                               failure_reason::bad_request};
      break;
    case batch_fate::exception:
      c.thrown = std::make_exception_ptr(
        std::runtime_error("latched_backend: batch " + std::to_string(b.key) + " threw"));
      break;
    case batch_fate::broken:
      c.thrown = std::make_exception_ptr(
        executor_broken("latched_backend: broken by batch " + std::to_string(b.key)));
      break;
    }
    return c;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || ready(); });
      if (stopping_)
        break;
      auto [key, fate] = take_ready();
      auto it = std::find_if(held_.begin(), held_.end(),
                             [&](const held_batch& h) { return h.key == key; });
      held_batch b = std::move(*it);
      held_.erase(it);
      lock.unlock();
      auto c = complete(b, fate);
      auto times = std::make_pair(c.compute_start_ns, c.compute_end_ns);
      b.done(std::move(c));
      lock.lock();
      times_[key] = times;
      ++completed_;
      cv_.notify_all();
    }
    // Stopped with batches held: each still completes exactly once.
    auto left = std::move(held_);
    held_.clear();
    lock.unlock();
    for (auto& b : left) {
      batch_completion c;
      c.status = serving_error{status_code::unavailable, "latched_backend: stopped",
                               failure_reason::unavailable};
      b.done(std::move(c));
      lock.lock();
      ++completed_;
      lock.unlock();
    }
  }

  /// A release whose batch is held. Called with the mutex held.
  bool ready() const {
    for (const auto& r : releases_)
      for (const auto& h : held_)
        if (h.key == r.first)
          return true;
    return false;
  }

  std::pair<int32_t, batch_fate> take_ready() {
    for (auto it = releases_.begin(); it != releases_.end(); ++it)
      for (const auto& h : held_)
        if (h.key == it->first) {
          auto r = *it;
          releases_.erase(it);
          return r;
        }
    throw std::logic_error("latched_backend: nothing ready");
  }

  model_config model_;
  latched_config cfg_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<held_batch> held_;
  std::deque<std::pair<int32_t, batch_fate>> releases_;
  std::vector<int32_t> submitted_keys_;
  std::map<int32_t, std::pair<int64_t, int64_t>> times_;
  size_t completed_ = 0;
  bool stopping_ = false;
  std::thread worker_; ///< last: starts after every member it uses
};

} // namespace caf_serving::executor::testing
