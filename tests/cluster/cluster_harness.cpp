#include <iostream>
#include "cluster_harness.hpp"

#include "support/http_client.hpp"
#include "support/tensor_bytes.hpp"

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace caf_serving::cluster_test {

void write_test_models(support::temp_repository& repo, int delay_us) {
  auto model = [&](const std::string& name, int delay) {
    std::string cfg = "name: \"" + name + "\"\nbackend: \"builtin\"\nmax_batch_size: 8\n"
                      "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
                      "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
                      "dynamic_batching { max_queue_delay_microseconds: 200 }\n"
                      "parameters { key: \"function\" value: { string_value: \"identity\" } }\n";
    if (delay > 0)
      cfg += "parameters { key: \"delay_us\" value: { string_value: \"" + std::to_string(delay)
             + "\" } }\n";
    repo.write_file(name + "/config.pbtxt", cfg);
    repo.write_file(name + "/1/model.txt", "builtin\n");
  };
  model("slow", delay_us);
  model("fast", 0);
}

// -- worker_process ---------------------------------------------------------------

namespace {

/// The command line: prefix, worker binary, the fixed flags, the test's own.
std::vector<std::string> worker_argv(const worker_config& cfg) {
  std::vector<std::string> args = cfg.prefix;
  args.push_back(CAF_SERVING_WORKER_BINARY);
  // No repository: the worker takes the models its servers ship.
  if (!cfg.repository.empty()) {
    args.push_back("--model-repository");
    args.push_back(cfg.repository);
  }
  for (const auto& a : {std::string("--address"), std::string("127.0.0.1"),
                        std::string("--port"), std::string("0"), std::string("--name"),
                        cfg.name})
    args.push_back(a);
  args.insert(args.end(), cfg.extra_args.begin(), cfg.extra_args.end());
  return args;
}

} // namespace

worker_process::worker_process(worker_config cfg) : child_({worker_argv(cfg), true}) {
  if (!wait_for_output(" listening on ", std::chrono::seconds(20)))
    throw std::runtime_error("caf-serving-worker did not start; its output:\n" + output());
  // The line is complete once the newline after the port arrived.
  for (int i = 0; i < 200 && port_ == 0; ++i) {
    auto out = output();
    auto at = out.find(" listening on ");
    auto eol = out.find('\n', at);
    if (eol != std::string::npos) {
      auto colon = out.rfind(':', eol);
      port_ = static_cast<uint16_t>(std::stoul(out.substr(colon + 1, eol - colon - 1)));
    }
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

worker_process::~worker_process() = default;

void worker_process::kill_hard() {
  child_.kill_and_wait();
}

std::string worker_process::output() const {
  return child_.output();
}

bool worker_process::wait_for_output(const std::string& text,
                                     std::chrono::milliseconds timeout) const {
  return child_.wait_for_output(text, timeout);
}

// -- load -------------------------------------------------------------------------

namespace {

/// Whether the answer's first "data" array holds exactly `expected`, compared
/// as numbers: the server writes each float in its shortest form ("1e+05" for
/// 100000), not as the request spelled it.
bool answer_data_is(const std::string& answer, const std::vector<double>& expected) {
  auto at = answer.find("\"data\":[");
  if (at == std::string::npos)
    return false;
  const char* p = answer.c_str() + at + 8;
  std::vector<double> got;
  while (*p && *p != ']') {
    char* end = nullptr;
    double v = std::strtod(p, &end);
    if (end == p)
      return false;
    got.push_back(v);
    p = end;
    if (*p == ',')
      ++p;
  }
  return *p == ']' && got == expected;
}

} // namespace

load_totals run_load(uint16_t http_port, const load_config& cfg) {
  std::mutex mutex;
  load_totals totals;
  std::atomic<int> answered{0};
  std::atomic<bool> called{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < cfg.clients; ++c) {
    threads.emplace_back([&, c] {
      support::http_client http(http_port);
      http.timeout = std::chrono::milliseconds(30000);
      for (int i = 0; i < cfg.requests_per_client; ++i) {
        float base = static_cast<float>(c * 10000 + i * 16);
        std::string data = "[";
        std::vector<double> values;
        for (int k = 0; k < 16; ++k) {
          data += (k ? "," : "") + std::to_string(static_cast<int>(base) + k);
          values.push_back(static_cast<double>(static_cast<int>(base) + k));
        }
        data += "]";
        std::string body = "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\","
                           "\"shape\":[1,16],\"data\":"
                           + data + "}]}";
        int status = 0;
        std::string answer;
        try {
          auto r = http.post("/v2/models/" + cfg.model + "/infer", body,
                             {{"Content-Type", "application/json"}});
          status = r.status;
          answer = r.body;
        } catch (const std::exception& e) {
          answer = e.what();
          http.close();
        }
        {
          std::lock_guard<std::mutex> guard(mutex);
          ++totals.sent;
          bool right = status == 200 && answer_data_is(answer, values);
          if (right)
            ++totals.correct;
          else if (status == 200)
            ++totals.wrong;
          else
            ++totals.failed;
          if (!right)
            if (totals.first_failure.empty())
              totals.first_failure = std::to_string(status) + " " + answer.substr(0, 300);
        }
        if (++answered >= cfg.call_after && cfg.midway && !called.exchange(true))
          cfg.midway();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return totals;
}

double metric_sum(uint16_t port, const std::string& metric, const std::string& label_part) {
  support::http_client http(port);
  auto body = http.get("/metrics").body;
  std::istringstream in(body);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(metric, 0) != 0)
      continue;
    auto rest = line.substr(metric.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' '))
      continue;
    if (!label_part.empty() && rest.find(label_part) == std::string::npos)
      continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

bool wait_for_v2(uint16_t port, const std::string& text, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  support::http_client http(port);
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    last = http.get("/v2").body;
    if (last.find(text) != std::string::npos)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::cerr << "/v2 never held " << text << "; it last read:\n" << last << "\n";
  return false;
}

uint16_t cluster_port(const support::server_process& server) {
  const std::string line = "cluster listening on 127.0.0.1:";
  if (!server.wait_for_output(line, std::chrono::seconds(5)))
    throw std::runtime_error("the server did not listen for workers; its output:\n"
                             + server.output());
  auto out = server.output();
  auto at = out.find(line) + line.size();
  for (int i = 0; i < 200 && out.find('\n', at) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    out = server.output();
  }
  return static_cast<uint16_t>(std::stoul(out.substr(at, out.find('\n', at) - at)));
}

namespace {

/// Runs `cmd` through the shell, its output discarded; throws when it fails.
void shell(const std::string& cmd) {
  if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0)
    throw std::runtime_error("failed: " + cmd);
}

} // namespace

void make_test_ca(const std::filesystem::path& dir, const std::string& ca) {
  auto d = dir.string() + "/";
  shell("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
        + d + ca + ".key -out " + d + ca + ".pem -subj /CN=" + ca + " -days 2");
}

void make_test_cert(const std::filesystem::path& dir, const std::string& ca,
                    const std::string& name) {
  auto d = dir.string() + "/";
  shell("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + d
        + name + ".key -out " + d + name + ".csr -subj /CN=" + name);
  shell("openssl x509 -req -in " + d + name + ".csr -CA " + d + ca + ".pem -CAkey " + d + ca
        + ".key -CAcreateserial -out " + d + name + ".pem -days 2");
}

std::vector<std::string> tls_flags(const std::filesystem::path& dir, const std::string& ca,
                                   const std::string& name) {
  auto d = dir.string() + "/";
  return {"--tls-certificate", d + name + ".pem", "--tls-key", d + name + ".key", "--tls-ca",
          d + ca + ".pem"};
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

} // namespace caf_serving::cluster_test
