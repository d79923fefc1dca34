/// Triton's response cache through the whole server (--cache-config
/// local,size=N and response_cache { enable: true }): a repeated request is
/// answered from the cache, byte for byte, without running the model, and
/// counted in /stats and /metrics; other inputs miss; a model without
/// response_cache never uses it; an answer larger than the cache is not kept;
/// a failed request is not kept.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <future>
#include <sstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

using namespace caf_serving::server_test;

namespace {

/// Room for a few small answers; a 64-row identity_cached answer (4 KiB in,
/// 4 KiB out) does not fit.
constexpr const char* cache_size = "local,size=6000";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Copies the model at `from` into `repo` as `name`, with response_cache on.
void add_cached_model(temp_repository& repo, const fs::path& from, const std::string& name) {
  auto config = read_file(from / "config.pbtxt");
  auto at = config.find("name: \"");
  REQUIRE(at != std::string::npos);
  auto end = config.find('"', at + 7);
  config.replace(at, end + 1 - at, "name: \"" + name + "\"");
  repo.write_file(fs::path(name) / "config.pbtxt",
                  config + "\nresponse_cache { enable: true }\n");
  repo.write_file(fs::path(name) / "1" / "model.builtin", "");
  if (fs::exists(from / "labels.txt"))
    repo.write_file(fs::path(name) / "labels.txt", read_file(from / "labels.txt"));
}

struct cache_server {
  temp_repository repo;
  std::unique_ptr<server_process> process;

  cache_server() {
    add_cached_model(repo, example_model("simple"), "simple");
    add_cached_model(repo, example_model("identity_fp32"), "identity_cached");
    add_cached_model(repo, test_model("slow_queue"), "slow_cached");
    add_cached_model(repo, test_model("classifier"), "classifier_cached");
    repo.add_model(example_model("identity_fp32")); // no response_cache
    process = std::make_unique<server_process>(server_config{
      CAF_SERVING_BINARY, repo.path().string(),
      model_control_api({"--cache-config", cache_size, "--allow-client-shm=true"})});
  }
  http_client client() const { return http_client(process->http_port()); }
};

cache_server& server() {
  static cache_server s;
  return s;
}

/// The model's /stats entry (version 1).
json_document stats_of(const std::string& model) {
  auto r = server().client().get("/v2/models/" + model + "/stats");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  return json_document::parse(r.body);
}

uint64_t stat_at(const json_document& doc, const std::string& path) {
  return doc.uint_at("/model_stats/0/" + path);
}

double metric(const std::string& name, const std::string& model) {
  http_client m(server().process->metrics_port());
  return metric_value(m.get("/metrics").body,
                      name + "{model=\"" + model + "\",version=\"1\"}");
}

std::vector<int32_t> iota32(int32_t from, size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = from + static_cast<int32_t>(i);
  return v;
}

std::string simple_body(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                        const std::string& rest = "") {
  return infer_body({input_json("INPUT0", "INT32", {1, 16}, json_list(a)),
                     input_json("INPUT1", "INT32", {1, 16}, json_list(b))},
                    rest);
}

std::string identity_body(size_t rows, float first) {
  std::vector<float> v(rows * 16);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = first + static_cast<float>(i);
  return fp32_identity_body(v, static_cast<int64_t>(rows));
}

} // namespace

TEST_CASE("the same request twice: the second is answered from the cache, byte for byte") {
  auto http = server().client();
  auto a = iota32(10, 16);
  auto b = iota32(-3, 16);
  auto body = simple_body(a, b, ",\"id\":\"same\"");
  auto first = http.post("/v2/models/simple/infer", body, json_content);
  REQUIRE_MESSAGE(first.status == 200, first.body);
  auto second = http.post("/v2/models/simple/infer", body, json_content);
  REQUIRE_MESSAGE(second.status == 200, second.body);
  CHECK(second.body == first.body);
  CHECK(second.header("content-type") == first.header("content-type"));

  auto doc = stats_of("simple");
  CHECK(stat_at(doc, "inference_stats/cache_miss/count") == 1);
  CHECK(stat_at(doc, "inference_stats/cache_hit/count") == 1);
  CHECK(stat_at(doc, "inference_stats/cache_hit/ns") > 0);
  CHECK(stat_at(doc, "inference_stats/cache_miss/ns") > 0);
  // The model ran once; both requests succeeded (Triton's accounting).
  CHECK(stat_at(doc, "execution_count") == 1);
  CHECK(stat_at(doc, "inference_count") == 1);
  CHECK(stat_at(doc, "inference_stats/compute_infer/count") == 1);
  CHECK(stat_at(doc, "inference_stats/success/count") == 2);
  CHECK(stat_at(doc, "inference_stats/queue/count") == 2);
  CHECK(metric("caf_serving_cache_hits", "simple") == 1);
  CHECK(metric("caf_serving_cache_misses", "simple") == 1);

  // The same inputs asked for as binary data, under another id, hit too:
  // the cache keeps outputs, and each request writes them out its own way.
  {
    auto r = http.post("/v2/models/simple/infer",
                       simple_body(a, b, ",\"id\":\"other\",\"parameters\":"
                                         "{\"binary_data_output\":true}"),
                       json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    auto split = split_binary(r);
    auto header = json_document::parse(split.json);
    CHECK(header.string_at("/id") == "other");
    REQUIRE(split.binary.size() == 2 * 16 * sizeof(int32_t));
    auto values = from_bytes<int32_t>(split.binary);
    for (size_t i = 0; i < 16; ++i) {
      int32_t sum = header.string_at("/outputs/0/name") == "OUTPUT0" ? values[i] : values[16 + i];
      CHECK(sum == a[i] + b[i]);
    }
    doc = stats_of("simple");
    CHECK(stat_at(doc, "inference_stats/cache_hit/count") == 2);
    CHECK(stat_at(doc, "execution_count") == 1);
  }

  // Other input bytes miss, run the model, and get their own answer.
  {
    auto b2 = b;
    b2[15] += 1;
    auto r = http.post("/v2/models/simple/infer", simple_body(a, b2), json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    auto out = json_document::parse(r.body);
    auto sums = json_ints(out.at("/outputs/0/data"));
    REQUIRE(sums.size() == 16);
    CHECK(sums[15] == a[15] + b2[15]);
    doc = stats_of("simple");
    CHECK(stat_at(doc, "inference_stats/cache_miss/count") == 2);
    CHECK(stat_at(doc, "inference_stats/cache_hit/count") == 2);
    CHECK(stat_at(doc, "execution_count") == 2);
  }
}

TEST_CASE("a model without response_cache never uses the cache") {
  auto http = server().client();
  auto body = identity_body(1, 0.5f);
  for (int i = 0; i < 2; ++i) {
    auto r = http.post("/v2/models/identity_fp32/infer", body, json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
  }
  auto doc = stats_of("identity_fp32");
  CHECK(stat_at(doc, "execution_count") == 2);
  CHECK(stat_at(doc, "inference_stats/cache_hit/count") == 0);
  CHECK(stat_at(doc, "inference_stats/cache_miss/count") == 0);
}

TEST_CASE("an answer larger than the whole cache is not cached; smaller ones are") {
  auto http = server().client();
  auto big = identity_body(64, 1.0f);
  for (int i = 0; i < 2; ++i) {
    auto r = http.post("/v2/models/identity_cached/infer", big, json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(fp32_output(json_document::parse(r.body)).size() == 64 * 16);
  }
  auto doc = stats_of("identity_cached");
  CHECK(stat_at(doc, "execution_count") == 2);
  CHECK(stat_at(doc, "inference_stats/cache_hit/count") == 0);
  CHECK(stat_at(doc, "inference_stats/cache_miss/count") == 2);
  // Not kept, and counted as such on /metrics.
  http_client m(server().process->metrics_port());
  CHECK(metric_value(m.get("/metrics").body, "caf_serving_cache_too_large") >= 2);

  auto small = identity_body(1, 2.0f);
  for (int i = 0; i < 2; ++i)
    REQUIRE(http.post("/v2/models/identity_cached/infer", small, json_content).status == 200);
  doc = stats_of("identity_cached");
  CHECK(stat_at(doc, "execution_count") == 3);
  CHECK(stat_at(doc, "inference_stats/cache_hit/count") == 1);
}

TEST_CASE("a failed request is not cached: the same request later runs the model") {
  // slow_cached runs 300 ms per request on one instance; a request with a
  // 40 ms queue timeout behind a running one fails with 503.
  auto port = server().process->http_port();
  auto body_of = [](float v, const std::string& rest = "") {
    return fp32_identity_body(std::vector<float>(2, v), 1, rest);
  };
  auto running = std::async(std::launch::async, [port, body = body_of(1)] {
    http_client http(port);
    return http.post("/v2/models/slow_cached/infer", body, json_content);
  });
  // As wait_pending (server_test.hpp): pending, then a little longer to be past
  // parsing and inside the model.
  REQUIRE(eventually([] { return metric("caf_serving_pending_request_count", "slow_cached") == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto http = server().client();
  auto failed = http.post("/v2/models/slow_cached/infer",
                          body_of(2, ",\"parameters\":{\"timeout\":40000}"), json_content);
  CHECK(failed.status == 503);
  REQUIRE(running.get().status == 200);

  // The same inputs (the timeout is not part of the key) now run the model.
  auto r = http.post("/v2/models/slow_cached/infer", body_of(2), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(fp32_output(json_document::parse(r.body)) == std::vector<float>{2, 2});
  auto doc = stats_of("slow_cached");
  CHECK(stat_at(doc, "execution_count") == 2);
  CHECK(stat_at(doc, "inference_stats/cache_hit/count") == 0);
  CHECK(stat_at(doc, "inference_stats/fail/count") == 1);
  // And from now on it is a hit.
  r = http.post("/v2/models/slow_cached/infer", body_of(2), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(stat_at(stats_of("slow_cached"), "inference_stats/cache_hit/count") == 1);
  CHECK(stat_at(stats_of("slow_cached"), "execution_count") == 2);
}

TEST_CASE("a reloaded model starts with no cached answers") {
  auto http = server().client();
  auto body = identity_body(1, 40.0f);
  for (int i = 0; i < 2; ++i)
    REQUIRE(http.post("/v2/models/identity_cached/infer", body, json_content).status == 200);
  auto before = stats_of("identity_cached");
  REQUIRE(stat_at(before, "inference_stats/cache_hit/count") >= 1);

  auto r = http.post("/v2/repository/models/identity_cached/load", "", json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  // The new load has its own statistics; its first request runs the model.
  r = http.post("/v2/models/identity_cached/infer", body, json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(fp32_output(json_document::parse(r.body)).front() == 40.0f);
  auto after = stats_of("identity_cached");
  CHECK(stat_at(after, "execution_count") == 1);
  CHECK(stat_at(after, "inference_stats/cache_hit/count") == 0);
  CHECK(stat_at(after, "inference_stats/cache_miss/count") == 1);
  // The cache as a whole is on /metrics, within its bound.
  http_client m(server().process->metrics_port());
  auto text = m.get("/metrics").body;
  CHECK(metric_value(text, "caf_serving_cache_max_bytes") == 6000);
  CHECK(metric_value(text, "caf_serving_cache_entries") >= 1);
  CHECK(metric_value(text, "caf_serving_cache_bytes") <= 6000);
}

TEST_CASE("JSON and binary input data for the same values share an answer") {
  auto http = server().client();
  auto before = stats_of("identity_cached");
  std::vector<float> values(16);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = 0.25f * static_cast<float>(i) - 7.f;
  auto r = http.post("/v2/models/identity_cached/infer", fp32_identity_body(values, 1),
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto header = infer_body({binary_input_json("INPUT0", "FP32", {1, 16}, 64)});
  r = http.post("/v2/models/identity_cached/infer", header + to_bytes(values),
                {{"Content-Type", "application/octet-stream"},
                 {"Inference-Header-Content-Length", std::to_string(header.size())}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(fp32_output(json_document::parse(r.body)) == values);
  auto doc = stats_of("identity_cached");
  CHECK(stat_at(doc, "inference_stats/cache_hit/count")
        == stat_at(before, "inference_stats/cache_hit/count") + 1);
  CHECK(stat_at(doc, "execution_count") == stat_at(before, "execution_count") + 1);
}

TEST_CASE("classification is part of the key: each count gets its own answer") {
  auto http = server().client();
  std::vector<float> scores{0.1f, 0.7f, 0.05f, 0.9f, 0.3f}; // fish, dog, ...
  auto ask = [&](int k) {
    return http.post("/v2/models/classifier_cached/infer",
                     infer_body({input_json("INPUT0", "FP32", {1, 5}, json_list(scores))},
                                ",\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":"
                                "{\"classification\":" + std::to_string(k) + "}}]"),
                     json_content);
  };
  auto two = ask(2);
  REQUIRE_MESSAGE(two.status == 200, two.body);
  CHECK(json_strings(json_document::parse(two.body).at("/outputs/0/data"))
        == std::vector<std::string>{"0.9:3:fish", "0.7:1:dog"});
  auto three = ask(3);
  REQUIRE_MESSAGE(three.status == 200, three.body);
  CHECK(json_strings(json_document::parse(three.body).at("/outputs/0/data"))
        == std::vector<std::string>{"0.9:3:fish", "0.7:1:dog", "0.3:4:horse"});
  auto again = ask(2);
  CHECK(again.body == two.body);
  auto doc = stats_of("classifier_cached");
  CHECK(stat_at(doc, "inference_stats/cache_miss/count") == 2);
  CHECK(stat_at(doc, "inference_stats/cache_hit/count") == 1);
  CHECK(stat_at(doc, "execution_count") == 2);
}

TEST_CASE("a request with inputs in shared memory is not cached") {
  // A client's POSIX shared-memory object holding both inputs of simple.
  std::string key = "/caf_serving_cache_test_" + std::to_string(getpid());
  int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 128) == 0);
  void* mapped = mmap(nullptr, 128, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(mapped != MAP_FAILED);
  auto a = iota32(500, 16);
  auto b = iota32(-500, 16);
  std::memcpy(mapped, a.data(), 64);
  std::memcpy(static_cast<char*>(mapped) + 64, b.data(), 64);

  auto http = server().client();
  auto r = http.post("/v2/systemsharedmemory/region/cache_in/register",
                     "{\"key\":\"" + key + "\",\"offset\":0,\"byte_size\":128}",
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto input = [](const std::string& name, int offset) {
    return "{\"name\":\"" + name + "\",\"datatype\":\"INT32\",\"shape\":[1,16],"
           "\"parameters\":{\"shared_memory_region\":\"cache_in\",\"shared_memory_offset\":"
           + std::to_string(offset) + ",\"shared_memory_byte_size\":64}}";
  };
  auto before = stats_of("simple");
  for (int i = 0; i < 2; ++i) {
    r = http.post("/v2/models/simple/infer", infer_body({input("INPUT0", 0), input("INPUT1", 64)}),
                  json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    auto sums = json_ints(json_document::parse(r.body).at("/outputs/0/data"));
    REQUIRE(sums.size() == 16);
    CHECK(sums[3] == a[3] + b[3]);
  }
  // The region is read only by the copy that survives a client truncating
  // it, so such requests go to the model every time.
  auto after = stats_of("simple");
  CHECK(stat_at(after, "execution_count") == stat_at(before, "execution_count") + 2);
  CHECK(stat_at(after, "inference_stats/cache_hit/count")
        == stat_at(before, "inference_stats/cache_hit/count"));
  CHECK(stat_at(after, "inference_stats/cache_miss/count")
        == stat_at(before, "inference_stats/cache_miss/count"));
  CHECK(http.post("/v2/systemsharedmemory/region/cache_in/unregister", "", json_content).status
        == 200);
  munmap(mapped, 128);
  close(fd);
  shm_unlink(key.c_str());
}
