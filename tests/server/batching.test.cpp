/// Dynamic batching seen from outside: many concurrent clients, each sending
/// its own values, must each get exactly their own values back, and /stats
/// must show fewer executions than inferences.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <mutex>

using namespace caf_serving::server_test;

namespace {

struct load_result {
  int requests = 0;
  int rows = 0;
  std::vector<std::string> problems;
};

/// `clients` threads each send `per_client` requests to an identity model
/// with FP32 input [rows, width]; odd clients send 2 rows, even ones 1. Every
/// value is unique to its client, request and position.
load_result run_clients(const test_server& server, const std::string& model, int width,
                        int clients, int per_client) {
  load_result total;
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto http = server.client();
      int rows = c % 2 == 1 ? 2 : 1;
      for (int k = 0; k < per_client; ++k) {
        std::vector<float> values;
        for (int i = 0; i < rows * width; ++i)
          values.push_back(static_cast<float>(c * 100000 + k * 100 + i));
        std::string problem;
        try {
          auto r = http.post("/v2/models/" + model + "/infer",
                             fp32_identity_body(values, rows), json_content);
          if (r.status != 200) {
            problem = "status " + std::to_string(r.status) + ": " + r.body;
          } else {
            auto doc = json_document::parse(r.body);
            auto got = fp32_output(doc);
            auto shape = json_ints(doc.at("/outputs/0/shape"));
            if (got != values)
              problem = "client " + std::to_string(c) + " request " + std::to_string(k)
                        + " got values of another request: first " + std::to_string(got.at(0));
            else if (shape != std::vector<int64_t>{rows, width})
              problem = "client " + std::to_string(c) + " got shape " + json_list(shape);
          }
        } catch (const std::exception& e) {
          problem = e.what();
        }
        std::lock_guard<std::mutex> guard(mutex);
        ++total.requests;
        total.rows += rows;
        if (!problem.empty())
          total.problems.push_back(problem);
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return total;
}

struct counts {
  uint64_t inferences = 0;
  uint64_t executions = 0;
  uint64_t successes = 0;
};

counts model_counts(const test_server& server, const std::string& model) {
  auto http = server.client();
  auto r = http.get("/v2/models/" + model + "/stats");
  REQUIRE(r.status == 200);
  auto doc = json_document::parse(r.body);
  return {doc.uint_at("/model_stats/0/inference_count"),
          doc.uint_at("/model_stats/0/execution_count"),
          doc.uint_at("/model_stats/0/inference_stats/success/count")};
}

} // namespace

TEST_CASE("concurrent clients on a slow batching model: batched, and no cross-talk") {
  test_server server({test_model("slow_batch"), example_model("identity_fp32")});
  auto result = run_clients(server, "slow_batch", 4, 16, 6);
  CHECK(result.requests == 96);
  for (const auto& p : result.problems)
    FAIL_CHECK(p);
  auto c = model_counts(server, "slow_batch");
  CHECK(c.inferences == static_cast<uint64_t>(result.rows));
  CHECK(c.successes == 96);
  // 16 clients against a 20 ms batch: requests pile up behind each batch.
  MESSAGE("slow_batch: " << c.inferences << " inferences in " << c.executions << " executions");
  CHECK(c.executions < c.inferences);
  CHECK(c.executions < 96);
  CHECK(c.executions > 0);
}

TEST_CASE("concurrent clients on identity_fp32 all get their own values") {
  test_server server({example_model("identity_fp32")});
  auto result = run_clients(server, "identity_fp32", 16, 8, 25);
  CHECK(result.requests == 200);
  for (const auto& p : result.problems)
    FAIL_CHECK(p);
  auto c = model_counts(server, "identity_fp32");
  CHECK(c.inferences == static_cast<uint64_t>(result.rows));
  CHECK(c.successes == 200);
  CHECK(c.executions <= 200);
  MESSAGE("identity_fp32: " << c.inferences << " inferences in " << c.executions
                            << " executions");
}
