#include "executor/threaded_backend.hpp"

#include "core/clock.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace caf_serving::executor {

namespace {

class threaded_backend final : public backend {
public:
  threaded_backend(std::shared_ptr<backend> inner, threaded_config cfg)
      : inner_(std::move(inner)), cfg_(std::move(cfg)), worker_([this] { run(); }) {}

  /// Runs what is queued, then stops: every submitted batch completes.
  ~threaded_backend() override {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  bool blocks() const override { return true; }
  bool asynchronous() const override { return true; }
  uint32_t pipeline_depth() const override { return cfg_.pipeline_depth; }

  std::variant<std::monostate, serving_error> execute(const batch_view& batch,
                                                      output_writer& out) override {
    return inner_->execute(batch, out);
  }

  void submit(const batch_view& batch, output_writer& out, completion_handler done) override {
    std::unique_lock<std::mutex> lock(mutex_);
    // Bounded like a device's staging slots: the caller waits for a free one.
    cv_.wait(lock, [&] { return queue_.size() < cfg_.pipeline_depth; });
    queue_.push_back({&batch, &out, std::move(done)});
    ++submitted_;
    cv_.notify_all();
  }

private:
  struct queued {
    const batch_view* batch;
    output_writer* out;
    completion_handler done;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty())
        return; // stopping, nothing left
      // The batch keeps its place (and its pipeline slot) while it runs.
      auto& q = queue_.front();
      uint64_t position = submitted_ - queue_.size() + 1; // 1-based submission number
      batch_completion c;
      if (cfg_.hold && cfg_.hold(*q.batch)) {
        bool came = cv_.wait_for(lock, cfg_.hold_limit, [&] { return submitted_ > position; });
        if (!came)
          c.status = serving_error{status_code::internal,
                                   "a held batch saw no batch submitted after it within "
                                     + std::to_string(cfg_.hold_limit.count())
                                     + " ms: its executor was given one batch at a time",
                                   failure_reason::internal};
      }
      lock.unlock();
      if (std::holds_alternative<std::monostate>(c.status)) {
        c.compute_start_ns = now_ns();
        try {
          c.status = inner_->execute(*q.batch, *q.out);
        } catch (...) {
          c.thrown = std::current_exception();
        }
        c.compute_end_ns = now_ns();
      }
      auto done = std::move(q.done);
      lock.lock();
      queue_.pop_front();
      cv_.notify_all();
      lock.unlock();
      done(std::move(c));
      lock.lock();
    }
  }

  std::shared_ptr<backend> inner_;
  threaded_config cfg_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<queued> queue_;
  uint64_t submitted_ = 0;
  bool stopping_ = false;
  std::thread worker_; ///< last: starts after every member it uses
};

} // namespace

std::shared_ptr<backend> make_threaded_backend(std::shared_ptr<backend> inner,
                                               threaded_config config) {
  return std::make_shared<threaded_backend>(std::move(inner), std::move(config));
}

} // namespace caf_serving::executor
