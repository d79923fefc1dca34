/// The extra time per batch of a remote executor against a local one.
///
/// One process, two actor systems: "worker" publishes an identity executor through
/// the middleman on loopback; "server" reaches it through the same proxy the
/// server uses (cluster/remote_executor), and also holds a local executor. For
/// each batch size it sends batches one at a time (no overlap) and reports the
/// median and P99 round trip of each path and their difference.
///
///   cluster_remote_overhead [iterations] [TLS_DIR]
///
/// With TLS_DIR (holding ca.pem, and node.pem/node.key signed by it; both
/// processes use that one certificate), the link is TLS as with --tls-* flags.

#include "cluster/protocol.hpp"
#include "cluster/remote_executor.hpp"
#include "cluster/tls.hpp"
#include "executor/builtin_backend.hpp"
#include "executor/executor_actor.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>
#include <caf/io/remote_actor.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include <csignal>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace caf_serving;

namespace {

model_config identity_model(int floats) {
  model_config m;
  m.name = "identity";
  m.backend = "builtin";
  m.max_batch_size = 1 << 20;
  tensor_config in;
  in.name = "INPUT0";
  in.dtype = datatype::fp32;
  in.dims = {floats};
  auto out = in;
  out.name = "OUTPUT0";
  m.inputs = {in};
  m.outputs = {out};
  m.parameters["function"] = "identity";
  return m;
}

batch_message make_batch(int rows, int floats) {
  auto m = batch_message::create(size_t(rows) * floats * 4 + 1024);
  auto b = m.builder();
  b.setRows(rows);
  b.initRequestRows(1).set(0, rows);
  auto t = b.initInputs(1)[0];
  t.setName("INPUT0");
  t.setDatatype(wire::DataType::FP32);
  auto s = t.initShape(2);
  s.set(0, rows);
  s.set(1, floats);
  auto d = t.initData(unsigned(rows) * floats * 4);
  std::memset(d.begin(), 1, d.size());
  return m;
}

struct stats {
  double p50_us, p99_us;
};

stats time_path(caf::scoped_actor& self, const executor::executor_actor& ex,
                const batch_message& batch, int iterations) {
  std::vector<double> us;
  for (int i = 0; i < iterations + 20; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    bool ok = false;
    self->request(ex, std::chrono::seconds(10), run_batch{batch, nullptr})
      .receive([&](batch_result_message& r) { ok = r.reader().getOutputs().size() == 1; },
               [&](caf::error&) {});
    auto t1 = std::chrono::steady_clock::now();
    if (!ok) {
      std::fprintf(stderr, "a batch failed\n");
      std::exit(1);
    }
    if (i >= 20)
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

struct shape {
  int rows, floats;
};

const std::vector<shape> shapes{{1, 16}, {8, 16}, {64, 16}, {8, 4096}, {64, 4096}, {64, 65536}};

/// TLS on the link when a directory is given (see the usage above).
cluster::tls_config bench_tls;

/// The worker process: one published executor per shape; ports go to `fd`.
[[noreturn]] void run_worker(int fd) {
  cluster::liveness_config live;
  caf::actor_system_config cfg;
  cluster::configure_actor_system(cfg, live);
  cluster::configure_tls(cfg, bench_tls);
  cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{cfg};
  std::vector<uint16_t> ports;
  for (auto [rows, floats] : shapes) {
    auto mc = identity_model(floats);
    auto ex = executor::spawn_executor(sys, *executor::make_builtin_backend(mc), mc);
    // Published typed, so that the server's typed remote_actor matches.
    auto port = bench_tls.enabled() ? caf::openssl::publish(ex, 0, "127.0.0.1")
                                    : caf::io::publish(ex, 0, "127.0.0.1");
    ports.push_back(port ? *port : 0);
  }
  (void) !write(fd, ports.data(), ports.size() * sizeof(uint16_t));
  close(fd);
  pause(); // until the parent kills it
  std::_Exit(0);
}

} // namespace

int main(int argc, char** argv) {
  int iterations = argc > 1 ? std::atoi(argv[1]) : 300;
  if (argc > 2) {
    std::string dir = argv[2];
    auto tls = cluster::check_tls_files({dir + "/node.pem", dir + "/node.key", dir + "/ca.pem"});
    if (!tls) {
      std::fprintf(stderr, "%s\n", tls.error().message.c_str());
      return 2;
    }
    bench_tls = *tls;
    std::printf("links: TLS (%s)\n", dir.c_str());
  }
  // The worker must be another process: two actor systems in one process share a
  // node id, and the middleman refuses to connect a node to itself.
  int fds[2];
  if (pipe(fds) != 0)
    return 1;
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(fds[0]);
    run_worker(fds[1]);
  }
  close(fds[1]);
  std::vector<uint16_t> ports(shapes.size());
  size_t got = 0;
  while (got < ports.size() * sizeof(uint16_t)) {
    auto n = read(fds[0], reinterpret_cast<char*>(ports.data()) + got,
                  ports.size() * sizeof(uint16_t) - got);
    if (n <= 0) {
      std::fprintf(stderr, "the worker process did not start\n");
      return 1;
    }
    got += size_t(n);
  }

  cluster::liveness_config live;
  caf::actor_system_config scfg;
  cluster::configure_actor_system(scfg, live);
  cluster::configure_tls(scfg, bench_tls);
  scfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system server_sys{scfg};

  std::printf("%-24s %12s %12s %12s %12s %12s\n", "batch", "local p50", "remote p50",
              "extra p50", "remote p99", "MB/s (2 way)");
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto [rows, floats] = shapes[i];
    auto cfg = identity_model(floats);
    auto be = *executor::make_builtin_backend(cfg);
    auto handle =
      bench_tls.enabled()
        ? caf::openssl::remote_actor<executor::executor_actor>(server_sys, "127.0.0.1", ports[i])
        : caf::io::remote_actor<executor::executor_actor>(server_sys, "127.0.0.1", ports[i]);
    if (!handle) {
      std::fprintf(stderr, "connect failed: %s\n", server_sys.render(handle.error()).c_str());
      return 1;
    }
    cluster::remote_executor_config rc;
    rc.remote = caf::actor_cast<caf::actor>(*handle);
    rc.node = "loopback";
    rc.model = cfg.name;
    rc.counters = std::make_shared<cluster::node_counters>();
    auto proxy = cluster::spawn_remote_executor(server_sys, rc);
    auto local_ex = executor::spawn_executor(server_sys, be, cfg);
    caf::scoped_actor self{server_sys};
    auto batch = make_batch(rows, floats);
    int iters = floats >= 65536 ? std::max(iterations / 10, 20) : iterations;
    auto local = time_path(self, local_ex, batch, iters);
    auto remote = time_path(self, proxy, batch, iters);
    double mb = double(rows) * floats * 4 / 1e6;
    char name[64];
    std::snprintf(name, sizeof(name), "%d x %d fp32 (%.3f MB)", rows, floats, mb);
    std::printf("%-24s %10.1fus %10.1fus %10.1fus %10.1fus %12.0f\n", name, local.p50_us,
                remote.p50_us, remote.p50_us - local.p50_us, remote.p99_us,
                2 * mb / (remote.p50_us / 1e6));
    self->send_exit(proxy, caf::exit_reason::user_shutdown);
    self->send_exit(local_ex, caf::exit_reason::user_shutdown);
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::fflush(stdout);
  std::_Exit(0); // the remote proxies' node is gone; skip the middleman's teardown
}
