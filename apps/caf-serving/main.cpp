/// caf-serving: parse options, start the actor system, load the repository,
/// serve HTTP until a signal, then drain and stop in reverse order.

#include "options.hpp"
#include "server/model_manager.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <kj/async-unix.h>

#include <sys/prctl.h>

#include <csignal>
#include <iostream>

using namespace caf_serving;

int main(int argc, char** argv) {
  auto parsed = app::parse_options(argc, argv);
  if (std::holds_alternative<app::show_help>(parsed)) {
    std::cout << app::usage();
    return 0;
  }
  if (auto* err = std::get_if<std::string>(&parsed)) {
    std::cerr << "caf-serving: " << *err << "\n";
    return 2;
  }
  auto& opts = std::get<app::server_options>(parsed);

  // Before any thread starts: the signals are delivered to the kj event loop.
  kj::UnixEventPort::captureSignal(SIGINT);
  kj::UnixEventPort::captureSignal(SIGTERM);
  // CAF's timers (the batching delay) fire ~100 us late with the default slack.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);

  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", static_cast<size_t>(opts.threads.caf_workers));
  cfg.set("scheduler.policy", caf::atom("sharing"));
  caf::actor_system sys{cfg};

  server::model_manager models(sys, {opts.model_repository, opts.max_queue_size,
                                     opts.executor_depth});
  auto loaded = models.load_all();
  if (auto* err = std::get_if<serving_error>(&loaded)) {
    std::cerr << "caf-serving: " << err->message << "\n";
    return 1;
  }
  for (const auto& row : models.index()) {
    if (row.state == "READY")
      std::cout << "model " << row.name << " version " << row.version << " READY\n";
    else
      std::cout << "model " << row.name << " " << row.state << ": " << row.reason << "\n";
  }

  try {
    ingress::run_http_server(opts.http, models, [&](ingress::listening_ports p) {
      auto host = opts.http.address == "0.0.0.0" ? std::string("127.0.0.1") : opts.http.address;
      std::cout << "HTTP listening on " << host << ":" << p.http << std::endl;
      if (p.metrics)
        std::cout << "metrics listening on " << host << ":" << p.metrics << std::endl;
    });
  } catch (const kj::Exception& e) {
    std::cerr << "caf-serving: cannot serve HTTP on " << opts.http.address << ":"
              << opts.http.http_port << ": " << e.getDescription().cStr() << "\n";
    return 1;
  }
  std::cout << "caf-serving: stopping" << std::endl;
  models.shutdown();
  sys.await_all_actors_done();
  std::cout << "caf-serving: stopped" << std::endl;
  return 0;
}
