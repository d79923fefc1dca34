/// Triton's system shared-memory extension through the whole server: the test
/// creates POSIX shared-memory objects as tritonclient.utils.shared_memory
/// does (shm_open, ftruncate, mmap), registers them, runs `simple` with its
/// inputs and outputs in them, and reads the results back from its own
/// mapping. Bad regions, offsets and sizes are answered with Triton's status
/// and phrase, and the server keeps serving; a region unregistered while a
/// request uses it stays (listed and mapped) until that request is answered.

#include "server_test.hpp"
#include "support/shm_object.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <future>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

using namespace caf_serving::server_test;

namespace {


test_server& server() {
  static test_server s({example_model("simple"), test_model("slow_queue")},
                       {"--allow-client-shm=true", "--shm-region-limit", "6"});
  return s;
}

std::string register_body(const std::string& key, uint64_t offset, uint64_t byte_size) {
  return "{\"key\":\"" + key + "\",\"offset\":" + std::to_string(offset)
         + ",\"byte_size\":" + std::to_string(byte_size) + "}";
}

http_response register_region(http_client& http, const std::string& name, const std::string& key,
                               uint64_t offset, uint64_t byte_size) {
  return http.post("/v2/systemsharedmemory/region/" + name + "/register",
                   register_body(key, offset, byte_size), json_content);
}

std::string shm_params(const std::string& region, uint64_t offset, uint64_t byte_size) {
  return "\"parameters\":{\"shared_memory_region\":\"" + region
         + "\",\"shared_memory_offset\":" + std::to_string(offset)
         + ",\"shared_memory_byte_size\":" + std::to_string(byte_size) + "}";
}

std::string shm_input(const std::string& name, const std::string& datatype,
                      const std::vector<int64_t>& shape, const std::string& region,
                      uint64_t offset, uint64_t byte_size) {
  return "{\"name\":\"" + name + "\",\"datatype\":\"" + datatype + "\",\"shape\":"
         + json_list(shape) + "," + shm_params(region, offset, byte_size) + "}";
}

std::string shm_output(const std::string& name, const std::string& region, uint64_t offset,
                       uint64_t byte_size) {
  return "{\"name\":\"" + name + "\"," + shm_params(region, offset, byte_size) + "}";
}

std::vector<int32_t> iota32(int32_t from, size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = from + static_cast<int32_t>(i);
  return v;
}

/// Runs simple with both inputs in `in` (at 0 and 64) and both outputs in
/// `out` (at 0 and 64); checks the sums and differences there.
void check_simple_in_shared_memory(http_client& http, shm_object& in, shm_object& out,
                                   int32_t seed) {
  auto a = iota32(seed, 16);
  auto b = iota32(100 - seed, 16);
  in.put(0, a);
  in.put(64, b);
  std::memset(out.data, 0, 128);
  auto body = infer_body({shm_input("INPUT0", "INT32", {1, 16}, "in", 0, 64),
                          shm_input("INPUT1", "INT32", {1, 16}, "in", 64, 64)},
                         ",\"outputs\":[" + shm_output("OUTPUT0", "out", 0, 64) + ","
                           + shm_output("OUTPUT1", "out", 64, 64) + "]");
  auto r = http.post("/v2/models/simple/infer", body, json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  for (int o = 0; o < 2; ++o) {
    std::string at = "/outputs/" + std::to_string(o);
    CHECK(doc.string_at(at + "/datatype") == "INT32");
    CHECK(json_ints(doc.at(at + "/shape")) == std::vector<int64_t>{1, 16});
    // As Triton: no data and no parameters for an output in shared memory.
    CHECK(doc.at(at).get_object().size() == 3);
  }
  auto sums = out.get<int32_t>(doc.string_at("/outputs/0/name") == "OUTPUT0" ? 0 : 64, 16);
  auto diffs = out.get<int32_t>(doc.string_at("/outputs/0/name") == "OUTPUT0" ? 64 : 0, 16);
  for (size_t i = 0; i < 16; ++i) {
    CHECK(sums[i] == a[i] + b[i]);
    CHECK(diffs[i] == a[i] - b[i]);
  }
}

/// The registered regions, by name.
std::vector<std::string> region_names(http_client& http) {
  auto r = http.get("/v2/systemsharedmemory/status");
  REQUIRE(r.status == 200);
  auto doc = json_document::parse(r.body);
  std::vector<std::string> names;
  for (auto e : doc.at("").get_array())
    names.emplace_back(std::string_view(e["name"].get_string().value()));
  return names;
}

} // namespace

TEST_CASE("the server lists system_shared_memory among its extensions") {
  auto http = server().client();
  auto doc = json_document::parse(http.get("/v2").body);
  bool listed = false;
  for (auto e : doc.at("/extensions").get_array())
    listed = listed || e.get_string().value() == "system_shared_memory";
  CHECK(listed);
}

TEST_CASE("simple reads its inputs from shared memory and writes its outputs there") {
  auto http = server().client();
  shm_object in(4096), out(4096);
  REQUIRE(register_region(http, "in", in.key, 0, 128).status == 200);
  REQUIRE(register_region(http, "out", out.key, 0, 128).status == 200);
  auto status = http.get("/v2/systemsharedmemory/region/in/status");
  CHECK(status.status == 200);
  CHECK(status.body == "[{\"name\":\"in\",\"key\":\"" + in.key + "\",\"offset\":0,\"byte_size\":128}]");

  check_simple_in_shared_memory(http, in, out, 3);
  check_simple_in_shared_memory(http, in, out, -40); // the same regions, used again

  // One input in shared memory and one as JSON; one output in shared memory
  // and one as JSON in the response.
  auto a = iota32(7, 16);
  in.put(0, a);
  auto body = infer_body({shm_input("INPUT0", "INT32", {1, 16}, "in", 0, 64),
                          input_json("INPUT1", "INT32", {1, 16}, json_list(iota32(1, 16)))},
                         ",\"outputs\":[" + shm_output("OUTPUT0", "out", 64, 64)
                           + ",{\"name\":\"OUTPUT1\"}]");
  auto r = http.post("/v2/models/simple/infer", body, json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  auto sums = out.get<int32_t>(64, 16);
  auto diffs = json_ints(doc.at("/outputs/1/data"));
  for (size_t i = 0; i < 16; ++i) {
    CHECK(sums[i] == a[i] + 1 + static_cast<int32_t>(i));
    CHECK(diffs[i] == a[i] - 1 - static_cast<int64_t>(i));
  }

  CHECK(http.post("/v2/systemsharedmemory/unregister", "").status == 200);
  CHECK(region_names(http).empty());
}

TEST_CASE("a window that is not page-aligned in its object works") {
  auto http = server().client();
  shm_object in(3 * 4096), out(3 * 4096);
  REQUIRE(register_region(http, "in", in.key, 4096 + 40, 128).status == 200);
  REQUIRE(register_region(http, "out", out.key, 8192 + 8, 128).status == 200);
  auto a = iota32(5, 16), b = iota32(-5, 16);
  in.put(4096 + 40, a);
  in.put(4096 + 40 + 64, b);
  auto body = infer_body({shm_input("INPUT0", "INT32", {1, 16}, "in", 0, 64),
                          shm_input("INPUT1", "INT32", {1, 16}, "in", 64, 64)},
                         ",\"outputs\":[" + shm_output("OUTPUT0", "out", 0, 64) + "]");
  auto r = http.post("/v2/models/simple/infer", body, json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto sums = out.get<int32_t>(8192 + 8, 16);
  for (size_t i = 0; i < 16; ++i)
    CHECK(sums[i] == a[i] + b[i]);
  CHECK(http.post("/v2/systemsharedmemory/unregister", "").status == 200);
}

TEST_CASE("bad registrations, regions, offsets and sizes get Triton's answers; the server serves on") {
  auto http = server().client();
  shm_object in(4096), out(4096);
  REQUIRE(register_region(http, "in", in.key, 0, 128).status == 200);
  REQUIRE(register_region(http, "out", out.key, 0, 128).status == 200);

  auto again = register_region(http, "in", in.key, 0, 128);
  CHECK(again.status == 400);
  CHECK(again.body.find("shared memory region 'in' already in manager") != std::string::npos);
  auto missing = register_region(http, "m", "/caf_serving_no_such_key", 0, 8);
  CHECK(missing.status == 400);
  CHECK(missing.body.find("Unable to open shared memory region: '/caf_serving_no_such_key'")
        != std::string::npos);
  auto past = register_region(http, "p", in.key, 4000, 128);
  CHECK(past.status == 400);
  CHECK(past.body.find("failed to register shared memory region 'p': invalid args")
        != std::string::npos);
  auto no_key = http.post("/v2/systemsharedmemory/region/k/register", "{\"byte_size\":8}");
  CHECK(no_key.status == 400);
  CHECK(no_key.body.find("Shared memory register request has no 'key' field") != std::string::npos);
  auto bad_json = http.post("/v2/systemsharedmemory/region/k/register", "{\"key\":");
  CHECK(bad_json.status == 400);
  CHECK(http.get("/v2/systemsharedmemory/region/nope/status").status == 404);
  CHECK(http.get("/v2/systemsharedmemory/region/in/register").status == 405);

  struct bad_infer {
    const char* what;
    std::string input0;
    std::string output0;
    int status;
    std::string phrase;
  };
  std::vector<bad_infer> cases = {
    {"unknown region", shm_input("INPUT0", "INT32", {1, 16}, "nope", 0, 64),
     shm_output("OUTPUT0", "out", 0, 64), 404, "Unable to find shared memory region: 'nope'"},
    {"offset past the region", shm_input("INPUT0", "INT32", {1, 16}, "in", 128, 64),
     shm_output("OUTPUT0", "out", 0, 64), 400, "Invalid offset for shared memory region: 'in'"},
    {"offset wrapped around", shm_input("INPUT0", "INT32", {1, 16}, "in", 0, 64),
     shm_output("OUTPUT0", "out", 18446744073709551584ull, 64), 400,
     "Invalid offset for shared memory region: 'out'"},
    {"offset + size overflowing", shm_input("INPUT0", "INT32", {1, 16}, "in", 0, 64),
     shm_output("OUTPUT0", "out", 32, 18446744073709551584ull), 400,
     "Integer overflow detected: byte_size "},
    {"window past the region", shm_input("INPUT0", "INT32", {1, 16}, "in", 100, 64),
     shm_output("OUTPUT0", "out", 0, 64), 400,
     "Invalid offset + byte size for shared memory region: 'in'"},
    {"input window of the wrong size", shm_input("INPUT0", "INT32", {1, 16}, "in", 0, 128),
     shm_output("OUTPUT0", "out", 0, 64), 400,
     "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 128"},
    {"output window too small", shm_input("INPUT0", "INT32", {1, 16}, "in", 0, 64),
     shm_output("OUTPUT0", "out", 0, 32), 400,
     "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be "
     "at least 64 bytes to hold the results"},
    {"input with data and a region",
     "{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1,16],\"data\":" + json_list(iota32(0, 16))
       + "," + shm_params("in", 0, 64) + "}",
     shm_output("OUTPUT0", "out", 0, 64), 400,
     "Input must set only one of the following fields"},
  };
  for (const auto& c : cases) {
    auto body = infer_body({c.input0, shm_input("INPUT1", "INT32", {1, 16}, "in", 64, 64)},
                           ",\"outputs\":[" + c.output0 + "]");
    auto r = http.post("/v2/models/simple/infer", body, json_content);
    CHECK_MESSAGE(r.status == c.status, c.what << ": " << r.body);
    CHECK_MESSAGE(r.body.find(c.phrase) != std::string::npos, c.what << ": " << r.body);
  }
  // Nothing was written outside the windows: the output region's bytes past
  // the 128 registered are as the test left them.
  CHECK(out.get<char>(128, 1)[0] == 0);

  check_simple_in_shared_memory(http, in, out, 11);
  CHECK(http.post("/v2/systemsharedmemory/unregister", "").status == 200);
}

TEST_CASE("a client that shrinks its object under a region gets a 400, and the server lives") {
  auto http = server().client();
  shm_object in(4096), out(4096);
  REQUIRE(register_region(http, "in", in.key, 0, 128).status == 200);
  REQUIRE(register_region(http, "out", out.key, 0, 128).status == 200);
  // Reading or writing the server's mapping now raises SIGBUS in the server.
  REQUIRE(ftruncate(in.fd, 0) == 0);
  auto body = infer_body({shm_input("INPUT0", "INT32", {1, 16}, "in", 0, 64),
                          shm_input("INPUT1", "INT32", {1, 16}, "in", 64, 64)},
                         ",\"outputs\":[" + shm_output("OUTPUT0", "out", 0, 64) + "]");
  auto r = http.post("/v2/models/simple/infer", body, json_content);
  CHECK(r.status == 400);
  CHECK(r.body.find("shared memory region 'in' faulted") != std::string::npos);
  REQUIRE(ftruncate(in.fd, 4096) == 0);
  REQUIRE(ftruncate(out.fd, 0) == 0);
  r = http.post("/v2/models/simple/infer", body, json_content);
  CHECK(r.status == 400);
  CHECK(r.body.find("shared memory region 'out' faulted") != std::string::npos);
  REQUIRE(ftruncate(out.fd, 4096) == 0);
  check_simple_in_shared_memory(http, in, out, 21);
  CHECK(http.post("/v2/systemsharedmemory/unregister", "").status == 200);
}

TEST_CASE("the region limit is an answer") {
  auto http = server().client();
  shm_object obj(4096);
  for (int i = 0; i < 6; ++i)
    REQUIRE(register_region(http, "r" + std::to_string(i), obj.key, 0, 8).status == 200);
  auto seventh = register_region(http, "r6", obj.key, 0, 8);
  CHECK(seventh.status == 400);
  CHECK(seventh.body.find("--shm-region-limit") != std::string::npos);
  CHECK(http.post("/v2/systemsharedmemory/region/r0/unregister", "").status == 200);
  CHECK(register_region(http, "r6", obj.key, 0, 8).status == 200);
  CHECK(region_names(http).size() == 6);
  CHECK(http.post("/v2/systemsharedmemory/unregister", "").status == 200);
}

TEST_CASE("a region unregistered while a request uses it stays until the request is answered") {
  auto& s = server();
  auto http = s.client();
  shm_object obj(4096);
  REQUIRE(register_region(http, "io", obj.key, 0, 16).status == 200);
  obj.put(0, std::vector<float>{1.5f, -2.5f});
  std::memset(obj.data + 8, 0, 8);
  // slow_queue holds each request for 300 ms: the unregister below lands
  // while the request is in the model, and its output is written after it.
  auto answer = std::async(std::launch::async, [&s] {
    auto client = s.client();
    auto body = infer_body({shm_input("INPUT0", "FP32", {1, 2}, "io", 0, 8)},
                           ",\"outputs\":[" + shm_output("OUTPUT0", "io", 8, 8) + "]");
    return client.post("/v2/models/slow_queue/infer", body, json_content);
  });
  REQUIRE(wait_pending(s, "slow_queue", 1));
  CHECK(http.post("/v2/systemsharedmemory/region/io/unregister", "").status == 200);
  // As in Triton: listed, and its name taken, until the request is done.
  CHECK(region_names(http) == std::vector<std::string>{"io"});
  CHECK(register_region(http, "io", obj.key, 0, 16).status == 400);
  auto r = answer.get();
  CHECK_MESSAGE(r.status == 200, r.body);
  CHECK(obj.get<float>(8, 2) == std::vector<float>{1.5f, -2.5f});
  // Gone with the request, without another unregister; the name is free.
  CHECK(region_names(http).empty());
  CHECK(register_region(http, "io", obj.key, 0, 16).status == 200);
  CHECK(http.post("/v2/systemsharedmemory/unregister", "").status == 200);
}

TEST_CASE("CUDA shared memory is refused with Triton's no-GPU answers") {
  auto http = server().client();
  auto status = http.get("/v2/cudasharedmemory/status");
  CHECK(status.status == 200);
  CHECK(status.body == "[]");
  auto reg = http.post("/v2/cudasharedmemory/region/g/register",
                       "{\"raw_handle\":{\"b64\":\"AAAA\"},\"device_id\":0,\"byte_size\":8}",
                       json_content);
  CHECK(reg.status == 400);
  CHECK(reg.body.find("failed to register CUDA shared memory region: 'g', GPUs not supported")
        != std::string::npos);
  CHECK(http.post("/v2/cudasharedmemory/unregister", "").status == 200);
}

TEST_CASE("without --allow-client-shm, registering is refused with Triton's 501") {
  test_server plain({example_model("simple")});
  auto http = plain.client();
  shm_object obj(64);
  auto r = register_region(http, "r", obj.key, 0, 64);
  CHECK(r.status == 501);
  CHECK(r.body.find("Client shared memory is disabled. Start the server with "
                    "'--allow-client-shm=true' to enable.")
        != std::string::npos);
  CHECK(http.post("/v2/systemsharedmemory/unregister", "").status == 501);
  auto status = http.get("/v2/systemsharedmemory/status");
  CHECK(status.status == 200);
  CHECK(status.body == "[]");
}
