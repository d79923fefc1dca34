#pragma once
/// Pieces shared by the cluster tests: a worker process, a test model repository,
/// a load of identity requests whose every answer is checked, and metric reads.
///
///   support::temp_repository repo;
///   write_test_models(repo);
///   worker_process w1({repo.path().string(), "w1"});
///   support::server_process server({CAF_SERVING_BINARY, repo.path().string(),
///                                   {"--worker", w1.address(), "--local-executors", "false"}});
///   auto totals = run_load(server.http_port(), {4, 100});
///   CHECK(totals.correct == 400);

#include "support/child_process.hpp"
#include "support/server_process.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace caf_serving::cluster_test {

/// Writes model "slow" (identity on 16 FP32, max batch 8, each batch sleeps
/// `delay_us`, like a device) and "fast" (the same without the delay).
void write_test_models(support::temp_repository& repo, int delay_us = 2000);

struct worker_config {
  /// --model-repository; empty: none (the server ships the models).
  std::string repository;
  std::string name;
  std::vector<std::string> extra_args;
  /// Run as: prefix + worker binary + args (e.g. {"ip", "netns", "exec", "ns"}).
  std::vector<std::string> prefix;
};

/// A caf-serving-worker child; stdout and stderr are both collected.
class worker_process {
public:
  explicit worker_process(worker_config cfg);
  ~worker_process();
  worker_process(const worker_process&) = delete;
  worker_process& operator=(const worker_process&) = delete;

  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return child_.pid(); }
  void kill_hard();
  std::string output() const;
  bool wait_for_output(const std::string& text, std::chrono::milliseconds timeout) const;

private:
  support::child_process child_;
  uint16_t port_ = 0;
};

struct load_config {
  int clients = 4;
  int requests_per_client = 100;
  std::string model = "slow";
  /// Called once after `call_after` requests were answered in total (mid-load).
  std::function<void()> midway;
  int call_after = 0;
};

struct load_totals {
  int sent = 0;
  int correct = 0;   ///< 200 with OUTPUT0 equal to the request's INPUT0
  int wrong = 0;     ///< 200 with other data
  int failed = 0;    ///< any other status, or no answer
  std::string first_failure;
};

/// Sends identity requests (each with its own values) from `clients` threads,
/// one at a time per thread, and checks every answer.
load_totals run_load(uint16_t http_port, const load_config& cfg);

/// The sum of every sample of `metric` whose labels contain `label_part` in the
/// Prometheus text at /metrics.
double metric_sum(uint16_t port, const std::string& metric, const std::string& label_part = "");

/// GET /v2 until its body contains `text`, or `timeout` passes.
bool wait_for_v2(uint16_t port, const std::string& text, std::chrono::milliseconds timeout);

/// The port of the server's "cluster listening on 127.0.0.1:PORT" line (--cluster-port 0);
/// throws when the line does not come within 5 s.
uint16_t cluster_port(const support::server_process& server);

/// Throwaway certificates for the TLS flags, made with the openssl CLI in `dir`
/// (keep it out of any model repository): a self-signed CA `NAME.pem`/`NAME.key`,
/// and a certificate `NAME.pem`/`NAME.key` that a CA signed. Throw with the
/// command when openssl fails.
void make_test_ca(const std::filesystem::path& dir, const std::string& ca);
void make_test_cert(const std::filesystem::path& dir, const std::string& ca,
                    const std::string& name);

/// --tls-certificate, --tls-key and --tls-ca for certificate `name` of CA `ca` in `dir`.
std::vector<std::string> tls_flags(const std::filesystem::path& dir, const std::string& ca,
                                   const std::string& name);

/// `a` followed by `b`.
std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b);

} // namespace caf_serving::cluster_test
