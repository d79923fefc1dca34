#include "ingress/http_server.hpp"

#include "ingress/http_event_loop.hpp"
#include "ingress/http_listen.hpp"
#include "ingress/http_shared.hpp"

#include <kj/compat/http.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace caf_serving::ingress {

/// What the loops share, and the loops: alive from start() until the server
/// is destroyed.
struct http_server::state {
  state(const http_server_config& c, server::model_directory& m, unsigned loops)
      : cfg(c),
        models(m),
        regions(c.shared_memory_regions
                  ? c.shared_memory_regions
                  : std::make_shared<shared_memory_registry>(c.shared_memory)),
        admission{c.limits, regions, c.cache},
        ids(table_builder),
        table(table_builder.build()),
        accepted_by_loop(loops),
        shared{cfg,         models,           *regions,
               admission,   *table,           ids,
               http_connections, metrics_connections, accepted_by_loop} {}

  http_server_config cfg;
  server::model_directory& models;
  std::shared_ptr<shared_memory_registry> regions;
  admission_config admission;
  kj::HttpHeaderTable::Builder table_builder;
  header_ids ids;
  kj::Own<kj::HttpHeaderTable> table;
  connection_count http_connections;
  connection_count metrics_connections;
  std::vector<std::atomic<uint64_t>> accepted_by_loop;
  http_shared shared;
  listening_ports ports;
  /// Loop 0 (accepting every connection), run by serve().
  loop_setup first;
  loop_control first_control;
  /// The other loops, on threads of their own.
  std::vector<std::unique_ptr<loop_thread>> others;
};

std::unique_ptr<http_server> http_server::start(const http_server_config& cfg,
                                                server::model_directory& models) {
  // Bound once, before any loop starts: a port in use fails the start here.
  auto http_fd = bind_listen_socket(cfg.address, cfg.http_port, {"HTTP", "--http-port"});
  kj::AutoCloseFd metrics_fd;
  if (cfg.metrics_enabled)
    metrics_fd = bind_listen_socket(cfg.address, cfg.metrics_port, {"metrics", "--metrics-port"});
  unsigned loops = std::max(cfg.event_loops, 1u);
  auto s = std::make_unique<state>(cfg, models, loops);
  s->ports.http = bound_port(http_fd.get());
  s->ports.metrics = cfg.metrics_enabled ? bound_port(metrics_fd.get()) : 0;

  // Loops 1..N-1 now: loop 0 hands them connections from its start on.
  // Their threads inherit this thread's signal mask (the stop signals stay
  // blocked in them).
  s->first = loop_setup{0, kj::mv(http_fd), kj::mv(metrics_fd), {}};
  for (unsigned i = 1; i < loops; ++i) {
    s->others.push_back(std::make_unique<loop_thread>(s->shared, loop_setup{i, {}, {}, {}}));
    s->first.peers.add(s->others.back()->peer());
  }
  return std::unique_ptr<http_server>(new http_server(std::move(s)));
}

http_server::http_server(std::unique_ptr<state> s) : state_(std::move(s)) {}

http_server::~http_server() {
  // loop_thread's destructor stops and joins its loop.
  state_->others.clear();
}

listening_ports http_server::ports() const {
  return state_->ports;
}

stop_report http_server::serve() {
  auto report = run_loop(state_->shared, kj::mv(state_->first), state_->first_control, nullptr);
  for (auto& loop : state_->others) {
    loop->stop(); // when loop 0 ended without stop()
    auto r = loop->join();
    report.abandoned += r.abandoned;
    report.drained = report.drained && r.drained;
  }
  return report;
}

void http_server::stop() {
  state_->first_control.stop();
  for (auto& loop : state_->others)
    loop->stop();
}

} // namespace caf_serving::ingress
