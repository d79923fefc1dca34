/// The extra time per batch of a remote executor against a local one.
///
/// One process, two actor systems: "worker" publishes an identity executor through
/// the middleman on loopback; "server" reaches it through the same proxy the
/// server uses (cluster/remote_executor), and also holds a local executor. For
/// each batch size it sends batches one at a time (no overlap) and reports the
/// median and P99 round trip of each path and their difference.
///
///   cluster_remote_overhead [iterations [rounds]] [TLS_DIR]
///
/// Without TLS each remote batch is timed both ways, in alternating rounds
/// (default 3): over CAF's link (BASP) and as the server sends it by default
/// (--bulk-threshold-bytes 1 MiB: the bulk channel, bulk_channel.hpp, for
/// batches of 1 MiB and more, BASP below). Each path's P50 is the median of
/// its rounds' P50s; every round's value is printed too.
///
/// With TLS_DIR (holding ca.pem, and node.pem/node.key signed by it; both
/// processes use that one certificate), the link is TLS as with --tls-* flags,
/// and there is no bulk channel (as in the server).

#include "cluster/bulk_channel.hpp"
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
#include <string>
#include <thread>
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

std::shared_ptr<cluster::bulk_listener> bulk_listener_for_bench(caf::actor_system& sys) {
  auto l = cluster::bulk_listener::listen(sys, "127.0.0.1", 0, {});
  if (!l) {
    std::fprintf(stderr, "%s\n", l.error().message.c_str());
    std::_Exit(1);
  }
  return *l;
}

/// The worker process: one published executor per shape; their ports, the bulk
/// port and one bulk token per shape go to `fd`.
[[noreturn]] void run_worker(int fd) {
  cluster::liveness_config live;
  caf::actor_system_config cfg;
  cluster::configure_actor_system(cfg, live);
  cluster::configure_tls(cfg, bench_tls);
  cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{cfg};
  std::vector<uint16_t> ports;
  // The bulk channel as the worker runs it (no gates here: the executors are
  // its targets), and one token per shape.
  auto bulk = bulk_listener_for_bench(sys);
  std::string tokens;
  for (auto [rows, floats] : shapes) {
    auto mc = identity_model(floats);
    auto ex = executor::spawn_executor(sys, *executor::make_builtin_backend(mc), mc);
    // Published typed, so that the server's typed remote_actor matches.
    auto port = bench_tls.enabled() ? caf::openssl::publish(ex, 0, "127.0.0.1")
                                    : caf::io::publish(ex, 0, "127.0.0.1");
    ports.push_back(port ? *port : 0);
    bulk->add_target(caf::actor_cast<caf::actor>(ex));
    tokens += bulk->issue_token("bench");
  }
  ports.push_back(bulk->port());
  (void) !write(fd, ports.data(), ports.size() * sizeof(uint16_t));
  (void) !write(fd, tokens.data(), tokens.size());
  close(fd);
  pause(); // until the parent kills it
  std::_Exit(0);
}

} // namespace

int main(int argc, char** argv) {
  int iterations = argc > 1 ? std::atoi(argv[1]) : 300;
  int rounds = 3;
  int tls_arg = 2;
  if (argc > 2 && std::string(argv[2]).find_first_not_of("0123456789") == std::string::npos) {
    rounds = std::max(1, std::atoi(argv[2]));
    tls_arg = 3;
  }
  if (argc > tls_arg) {
    std::string dir = argv[tls_arg];
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
  std::vector<uint16_t> ports(shapes.size() + 1);
  std::string tokens(shapes.size() * cluster::bulk::token_bytes, '\0');
  auto read_all = [&](char* to, size_t size) {
    size_t got = 0;
    while (got < size) {
      auto n = read(fds[0], to + got, size - got);
      if (n <= 0) {
        std::fprintf(stderr, "the worker process did not start\n");
        std::exit(1);
      }
      got += size_t(n);
    }
  };
  read_all(reinterpret_cast<char*>(ports.data()), ports.size() * sizeof(uint16_t));
  read_all(tokens.data(), tokens.size());
  auto bulk_port = ports.back();

  cluster::liveness_config live;
  caf::actor_system_config scfg;
  cluster::configure_actor_system(scfg, live);
  cluster::configure_tls(scfg, bench_tls);
  scfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system server_sys{scfg};

  bool with_bulk = !bench_tls.enabled();
  if (with_bulk)
    std::printf("%d alternating rounds; remote p50 = median of the rounds' p50s\n", rounds);
  std::printf("%-24s %12s %12s %12s %12s %12s %12s %12s\n", "batch", "local p50",
              "BASP p50", "extra p50", "BASP p99", "MB/s (2 way)", "bulk p50", "MB/s (2 way)");
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
    // The same executor through the bulk channel, as the server sends by default.
    executor::executor_actor bulk_proxy;
    std::shared_ptr<cluster::bulk_client> client;
    if (with_bulk) {
      cluster::bulk_client_config bc;
      bc.host = "127.0.0.1";
      bc.port = bulk_port;
      bc.token = tokens.substr(i * cluster::bulk::token_bytes, cluster::bulk::token_bytes);
      bc.worker = "loopback";
      bc.on_lost = [](const std::string& why) {
        std::fprintf(stderr, "bulk channel lost: %s\n", why.c_str());
        std::_Exit(1);
      };
      client = cluster::bulk_client::connect(server_sys, std::move(bc));
      for (int k = 0; k < 500 && !client->connected(); ++k)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!client->connected()) {
        std::fprintf(stderr, "the bulk channel did not connect\n");
        return 1;
      }
      auto with = rc;
      with.bulk = client;
      with.bulk_threshold = 1 << 20;
      bulk_proxy = cluster::spawn_remote_executor(server_sys, with);
    }
    auto local_ex = executor::spawn_executor(server_sys, be, cfg);
    caf::scoped_actor self{server_sys};
    auto batch = make_batch(rows, floats);
    int iters = floats >= 65536 ? std::max(iterations / 10, 20) : iterations;
    auto local = time_path(self, local_ex, batch, iters);
    std::vector<double> basp_p50, bulk_p50;
    stats remote{};
    std::string each;
    for (int r = 0; r < (with_bulk ? rounds : 1); ++r) {
      // Alternating: ABBA over the rounds, so a drift in load hits both.
      bool basp_first = r % 2 == 0;
      for (int leg = 0; leg < (with_bulk ? 2 : 1); ++leg) {
        bool basp = (leg == 0) == basp_first || !with_bulk;
        auto st = time_path(self, basp ? proxy : bulk_proxy, batch, iters);
        (basp ? basp_p50 : bulk_p50).push_back(st.p50_us);
        if (basp)
          remote.p99_us = std::max(remote.p99_us, st.p99_us);
      }
      if (with_bulk) {
        char one[96];
        std::snprintf(one, sizeof(one), " [%.0f/%.0f]", basp_p50.back(), bulk_p50.back());
        each += one;
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    remote.p50_us = median(basp_p50);
    double mb = double(rows) * floats * 4 / 1e6;
    char name[64];
    std::snprintf(name, sizeof(name), "%d x %d fp32 (%.3f MB)", rows, floats, mb);
    std::printf("%-24s %10.1fus %10.1fus %10.1fus %10.1fus %12.0f", name, local.p50_us,
                remote.p50_us, remote.p50_us - local.p50_us, remote.p99_us,
                2 * mb / (remote.p50_us / 1e6));
    if (with_bulk) {
      auto b = median(bulk_p50);
      std::printf(" %10.1fus %12.0f  rounds BASP/bulk us:%s", b, 2 * mb / (b / 1e6),
                  each.c_str());
    }
    std::printf("\n");
    std::fflush(stdout);
    self->send_exit(proxy, caf::exit_reason::user_shutdown);
    if (with_bulk)
      self->send_exit(bulk_proxy, caf::exit_reason::user_shutdown);
    self->send_exit(local_ex, caf::exit_reason::user_shutdown);
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::fflush(stdout);
  std::_Exit(0); // the remote proxies' node is gone; skip the middleman's teardown
}
