#include "ingress/grpc/grpc_server.hpp"

#include "core/clock.hpp"
#include "core/pipeline_messages.hpp"
#include "ingress/admission.hpp"
#include "ingress/grpc/control_calls.hpp"
#include "ingress/grpc/convert.hpp"
#include "ingress/grpc/generate_convert.hpp"
#include "ingress/generation_admission.hpp"
#include "scheduler/generation_actor.hpp"

#include "grpc_service.grpc.pb.h"

#include <absl/synchronization/mutex.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <deque>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <shared_mutex>
#include <thread>
#include <stdexcept>
#include <variant>

namespace caf_serving::ingress {

namespace {

namespace pb = inference;
using ::grpc::Status;
using ::grpc::StatusCode;

/// How a ModelStreamInfer stream ends once every answer is written: OK when
/// the client closed its side, else (a drain) UNAVAILABLE saying why.
Status stream_end_status(bool client_closed) {
  return client_closed ? Status::OK
                       : Status(StatusCode::UNAVAILABLE,
                                "the server is shutting down (SIGINT or SIGTERM); every "
                                "request sent on this stream was answered");
}

/// An inference call's answer, or why there is none.
using infer_outcome = std::variant<pb::ModelInferResponse, serving_error>;
using infer_done = std::function<void(infer_outcome)>;

/// What a completion queue hands back: each operation a call starts carries
/// its own tag, so that one call may have a read, a write and its done
/// notification outstanding at once.
struct cq_tag {
  virtual void on_event(bool ok) = 0;

protected:
  ~cq_tag() = default;
};

class cq_unary_infer;

/// ModelInfer answers on their way from the pipeline's threads to the thread
/// of one completion queue, which finishes the calls. Finishing a call from
/// the CAF worker that has its answer made that worker do grpc's send (the
/// write to the socket and the client's wake-up) and then wake the queue's
/// thread for the finish tag anyway; the queue's thread also reads the next
/// request from the same socket. An inbox wakes that thread once (an alarm
/// set in the past, grpc's way to put an event on a queue) for every answer
/// posted before it looks: a batch's answers cost one wake-up, not one each.
class cq_answer_inbox final : public cq_tag {
public:
  cq_answer_inbox(grpc_server::state& s, ::grpc::ServerCompletionQueue& cq) : state_(s), cq_(cq) {}

  /// Any thread: finishes `call` with `outcome` on the queue's thread (at
  /// once when called there). Dropped when the call is gone by then, and
  /// when the queues are closing (the calls end with the queue).
  void post(std::weak_ptr<cq_unary_infer> call, infer_outcome outcome);

  /// The queue's thread: marks it as the thread of this inbox.
  void bind_thread() { this_thread_inbox = this; }

  /// The alarm fired (or was cancelled at the stop): finishes what is posted.
  void on_event(bool ok) override;

private:
  struct item {
    std::weak_ptr<cq_unary_infer> call;
    infer_outcome outcome;
  };

  static thread_local const cq_answer_inbox* this_thread_inbox;

  grpc_server::state& state_;
  ::grpc::ServerCompletionQueue& cq_;
  std::mutex mutex_;
  std::vector<item> items_;
  /// The alarm is set and has not fired yet: a post need not set it.
  bool rung_ = false;
  ::grpc::Alarm alarm_;
  /// The queue thread's own: what it takes in one look (its space is kept).
  std::vector<item> taken_;
};

thread_local const cq_answer_inbox* cq_answer_inbox::this_thread_inbox = nullptr;

} // namespace

/// What the service and its calls share: configuration, the model manager,
/// the shared-memory regions registered over gRPC, and the drain state.
struct grpc_server::state {
  grpc_server_config cfg;
  server::model_directory& models;
  /// The server's one registry of regions, shared with HTTP (as Triton's).
  std::shared_ptr<shared_memory_registry> shm;
  /// Inference requests' admission (admission.hpp), as HTTP's.
  admission_config admission;
  std::atomic<bool> draining{false};
  /// Calls cancelled while waiting for the pipeline during the drain.
  std::atomic<size_t> abandoned{0};
  /// Every call but ModelInfer and ModelStreamInfer.
  control_calls control;
  /// Open ModelStreamInfer streams, so that the drain can close them (a
  /// client keeps a stream open between requests). Locked once per stream
  /// opened and at the drain, never per request.
  std::mutex streams_mutex;
  std::vector<std::function<void()>> stream_drains;
  std::vector<std::weak_ptr<void>> stream_handles;
  std::unique_ptr<::grpc::Service> service;
  std::unique_ptr<::grpc::Server> server;
  int port = 0;
  /// One completion queue per thread (cfg.threads), serving every call.
  std::vector<std::unique_ptr<::grpc::ServerCompletionQueue>> cqs;
  /// One per queue: the ModelInfer answers for its thread to finish. Here,
  /// not on the thread, because a call (and so this state) may still be held
  /// by a CAF worker posting its answer after the thread has left.
  std::vector<std::unique_ptr<cq_answer_inbox>> inboxes;
  std::vector<std::thread> cq_threads;
  /// Starting an operation on a completion queue that is shut down aborts
  /// grpc; operations start under a shared lock of this (uncontended but at
  /// the stop) and only while cq_closed is false.
  std::shared_mutex cq_gate;
  bool cq_closed = false;

  /// Runs `start` (which starts a grpc operation on a completion queue)
  /// unless the queues are closing; says whether it ran.
  template <class F>
  bool on_open_cq(F&& start) {
    std::shared_lock lock(cq_gate);
    if (cq_closed)
      return false;
    start();
    return true;
  }

  /// Shuts the completion queues down (after the server) and joins their
  /// threads once they have drained.
  void close_queues() {
    {
      std::unique_lock lock(cq_gate);
      if (cq_closed)
        return;
      cq_closed = true;
    }
    for (auto& q : cqs)
      q->Shutdown();
    for (auto& t : cq_threads)
      t.join();
    cq_threads.clear();
  }

  /// Remembers an open stream so that the drain can close it. False when
  /// the server already drains (the caller then drains the stream at once).
  bool register_stream(std::weak_ptr<void> handle, std::function<void()> drain) {
    std::lock_guard lock(streams_mutex);
    if (draining.load())
      return false;
    // Forget streams that are gone, so the list stays as long as the
    // streams open.
    for (size_t i = 0; i < stream_handles.size();) {
      if (stream_handles[i].expired()) {
        stream_handles.erase(stream_handles.begin() + i);
        stream_drains.erase(stream_drains.begin() + i);
      } else {
        ++i;
      }
    }
    stream_handles.push_back(std::move(handle));
    stream_drains.push_back(std::move(drain));
    return true;
  }

  state(const grpc_server_config& c, server::model_directory& m)
      : cfg(c), models(m),
        shm(c.shared_memory_regions
              ? c.shared_memory_regions
              : std::make_shared<shared_memory_registry>(c.shared_memory)),
        admission{c.limits, shm, c.cache},
        control(m, shm, draining, c.strict_readiness) {}

  /// Inference call objects alive (call_object). A call object holds a
  /// grpc::ServerContext, which must go before the grpc::Server does; the
  /// pipeline's callbacks hold calls only weakly (a late answer finds a
  /// tombstone), so once grpc has let go of every call they all go within
  /// the few instructions a callback holds one, and wait_for_calls waits
  /// for that.
  std::mutex calls_mutex;
  std::condition_variable calls_gone;
  size_t live_calls = 0;

  void call_created() {
    std::lock_guard lock(calls_mutex);
    ++live_calls;
  }
  void call_destroyed() {
    std::lock_guard lock(calls_mutex);
    if (--live_calls == 0)
      calls_gone.notify_all();
  }
  /// True once no call object is alive; false when `deadline` passed first.
  bool wait_for_calls(std::chrono::milliseconds deadline) {
    std::unique_lock lock(calls_mutex);
    return calls_gone.wait_for(lock, deadline, [&] { return live_calls == 0; });
  }

  /// ModelInfer calls and streams open now (cfg.max_open_calls).
  std::atomic<uint32_t> open_calls{0};

  /// Counts a new inference call in; false (and not counted) past
  /// cfg.max_open_calls.
  bool admit_call() {
    if (open_calls.fetch_add(1, std::memory_order_relaxed) < cfg.max_open_calls)
      return true;
    open_calls.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  void end_call() { open_calls.fetch_sub(1, std::memory_order_relaxed); }
  Status too_many_calls() const {
    return Status(StatusCode::UNAVAILABLE,
                  "the server has " + std::to_string(cfg.max_open_calls)
                    + " gRPC inference calls and streams open, its limit "
                      "(--grpc-max-open-calls); retry when one has ended, or raise the limit");
  }

  /// What every inference request must pass before its model is looked at
  /// (the server takes requests, the message is within --max-body-bytes),
  /// then its model.
  result<std::shared_ptr<const server::model_pipeline>> accept(
    const pb::ModelInferRequest& request) const;

  /// Parses the request for the one-shot `model`, admits it (admission.hpp)
  /// and hands it to the pipeline; `done` gets its answer, at once or later
  /// on the thread that delivers it.
  void start_infer(std::shared_ptr<const server::model_pipeline> model,
                   const pb::ModelInferRequest& request, int64_t received, infer_done done);
};

namespace {

/// One inference in the pipeline: what its answer needs, and the count of
/// the model's pending requests, held until it is answered.
struct pending_infer {
  std::shared_ptr<const server::model_pipeline> model;
  int64_t received_ns = 0;
  answer_context answer;
  infer_done done;

  pending_infer(std::shared_ptr<const server::model_pipeline> m, int64_t received)
      : model(std::move(m)), received_ns(received) {
    model->stats->pending.fetch_add(1, std::memory_order_relaxed);
  }
  ~pending_infer() { model->stats->pending.fetch_sub(1, std::memory_order_relaxed); }
  pending_infer(const pending_infer&) = delete;
  pending_infer& operator=(const pending_infer&) = delete;

  void fail(serving_error e) {
    answer.shared_memory = {};
    record_failure(*model, received_ns, e);
    done(std::move(e));
  }

  /// The pipeline's answer, turned into the call's (on the thread that
  /// delivers it: one copy of the output bytes into the protobuf).
  void answer_with(const response_message& msg) {
    auto view = read_answer(msg, answer, *model, received_ns);
    if (!view) // counted by read_answer
      return done(view.error());
    view->model_name = model->config.name;
    auto version = std::to_string(model->version);
    view->model_version = version;
    view->id = answer.request.id;
    answer.shared_memory = {};
    auto reply = grpc_api::to_infer_response(*view, answer.request.outputs);
    record_answer(answer, *model->stats, view->outputs, received_ns);
    done(std::move(reply));
  }
};

/// Hands the pipeline's answer to the call. Every request gets one answer: a
/// sink dropped without one (a stage stopped while holding the request)
/// answers INTERNAL naming the model.
class grpc_sink final : public response_sink {
public:
  explicit grpc_sink(std::shared_ptr<pending_infer> p) : pending_(std::move(p)) {}
  ~grpc_sink() noexcept override {
    if (!delivered_)
      pending_->fail({status_code::internal,
                      "model '" + pending_->model->config.name
                        + "': the request was lost inside the server (a pipeline stage "
                          "stopped while holding it); retry it",
                      failure_reason::internal});
  }
  void deliver(response_message r) override {
    delivered_ = true;
    pending_->answer_with(r);
  }

private:
  std::shared_ptr<pending_infer> pending_;
  bool delivered_ = false;
};

} // namespace

result<std::shared_ptr<const server::model_pipeline>>
grpc_server::state::accept(const pb::ModelInferRequest& request) const {
  if (draining.load())
    return unavailable("the server is shutting down (SIGINT or SIGTERM) and takes no "
                       "new requests; send it to another server");
  size_t size = request.ByteSizeLong();
  if (size > cfg.limits.max_body_bytes)
    return serving_error{status_code::payload_too_large,
                         "the request message has " + std::to_string(size)
                           + " bytes, over the limit of "
                           + std::to_string(cfg.limits.max_body_bytes)
                           + " bytes; raise --max-body-bytes (it bounds HTTP bodies and "
                             "gRPC messages alike)"};
  auto version = grpc_api::parse_version(request.model_version(), request.model_name());
  if (!version)
    return version.error();
  auto found = models.find(request.model_name(), *version);
  if (!found)
    return found.error();
  return *found;
}

void grpc_server::state::start_infer(std::shared_ptr<const server::model_pipeline> model,
                                     const pb::ModelInferRequest& request, int64_t received,
                                     infer_done done) {
  auto parsed = grpc_api::to_infer_request(request, cfg.limits);
  if (!parsed) {
    record_failure(*model, received, parsed.error());
    return done(parsed.error());
  }
  auto admitted = admit(admission, model, std::move(*parsed), received);
  if (auto* e = std::get_if<serving_error>(&admitted)) // counted by admit
    return done(std::move(*e));
  if (auto* hit = std::get_if<cache_hit>(&admitted)) {
    // The response cache, as on HTTP: the pipeline is skipped.
    auto view = cached_answer(*hit, *model->stats, received);
    view.model_name = model->config.name;
    auto version = std::to_string(model->version);
    view.model_version = version;
    view.id = hit->answer.request.id;
    auto reply = grpc_api::to_infer_response(view, hit->answer.request.outputs);
    record_answer(hit->answer, *model->stats, view.outputs, received);
    return done(std::move(reply));
  }
  auto& to_pipeline = std::get<admitted_request>(admitted);
  auto pending = std::make_shared<pending_infer>(model, received);
  pending->answer = std::move(to_pipeline.answer);
  pending->done = std::move(done);
  submit(*model, std::move(to_pipeline.message),
         std::make_shared<grpc_sink>(std::move(pending)));
}

namespace {

// -- calls -------------------------------------------------------------------

/// The first base of every inference call: counts the call in
/// state::live_calls from its construction to the very end of its
/// destruction (a first base is destroyed last), so that the server is
/// destroyed only after every ServerContext is.
class call_object {
protected:
  explicit call_object(grpc_server::state& s) : counted_in_(s) { s.call_created(); }
  ~call_object() { counted_in_.call_destroyed(); }
  call_object(const call_object&) = delete;
  call_object& operator=(const call_object&) = delete;

private:
  grpc_server::state& counted_in_;
};

// -- calls on completion queues -----------------------------------------------

using svc = pb::GRPCInferenceService;
/// Every RPC on completion queues (--grpc-threads). None may be on grpc's
/// callback API: a single callback method makes grpc start the threads that
/// would poll the sockets beside the completion-queue threads
/// (control_calls.hpp).
using cq_base = svc::WithAsyncMethod_ServerLive<svc::WithAsyncMethod_ServerReady<
  svc::WithAsyncMethod_ModelReady<svc::WithAsyncMethod_ServerMetadata<
    svc::WithAsyncMethod_ModelMetadata<svc::WithAsyncMethod_ModelConfig<
      svc::WithAsyncMethod_ModelStatistics<svc::WithAsyncMethod_RepositoryIndex<
        svc::WithAsyncMethod_RepositoryModelLoad<svc::WithAsyncMethod_RepositoryModelUnload<
          svc::WithAsyncMethod_SystemSharedMemoryStatus<
            svc::WithAsyncMethod_SystemSharedMemoryRegister<
              svc::WithAsyncMethod_SystemSharedMemoryUnregister<
                svc::WithAsyncMethod_CudaSharedMemoryStatus<
                  svc::WithAsyncMethod_CudaSharedMemoryRegister<
                    svc::WithAsyncMethod_CudaSharedMemoryUnregister<
                      svc::WithAsyncMethod_TraceSetting<svc::WithAsyncMethod_LogSettings<
                        svc::WithAsyncMethod_ModelInfer<
                          svc::WithAsyncMethod_ModelStreamInfer<svc::Service>>>>>>>>>>>>>>>>>>>>;

template <class Call, void (Call::*Handler)(bool)>
struct call_tag final : cq_tag {
  explicit call_tag(Call* c) : call(c) {}
  void on_event(bool ok) override { (call->*Handler)(ok); }
  Call* call;
};

/// A unary ModelInfer on a completion queue. The thread of the queue reads
/// the request and hands it to the scheduler; the CAF thread that delivers
/// the pipeline's answer turns it into the reply and posts it to the queue's
/// inbox (cq_answer_inbox), and the queue's thread finishes the call. The
/// call lives while grpc holds one of its tags (ops_).
class cq_unary_infer : call_object {
public:
  /// Asks grpc for the next ModelInfer call on `cq`.
  static void listen(cq_base& service, ::grpc::ServerCompletionQueue& cq,
                     cq_answer_inbox& inbox, grpc_server::state& s) {
    auto call = std::shared_ptr<cq_unary_infer>(new cq_unary_infer(service, cq, inbox, s));
    auto* c = call.get();
    c->self_ = std::move(call);
    c->ctx_.AsyncNotifyWhenDone(&c->done_tag_);
    if (!s.on_open_cq([&] {
          service.RequestModelInfer(&c->ctx_, &c->request_, &c->writer_, &cq, &cq,
                                    &c->accepted_tag_);
        }))
      c->self_.reset();
  }

private:
  cq_unary_infer(cq_base& service, ::grpc::ServerCompletionQueue& cq, cq_answer_inbox& inbox,
                 grpc_server::state& s)
      : call_object(s), service_(service), cq_(cq), inbox_(inbox), state_(s) {}

  void on_accepted(bool ok) {
    if (!ok) {
      // The server stops: no call came, and the done tag never will.
      self_.reset();
      return;
    }
    int64_t received = now_ns();
    listen(service_, cq_, inbox_, state_);
    auto self = self_;
    {
      std::lock_guard lock(mutex_);
      ops_ = 1; // the done notification
      counted_ = state_.admit_call();
      if (!counted_) {
        finished_ = true;
        if (state_.on_open_cq(
              [&] { writer_.FinishWithError(state_.too_many_calls(), &finish_tag_); }))
          ++ops_;
        return;
      }
    }
    // Weakly: once grpc is done with the call (answered, or cancelled) it
    // goes, and a late answer finds nothing to complete.
    std::weak_ptr<cq_unary_infer> weak = self;
    infer_done done = [weak, &inbox = inbox_](infer_outcome outcome) {
      inbox.post(weak, std::move(outcome));
    };
    auto model = state_.accept(request_);
    if (!model)
      return done(model.error());
    if ((*model)->generative) {
      // Triton's words (TRITONSERVER_ERROR_UNSUPPORTED, UNIMPLEMENTED).
      serving_error e{status_code::method_not_allowed,
                      "ModelInfer RPC doesn't support models with decoupled transaction "
                      "policy: model '" + (*model)->config.name + "' is generative; send its "
                      "requests on ModelStreamInfer (tritonclient.grpc's start_stream and "
                      "async_stream_infer)",
                      failure_reason::bad_request};
      record_failure(**model, received, e);
      return done(std::move(e));
    }
    state_.start_infer(std::move(*model), request_, received, std::move(done));
  }

  friend class cq_answer_inbox;

  void complete(infer_outcome outcome) {
    std::lock_guard lock(mutex_);
    if (finished_)
      return;
    finished_ = true;
    bool started = state_.on_open_cq([&] {
      if (auto* e = std::get_if<serving_error>(&outcome))
        writer_.FinishWithError(grpc_api::to_status(*e), &finish_tag_);
      else
        writer_.Finish(std::get<pb::ModelInferResponse>(outcome), Status::OK, &finish_tag_);
    });
    if (started)
      ++ops_;
  }

  void on_finished(bool) { release(); }

  void on_done(bool) {
    {
      std::lock_guard lock(mutex_);
      if (!finished_ && ctx_.IsCancelled()) {
        // The client gave up, or the drain's deadline passed.
        finished_ = true;
        if (state_.draining.load())
          state_.abandoned.fetch_add(1);
      }
    }
    release();
  }

  void release() {
    std::shared_ptr<cq_unary_infer> last;
    {
      std::lock_guard lock(mutex_);
      if (--ops_ == 0) {
        if (counted_)
          state_.end_call();
        last = std::move(self_);
      }
    }
  }

  cq_base& service_;
  ::grpc::ServerCompletionQueue& cq_;
  cq_answer_inbox& inbox_;
  grpc_server::state& state_;
  ::grpc::ServerContext ctx_;
  pb::ModelInferRequest request_;
  ::grpc::ServerAsyncResponseWriter<pb::ModelInferResponse> writer_{&ctx_};
  std::shared_ptr<cq_unary_infer> self_;
  std::mutex mutex_;
  int ops_ = 0;
  bool finished_ = false;
  /// Counted in state::open_calls.
  bool counted_ = false;
  call_tag<cq_unary_infer, &cq_unary_infer::on_accepted> accepted_tag_{this};
  call_tag<cq_unary_infer, &cq_unary_infer::on_finished> finish_tag_{this};
  call_tag<cq_unary_infer, &cq_unary_infer::on_done> done_tag_{this};
};

void cq_answer_inbox::post(std::weak_ptr<cq_unary_infer> call, infer_outcome outcome) {
  if (this_thread_inbox == this) {
    // An answer given at once (a refusal, a cache hit) on the queue's thread.
    if (auto c = call.lock())
      c->complete(std::move(outcome));
    return;
  }
  bool ring = false;
  {
    std::lock_guard lock(mutex_);
    items_.push_back(item{std::move(call), std::move(outcome)});
    ring = !rung_;
    rung_ = true;
  }
  // Set outside the lock: the alarm cannot fire (and so rung_ cannot be
  // cleared and the alarm set again) before this Set.
  if (ring)
    state_.on_open_cq([&] { alarm_.Set(&cq_, gpr_inf_past(GPR_CLOCK_MONOTONIC), this); });
}

void cq_answer_inbox::on_event(bool) {
  {
    std::lock_guard lock(mutex_);
    std::swap(items_, taken_);
    rung_ = false;
  }
  for (auto& it : taken_)
    if (auto c = it.call.lock())
      c->complete(std::move(it.outcome));
  taken_.clear();
}

/// A call other than ModelInfer and ModelStreamInfer on a completion queue:
/// the queue's thread runs its control_calls handler, which finishes it at
/// once (RepositoryModelLoad: later, from the loader thread). The call lives
/// until grpc hands back its finish tag.
template <class Request, class Response>
class cq_control_call : call_object {
public:
  /// svc::WithAsyncMethod_X::RequestX.
  using request_method = void (cq_base::*)(::grpc::ServerContext*, Request*,
                                           ::grpc::ServerAsyncResponseWriter<Response>*,
                                           ::grpc::CompletionQueue*,
                                           ::grpc::ServerCompletionQueue*, void*);
  /// Runs a call: fills the response and calls `finish` once, on any thread.
  using handler = void (*)(const control_calls&, const Request&, Response*,
                           std::function<void(Status)> finish);

  /// Asks grpc for the next call of `request` on `cq`.
  static void listen(cq_base& service, ::grpc::ServerCompletionQueue& cq, grpc_server::state& s,
                     request_method request, handler handle) {
    auto call = std::shared_ptr<cq_control_call>(
      new cq_control_call(service, cq, s, request, handle));
    auto* c = call.get();
    c->self_ = std::move(call);
    if (!s.on_open_cq([&] {
          (service.*request)(&c->ctx_, &c->request_, &c->writer_, &cq, &cq, &c->accepted_tag_);
        }))
      c->self_.reset();
  }

private:
  cq_control_call(cq_base& service, ::grpc::ServerCompletionQueue& cq, grpc_server::state& s,
                  request_method request, handler handle)
      : call_object(s), service_(service), cq_(cq), state_(s), request_method_(request),
        handle_(handle) {}

  void on_accepted(bool ok) {
    if (!ok) {
      self_.reset(); // the server stops
      return;
    }
    listen(service_, cq_, state_, request_method_, handle_);
    handle_(state_.control, request_, &response_, [this](Status status) { finish(status); });
  }

  void finish(const Status& status) {
    bool started = state_.on_open_cq([&] {
      if (status.ok())
        writer_.Finish(response_, status, &finish_tag_);
      else
        writer_.FinishWithError(status, &finish_tag_);
    });
    if (!started)
      self_.reset(); // the queues are closing: no finish tag will come
  }

  void on_finished(bool) { self_.reset(); }

  cq_base& service_;
  ::grpc::ServerCompletionQueue& cq_;
  grpc_server::state& state_;
  request_method request_method_;
  handler handle_;
  ::grpc::ServerContext ctx_;
  Request request_;
  Response response_;
  ::grpc::ServerAsyncResponseWriter<Response> writer_{&ctx_};
  std::shared_ptr<cq_control_call> self_;
  call_tag<cq_control_call, &cq_control_call::on_accepted> accepted_tag_{this};
  call_tag<cq_control_call, &cq_control_call::on_finished> finish_tag_{this};
};

/// Starts listening for every control call on `cq`.
void listen_control_calls(cq_base& service, ::grpc::ServerCompletionQueue& cq,
                          grpc_server::state& s) {
// One call: the handler of control_calls that answers it at once.
#define CAF_SERVING_CQ_CONTROL(rpc, method)                                                       \
  cq_control_call<pb::rpc##Request, pb::rpc##Response>::listen(                                   \
    service, cq, s, &cq_base::Request##rpc,                                                       \
    [](const control_calls& calls, const pb::rpc##Request& request, pb::rpc##Response* response,  \
       std::function<void(Status)> finish) { finish(calls.method(request, response)); })
  CAF_SERVING_CQ_CONTROL(ServerLive, server_live);
  CAF_SERVING_CQ_CONTROL(ServerReady, server_ready);
  CAF_SERVING_CQ_CONTROL(ModelReady, model_ready);
  CAF_SERVING_CQ_CONTROL(ServerMetadata, server_metadata);
  CAF_SERVING_CQ_CONTROL(ModelMetadata, model_metadata);
  CAF_SERVING_CQ_CONTROL(ModelConfig, model_config);
  CAF_SERVING_CQ_CONTROL(ModelStatistics, model_statistics);
  CAF_SERVING_CQ_CONTROL(RepositoryIndex, repository_index);
  CAF_SERVING_CQ_CONTROL(RepositoryModelUnload, repository_model_unload);
  CAF_SERVING_CQ_CONTROL(SystemSharedMemoryStatus, system_shared_memory_status);
  CAF_SERVING_CQ_CONTROL(SystemSharedMemoryRegister, system_shared_memory_register);
  CAF_SERVING_CQ_CONTROL(SystemSharedMemoryUnregister, system_shared_memory_unregister);
  CAF_SERVING_CQ_CONTROL(CudaSharedMemoryStatus, cuda_shared_memory_status);
  CAF_SERVING_CQ_CONTROL(CudaSharedMemoryRegister, cuda_shared_memory_register);
  CAF_SERVING_CQ_CONTROL(CudaSharedMemoryUnregister, cuda_shared_memory_unregister);
  CAF_SERVING_CQ_CONTROL(TraceSetting, trace_setting);
  CAF_SERVING_CQ_CONTROL(LogSettings, log_settings);
#undef CAF_SERVING_CQ_CONTROL
  cq_control_call<pb::RepositoryModelLoadRequest, pb::RepositoryModelLoadResponse>::listen(
    service, cq, s, &cq_base::RequestRepositoryModelLoad,
    [](const control_calls& calls, const pb::RepositoryModelLoadRequest& request,
       pb::RepositoryModelLoadResponse*, std::function<void(Status)> finish) {
      calls.repository_model_load(request, std::move(finish));
    });
}

/// A ModelStreamInfer stream on a completion queue: requests are read one at
/// a time and sent on into the pipeline, or for a generative model to its
/// generation actor. A one-shot request's answer is written in the order of
/// the one-shot requests; a generative request's responses (one per step of
/// text, stream_generation_sink) are written as they come, so those of
/// several requests interleave, each request's in order. A failed request is
/// answered with error_message and the stream goes on. At most
/// stream_max_in_flight requests are unfinished at once (their last response
/// not yet written): past that, reading waits for a write. Responses are
/// written from the thread that delivers them (a CAF worker, the generation
/// actor's thread); grpc's Write only queues, so no thread waits on the
/// client. A client that cancels the call or goes away cancels its
/// generations.
class cq_stream_infer : call_object, public std::enable_shared_from_this<cq_stream_infer> {
public:
  static void listen(cq_base& service, ::grpc::ServerCompletionQueue& cq,
                     grpc_server::state& s) {
    auto call = std::shared_ptr<cq_stream_infer>(new cq_stream_infer(service, cq, s));
    auto* c = call.get();
    c->self_ = std::move(call);
    c->ctx_.AsyncNotifyWhenDone(&c->done_tag_);
    if (!s.on_open_cq([&] {
          service.RequestModelStreamInfer(&c->ctx_, &c->stream_, &cq, &cq, &c->accepted_tag_);
        }))
      c->self_.reset();
  }

  /// The server is shutting down: requests still read are answered
  /// UNAVAILABLE (state::accept), and the stream finishes as soon as no
  /// answer is owed, instead of waiting for the client to close it.
  void drain() {
    std::lock_guard lock(mutex_);
    draining_ = true;
    maybe_finish();
  }

  /// The responses of generation `job` for one update, from the generation
  /// actor's thread; `last`: its last update.
  void post_generated(uint64_t job, std::vector<pb::ModelStreamInferResponse> responses,
                      bool last) {
    std::lock_guard lock(mutex_);
    if (last)
      forget_generation(job);
    if (finished_)
      return;
    for (size_t i = 0; i < responses.size(); ++i)
      out_.push_back({std::move(responses[i]), last && i + 1 == responses.size()});
    if (last && responses.empty()) {
      --in_flight_;
      maybe_finish();
    }
    write_next();
  }

private:
  cq_stream_infer(cq_base& service, ::grpc::ServerCompletionQueue& cq, grpc_server::state& s)
      : call_object(s), service_(service), cq_(cq), state_(s) {}

  /// A one-shot request's place in the order of answers.
  struct slot {
    bool ready = false;
    pb::ModelStreamInferResponse response;
  };

  /// A response to write; `ends_request`: the last of its request.
  struct outgoing {
    pb::ModelStreamInferResponse response;
    bool ends_request = false;
  };

  void on_accepted(bool ok) {
    if (!ok) {
      self_.reset();
      return;
    }
    listen(service_, cq_, state_);
    if (!state_.admit_call()) {
      std::lock_guard lock(mutex_);
      ops_ = 1; // the done notification
      finish(state_.too_many_calls());
      return;
    }
    counted_ = true;
    std::weak_ptr<cq_stream_infer> weak = self_;
    bool registered = state_.register_stream(self_, [weak] {
      if (auto s = weak.lock())
        s->drain();
    });
    std::lock_guard lock(mutex_);
    ops_ = 1; // the done notification
    start_read();
    if (!registered) {
      draining_ = true;
      maybe_finish();
    }
  }

  void on_read(bool ok) {
    auto keep = shared_from_this(); // self_ may go below, with mutex_ held
    {
      std::lock_guard lock(mutex_);
      --ops_;
      if (!ok || finished_) {
        reading_done_ = true;
        maybe_finish();
        return release_if_idle();
      }
      ++in_flight_;
    }
    // The request's bytes are copied (into the pipeline's message, or the
    // generation job) before these return, so request_ may be read into
    // again after them.
    int64_t received = now_ns();
    auto model = state_.accept(request_);
    if (model && (*model)->generative)
      start_generation(std::move(*model), received);
    else
      start_one_shot(std::move(model), received);
    std::lock_guard lock(mutex_);
    if (finished_)
      return release_if_idle();
    if (in_flight_ < state_.cfg.stream_max_in_flight)
      start_read();
    else
      read_paused_ = true;
  }

  void start_one_shot(result<std::shared_ptr<const server::model_pipeline>> model,
                      int64_t received) {
    size_t seq;
    {
      std::lock_guard lock(mutex_);
      seq = next_seq_++;
      slots_.emplace_back();
    }
    // Weakly, as cq_unary_infer: a stream grpc is done with goes at once.
    infer_done done = [weak = weak_from_this(), seq](infer_outcome outcome) {
      if (auto self = weak.lock())
        self->answered(seq, std::move(outcome));
    };
    if (!model)
      return done(model.error());
    state_.start_infer(std::move(*model), request_, received, std::move(done));
  }

  /// Reads request_ as a generative request, admits it
  /// (generation_admission.hpp) and hands it to the model's generation
  /// actor; defined below stream_generation_sink.
  void start_generation(std::shared_ptr<const server::model_pipeline> model, int64_t received);

  /// A generative request refused before it reached the actor.
  void refuse_generation(pb::ModelStreamInferResponse response) {
    std::lock_guard lock(mutex_);
    if (finished_)
      return;
    out_.push_back({std::move(response), true});
    write_next();
  }

  void answered(size_t seq, infer_outcome outcome) {
    std::lock_guard lock(mutex_);
    if (finished_ || seq < first_seq_)
      return;
    auto& s = slots_[seq - first_seq_];
    if (auto* e = std::get_if<serving_error>(&outcome))
      s.response.set_error_message(e->message);
    else
      s.response.mutable_infer_response()->Swap(&std::get<pb::ModelInferResponse>(outcome));
    s.ready = true;
    // The one-shot answers ready in order join the responses to write.
    while (!slots_.empty() && slots_.front().ready) {
      out_.push_back({std::move(slots_.front().response), true});
      slots_.pop_front();
      ++first_seq_;
    }
    write_next();
  }

  void on_write(bool ok) {
    auto keep = shared_from_this(); // self_ may go below, with mutex_ held
    std::lock_guard lock(mutex_);
    --ops_;
    writing_ = false;
    if (out_.front().ends_request)
      --in_flight_;
    out_.pop_front();
    if (!ok) {
      // The client is gone: nothing more can be written.
      finish(Status(StatusCode::CANCELLED, "the stream was closed by the client"));
      cancel_generations();
      return release_if_idle();
    }
    if (read_paused_ && !reading_done_ && !finished_
        && in_flight_ < state_.cfg.stream_max_in_flight) {
      read_paused_ = false;
      start_read();
    }
    write_next();
    maybe_finish();
    release_if_idle();
  }

  void on_finished(bool) {
    auto keep = shared_from_this(); // self_ may go below, with mutex_ held
    std::lock_guard lock(mutex_);
    --ops_;
    release_if_idle();
  }

  void on_done(bool) {
    auto keep = shared_from_this(); // self_ may go below, with mutex_ held
    std::lock_guard lock(mutex_);
    --ops_;
    // Cancelled (by the client, or by the drain's deadline): nothing more
    // may be written, and generations still running are dropped.
    finished_ = true;
    cancel_generations();
    release_if_idle();
  }

  // The rest is called with mutex_ held.

  void start_read() {
    if (state_.on_open_cq([&] { stream_.Read(&request_, &read_tag_); }))
      ++ops_;
  }

  void write_next() {
    if (writing_ || finished_ || out_.empty())
      return;
    if (state_.on_open_cq([&] { stream_.Write(out_.front().response, &write_tag_); })) {
      writing_ = true;
      ++ops_;
    }
  }

  void maybe_finish() {
    if (in_flight_ == 0 && out_.empty() && !writing_ && (reading_done_ || draining_))
      finish(stream_end_status(reading_done_));
  }

  void finish(Status s) {
    if (finished_)
      return;
    finished_ = true;
    if (state_.on_open_cq([&] { stream_.Finish(s, &finish_tag_); }))
      ++ops_;
  }

  /// The client is gone: its generations end and free their cache blocks.
  void cancel_generations() {
    for (const auto& [job, model] : generations_)
      cancel_generation(*model, job);
    generations_.clear();
  }

  void forget_generation(uint64_t job) {
    for (size_t i = 0; i < generations_.size(); ++i)
      if (generations_[i].first == job) {
        generations_.erase(generations_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  }

  /// Once grpc holds none of its tags the call lets go of itself (the tag
  /// handler's `keep` outlives the lock); the object goes when the last
  /// answer for it has been delivered too.
  void release_if_idle() {
    if (ops_ != 0)
      return;
    if (counted_)
      state_.end_call();
    counted_ = false;
    self_.reset();
  }

  cq_base& service_;
  ::grpc::ServerCompletionQueue& cq_;
  grpc_server::state& state_;
  ::grpc::ServerContext ctx_;
  ::grpc::ServerAsyncReaderWriter<pb::ModelStreamInferResponse, pb::ModelInferRequest> stream_{
    &ctx_};
  pb::ModelInferRequest request_;
  std::shared_ptr<cq_stream_infer> self_;
  std::mutex mutex_;
  int ops_ = 0;
  /// One-shot requests not answered in order yet.
  std::deque<slot> slots_;
  size_t first_seq_ = 0;
  size_t next_seq_ = 0;
  /// Responses to write, the front one being written while writing_.
  std::deque<outgoing> out_;
  /// Requests read whose last response is not written yet.
  uint32_t in_flight_ = 0;
  /// Generations running for this stream (job id, model), to cancel.
  std::vector<std::pair<uint64_t, std::shared_ptr<const server::model_pipeline>>> generations_;
  bool reading_done_ = false;
  bool read_paused_ = false;
  bool writing_ = false;
  bool finished_ = false;
  bool draining_ = false;
  /// Counted in state::open_calls.
  bool counted_ = false;
  call_tag<cq_stream_infer, &cq_stream_infer::on_accepted> accepted_tag_{this};
  call_tag<cq_stream_infer, &cq_stream_infer::on_read> read_tag_{this};
  call_tag<cq_stream_infer, &cq_stream_infer::on_write> write_tag_{this};
  call_tag<cq_stream_infer, &cq_stream_infer::on_finished> finish_tag_{this};
  call_tag<cq_stream_infer, &cq_stream_infer::on_done> done_tag_{this};
};

/// One generative request on a stream: what its responses need. Touched
/// only by its sink, on the generation actor's thread, so it needs no lock.
struct stream_generation {
  std::shared_ptr<const server::model_pipeline> model;
  uint64_t job = 0;
  /// The request's id, and the model's version as text, for every response.
  std::string id;
  std::string version;
  /// The prompt as the model read it, for echo (vLLM's backend leads the
  /// whole text with it when not streaming, unless exclude_input_in_output).
  std::string prompt_text;
  bool stream = false;
  bool echo = false;
  bool empty_final_response = false;
  bool return_finish_reason = false;
  bool return_num_input_tokens = false;
  bool return_num_output_tokens = false;
  int64_t received_ns = 0;
  /// The text so far, when not streaming.
  std::string text;
};

generation_finish finish_of(const std::optional<std::string>& reason) {
  if (!reason)
    return generation_finish::none;
  return *reason == "length" ? generation_finish::length : generation_finish::stop;
}

/// The generation actor's end of a generative request on a stream: turns
/// each update into its responses and hands them to the stream (held
/// weakly: a stream grpc is done with goes, and its generations are
/// cancelled). Every job gets a last update: one dropped without it (the
/// actor stopped) answers an error.
class stream_generation_sink final : public scheduler::generation_sink {
public:
  stream_generation_sink(std::weak_ptr<cq_stream_infer> stream, stream_generation g)
      : stream_(std::move(stream)), g_(std::move(g)) {}

  ~stream_generation_sink() override {
    if (ended_)
      return;
    scheduler::generation_update u;
    u.error = serving_error{status_code::internal,
                            "model '" + g_.model->config.name + "': the request was lost "
                            "inside the server (its generation stopped); retry it"};
    deliver(std::move(u));
  }

  void deliver(scheduler::generation_update u) override {
    ended_ = u.last();
    auto responses = responses_for(u);
    if (auto s = stream_.lock())
      s->post_generated(g_.job, std::move(responses), u.last());
  }

private:
  std::vector<pb::ModelStreamInferResponse> responses_for(const scheduler::generation_update& u) {
    std::vector<pb::ModelStreamInferResponse> out;
    grpc_api::generate_response_meta meta{g_.id, g_.model->config.name, g_.version};
    if (u.error) {
      record_failure(*g_.model, g_.received_ns, *u.error);
      out.push_back(grpc_api::to_generate_error(meta, u.error->message));
      return out;
    }
    bool last = u.last();
    grpc_api::generate_response r;
    r.meta = meta;
    r.final = last && !g_.empty_final_response;
    if (g_.return_finish_reason)
      r.finish_reason = finish_of(u.finish_reason);
    if (g_.return_num_input_tokens)
      r.num_input_tokens = u.prompt_tokens;
    std::string whole;
    if (g_.stream) {
      // One response per step that has text (and the last, when it carries
      // the final flag), as vLLM's backend sends them.
      if (!u.text.empty() || r.final) {
        r.text_output = u.text;
        if (g_.return_num_output_tokens)
          r.num_output_tokens = static_cast<uint32_t>(u.tokens.size());
        out.push_back(grpc_api::to_generate_response(r));
      }
    } else {
      g_.text += u.text;
      if (!last)
        return out;
      whole = g_.echo ? g_.prompt_text + g_.text : g_.text;
      r.text_output = whole;
      if (g_.return_num_output_tokens)
        r.num_output_tokens = u.completion_tokens;
      out.push_back(grpc_api::to_generate_response(r));
    }
    if (last) {
      record_generation(*g_.model, g_.received_ns);
      if (g_.empty_final_response) {
        grpc_api::generate_response empty;
        empty.meta = meta;
        empty.final = true;
        out.push_back(grpc_api::to_generate_response(empty));
      }
    }
    return out;
  }

  std::weak_ptr<cq_stream_infer> stream_;
  stream_generation g_;
  bool ended_ = false;
};

void cq_stream_infer::start_generation(std::shared_ptr<const server::model_pipeline> model,
                                       int64_t received) {
  const auto& m = *model;
  std::string version = std::to_string(m.version);
  grpc_api::generate_response_meta meta{request_.id(), m.config.name, version};
  auto refuse = [&](const serving_error& e) {
    record_failure(m, received, e);
    refuse_generation(grpc_api::to_generate_error(meta, e.message));
  };
  auto read = grpc_api::to_generate_request(request_, generate_model_info_of(m.config),
                                            state_.cfg.limits);
  if (!read)
    return refuse(read.error());
  auto admitted = admit_generation(m, read->request);
  if (!admitted)
    return refuse(admitted.error());
  auto job = std::move(admitted->job);
  stream_generation g;
  g.model = model;
  g.job = job->id;
  g.id = request_.id();
  g.version = std::move(version);
  g.prompt_text = std::move(admitted->prompt_text);
  g.stream = read->request.stream;
  g.echo = read->request.echo;
  g.empty_final_response = read->empty_final_response;
  g.return_finish_reason = read->request.triton.return_finish_reason;
  g.return_num_input_tokens = read->request.triton.return_num_input_tokens;
  g.return_num_output_tokens = read->request.triton.return_num_output_tokens;
  g.received_ns = received;
  uint64_t id = job->id;
  {
    std::lock_guard lock(mutex_);
    if (finished_)
      return; // the client is gone: nothing to generate for
    // Known before the actor may answer, so that a last update forgets it.
    generations_.emplace_back(id, model);
  }
  job->sink = std::make_shared<stream_generation_sink>(weak_from_this(), std::move(g));
  submit_generation(m, std::move(job));
}

::grpc_compression_level to_grpc(grpc_response_compression level) {
  switch (level) {
    case grpc_response_compression::none: return GRPC_COMPRESS_LEVEL_NONE;
    case grpc_response_compression::low: return GRPC_COMPRESS_LEVEL_LOW;
    case grpc_response_compression::medium: return GRPC_COMPRESS_LEVEL_MED;
    case grpc_response_compression::high: return GRPC_COMPRESS_LEVEL_HIGH;
  }
  return GRPC_COMPRESS_LEVEL_NONE;
}

} // namespace

std::string_view to_string(grpc_response_compression level) {
  switch (level) {
    case grpc_response_compression::none: return "none";
    case grpc_response_compression::low: return "low";
    case grpc_response_compression::medium: return "medium";
    case grpc_response_compression::high: return "high";
  }
  return "none";
}

grpc_server::grpc_server(std::unique_ptr<state> s) : state_(std::move(s)) {}

grpc_server::~grpc_server() {
  if (state_ && state_->server) {
    state_->server->Shutdown(std::chrono::system_clock::now());
    state_->server->Wait();
    state_->close_queues();
    release_calls(std::chrono::seconds(5));
  }
}

void grpc_server::release_calls(std::chrono::milliseconds deadline) {
  if (state_->wait_for_calls(deadline)) {
    state_->server.reset();
    return;
  }
  // A call object is still held (it cannot be by the pipeline, which holds
  // calls weakly): its ServerContext must not outlive the grpc::Server, so
  // the server, the service and the state stay, unreleased, until the
  // process exits.
  std::cerr << "caf-serving: gRPC calls still held at exit; the gRPC server is left "
               "running until the process exits"
            << std::endl;
  state_->server.release();
  state_->service.release();
  state_.release();
}

std::unique_ptr<grpc_server> grpc_server::start(const grpc_server_config& cfg,
                                                server::model_directory& models) {
  // Debian's abseil is built without NDEBUG, so every absl::Mutex that grpc
  // takes (about 26 a call) also updates a lock-order graph for deadlock
  // detection: 10% of a gRPC call's instructions (bench/grpc/callgrind).
  // Release builds of abseil have it off; so does the server.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (cfg.threads == 0)
    throw std::invalid_argument("the gRPC server needs at least one completion-queue thread "
                                "(--grpc-threads)");
  auto s = std::make_unique<state>(cfg, models);
  // Every call is on the completion queues: ModelInfer and ModelStreamInfer
  // (cq_unary_infer, cq_stream_infer), the rest through cq_control_call.
  auto service = std::make_unique<cq_base>();
  cq_base* async = service.get();
  s->service = std::move(service);
  ::grpc::ServerBuilder builder;
  std::string host = cfg.address.find(':') != std::string::npos ? "[" + cfg.address + "]"
                                                                 : cfg.address;
  builder.AddListeningPort(host + ":" + std::to_string(cfg.port),
                           ::grpc::InsecureServerCredentials(), &s->port);
  builder.RegisterService(s->service.get());
  // A message may be larger than --max-body-bytes by half again before grpc
  // itself refuses it (RESOURCE_EXHAUSTED, grpc's words); up to there the
  // server refuses it with a message naming the flag.
  size_t limit = cfg.limits.max_body_bytes + cfg.limits.max_body_bytes / 2;
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(limit, INT_MAX)));
  // A port in use is an error, as for HTTP: grpc would otherwise share it
  // with another server through SO_REUSEPORT.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(std::min<uint32_t>(cfg.max_concurrent_streams,
                                                                 INT_MAX)));
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, true);
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, true);
  if (cfg.compression != grpc_response_compression::none)
    builder.SetDefaultCompressionLevel(to_grpc(cfg.compression));
  for (uint32_t i = 0; i < cfg.threads; ++i)
    s->cqs.push_back(builder.AddCompletionQueue());
  s->server = builder.BuildAndStart();
  if (!s->server || s->port == 0)
    throw std::runtime_error("cannot listen on the gRPC port " + std::to_string(cfg.port) + " of "
                             + cfg.address
                             + " (--grpc-port, --grpc-address): the port is in use or the "
                               "address is not this machine's; grpc's log above says which "
                               "(--allow-grpc false serves without gRPC)");
  for (auto& q : s->cqs) {
    auto& inbox = *s->inboxes.emplace_back(std::make_unique<cq_answer_inbox>(*s, *q));
    s->cq_threads.emplace_back([&st = *s, async, cq = q.get(), &inbox] {
      inbox.bind_thread();
      cq_unary_infer::listen(*async, *cq, inbox, st);
      cq_stream_infer::listen(*async, *cq, st);
      listen_control_calls(*async, *cq, st);
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok))
        static_cast<cq_tag*>(tag)->on_event(ok);
    });
    // Named, so that top, perf and the tests tell them from grpc's own; named
    // here rather than by the thread itself, so the name is set before the
    // server announces its port.
    pthread_setname_np(s->cq_threads.back().native_handle(), "grpc-cq");
  }
  return std::unique_ptr<grpc_server>(new grpc_server(std::move(s)));
}

uint16_t grpc_server::port() const {
  return static_cast<uint16_t>(state_->port);
}

void grpc_server::begin_drain() {
  std::vector<std::function<void()>> drains;
  {
    std::lock_guard lock(state_->streams_mutex);
    state_->draining.store(true);
    drains = state_->stream_drains;
  }
  for (auto& d : drains)
    d();
}

grpc_stop_report grpc_server::stop(std::chrono::milliseconds deadline) {
  begin_drain();
  state_->server->Shutdown(std::chrono::system_clock::now() + deadline);
  state_->server->Wait();
  state_->close_queues();
  grpc_stop_report report;
  report.abandoned = state_->abandoned.load();
  release_calls(deadline);
  return report;
}

} // namespace caf_serving::ingress
