/// Triton's model control as its clients see it: the control modes (none,
/// explicit with --load-model, poll), load parameters (a config override,
/// model files sent as file: parameters), unload_dependents, and Triton's
/// status codes and phrases for what fails.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <unistd.h>

using namespace caf_serving::server_test;

namespace {

/// `text` as a JSON string literal.
std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

/// A load body: {"parameters": {"config": "<config>", <more>}}.
std::string load_body(const std::string& config, const std::string& more = "") {
  std::string params = "\"config\":" + json_quote(config);
  if (!more.empty())
    params += "," + more;
  return "{\"parameters\":{" + params + "}}";
}

/// examples/models/simple's configuration as JSON, with another max_batch_size.
std::string simple_json(int max_batch_size) {
  std::string io;
  for (const char* name : {"INPUT0", "INPUT1"})
    io += std::string(io.empty() ? "" : ",") + "{\"name\":\"" + name
          + "\",\"data_type\":\"TYPE_INT32\",\"dims\":[16]}";
  std::string out;
  for (const char* name : {"OUTPUT0", "OUTPUT1"})
    out += std::string(out.empty() ? "" : ",") + "{\"name\":\"" + name
           + "\",\"data_type\":\"TYPE_INT32\",\"dims\":[16]}";
  return "{\"backend\":\"builtin\",\"max_batch_size\":" + std::to_string(max_batch_size)
         + ",\"input\":[" + io + "],\"output\":[" + out
         + "],\"parameters\":{\"function\":{\"string_value\":\"add_sub\"}}}";
}

/// A request to `simple` with `rows` rows of 16.
std::string simple_body(int rows) {
  std::vector<int32_t> a(static_cast<size_t>(rows) * 16, 5), b(a.size(), 2);
  return infer_body({input_json("INPUT0", "INT32", {rows, 16}, json_list(a)),
                     input_json("INPUT1", "INT32", {rows, 16}, json_list(b))});
}

const char* identity_config =
  "backend: \"builtin\"\nmax_batch_size: 8\n"
  "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
  "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
  "parameters { key: \"function\" value: { string_value: \"identity\" } }\n";

/// identity_config as JSON.
const char* identity_json =
  R"({"backend":"builtin","max_batch_size":8,)"
  R"("input":[{"name":"INPUT0","data_type":"TYPE_FP32","dims":[4]}],)"
  R"("output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4]}],)"
  R"("parameters":{"function":{"string_value":"identity"}}})";

/// Clients sending identity requests to `model` until stopped; anything but a
/// correct 200 is a problem.
class steady_clients {
public:
  steady_clients(uint16_t port, std::string model, size_t width = 16) {
    for (int c = 0; c < 2; ++c)
      threads_.emplace_back([this, port, model, c, width] {
        http_client http(port);
        for (int k = 0; !stop_; ++k) {
          std::vector<float> v(width, static_cast<float>(c * 100000 + k));
          auto r = http.post("/v2/models/" + model + "/infer", fp32_identity_body(v, 1),
                             json_content);
          if (r.status == 200 && fp32_output(json_document::parse(r.body)) == v)
            ++ok_;
          else
            problems_.fetch_add(1), last_problem_ = r.body.substr(0, 300);
        }
      });
  }
  ~steady_clients() { stop(); }
  void stop() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable())
        t.join();
  }
  int ok() const { return ok_; }
  int problems() const { return problems_; }
  /// Only read after stop().
  const std::string& last_problem() const { return last_problem_; }

private:
  std::string last_problem_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0}, problems_{0};
  std::vector<std::thread> threads_;
};

} // namespace

TEST_CASE("mode none (the default): every model loads, load and unload are refused as in Triton") {
  test_server server({example_model("simple")});
  auto http = server.client();
  CHECK(http.get("/v2/models/simple/ready").status == 200);
  for (const char* action : {"load", "unload"}) {
    auto r = http.post(std::string("/v2/repository/models/simple/") + action, "");
    CHECK(r.status == 503);
    auto message = error_message(r.body);
    CHECK(message.rfind("explicit model load / unload is not allowed if polling is enabled", 0)
          == 0);
    CHECK(message.find("--model-control-mode explicit") != std::string::npos);
  }
  CHECK(http.post("/v2/models/simple/infer", simple_body(1), json_content).status == 200);
}

TEST_CASE("explicit mode loads only the --load-model models; the index lists the others by name") {
  test_server server({example_model("simple"), example_model("identity_fp32")},
                     {"--model-control-mode", "explicit", "--load-model", "simple"});
  auto http = server.client();
  CHECK(http.get("/v2/models/simple/ready").status == 200);
  CHECK(http.get("/v2/models/identity_fp32/ready").status != 200);
  CHECK(http.get("/v2/health/ready").status == 200);
  auto index = http.post("/v2/repository/index", "");
  REQUIRE(index.status == 200);
  CHECK(index.body.find("{\"name\":\"identity_fp32\"}") != std::string::npos);
  CHECK(index.body.find("{\"name\":\"simple\",\"version\":\"1\",\"state\":\"READY\"}")
        != std::string::npos);

  auto r = http.post("/v2/repository/models/identity_fp32/load", "");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(http.get("/v2/models/identity_fp32/ready").status == 200);

  // unload_dependents is accepted (the engine has no ensembles to unload with it).
  r = http.post("/v2/repository/models/identity_fp32/unload",
                "{\"parameters\":{\"unload_dependents\":true}}", json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(http.get("/v2/models/identity_fp32/ready").status != 200);
  r = http.post("/v2/repository/models/simple/unload",
                "{\"parameters\":{\"unload_dependents\":\"yes\"}}", json_content);
  CHECK(r.status == 400);
  CHECK(error_message(r.body).rfind("Unable to parse 'unload_dependents'", 0) == 0);
  CHECK(http.get("/v2/models/simple/ready").status == 200);
}

TEST_CASE("a config override: max_batch_size 16 over the repository's 8") {
  test_server server({example_model("simple")}, model_control_api());
  auto http = server.client();
  // 16 rows do not fit the repository's max_batch_size 8.
  CHECK(http.post("/v2/models/simple/infer", simple_body(16), json_content).status == 400);

  auto r = http.post("/v2/repository/models/simple/load", load_body(simple_json(16)),
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto config = json_document::parse(http.get("/v2/models/simple/config").body);
  CHECK(config.int_at("/max_batch_size") == 16);
  r = http.post("/v2/models/simple/infer", simple_body(16), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(json_ints(json_document::parse(r.body).at("/outputs/0/data"))
        == std::vector<int64_t>(256, 7));

  // tritonclient's model control example sends this malformed config first.
  r = http.post("/v2/repository/models/simple/load",
                load_body(R"("parameters": {"config": {{"max_batch_size": "16"}}})"),
                json_content);
  CHECK(r.status == 500);
  CHECK(error_message(r.body).rfind(
          "failed to load 'simple', failed to poll from model repository: Invalid config "
          "override: ", 0) == 0);
  // A config that parses but cannot work.
  r = http.post("/v2/repository/models/simple/load",
                load_body(R"({"backend":"builtin","max_batch_size":-2})"), json_content);
  CHECK(r.status == 500);
  CHECK(error_message(r.body).find("max_batch_size is -2") != std::string::npos);
  // Unknown parameters and non-string values are refused.
  r = http.post("/v2/repository/models/simple/load", "{\"parameters\":{\"priority\":\"1\"}}",
                json_content);
  CHECK(r.status == 400);
  CHECK(error_message(r.body).rfind("Unrecognized load parameter 'priority'", 0) == 0);
  r = http.post("/v2/repository/models/simple/load", "{\"parameters\":{\"config\":{}}}",
                json_content);
  CHECK(r.status == 400);
  // The failed loads left the override serving.
  CHECK(json_document::parse(http.get("/v2/models/simple/config").body).int_at("/max_batch_size")
        == 16);
  CHECK(http.post("/v2/models/simple/infer", simple_body(16), json_content).status == 200);
}

TEST_CASE("file: parameters: a model sent in the request, never written outside its folder") {
  test_server server({}, model_control_api({"--model-load-max-file-bytes", "64"}));
  auto http = server.client();
  // "builtin\n" in base64.
  const std::string file = "\"file:1/model.builtin\":\"YnVpbHRpbgo=\"";
  auto r = http.post("/v2/repository/models/sent/load", load_body(identity_json, file),
                     json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  std::vector<float> v{1, 2, 3, 4};
  r = http.post("/v2/models/sent/infer", fp32_identity_body(v, 1), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(fp32_output(json_document::parse(r.body)) == v);
  CHECK_FALSE(fs::exists(server.repo.path() / "sent"));

  // Without a config: Triton's status and words, and why.
  r = http.post("/v2/repository/models/other/load", "{\"parameters\":{" + file + "}}",
                json_content);
  CHECK(r.status == 500);
  CHECK(error_message(r.body).rfind(
          "failed to load 'other', failed to poll from model repository: ", 0) == 0);
  CHECK(error_message(r.body).find("\"config\" parameter must come with them")
        != std::string::npos);

  // Paths that would leave the load's folder write nothing.
  auto outside = "caf_serving_escape_" + std::to_string(::getpid());
  for (const std::string& path :
       {"../" + outside, "/tmp/" + outside, "1/../../" + outside, std::string(256, 'A')}) {
    r = http.post("/v2/repository/models/escape/load",
                  load_body(identity_json, json_quote("file:" + path) + ":\"YQ==\""),
                  json_content);
    CHECK_MESSAGE(r.status == 500, path);
    CHECK(error_message(r.body).find("failed to poll from model repository") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(fs::temp_directory_path() / outside));
  CHECK_FALSE(fs::exists("/tmp/" + outside));
  CHECK(http.get("/v2/health/live").status == 200);

  // Over --model-load-max-file-bytes (64): an answer, not a write.
  std::string big(100, 'A');
  r = http.post("/v2/repository/models/big/load",
                load_body(identity_json, "\"file:1/model.builtin\":\"" + big + "\""),
                json_content);
  CHECK(r.status == 413);
  CHECK(error_message(r.body).find("--model-load-max-file-bytes") != std::string::npos);
  r = http.post("/v2/repository/models/bad64/load",
                load_body(identity_json, "\"file:1/model.builtin\":\"%%%%\""), json_content);
  CHECK(r.status == 400);
  CHECK(error_message(r.body).find("not base64") != std::string::npos);

  // Unloaded, the model is gone; loaded again without files, it needs the
  // repository (where it is not).
  REQUIRE(http.post("/v2/repository/models/sent/unload", "").status == 200);
  r = http.post("/v2/repository/models/sent/load", "");
  CHECK(r.status == 500);
  CHECK(error_message(r.body).find("failed to poll from model repository") != std::string::npos);
}

TEST_CASE("poll mode: added, changed and removed models are picked up; other models keep serving") {
  test_server server({example_model("identity_fp32")},
                     {"--model-control-mode", "poll", "--repository-poll-secs", "1"});
  auto http = server.client();
  CHECK(http.post("/v2/repository/models/identity_fp32/load", "").status == 503);
  steady_clients clients(server.port(), "identity_fp32");

  // Added.
  server.repo.write_file("polled/1/model.builtin", "builtin\n");
  server.repo.write_file("polled/config.pbtxt", identity_config);
  REQUIRE(eventually([&] { return http.get("/v2/models/polled/ready").status == 200; }));
  std::vector<float> v{1, 2, 3, 4};
  CHECK(http.post("/v2/models/polled/infer", fp32_identity_body(v, 1), json_content).status
        == 200);

  // Changed: another max_batch_size, and a second version. The model serves
  // its requests all along, the old version until the new one is ready.
  steady_clients on_polled(server.port(), "polled", 4);
  REQUIRE(eventually([&] { return on_polled.ok() > 10; }));
  std::string changed = identity_config;
  changed.replace(changed.find("max_batch_size: 8"), 17, "max_batch_size: 4");
  server.repo.write_file("polled/2/model.builtin", "builtin\n");
  server.repo.write_file("polled/config.pbtxt", changed);
  REQUIRE(eventually([&] {
    auto r = http.get("/v2/models/polled/config");
    return r.status == 200 && json_document::parse(r.body).int_at("/max_batch_size") == 4
           && http.get("/v2/models/polled/versions/2/ready").status == 200;
  }));

  int before_change = on_polled.ok();
  REQUIRE(eventually([&] { return on_polled.ok() > before_change + 10; }));
  on_polled.stop();
  CHECK_MESSAGE(on_polled.problems() == 0, on_polled.last_problem());

  // Removed.
  fs::remove_all(server.repo.path() / "polled");
  // Gone: its metadata is Triton's 404, its readiness Triton's 400.
  REQUIRE(eventually([&] { return http.get("/v2/models/polled").status == 404; }));
  CHECK(http.get("/v2/models/polled/ready").status == 400);
  CHECK(http.post("/v2/repository/index", "").body.find("polled") == std::string::npos);

  clients.stop();
  CHECK_MESSAGE(clients.problems() == 0, clients.last_problem());
  CHECK(clients.ok() > 10);
  MESSAGE("identity_fp32 answered " << clients.ok() << " requests while the repository changed");
}

TEST_CASE("tritonclient's model control example, step by step") {
  // simple_http_model_control.py against a server in explicit mode.
  test_server server({example_model("simple")}, {"--model-control-mode", "explicit"});
  auto http = server.client();
  REQUIRE(http.post("/v2/repository/models/simple/load", "").status == 200);
  CHECK(http.get("/v2/models/simple/ready").status == 200);
  auto r = http.post("/v2/repository/models/simple/load",
                     load_body(R"("parameters": {"config": {{"max_batch_size": "16"}}})"),
                     json_content);
  CHECK(r.status != 200);
  CHECK(error_message(r.body).find("failed to load") != std::string::npos);
  // Only max_batch_size: the builtin model keeps the rest of its config.pbtxt.
  r = http.post("/v2/repository/models/simple/load", load_body(R"({"max_batch_size":"16"})"),
                json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(json_document::parse(http.get("/v2/models/simple/config").body).int_at("/max_batch_size")
        == 16);
  CHECK(http.post("/v2/models/simple/infer", simple_body(16), json_content).status == 200);
  REQUIRE(http.post("/v2/repository/models/simple/unload", "").status == 200);
  CHECK(http.get("/v2/models/simple/ready").status != 200);
  r = http.post("/v2/repository/models/wrong_model_name/load", "");
  CHECK(r.status != 200);
  CHECK(error_message(r.body).find("failed to load") != std::string::npos);
}

TEST_CASE("a load body over --max-body-bytes is refused with Triton's phrase; the server goes on") {
  test_server server({}, model_control_api({"--max-body-bytes", "4096"}));
  std::string big(8192, 'A');
  auto r = server.client().post("/v2/repository/models/m/load",
                                load_body(identity_json, "\"file:1/model.builtin\":\"" + big + "\""),
                                json_content);
  CHECK(r.status == 413);
  CHECK(error_message(r.body).find("request JSON size of ") == 0);
  CHECK(error_message(r.body).find(" exceeds the maximum allowed input size") != std::string::npos);
  CHECK(server.client().get("/v2/health/live").status == 200);
}

TEST_CASE("an ONNX model's override replaces config.pbtxt; the graph completes what it leaves out") {
  // As Triton's lifecycle test_config_override: {"backend": ..., "version_policy": ...}.
  test_server server({example_model("resnet_small")},
                     {"--model-control-mode", "explicit", "--load-model", "resnet_small"});
  auto http = server.client();
  auto before = json_document::parse(http.get("/v2/models/resnet_small/config").body);
  REQUIRE(before.int_at("/max_batch_size") == 16);
  REQUIRE(before.has("/dynamic_batching"));
  REQUIRE(before.string_at("/output/0/label_filename") == "labels.txt");
  auto r = http.post("/v2/repository/models/resnet_small/load",
                     load_body(R"({"backend":"onnxruntime","max_batch_size":4})"), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto after = json_document::parse(http.get("/v2/models/resnet_small/config").body);
  CHECK(after.int_at("/max_batch_size") == 4);
  // Inputs and outputs come from the graph; what only config.pbtxt said (the
  // label file) is gone, as in Triton. dynamic_batching comes back from
  // auto-complete, which turns it on for a graph that batches with a
  // max_batch_size over 1, as Triton's ONNX Runtime backend does.
  CHECK(after.string_at("/input/0/name") == "input");
  CHECK(after.string_at("/output/0/name") == "logits");
  CHECK(after.string_at("/output/0/label_filename").empty());
  CHECK(after.has("/dynamic_batching"));
  CHECK(http.get("/v2/models/resnet_small/ready").status == 200);
}
