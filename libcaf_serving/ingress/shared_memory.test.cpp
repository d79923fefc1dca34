#include "ingress/shared_memory.hpp"
#include "support/shm_object.hpp"

#include "ingress/kserve_codec.hpp"
#include "ingress/shm_api.hpp"
#include "ingress/shm_tensors.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

using caf_serving::support::shm_object;

shared_memory_config allowed(size_t max_regions = 64) {
  shared_memory_config c;
  c.allow_client_shm = true;
  c.max_regions = max_regions;
  return c;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

shm_api_response call(shared_memory_registry& r, shm_method m, std::vector<std::string> parts,
                      std::string_view body = {}) {
  return handle_shared_memory_request(r, {m, std::move(parts), body});
}

model_config simple_model() {
  model_config m;
  m.name = "simple";
  m.max_batch_size = 8;
  tensor_config in0{"INPUT0", datatype::int32, {16}};
  tensor_config in1{"INPUT1", datatype::int32, {16}};
  m.inputs = {in0, in1};
  tensor_config out0{"OUTPUT0", datatype::int32, {16}};
  m.outputs = {out0};
  return m;
}

result<infer_request> parse_json(const std::string& json) {
  parse_input in;
  in.body = json;
  return parse_infer_request(in);
}

} // namespace

TEST_CASE("a registered region maps the window of the object, at any offset") {
  shm_object obj(3 * 4096 + 100);
  for (size_t i = 0; i < obj.size; ++i)
    obj.data[i] = static_cast<char>(i % 251);
  shared_memory_registry regions(allowed());
  // 4100 is not a multiple of the page size, which mmap needs: the mapping
  // starts at the page and the window 4 bytes into it.
  auto ok = regions.register_system("r", obj.key, 4100, 64);
  REQUIRE(ok);
  auto s = regions.slice("r", 10, 20);
  REQUIRE(s);
  CHECK(s->size == 20);
  for (size_t i = 0; i < 20; ++i)
    CHECK(static_cast<unsigned char>(s->data[i]) == (4100 + 10 + i) % 251);
  // Writes reach the client's object.
  char out[4] = {1, 2, 3, 4};
  CHECK(copy_to_shared_memory(s->data, out, 4));
  CHECK(std::memcmp(obj.data + 4110, out, 4) == 0);
}

TEST_CASE("registering answers Triton's errors, with guidance after them") {
  shm_object obj(64);
  shared_memory_registry regions(allowed());
  REQUIRE(regions.register_system("r", obj.key, 0, 64));

  auto twice = regions.register_system("r", obj.key, 0, 64);
  REQUIRE_FALSE(twice);
  CHECK(twice.error().status == status_code::bad_request);
  CHECK(contains(twice.error().message, "shared memory region 'r' already in manager"));

  auto missing = regions.register_system("m", "/caf_serving_no_such_object", 0, 8);
  REQUIRE_FALSE(missing);
  CHECK(contains(missing.error().message,
                 "Unable to open shared memory region: '/caf_serving_no_such_object'"));
  CHECK(contains(missing.error().message, "create it first"));

  for (auto [offset, size] : {std::pair<uint64_t, uint64_t>{0, 65}, {1, 64}, {64, 1},
                              {~uint64_t{0}, 2}}) {
    auto past = regions.register_system("p", obj.key, offset, size);
    REQUIRE_FALSE(past);
    CHECK(past.error().status == status_code::bad_request);
    CHECK(contains(past.error().message, "failed to register shared memory region 'p': invalid args"));
  }
  auto empty = regions.register_system("z", obj.key, 0, 0);
  REQUIRE_FALSE(empty);
  CHECK(contains(empty.error().message, "invalid args"));

  for (const char* key : {"", "/", "//", "/a/b", "/..", "../etc"}) {
    auto bad = regions.register_system("k", key, 0, 8);
    REQUIRE_FALSE(bad);
    CHECK(contains(bad.error().message, "cannot register shared memory region 'k' - invalid shm key"));
  }
  CHECK(regions.size() == 1);
}

TEST_CASE("the region limit is an answer, and unregistering frees a place") {
  shm_object obj(64);
  shared_memory_registry regions(allowed(2));
  REQUIRE(regions.register_system("a", obj.key, 0, 8));
  REQUIRE(regions.register_system("b", obj.key, 8, 8));
  auto third = regions.register_system("c", obj.key, 16, 8);
  REQUIRE_FALSE(third);
  CHECK(contains(third.error().message, "--shm-region-limit"));
  regions.unregister("a", region_kind::system);
  CHECK(regions.register_system("c", obj.key, 16, 8));
}

TEST_CASE("slices are bounds-checked as Triton checks them") {
  shm_object obj(64);
  shared_memory_registry regions(allowed());
  REQUIRE(regions.register_system("r", obj.key, 0, 64));
  auto unknown = regions.slice("nope", 0, 4);
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().status == status_code::not_found);
  CHECK(contains(unknown.error().message, "Unable to find shared memory region: 'nope'"));
  auto offset = regions.slice("r", ~uint64_t{0} - 31, 64);
  REQUIRE_FALSE(offset);
  CHECK(contains(offset.error().message, "Invalid offset for shared memory region: 'r'"));
  auto overflow = regions.slice("r", 32, ~uint64_t{0} - 31);
  REQUIRE_FALSE(overflow);
  CHECK(contains(overflow.error().message, "Integer overflow detected: byte_size "));
  auto past = regions.slice("r", 1, 64);
  REQUIRE_FALSE(past);
  CHECK(contains(past.error().message, "Invalid offset + byte size for shared memory region: 'r'"));
  CHECK(regions.slice("r", 0, 64));
  CHECK(regions.slice("r", 63, 1));
}

TEST_CASE("a region unregistered while in use stays until its last slice goes, as in Triton") {
  auto obj = std::make_unique<shm_object>(4096);
  std::memset(obj->data, 7, 4096);
  shared_memory_registry regions(allowed());
  REQUIRE(regions.register_system("r", obj->key, 0, 4096));
  REQUIRE(regions.register_system("idle", obj->key, 0, 8));
  auto s = std::make_unique<region_slice>(*regions.slice("r", 0, 4096));
  auto second = std::make_unique<region_slice>(*regions.slice("r", 0, 8));
  regions.unregister_all(region_kind::system);
  // "idle" had no user and went at once; "r" is still listed, usable, and
  // its name taken.
  auto listed = regions.status(std::nullopt, region_kind::system);
  REQUIRE(listed);
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].name == "r");
  CHECK(regions.slice("r", 0, 8));
  CHECK_FALSE(regions.register_system("r", obj->key, 0, 8));
  second.reset();
  CHECK(regions.size() == 1);
  obj.reset(); // the client unmaps and unlinks its object too
  std::vector<char> copy(4096);
  REQUIRE(copy_from_shared_memory(copy.data(), s->data, copy.size()));
  CHECK(copy[4095] == 7);
  s.reset(); // the last use: "r" goes without another unregister
  CHECK(regions.size() == 0);
  CHECK_FALSE(regions.slice("r", 0, 8));
}

TEST_CASE("a slice may outlive its registry") {
  shm_object obj(64);
  std::optional<region_slice> s;
  {
    shared_memory_registry regions(allowed());
    REQUIRE(regions.register_system("r", obj.key, 0, 64));
    s = *regions.slice("r", 0, 64);
  }
  obj.data[3] = 42;
  CHECK(s->data[3] == 42);
  s.reset();
}

TEST_CASE("keys with Triton's reserved prefix are refused as Triton refuses them") {
  shared_memory_registry regions(allowed());
  for (const char* key : {"triton_python_backend_shm_region_x", "//triton_python_backend_shm_region_x"}) {
    auto r = regions.register_system("n", key, 0, 8);
    REQUIRE_FALSE(r);
    CHECK(contains(r.error().message, "cannot register shared memory region 'n' with key '"
                                        + std::string(key)
                                        + "' as the key contains the reserved prefix "
                                          "'triton_python_backend_shm_region_'"));
  }
}

TEST_CASE("a region truncated under its mapping fails the copy instead of the process") {
  shm_object obj(2 * 4096);
  shared_memory_registry regions(allowed());
  REQUIRE(regions.register_system("r", obj.key, 0, 2 * 4096));
  auto s = regions.slice("r", 0, 2 * 4096);
  REQUIRE(s);
  REQUIRE(ftruncate(obj.fd, 0) == 0); // the client shrinks its object
  std::vector<char> copy(2 * 4096);
  CHECK_FALSE(copy_from_shared_memory(copy.data(), s->data, copy.size()));
  CHECK_FALSE(copy_to_shared_memory(s->data, copy.data(), copy.size()));
  // Memory that does not fault still copies after a fault was caught.
  char a[8] = "abcdefg", b[8] = {};
  CHECK(copy_from_shared_memory(b, a, 8));
  CHECK(std::string(b) == "abcdefg");
}

TEST_CASE("the endpoints: register, status, unregister in Triton's shapes") {
  shm_object obj(128);
  shared_memory_registry regions(allowed());
  auto r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "region", "in%200", "register"},
                "{\"key\":\"" + obj.key + "\",\"offset\":16,\"byte_size\":64}");
  CHECK(r.status == 200);
  CHECK(r.body.empty());
  r = call(regions, shm_method::get, {"v2", "systemsharedmemory", "status"});
  CHECK(r.status == 200);
  CHECK(r.body == "[{\"name\":\"in 0\",\"key\":\"" + obj.key + "\",\"offset\":16,\"byte_size\":64}]");
  r = call(regions, shm_method::get, {"v2", "systemsharedmemory", "region", "other", "status"});
  CHECK(r.status == 404);
  CHECK(contains(r.body, "Unable to find system shared memory region: 'other'"));
  r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "region", "x", "register"},
           "{\"offset\":0,\"byte_size\":8}");
  CHECK(r.status == 400);
  CHECK(contains(r.body, "Shared memory register request has no 'key' field"));
  r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "region", "x", "register"},
           "{\"key\":\"" + obj.key + "\"}");
  CHECK(r.status == 400);
  CHECK(contains(r.body, "Shared memory register request has no 'byte_size' field"));
  r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "region", "x", "register"},
           "{\"key\":\"" + obj.key + "\",\"byte_size\":-1}");
  CHECK(r.status == 400);
  r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "region", "x", "register"}, "[1");
  CHECK(r.status == 400);
  CHECK(contains(r.body, "not a JSON object"));
  r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "register"}, "{}");
  CHECK(r.status == 400);
  CHECK(contains(r.body, "'region name' is necessary to register system shared memory region"));
  r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "status"});
  CHECK(r.status == 405);
  r = call(regions, shm_method::get, {"v2", "systemsharedmemory", "region", "x", "bogus"});
  CHECK(r.status == 404);
  r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "region", "gone", "unregister"});
  CHECK(r.status == 200); // nothing to do is no error, as in Triton
  r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "unregister"});
  CHECK(r.status == 200);
  CHECK(call(regions, shm_method::get, {"v2", "systemsharedmemory", "status"}).body == "[]");
}

TEST_CASE("without --allow-client-shm, register and unregister answer Triton's 501") {
  shm_object obj(64);
  shared_memory_registry regions({});
  for (auto action : {"register", "unregister"}) {
    auto r = call(regions, shm_method::post, {"v2", "systemsharedmemory", "region", "r", action},
                  "{\"key\":\"" + obj.key + "\",\"byte_size\":8}");
    CHECK(r.status == 501);
    CHECK(contains(r.body, "Client shared memory is disabled. Start the server with "
                           "'--allow-client-shm=true' to enable."));
  }
  CHECK(call(regions, shm_method::get, {"v2", "systemsharedmemory", "status"}).body == "[]");
  CHECK(regions.size() == 0);
}

TEST_CASE("CUDA shared memory answers as a Triton without GPUs") {
  shm_object obj(64);
  shared_memory_registry regions(allowed());
  REQUIRE(regions.register_system("sys", obj.key, 0, 8));
  auto r = call(regions, shm_method::get, {"v2", "cudasharedmemory", "status"});
  CHECK(r.status == 200);
  CHECK(r.body == "[]");
  r = call(regions, shm_method::post, {"v2", "cudasharedmemory", "region", "g", "register"},
           "{\"raw_handle\":{\"b64\":\"\"},\"device_id\":0,\"byte_size\":8}");
  CHECK(r.status == 400);
  CHECK(contains(r.body, "failed to register CUDA shared memory region: 'g', GPUs not supported"));
  r = call(regions, shm_method::get, {"v2", "cudasharedmemory", "region", "sys", "status"});
  CHECK(r.status == 404);
  CHECK(contains(r.body, "is registered as system shared memory, not CUDA shared memory"));
  r = call(regions, shm_method::post, {"v2", "cudasharedmemory", "unregister"});
  CHECK(r.status == 200);
  CHECK(regions.size() == 1); // a CUDA unregister leaves system regions alone
}

TEST_CASE("the codec reads the shared-memory parameters of inputs and outputs") {
  auto req = parse_json(
    "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1,16],\"parameters\":"
    "{\"shared_memory_region\":\"in\",\"shared_memory_offset\":8,\"shared_memory_byte_size\":64}}],"
    "\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"shared_memory_region\":\"out\","
    "\"shared_memory_byte_size\":64}}]}");
  REQUIRE(req);
  REQUIRE(req->inputs[0].shared_memory);
  CHECK(req->inputs[0].shared_memory->region == "in");
  CHECK(req->inputs[0].shared_memory->offset == 8);
  CHECK(req->inputs[0].shared_memory->byte_size == 64);
  CHECK(req->inputs[0].data.empty());
  REQUIRE(req->outputs[0].shared_memory);
  CHECK(req->outputs[0].shared_memory->region == "out");
  CHECK(req->outputs[0].shared_memory->offset == 0);

  auto both = parse_json(
    "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1],\"data\":[1],"
    "\"parameters\":{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":4}}]}");
  REQUIRE_FALSE(both);
  CHECK(contains(both.error().message,
                 "Input must set only one of the following fields: 'data', 'binary_data_size' "
                 "in 'parameters', 'shared_memory_region' in 'parameters'. But set 'data' "
                 "'shared_memory_region'"));
  auto no_size = parse_json(
    "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1],"
    "\"parameters\":{\"shared_memory_region\":\"in\"}}]}");
  REQUIRE_FALSE(no_size);
  CHECK(contains(no_size.error().message, "no shared_memory_byte_size"));
  auto bad_offset = parse_json(
    "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1],\"parameters\":"
    "{\"shared_memory_region\":\"in\",\"shared_memory_offset\":-1,\"shared_memory_byte_size\":4}}]}");
  REQUIRE_FALSE(bad_offset);
  CHECK(contains(bad_offset.error().message, "Unable to parse 'shared_memory_offset'"));
  auto cls = parse_json(
    "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1],\"data\":[1]}],"
    "\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"shared_memory_region\":\"out\","
    "\"shared_memory_byte_size\":64,\"classification\":2}}]}");
  REQUIRE_FALSE(cls);
  CHECK(contains(cls.error().message,
                 "Output can't set both 'shared_memory_region' and 'classification'"));
  auto bin = parse_json(
    "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1],\"data\":[1]}],"
    "\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"shared_memory_region\":\"out\","
    "\"shared_memory_byte_size\":64,\"binary_data\":true}}]}");
  REQUIRE_FALSE(bin);
  CHECK(contains(bin.error().message, "Output can't set both 'shared_memory_region' and 'binary_data'"));
}

TEST_CASE("an output in shared memory is answered with its name, datatype and shape only") {
  int32_t values[2] = {5, 6};
  response_view view;
  view.model_name = "simple";
  view.model_version = "1";
  view.outputs.push_back({"OUTPUT0", datatype::int32, {1, 2},
                          std::string_view(reinterpret_cast<const char*>(values), 8)});
  view.outputs.push_back({"OUTPUT1", datatype::int32, {1, 2},
                          std::string_view(reinterpret_cast<const char*>(values), 8)});
  serialize_options opts;
  requested_output out0;
  out0.name = "OUTPUT0";
  out0.shared_memory = shared_memory_ref{"out", 0, 8};
  opts.requested = {out0};
  auto r = serialize_infer_response(view, opts);
  REQUIRE(r);
  CHECK(r->body
        == "{\"model_name\":\"simple\",\"model_version\":\"1\",\"outputs\":["
           "{\"name\":\"OUTPUT0\",\"datatype\":\"INT32\",\"shape\":[1,2]},"
           "{\"name\":\"OUTPUT1\",\"datatype\":\"INT32\",\"shape\":[1,2],\"data\":[5,6]}]}");
}

TEST_CASE("binding reads inputs from their regions and writes outputs into theirs") {
  shm_object obj(4096);
  auto* ints = reinterpret_cast<int32_t*>(obj.data);
  for (int i = 0; i < 16; ++i)
    ints[i] = i * 3;
  shared_memory_registry regions(allowed());
  REQUIRE(regions.register_system("in", obj.key, 0, 64));
  REQUIRE(regions.register_system("out", obj.key, 1024, 128));
  auto model = simple_model();
  auto json = [](uint64_t in_size, uint64_t out_size) {
    return "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[1,16],"
           "\"parameters\":{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":"
           + std::to_string(in_size)
           + "}}],\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"shared_memory_region\":"
             "\"out\",\"shared_memory_offset\":4,\"shared_memory_byte_size\":"
           + std::to_string(out_size) + "}}]}";
  };
  auto req = parse_json(json(64, 64));
  REQUIRE(req);
  auto bound = bind_shared_memory(*req, regions, model);
  REQUIRE(bound);
  REQUIRE(req->inputs[0].data.size() == 64);
  std::vector<char> message(64);
  REQUIRE(copy_input_data(message.data(), req->inputs[0]));
  CHECK(std::memcmp(message.data(), obj.data, 64) == 0);

  int32_t result_values[16];
  for (int i = 0; i < 16; ++i)
    result_values[i] = 100 + i;
  response_view view;
  view.outputs.push_back({"OUTPUT0", datatype::int32, {1, 16},
                          std::string_view(reinterpret_cast<const char*>(result_values), 64)});
  REQUIRE(bound->write_outputs(view));
  CHECK(std::memcmp(obj.data + 1024 + 4, result_values, 64) == 0);

  // A window smaller than the output: Triton's phrase, nothing written.
  auto small = parse_json(json(64, 60));
  REQUIRE(small);
  auto small_bound = bind_shared_memory(*small, regions, model);
  REQUIRE(small_bound);
  auto refused = small_bound->write_outputs(view);
  REQUIRE_FALSE(refused);
  CHECK(contains(refused.error().message,
                 "shared memory size specified with the request for output 'OUTPUT0' (60 bytes) "
                 "should be at least 64 bytes to hold the results"));

  // An input window of the wrong size: Triton's phrase.
  auto wrong = parse_json(json(32, 64));
  REQUIRE(wrong);
  auto mismatch = bind_shared_memory(*wrong, regions, model);
  REQUIRE_FALSE(mismatch);
  CHECK(contains(mismatch.error().message,
                 "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 32"));
  // A window outside the region.
  auto outside = parse_json(json(64, 128));
  REQUIRE(outside);
  auto past = bind_shared_memory(*outside, regions, model);
  REQUIRE_FALSE(past);
  CHECK(contains(past.error().message, "Invalid offset + byte size for shared memory region: 'out'"));
}

TEST_CASE("a BYTES input is copied out of its region before anything reads its lengths") {
  shm_object obj(4096);
  std::string elements;
  for (std::string e : {"ab", "cde"}) {
    uint32_t n = static_cast<uint32_t>(e.size());
    elements.append(reinterpret_cast<const char*>(&n), 4);
    elements += e;
  }
  std::memcpy(obj.data, elements.data(), elements.size());
  shared_memory_registry regions(allowed());
  REQUIRE(regions.register_system("in", obj.key, 0, 4096));
  model_config model;
  model.name = "identity_bytes";
  model.inputs = {tensor_config{"INPUT0", datatype::bytes, {-1}}};
  auto req = parse_json(
    "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"BYTES\",\"shape\":[2],\"parameters\":"
    "{\"shared_memory_region\":\"in\",\"shared_memory_byte_size\":"
    + std::to_string(elements.size()) + "}}]}");
  REQUIRE(req);
  auto bound = bind_shared_memory(*req, regions, model);
  REQUIRE(bound);
  CHECK(req->inputs[0].owns_data());
  CHECK(req->inputs[0].data == elements);
  // Later writes to the region do not change what the request carries.
  obj.data[4] = 'X';
  CHECK(req->inputs[0].data == elements);
}
