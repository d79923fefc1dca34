#include "ingress/http_event_loop.hpp"

#include "ingress/http_service.hpp"

#include <kj/async-io.h>

#include <memory>

#include <stdexcept>

namespace caf_serving::ingress {

namespace {

/// One event loop: its kj loop, HttpServer and service over the HTTP listening
/// socket (and the metrics socket) when it is loop 0. It serves
/// until `stop` resolves, then drains its own connections, and tells how that
/// ended.
class event_loop {
public:
  event_loop(kj::AsyncIoContext& io, const http_shared& s, loop_setup& setup)
      : io_(io),
        timer_(io.provider->getTimer()),
        cfg_(s.cfg),
        service_(s, service_ports::http, timer_, closer_),
        metrics_service_(s, service_ports::metrics_only, timer_, closer_),
        server_(timer_, s.table, service_, settings()),
        metrics_server_(timer_, s.table, metrics_service_, settings()),
        gate_(server_, *io.lowLevelProvider, timer_, s.cfg.max_connections, s.http_connections,
              &s.accepted_by_loop[setup.index]),
        metrics_gate_(metrics_server_, *io.lowLevelProvider, timer_, s.cfg.max_connections,
                      s.metrics_connections) {
    if (setup.http_fd.get() >= 0)
      listener_ = listen_on(kj::mv(setup.http_fd));
    if (setup.metrics_fd.get() >= 0)
      metrics_listener_ = listen_on(kj::mv(setup.metrics_fd));
  }

  /// The HTTP port's gate: loop 0 hands connections to the others' gates.
  connection_gate& gate() { return gate_; }

  stop_report serve(kj::Promise<void> stop) {
    auto& ws = io_.waitScope;
    // Loops other than loop 0 only serve what it hands them.
    kj::Promise<void> serving = kj::NEVER_DONE;
    if (listener_)
      serving = gate_.listen(*listener_);
    if (metrics_listener_)
      serving = serving.exclusiveJoin(metrics_gate_.listen(*metrics_listener_));
    // Serve until stopped; dropping the listen loops stops accepting connections.
    serving.exclusiveJoin(kj::mv(stop)).wait(ws);
    service_.draining = true;
    listener_ = nullptr;
    metrics_listener_ = nullptr;
    // Answer every request already accepted, then close the connections.
    // Both drains must finish: exclusiveJoin would stop at the first one (the
    // metrics server's, at once) and drop the inference requests still running.
    auto metrics_drained = metrics_server_.drain();
    auto drained = server_.drain()
                     .then([m = kj::mv(metrics_drained)]() mutable { return kj::mv(m); })
                     .then([this]() { return gate_.connections_closed(); })
                     .then([this]() { return metrics_gate_.connections_closed(); })
                     .fork();
    auto within = [&](kj::Duration limit) {
      return drained.addBranch()
        .then([]() { return true; })
        .exclusiveJoin(timer_.afterDelay(limit).then([]() { return false; }))
        .wait(ws);
    };
    stop_report report;
    if (within(cfg_.exit_timeout_secs * kj::SECONDS))
      return report;
    // Past --exit-timeout-secs: what still waits for the pipeline is answered
    // 503; a second is left for those answers to be written.
    report.abandoned = service_.abandon_in_flight() + metrics_service_.abandon_in_flight();
    report.drained = within(1 * kj::SECONDS);
    return report;
  }

private:
  kj::HttpServerSettings settings() {
    kj::HttpServerSettings s;
    s.headerTimeout = cfg_.header_timeout_ms * kj::MILLISECONDS;
    s.pipelineTimeout = cfg_.idle_timeout_ms * kj::MILLISECONDS;
    s.errorHandler = errors_;
    s.callbacks = closer_;
    return s;
  }

  /// A listening socket (bind_listen_socket's: non-blocking, close-on-exec)
  /// on this loop.
  kj::Own<kj::ConnectionReceiver> listen_on(kj::AutoCloseFd fd) {
    using flags = kj::LowLevelAsyncIoProvider;
    return io_.lowLevelProvider->wrapListenSocketFd(
      fd.release(), flags::TAKE_OWNERSHIP | flags::ALREADY_CLOEXEC | flags::ALREADY_NONBLOCK);
  }

  kj::AsyncIoContext& io_;
  kj::Timer& timer_;
  const http_server_config& cfg_;
  close_after_response closer_;
  kserve_error_handler errors_;
  kserve_service service_;
  kserve_service metrics_service_;
  kj::HttpServer server_;
  kj::HttpServer metrics_server_;
  // After the servers: their connections are cancelled before the servers go.
  connection_gate gate_;
  connection_gate metrics_gate_;
  kj::Own<kj::ConnectionReceiver> listener_;
  kj::Own<kj::ConnectionReceiver> metrics_listener_;
};

} // namespace

void loop_control::stop() {
  auto st = slot_.lockExclusive();
  if (st->fulfiller && !st->stopped)
    st->fulfiller->fulfill();
  st->stopped = true;
}

kj::Promise<void> loop_control::when_stopped() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  auto st = slot_.lockExclusive();
  if (st->stopped)
    return kj::READY_NOW;
  st->fulfiller = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

void loop_control::forget() {
  // The fulfiller belongs to the loop's promise: gone with it.
  slot_.lockExclusive()->fulfiller = nullptr;
}

stop_report run_loop(const http_shared& shared, loop_setup setup, loop_control& control,
                     const loop_ready& ready) {
  auto io = kj::setupAsyncIo();
  event_loop loop(io, shared, setup);
  loop.gate().set_peers(kj::mv(setup.peers));
  auto stopped = control.when_stopped();
  if (ready)
    ready({kj::getCurrentThreadExecutor().addRef(), &loop.gate()});
  auto report = loop.serve(kj::mv(stopped));
  control.forget();
  return report;
}

loop_thread::loop_thread(const http_shared& shared, loop_setup setup) {
  // Behind a pointer: a lambda holding kj's objects would have a destructor
  // that may throw, which std::thread does not take.
  thread_ = std::thread([this, &shared, owned = std::make_unique<loop_setup>(kj::mv(setup))] {
    run(shared, kj::mv(*owned));
  });
  std::string failure;
  {
    auto ready = state_.lockExclusive();
    ready.wait([](const slot& st) { return st.ready || !st.failure.empty(); });
    failure = ready->failure;
    if (failure.empty())
      peer_ = kj::mv(ready->peer);
  }
  if (!failure.empty()) {
    thread_.join();
    throw std::runtime_error(failure);
  }
}

loop_thread::~loop_thread() {
  stop();
  if (thread_.joinable())
    thread_.join();
}

connection_gate::peer loop_thread::peer() const {
  return {peer_.executor->addRef(), peer_.gate};
}

stop_report loop_thread::join() {
  thread_.join();
  auto st = state_.lockExclusive();
  if (!st->failure.empty())
    throw std::runtime_error(st->failure);
  return st->report;
}

void loop_thread::run(const http_shared& shared, loop_setup setup) {
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                 auto report = run_loop(shared, kj::mv(setup), control_,
                                        [this](connection_gate::peer peer) {
                                          auto st = state_.lockExclusive();
                                          st->peer = kj::mv(peer);
                                          st->ready = true;
                                        });
                 state_.lockExclusive()->report = report;
               })) {
    state_.lockExclusive()->failure
      = "an HTTP event loop failed: " + std::string(e->getDescription().cStr());
  }
}

} // namespace caf_serving::ingress
