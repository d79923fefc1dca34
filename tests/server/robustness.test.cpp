/// Where batching meets shapes and message limits (issue 14, findings 2 and 3):
/// requests of different non-batch shapes must never share a batch, and a batch
/// must never pass what one Cap'n Proto Data field holds. Each test starts the
/// real server and checks every answer's values and shape against its request.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <future>
#include <mutex>

using namespace caf_serving::server_test;
using std::chrono::milliseconds;

namespace {

/// An FP32 identity model whose input has a variable dimension besides the
/// batch. Each batch takes `delay_us`, so requests sent meanwhile queue up and
/// would be batched together.
std::string variable_identity_config(const std::string& name, int64_t delay_us,
                                     int max_batch_size = 8) {
  return "name: \"" + name + "\"\nbackend: \"builtin\"\nmax_batch_size: "
         + std::to_string(max_batch_size)
         + "\ninput [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
           "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
           "dynamic_batching { max_queue_delay_microseconds: 200000 }\n"
           "parameters { key: \"function\" value: { string_value: \"identity\" } }\n"
           "parameters { key: \"delay_us\" value: { string_value: \""
         + std::to_string(delay_us) + "\" } }\n";
}

void add_model(temp_repository& repo, const std::string& name, const std::string& config) {
  repo.write_file(name + "/config.pbtxt", config);
  repo.write_file(name + "/1/model.builtin", "builtin: no model file\n");
}

/// One identity request of `rows` x `width` values unique to `tag`, checked.
std::string check_identity(uint16_t port, const std::string& model, int tag, int64_t rows,
                           int64_t width) {
  std::vector<float> values;
  for (int64_t i = 0; i < rows * width; ++i)
    values.push_back(static_cast<float>(tag * 1000 + i));
  http_client http(port);
  auto r = http.post("/v2/models/" + model + "/infer", fp32_identity_body(values, rows),
                     json_content);
  if (r.status != 200)
    return "request " + std::to_string(tag) + ": status " + std::to_string(r.status) + ": "
           + r.body;
  auto doc = json_document::parse(r.body);
  auto shape = json_ints(doc.at("/outputs/0/shape"));
  if (shape != std::vector<int64_t>{rows, width})
    return "request " + std::to_string(tag) + " of shape " + json_list(std::vector<int64_t>{rows, width})
           + " was answered with shape " + json_list(shape);
  if (fp32_output(doc) != values)
    return "request " + std::to_string(tag) + " got values of another request";
  return "";
}

} // namespace

TEST_CASE("requests of different shapes queued together each get their own answer") {
  test_server server({}, model_control_api());
  // A batch takes 1 s, so that all eight requests below queue while the first
  // runs; the other model batches concurrent clients every few milliseconds.
  add_model(server.repo, "ragged", variable_identity_config("ragged", 1000000));
  add_model(server.repo, "ragged_fast", variable_identity_config("ragged_fast", 3000));
  // The repository was empty at start: load the models over the API.
  for (const char* m : {"ragged", "ragged_fast"}) {
    auto load = server.client().post("/v2/repository/models/" + std::string(m) + "/load", "");
    REQUIRE_MESSAGE(load.status == 200, load.body);
  }

  // One request occupies the executor; the others queue behind it and would
  // all be gathered into one batch if shapes were not part of the batch key.
  auto first = std::async(std::launch::async,
                          [&] { return check_identity(server.port(), "ragged", 0, 1, 3); });
  REQUIRE(wait_pending(server, "ragged", 1));
  // Grouped by shape, in a known queue order: [*,2] x3, [*,4] x3, [*,3] x2 (8
  // rows, one batch's worth if shapes were not part of the batch key).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
    {1, 2}, {2, 2}, {1, 2}, {1, 4}, {1, 4}, {1, 4}, {1, 3}, {1, 3}};
  std::vector<std::future<std::string>> answers;
  for (size_t i = 0; i < shapes.size(); ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      return check_identity(server.port(), "ragged", static_cast<int>(i) + 1, shapes[i].first,
                            shapes[i].second);
    }));
    REQUIRE(wait_pending(server, "ragged", static_cast<double>(i) + 2));
  }
  CHECK(first.get() == "");
  for (auto& a : answers)
    CHECK(a.get() == "");
  // Requests of one shape still share a batch: one per shape after the first.
  auto stats = json_document::parse(server.client().get("/v2/models/ragged/stats").body);
  CHECK(stats.uint_at("/model_stats/0/execution_count") == 4);

  // Interleaved at random by concurrent clients: every answer is still its own.
  std::vector<std::future<std::string>> mixed;
  for (int i = 0; i < 24; ++i)
    mixed.push_back(std::async(std::launch::async, [&, i] {
      return check_identity(server.port(), "ragged_fast", 100 + i, 1 + i % 2, 2 + i % 3);
    }));
  for (auto& a : mixed)
    CHECK(a.get() == "");
}

TEST_CASE("a batch closes before it would pass --max-batch-bytes; a request over it is 413") {
  test_server server({}, model_control_api({"--max-batch-bytes", "1048576"}));
  add_model(server.repo, "wide", variable_identity_config("wide", 1000000));
  REQUIRE(server.client().post("/v2/repository/models/wide/load", "").status == 200);

  // 100000 floats (400 kB) each: two fit in 1 MiB, three do not.
  auto first = std::async(std::launch::async,
                          [&] { return check_identity(server.port(), "wide", 0, 1, 100000); });
  REQUIRE(wait_pending(server, "wide", 1));
  std::vector<std::future<std::string>> answers;
  for (int i = 1; i <= 4; ++i)
    answers.push_back(std::async(std::launch::async, [&, i] {
      return check_identity(server.port(), "wide", i, 1, 100000);
    }));
  REQUIRE(wait_pending(server, "wide", 5));
  CHECK(first.get() == "");
  for (auto& a : answers)
    CHECK(a.get() == "");
  auto stats = json_document::parse(server.client().get("/v2/models/wide/stats").body);
  CHECK(stats.uint_at("/model_stats/0/execution_count") == 3); // 1, then 2 + 2

  // One request over the cap alone: a clear 413, and the model keeps serving.
  std::vector<float> big(300000, 1.0f);
  auto r = server.client().post("/v2/models/wide/infer", fp32_identity_body(big, 1), json_content);
  CHECK(r.status == 413);
  CHECK(r.body.find("--max-batch-bytes") != std::string::npos);
  CHECK(check_identity(server.port(), "wide", 9, 1, 10) == "");
}

TEST_CASE("three 200 MB requests queued together pass a Data field's 512 MiB and all succeed") {
  // The reproduction: gathered into one 600 MB batch they made kj throw
  // inside the scheduler, which killed the model. With the default cap they go
  // out in batches of at most two.
  test_server server({}, model_control_api({"--max-body-bytes", "268435456"}));
  // The first (small) request, of 4 rows at 2 s a row, holds the executor for
  // 8 s, while the three big ones (a row each) arrive and queue together behind
  // it. (A 3 s hold was not enough in a full CI run on 2 busy cores: building,
  // sending and parsing 600 MB took longer, the first answer came back before
  // the third big request was queued, and four were never pending at once.)
  add_model(server.repo, "huge",
            variable_identity_config("huge", 0, 4)
              + "parameters { key: \"delay_per_item_us\" value: { string_value: \"2000000\" } }\n");
  REQUIRE(server.client().post("/v2/repository/models/huge/load", "").status == 200);
  constexpr int64_t width = 50'000'000; // 200 MB of FP32
  auto send = [&](int tag) -> std::string {
    std::string raw(static_cast<size_t>(width) * 4, '\0');
    for (int64_t i = 0; i < width; i += 1000) {
      float v = static_cast<float>(tag * 1'000'000 + i);
      std::memcpy(raw.data() + i * 4, &v, 4);
    }
    auto json = infer_body({binary_input_json("INPUT0", "FP32", {1, width}, raw.size())},
                           ",\"parameters\":{\"binary_data_output\":true}");
    http_client http(server.port());
    http.timeout = std::chrono::seconds(60);
    auto r = http.post("/v2/models/huge/infer", json + raw,
                       {{"Content-Type", "application/octet-stream"},
                        {"Inference-Header-Content-Length", std::to_string(json.size())}});
    if (r.status != 200)
      return "request " + std::to_string(tag) + ": status " + std::to_string(r.status) + ": "
             + r.body.substr(0, 300);
    auto body = split_binary(r);
    if (body.binary != raw)
      return "request " + std::to_string(tag) + " got other bytes back";
    return "";
  };
  auto first = std::async(std::launch::async,
                          [&] { return check_identity(server.port(), "huge", 0, 4, 5); });
  REQUIRE(wait_pending(server, "huge", 1));
  std::vector<std::future<std::string>> answers;
  for (int i = 1; i <= 3; ++i)
    answers.push_back(std::async(std::launch::async, send, i));
  REQUIRE(wait_pending(server, "huge", 4));
  CHECK(first.get() == "");
  for (auto& a : answers)
    CHECK(a.get() == "");
  auto stats = json_document::parse(server.client().get("/v2/models/huge/stats").body);
  MESSAGE("batches: " << stats.uint_at("/model_stats/0/execution_count"));
  // The model is still ready and serving.
  CHECK(server.client().get("/v2/models/huge/ready").status == 200);
  CHECK(check_identity(server.port(), "huge", 7, 1, 5) == "");
}

TEST_CASE("binary outputs over 16 KiB, written in pieces from the pipeline's message: every byte "
          "arrives, also next to a small output and gzip") {
  test_server server({}, model_control_api());
  add_model(server.repo, "wide", variable_identity_config("wide", 0, 4));
  REQUIRE(server.client().post("/v2/repository/models/wide/load", "").status == 200);
  http_client http(server.port());
  for (int64_t width : {int64_t{3}, int64_t{4096}, int64_t{65536}}) { // 12 B, 16 KiB, 256 KiB
    CAPTURE(width);
    std::string raw(static_cast<size_t>(width) * 4, '\0');
    for (int64_t i = 0; i < width; ++i) {
      float v = static_cast<float>(width + i) * 0.5f;
      std::memcpy(raw.data() + i * 4, &v, 4);
    }
    auto json = infer_body({binary_input_json("INPUT0", "FP32", {1, width}, raw.size())},
                           ",\"parameters\":{\"binary_data_output\":true}");
    auto r = http.post("/v2/models/wide/infer", json + raw,
                       {{"Content-Type", "application/octet-stream"},
                        {"Inference-Header-Content-Length", std::to_string(json.size())}});
    REQUIRE_MESSAGE(r.status == 200, r.body.substr(0, 300));
    CHECK(r.header("content-length") == std::to_string(r.body.size()));
    auto body = split_binary(r);
    CHECK(body.binary == raw);
    // Compressed, the same answer is one string.
    auto z = http.post("/v2/models/wide/infer", json + raw,
                       {{"Content-Type", "application/octet-stream"},
                        {"Inference-Header-Content-Length", std::to_string(json.size())},
                        {"Accept-Encoding", "gzip"}});
    REQUIRE(z.status == 200);
    CHECK(z.header("content-encoding") == "gzip");
  }
}
