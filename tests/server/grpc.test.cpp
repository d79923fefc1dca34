/// The KServe gRPC ingress end to end: the caf-serving binary on loopback
/// ports, and a C++ client built from the same schemas/grpc_service.proto.

#include "server_test.hpp"

#include "support/shm_object.hpp"

#include "grpc_service.grpc.pb.h"

#include <doctest/doctest.h>
#include <grpcpp/grpcpp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

using namespace caf_serving::server_test;
namespace pb = inference;

namespace {

using stub_ptr = std::unique_ptr<pb::GRPCInferenceService::Stub>;

/// A stub on a connection of its own (channels with the same arguments would
/// otherwise share one).
stub_ptr connect(uint16_t port, grpc_compression_algorithm compression = GRPC_COMPRESS_NONE) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);
  if (compression != GRPC_COMPRESS_NONE)
    args.SetCompressionAlgorithm(compression);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  return pb::GRPCInferenceService::NewStub(channel);
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <class T>
std::vector<T> values_of(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

pb::ModelInferRequest::InferInputTensor* add_input(pb::ModelInferRequest& r, const char* name,
                                                   const char* dtype,
                                                   std::vector<int64_t> shape) {
  auto* t = r.add_inputs();
  t->set_name(name);
  t->set_datatype(dtype);
  for (auto d : shape)
    t->add_shape(d);
  return t;
}

/// A request to `simple` (INT32 [1,16] + [1,16] -> sum, difference) with
/// raw contents.
pb::ModelInferRequest simple_request(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                                     const std::string& id = "") {
  pb::ModelInferRequest r;
  r.set_model_name("simple");
  r.set_id(id);
  add_input(r, "INPUT0", "INT32", {1, 16});
  add_input(r, "INPUT1", "INT32", {1, 16});
  r.add_raw_input_contents(raw_bytes(a));
  r.add_raw_input_contents(raw_bytes(b));
  return r;
}

std::vector<int32_t> iota16(int32_t from) {
  std::vector<int32_t> v(16);
  for (int i = 0; i < 16; ++i)
    v[i] = from + i;
  return v;
}

/// The raw contents of output `name` of `r`.
std::string output_bytes(const pb::ModelInferResponse& r, const std::string& name) {
  for (int i = 0; i < r.outputs_size(); ++i)
    if (r.outputs(i).name() == name && i < r.raw_output_contents_size())
      return r.raw_output_contents(i);
  return {};
}

std::vector<int32_t> sum(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::vector<int32_t> out(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    out[i] = a[i] + b[i];
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("health, server and model metadata, model configuration") {
  test_server server({example_model("simple")});
  REQUIRE(server.process->grpc_port() != 0);
  auto stub = connect(server.process->grpc_port());
  {
    grpc::ClientContext ctx;
    pb::ServerLiveResponse live;
    REQUIRE(stub->ServerLive(&ctx, {}, &live).ok());
    CHECK(live.live());
  }
  {
    grpc::ClientContext ctx;
    pb::ServerReadyResponse ready;
    REQUIRE(stub->ServerReady(&ctx, {}, &ready).ok());
    CHECK(ready.ready());
  }
  {
    grpc::ClientContext ctx;
    pb::ServerMetadataResponse meta;
    REQUIRE(stub->ServerMetadata(&ctx, {}, &meta).ok());
    CHECK(meta.name() == "triton");
    std::vector<std::string> ext(meta.extensions().begin(), meta.extensions().end());
    CHECK(std::find(ext.begin(), ext.end(), "model_repository") != ext.end());
  }
  {
    grpc::ClientContext ctx;
    pb::ModelMetadataRequest req;
    req.set_name("simple");
    pb::ModelMetadataResponse meta;
    REQUIRE(stub->ModelMetadata(&ctx, req, &meta).ok());
    CHECK(meta.name() == "simple");
    REQUIRE(meta.versions_size() == 1);
    CHECK(meta.versions(0) == "1");
    REQUIRE(meta.inputs_size() == 2);
    CHECK(meta.inputs(0).datatype() == "INT32");
    CHECK(std::vector<int64_t>(meta.inputs(0).shape().begin(), meta.inputs(0).shape().end())
          == std::vector<int64_t>{-1, 16});
  }
  {
    grpc::ClientContext ctx;
    pb::ModelConfigRequest req;
    req.set_name("simple");
    pb::ModelConfigResponse config;
    auto status = stub->ModelConfig(&ctx, req, &config);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
    CHECK(config.config().name() == "simple");
    CHECK(config.config().max_batch_size() == 8);
    REQUIRE(config.config().input_size() == 2);
    CHECK(config.config().input(0).dims(0) == 16);
  }
  {
    grpc::ClientContext ctx;
    pb::ModelReadyRequest req;
    req.set_name("simple");
    pb::ModelReadyResponse ready;
    REQUIRE(stub->ModelReady(&ctx, req, &ready).ok());
    CHECK(ready.ready());
  }
  {
    grpc::ClientContext ctx;
    pb::ModelReadyRequest req;
    req.set_name("no_such_model");
    pb::ModelReadyResponse ready;
    REQUIRE(stub->ModelReady(&ctx, req, &ready).ok());
    CHECK_FALSE(ready.ready());
  }
  {
    grpc::ClientContext ctx;
    pb::ModelMetadataRequest req;
    req.set_name("no_such_model");
    pb::ModelMetadataResponse meta;
    auto status = stub->ModelMetadata(&ctx, req, &meta);
    CHECK(status.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(contains(status.error_message(), "'no_such_model'"));
  }
}

TEST_CASE("inference with raw contents, typed contents, BYTES and classification") {
  test_server server({example_model("simple"), example_model("simple_string"),
                      test_model("classifier")});
  auto stub = connect(server.process->grpc_port());
  auto a = iota16(0), b = iota16(100);

  SUBCASE("raw contents, with stage times") {
    auto request = simple_request(a, b, "r1");
    (*request.mutable_parameters())["timing"].set_bool_param(true);
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, request, &reply);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
    CHECK(reply.model_name() == "simple");
    CHECK(reply.model_version() == "1");
    CHECK(reply.id() == "r1");
    CHECK(values_of<int32_t>(output_bytes(reply, "OUTPUT0")) == sum(a, b));
    REQUIRE(reply.outputs_size() == 2);
    CHECK(std::vector<int64_t>(reply.outputs(0).shape().begin(), reply.outputs(0).shape().end())
          == std::vector<int64_t>{1, 16});
    // As HTTP's timing=true: the stages, and the whole time at least their sum.
    const auto& p = reply.parameters();
    REQUIRE(p.count("until_response_us") == 1);
    REQUIRE(p.count("compute_infer_us") == 1);
    CHECK(p.at("until_response_us").uint64_param() >= p.at("compute_infer_us").uint64_param());
  }
  SUBCASE("typed contents, one output asked for") {
    pb::ModelInferRequest r;
    r.set_model_name("simple");
    auto* x = add_input(r, "INPUT0", "INT32", {1, 16});
    auto* y = add_input(r, "INPUT1", "INT32", {1, 16});
    for (int i = 0; i < 16; ++i) {
      x->mutable_contents()->add_int_contents(a[i]);
      y->mutable_contents()->add_int_contents(b[i]);
    }
    r.add_outputs()->set_name("OUTPUT1");
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
    REQUIRE(reply.outputs_size() == 1);
    CHECK(reply.outputs(0).name() == "OUTPUT1");
    auto diff = values_of<int32_t>(reply.raw_output_contents(0));
    REQUIRE(diff.size() == 16);
    for (int i = 0; i < 16; ++i)
      CHECK(diff[i] == a[i] - b[i]);
  }
  SUBCASE("BYTES in bytes_contents") {
    pb::ModelInferRequest r;
    r.set_model_name("simple_string");
    auto* x = add_input(r, "INPUT0", "BYTES", {1, 16});
    auto* y = add_input(r, "INPUT1", "BYTES", {1, 16});
    for (int i = 0; i < 16; ++i) {
      x->mutable_contents()->add_bytes_contents(std::to_string(i));
      y->mutable_contents()->add_bytes_contents("1");
    }
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
    auto out = output_bytes(reply, "OUTPUT0");
    // 4-byte little-endian length, then the element's bytes.
    std::vector<std::string> elements;
    for (size_t at = 0; at + 4 <= out.size();) {
      uint32_t n = 0;
      std::memcpy(&n, out.data() + at, 4);
      elements.push_back(out.substr(at + 4, n));
      at += 4 + n;
    }
    REQUIRE(elements.size() == 16);
    for (int i = 0; i < 16; ++i)
      CHECK(elements[i] == std::to_string(i + 1));
  }
  SUBCASE("classification as HTTP does it") {
    pb::ModelInferRequest r;
    r.set_model_name("classifier");
    add_input(r, "INPUT0", "FP32", {1, 5});
    r.add_raw_input_contents(raw_bytes(std::vector<float>{0.1f, 0.9f, 0.3f, 0.7f, 0.2f}));
    auto* o = r.add_outputs();
    o->set_name("OUTPUT0");
    (*o->mutable_parameters())["classification"].set_int64_param(2);
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
    REQUIRE(reply.outputs_size() == 1);
    CHECK(reply.outputs(0).datatype() == "BYTES");
    auto out = reply.raw_output_contents(0);
    // Highest first: index 1 (0.9), then index 3 (0.7), with their labels.
    CHECK(contains(out, ":1:"));
    CHECK(out.find(":1:") < out.find(":3:"));
  }
}

TEST_CASE("bad requests are INVALID_ARGUMENT or NOT_FOUND with a message saying what is wrong") {
  test_server server({example_model("simple")});
  auto stub = connect(server.process->grpc_port());
  auto a = iota16(0);

  SUBCASE("wrong shape") {
    auto r = simple_request(a, a);
    r.mutable_inputs(0)->set_shape(1, 8);
    r.set_raw_input_contents(0, raw_bytes(std::vector<int32_t>(8, 1)));
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(contains(status.error_message(), "Expected [-1,16], got [1,8]"));
  }
  SUBCASE("wrong datatype") {
    auto r = simple_request(a, a);
    r.mutable_inputs(1)->set_datatype("FP32");
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(contains(status.error_message(), "INPUT1"));
    CHECK(contains(status.error_message(), "INT32"));
  }
  SUBCASE("unknown model") {
    auto r = simple_request(a, a);
    r.set_model_name("no_such_model");
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    CHECK(status.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(contains(status.error_message(), "'no_such_model'"));
  }
  SUBCASE("a version that is not a number") {
    auto r = simple_request(a, a);
    r.set_model_version("latest");
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(contains(status.error_message(), "'latest'"));
  }
  // The server kept running.
  grpc::ClientContext ctx;
  pb::ModelInferResponse reply;
  CHECK(stub->ModelInfer(&ctx, simple_request(a, a), &reply).ok());
}

TEST_CASE("a message over --max-body-bytes is RESOURCE_EXHAUSTED naming the flag") {
  test_server server({example_model("identity_fp32")}, {"--max-body-bytes", "8192"});
  auto stub = connect(server.process->grpc_port());
  pb::ModelInferRequest r;
  r.set_model_name("identity_fp32");
  add_input(r, "INPUT0", "FP32", {160, 16});
  r.add_raw_input_contents(std::string(160 * 16 * 4, '\0')); // 10240 bytes
  grpc::ClientContext ctx;
  pb::ModelInferResponse reply;
  auto status = stub->ModelInfer(&ctx, r, &reply);
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(contains(status.error_message(), "--max-body-bytes"));
  // Far past the limit grpc refuses it itself, still RESOURCE_EXHAUSTED.
  r.set_raw_input_contents(0, std::string(100000, '\0'));
  grpc::ClientContext ctx2;
  CHECK(stub->ModelInfer(&ctx2, r, &reply).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_CASE("a stream answers every request in order, a failed one in error_message") {
  test_server server({example_model("simple")});
  auto stub = connect(server.process->grpc_port());
  grpc::ClientContext ctx;
  auto stream = stub->ModelStreamInfer(&ctx);
  constexpr int n = 40;
  constexpr int bad = 17;
  // Written from one thread while this one reads: the server answers while
  // requests are still coming.
  std::thread writer([&] {
    for (int i = 0; i < n; ++i) {
      auto r = simple_request(iota16(i), iota16(1000 * i), "s" + std::to_string(i));
      if (i == bad)
        r.set_model_name("no_such_model");
      stream->Write(r);
    }
    stream->WritesDone();
  });
  pb::ModelStreamInferResponse answer;
  int got = 0;
  while (stream->Read(&answer)) {
    if (got == bad) {
      CHECK(contains(answer.error_message(), "'no_such_model'"));
    } else {
      CHECK(answer.error_message().empty());
      const auto& reply = answer.infer_response();
      CHECK(reply.id() == "s" + std::to_string(got));
      CHECK(values_of<int32_t>(output_bytes(reply, "OUTPUT0"))
            == sum(iota16(got), iota16(1000 * got)));
    }
    ++got;
  }
  writer.join();
  CHECK(got == n);
  CHECK(stream->Finish().ok());
}

namespace {

/// Threads of process `pid` named `name` (/proc/PID/task/*/comm).
int threads_named(pid_t pid, const std::string& name) {
  int n = 0;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name)
      ++n;
  }
  return n;
}

/// One unary call and a stream of 20 on `port`; every answer checked.
void check_unary_and_stream(uint16_t port) {
  auto stub = connect(port);
  {
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, simple_request(iota16(3), iota16(40), "u"), &reply);
    REQUIRE(status.ok());
    CHECK(reply.id() == "u");
    CHECK(values_of<int32_t>(output_bytes(reply, "OUTPUT0")) == sum(iota16(3), iota16(40)));
  }
  grpc::ClientContext ctx;
  auto stream = stub->ModelStreamInfer(&ctx);
  constexpr int n = 20;
  for (int i = 0; i < n; ++i)
    REQUIRE(stream->Write(simple_request(iota16(i), iota16(7 * i), "s" + std::to_string(i))));
  stream->WritesDone();
  pb::ModelStreamInferResponse answer;
  int got = 0;
  while (stream->Read(&answer)) {
    CHECK(answer.error_message().empty());
    CHECK(answer.infer_response().id() == "s" + std::to_string(got));
    CHECK(values_of<int32_t>(output_bytes(answer.infer_response(), "OUTPUT0"))
          == sum(iota16(got), iota16(7 * got)));
    ++got;
  }
  CHECK(got == n);
  CHECK(stream->Finish().ok());
}

/// Control calls on `port`, those answered at once and a load (a reload here)
/// answered from the loader thread (the server runs with the model control
/// API open).
void check_control_calls(uint16_t port) {
  auto stub = connect(port);
  {
    grpc::ClientContext ctx;
    pb::ServerReadyResponse r;
    REQUIRE(stub->ServerReady(&ctx, {}, &r).ok());
    CHECK(r.ready());
  }
  {
    grpc::ClientContext ctx;
    pb::ModelMetadataRequest req;
    req.set_name("simple");
    pb::ModelMetadataResponse r;
    REQUIRE(stub->ModelMetadata(&ctx, req, &r).ok());
    CHECK(r.inputs_size() == 2);
  }
  {
    grpc::ClientContext ctx;
    pb::ModelReadyRequest req;
    req.set_name("no_such_model");
    pb::ModelReadyResponse r;
    auto status = stub->ModelReady(&ctx, req, &r);
    CHECK((status.ok() && !r.ready()));
  }
  {
    grpc::ClientContext ctx;
    pb::RepositoryModelLoadRequest req;
    req.set_model_name("simple");
    (*req.mutable_parameters())["bogus"].set_bool_param(true);
    pb::RepositoryModelLoadResponse r;
    auto status = stub->RepositoryModelLoad(&ctx, req, &r);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(contains(status.error_message(), "unknown load parameter 'bogus'"));
  }
  {
    grpc::ClientContext ctx;
    pb::RepositoryModelLoadRequest req;
    req.set_model_name("identity_fp32");
    pb::RepositoryModelLoadResponse r;
    auto status = stub->RepositoryModelLoad(&ctx, req, &r);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
  }
  grpc::ClientContext ctx;
  pb::ModelReadyRequest req;
  req.set_name("identity_fp32");
  pb::ModelReadyResponse r;
  REQUIRE(stub->ModelReady(&ctx, req, &r).ok());
  CHECK(r.ready());
}

} // namespace

TEST_CASE("--grpc-threads N serves every call on N completion-queue threads") {
  std::vector<fs::path> models = {example_model("simple"), example_model("identity_fp32")};
  test_server server(models, model_control_api({"--grpc-threads", "3"}));
  CHECK(threads_named(server.process->pid(), "grpc-cq") == 3);
  // No call is on the callback API: grpc 1.51 would start two threads of
  // its own that poll the sockets beside grpc-cq (control_calls.hpp).
  CHECK(threads_named(server.process->pid(), "nexting_thread") == 0);
  check_unary_and_stream(server.process->grpc_port());
  check_control_calls(server.process->grpc_port());
}

TEST_CASE("--grpc-threads 0 (grpc's callback API, removed) is an error at start") {
  temp_repository repo;
  repo.add_model(example_model("simple"));
  child_process child({{CAF_SERVING_BINARY, "--model-repository", repo.path().string(),
                        "--http-port", "0", "--metrics-port", "0", "--grpc-threads", "0"},
                       true});
  auto status = child.wait_exit(std::chrono::seconds(20));
  CHECK(status == 2);
  CHECK_MESSAGE(contains(child.output(), "--grpc-threads: 0 (grpc's callback API) is no longer "
                                         "served; give 1 to 256"),
                child.output());
}

TEST_CASE("--grpc-max-open-calls bounds the calls and streams open in the server: past it "
          "UNAVAILABLE naming the flag") {
  for (const char* threads : {"1", "2"}) {
    CAPTURE(threads);
    test_server server({example_model("simple")},
                       {"--grpc-max-open-calls", "2", "--grpc-threads", threads});
    auto port = server.process->grpc_port();
    // Two streams, each shown open by an answer, from two connections.
    std::vector<stub_ptr> stubs;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<std::unique_ptr<grpc::ClientReaderWriter<pb::ModelInferRequest,
                                                         pb::ModelStreamInferResponse>>>
      streams;
    for (int i = 0; i < 2; ++i) {
      stubs.push_back(connect(port));
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      streams.push_back(stubs.back()->ModelStreamInfer(contexts.back().get()));
      REQUIRE(streams.back()->Write(simple_request(iota16(i), iota16(i))));
      pb::ModelStreamInferResponse answer;
      REQUIRE(streams.back()->Read(&answer));
      CHECK(answer.error_message().empty());
    }
    auto stub = connect(port);
    {
      grpc::ClientContext ctx;
      pb::ModelInferResponse reply;
      auto status = stub->ModelInfer(&ctx, simple_request(iota16(1), iota16(2)), &reply);
      CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
      CHECK(contains(status.error_message(), "--grpc-max-open-calls"));
    }
    {
      grpc::ClientContext ctx;
      auto third = stub->ModelStreamInfer(&ctx);
      third->Write(simple_request(iota16(1), iota16(2)));
      pb::ModelStreamInferResponse answer;
      CHECK_FALSE(third->Read(&answer));
      auto status = third->Finish();
      CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
      CHECK(contains(status.error_message(), "--grpc-max-open-calls"));
    }
    // A stream closed makes room again (the server counts it out once its
    // call has ended there, just after the client sees the end).
    streams[0]->WritesDone();
    CHECK(streams[0]->Finish().ok());
    CHECK(eventually([&] {
      grpc::ClientContext ctx;
      pb::ModelInferResponse reply;
      return stub->ModelInfer(&ctx, simple_request(iota16(1), iota16(2)), &reply).ok();
    }));
    streams[1]->WritesDone();
    CHECK(streams[1]->Finish().ok());
  }
}

TEST_CASE("the response cache answers a repeated gRPC request for a model that enables it") {
  temp_repository repo;
  auto config_path = example_model("simple") / "config.pbtxt";
  std::ifstream in(config_path);
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  repo.write_file("simple/config.pbtxt", config + "\nresponse_cache { enable: true }\n");
  repo.write_file("simple/1/model.builtin", "");
  server_process process(server_config{CAF_SERVING_BINARY, repo.path().string(),
                                       {"--cache-config", "local,size=100000"}});
  auto stub = connect(process.grpc_port());
  auto statistics = [&] {
    grpc::ClientContext ctx;
    pb::ModelStatisticsRequest req;
    req.set_name("simple");
    pb::ModelStatisticsResponse stats;
    REQUIRE(stub->ModelStatistics(&ctx, req, &stats).ok());
    REQUIRE(stats.model_stats_size() == 1);
    return stats.model_stats(0);
  };
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    REQUIRE(stub->ModelInfer(&ctx, simple_request(iota16(5), iota16(9), "c" + std::to_string(i)),
                             &reply)
              .ok());
    CHECK(reply.id() == "c" + std::to_string(i));
    CHECK(values_of<int32_t>(output_bytes(reply, "OUTPUT0")) == sum(iota16(5), iota16(9)));
  }
  auto s = statistics();
  CHECK(s.inference_stats().cache_miss().count() == 1);
  CHECK(s.inference_stats().cache_hit().count() == 1);
  CHECK(s.inference_stats().success().count() == 2);
  // The model ran once.
  CHECK(s.inference_count() == 1);
  // Other inputs: a miss.
  grpc::ClientContext ctx;
  pb::ModelInferResponse reply;
  REQUIRE(stub->ModelInfer(&ctx, simple_request(iota16(6), iota16(9)), &reply).ok());
  CHECK(statistics().inference_stats().cache_miss().count() == 2);
}

/// Requests compressed by the client, answers compressed by the server
/// (--grpc-infer-response-compression-level high): both decode to the same
/// tensors. grpc does not show a client which encoding an answer came in.
TEST_CASE("gzip and deflate requests, and compressed answers") {
  test_server server({example_model("simple")},
                     {"--grpc-infer-response-compression-level", "high"});
  auto a = iota16(5), b = iota16(7);
  for (auto algorithm : {GRPC_COMPRESS_GZIP, GRPC_COMPRESS_DEFLATE}) {
    auto stub = connect(server.process->grpc_port(), algorithm);
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, simple_request(a, b), &reply);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
    CHECK(values_of<int32_t>(output_bytes(reply, "OUTPUT0")) == sum(a, b));

  }
}

TEST_CASE("many connections from many threads: every answer matches its request") {
  test_server server({example_model("identity_fp32")});
  constexpr int threads = 8;
  constexpr int per_thread = 60;
  std::atomic<int> matched{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t)
    clients.emplace_back([&, t] {
      // Half the threads on a connection of their own, half sharing by
      // stream: both paths run at once.
      auto stub = connect(server.process->grpc_port());
      for (int i = 0; i < per_thread; ++i) {
        std::vector<float> values(16);
        for (int k = 0; k < 16; ++k)
          values[k] = static_cast<float>(t * 100000 + i * 100 + k);
        pb::ModelInferRequest r;
        r.set_model_name("identity_fp32");
        r.set_id(std::to_string(t) + "/" + std::to_string(i));
        add_input(r, "INPUT0", "FP32", {1, 16});
        if (i % 2 == 0) {
          r.add_raw_input_contents(raw_bytes(values));
        } else {
          for (float v : values)
            r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(v);
        }
        grpc::ClientContext ctx;
        pb::ModelInferResponse reply;
        auto status = stub->ModelInfer(&ctx, r, &reply);
        if (status.ok() && reply.id() == r.id()
            && values_of<float>(output_bytes(reply, "OUTPUT0")) == values)
          ++matched;
        else
          ++failed;
      }
    });
  for (auto& c : clients)
    c.join();
  CHECK(failed.load() == 0);
  CHECK(matched.load() == threads * per_thread);
  // Counted once each, like HTTP's.
  auto stub = connect(server.process->grpc_port());
  grpc::ClientContext ctx;
  pb::ModelStatisticsRequest req;
  req.set_name("identity_fp32");
  pb::ModelStatisticsResponse stats;
  REQUIRE(stub->ModelStatistics(&ctx, req, &stats).ok());
  REQUIRE(stats.model_stats_size() == 1);
  CHECK(stats.model_stats(0).inference_stats().success().count()
        == static_cast<uint64_t>(threads * per_thread));
}

TEST_CASE("a full queue is UNAVAILABLE with Triton's words") {
  test_server server({test_model("slow_queue")});
  auto port = server.process->grpc_port();
  constexpr int n = 6;
  std::vector<std::future<grpc::Status>> calls;
  for (int i = 0; i < n; ++i)
    calls.push_back(std::async(std::launch::async, [port] {
      auto stub = connect(port);
      pb::ModelInferRequest r;
      r.set_model_name("slow_queue");
      add_input(r, "INPUT0", "FP32", {1, 2});
      r.add_raw_input_contents(raw_bytes(std::vector<float>{1, 2}));
      grpc::ClientContext ctx;
      pb::ModelInferResponse reply;
      return stub->ModelInfer(&ctx, r, &reply);
    }));
  int ok = 0, full = 0;
  for (auto& c : calls) {
    auto status = c.get();
    if (status.ok())
      ++ok;
    else if (status.error_code() == grpc::StatusCode::UNAVAILABLE
             && contains(status.error_message(), "Exceeds maximum queue size"))
      ++full;
  }
  // One running and two queued at most; the rest refused, none lost.
  CHECK(ok >= 1);
  CHECK(full >= 1);
  CHECK(ok + full == n);
}

TEST_CASE("repository index, unload and load over gRPC") {
  test_server server({example_model("simple"), example_model("identity_fp32")},
                     model_control_api());
  auto stub = connect(server.process->grpc_port());
  auto state_of = [&](const std::string& name) {
    grpc::ClientContext ctx;
    pb::RepositoryIndexResponse index;
    REQUIRE(stub->RepositoryIndex(&ctx, {}, &index).ok());
    for (const auto& m : index.models())
      if (m.name() == name)
        return m.state();
    return std::string("absent");
  };
  CHECK(state_of("simple") == "READY");
  {
    grpc::ClientContext ctx;
    pb::RepositoryModelUnloadRequest req;
    req.set_model_name("simple");
    pb::RepositoryModelUnloadResponse r;
    REQUIRE(stub->RepositoryModelUnload(&ctx, req, &r).ok());
  }
  CHECK(eventually([&] { return state_of("simple") == "UNAVAILABLE"; }));
  {
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    CHECK(stub->ModelInfer(&ctx, simple_request(iota16(0), iota16(0)), &reply).error_code()
          != grpc::StatusCode::OK);
  }
  {
    grpc::ClientContext ctx;
    pb::RepositoryModelLoadRequest req;
    req.set_model_name("simple");
    pb::RepositoryModelLoadResponse r;
    auto status = stub->RepositoryModelLoad(&ctx, req, &r);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
  }
  CHECK(state_of("simple") == "READY");
  {
    grpc::ClientContext ctx;
    pb::RepositoryModelLoadRequest req;
    req.set_model_name("no_such_model");
    pb::RepositoryModelLoadResponse r;
    CHECK_FALSE(stub->RepositoryModelLoad(&ctx, req, &r).ok());
  }
  grpc::ClientContext ctx;
  pb::ModelInferResponse reply;
  CHECK(stub->ModelInfer(&ctx, simple_request(iota16(1), iota16(2)), &reply).ok());
}

TEST_CASE("system shared memory over gRPC: inputs read from and outputs written to a region") {
  test_server server({example_model("simple")}, {"--allow-client-shm", "true"});
  auto stub = connect(server.process->grpc_port());
  caf_serving::support::shm_object region(256, "grpc");
  auto a = iota16(3), b = iota16(40);
  region.put(0, a);
  region.put(64, b);
  {
    grpc::ClientContext ctx;
    pb::SystemSharedMemoryRegisterRequest req;
    req.set_name("r0");
    req.set_key(region.key);
    req.set_byte_size(256);
    pb::SystemSharedMemoryRegisterResponse r;
    auto status = stub->SystemSharedMemoryRegister(&ctx, req, &r);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
  }
  pb::ModelInferRequest r;
  r.set_model_name("simple");
  int64_t offsets[] = {0, 64};
  const char* names[] = {"INPUT0", "INPUT1"};
  for (int i = 0; i < 2; ++i) {
    auto* in = add_input(r, names[i], "INT32", {1, 16});
    (*in->mutable_parameters())["shared_memory_region"].set_string_param("r0");
    (*in->mutable_parameters())["shared_memory_offset"].set_int64_param(offsets[i]);
    (*in->mutable_parameters())["shared_memory_byte_size"].set_int64_param(64);
  }
  auto* out = r.add_outputs();
  out->set_name("OUTPUT0");
  (*out->mutable_parameters())["shared_memory_region"].set_string_param("r0");
  (*out->mutable_parameters())["shared_memory_offset"].set_int64_param(128);
  (*out->mutable_parameters())["shared_memory_byte_size"].set_int64_param(64);
  grpc::ClientContext ctx;
  pb::ModelInferResponse reply;
  auto status = stub->ModelInfer(&ctx, r, &reply);
  REQUIRE_MESSAGE(status.ok(), status.error_message());
  CHECK(region.get<int32_t>(128, 16) == sum(a, b));
  REQUIRE(reply.raw_output_contents_size() == 1);
  CHECK(reply.raw_output_contents(0).empty());
  {
    grpc::ClientContext sctx;
    pb::SystemSharedMemoryStatusResponse s;
    REQUIRE(stub->SystemSharedMemoryStatus(&sctx, {}, &s).ok());
    CHECK(s.regions().count("r0") == 1);
  }
  grpc::ClientContext uctx;
  pb::SystemSharedMemoryUnregisterRequest u;
  u.set_name("r0");
  pb::SystemSharedMemoryUnregisterResponse ur;
  CHECK(stub->SystemSharedMemoryUnregister(&uctx, u, &ur).ok());
}

TEST_CASE("one registry of shared-memory regions for HTTP and gRPC, as Triton's: a region "
          "registered over HTTP is used and listed over gRPC, and unregistered over gRPC it is "
          "gone for HTTP too") {
  test_server server({example_model("simple")}, {"--allow-client-shm", "true"});
  auto http = server.client();
  auto stub = connect(server.process->grpc_port());
  caf_serving::support::shm_object region(256, "both");
  auto a = iota16(5), b = iota16(70);
  region.put(0, a);
  region.put(64, b);
  auto registered = http.post("/v2/systemsharedmemory/region/shared0/register",
                              "{\"key\":\"" + region.key + "\",\"offset\":0,\"byte_size\":256}",
                              json_content);
  REQUIRE_MESSAGE(registered.status == 200, registered.body);
  {
    grpc::ClientContext ctx;
    pb::SystemSharedMemoryStatusRequest req;
    req.set_name("shared0");
    pb::SystemSharedMemoryStatusResponse s;
    auto status = stub->SystemSharedMemoryStatus(&ctx, req, &s);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
    CHECK(s.regions().count("shared0") == 1);
  }
  // Inference over gRPC with inputs and an output in the region HTTP registered.
  pb::ModelInferRequest r;
  r.set_model_name("simple");
  int64_t offsets[] = {0, 64};
  const char* names[] = {"INPUT0", "INPUT1"};
  for (int i = 0; i < 2; ++i) {
    auto* in = add_input(r, names[i], "INT32", {1, 16});
    (*in->mutable_parameters())["shared_memory_region"].set_string_param("shared0");
    (*in->mutable_parameters())["shared_memory_offset"].set_int64_param(offsets[i]);
    (*in->mutable_parameters())["shared_memory_byte_size"].set_int64_param(64);
  }
  auto* out = r.add_outputs();
  out->set_name("OUTPUT0");
  (*out->mutable_parameters())["shared_memory_region"].set_string_param("shared0");
  (*out->mutable_parameters())["shared_memory_offset"].set_int64_param(128);
  (*out->mutable_parameters())["shared_memory_byte_size"].set_int64_param(64);
  {
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    REQUIRE_MESSAGE(status.ok(), status.error_message());
    CHECK(region.get<int32_t>(128, 16) == sum(a, b));
  }
  {
    grpc::ClientContext ctx;
    pb::SystemSharedMemoryStatusResponse s;
    REQUIRE(stub->SystemSharedMemoryStatus(&ctx, {}, &s).ok());
    REQUIRE(s.regions().count("shared0") == 1);
    CHECK(s.regions().at("shared0").key() == region.key);
    CHECK(s.regions().at("shared0").byte_size() == 256);
  }
  {
    grpc::ClientContext ctx;
    pb::SystemSharedMemoryUnregisterRequest u;
    u.set_name("shared0");
    pb::SystemSharedMemoryUnregisterResponse ur;
    REQUIRE(stub->SystemSharedMemoryUnregister(&ctx, u, &ur).ok());
  }
  CHECK(http.get("/v2/systemsharedmemory/region/shared0/status").status == 404);
  CHECK(http.get("/v2/systemsharedmemory/status").body == "[]");
}

TEST_CASE("CUDA shared memory over gRPC is answered as a Triton without GPUs answers: "
          "status empty, unregister succeeds, register refused with a reason") {
  // Triton's own examples (simple_grpc_shm_client.py, reuse_infer_objects_client.py)
  // start by unregistering every CUDA region; an error there stops them.
  test_server server({example_model("simple")}, {"--allow-client-shm", "true"});
  auto stub = connect(server.process->grpc_port());
  {
    grpc::ClientContext ctx;
    pb::CudaSharedMemoryUnregisterResponse r;
    auto status = stub->CudaSharedMemoryUnregister(&ctx, {}, &r);
    CHECK_MESSAGE(status.ok(), status.error_message());
  }
  {
    grpc::ClientContext ctx;
    pb::CudaSharedMemoryStatusResponse r;
    auto status = stub->CudaSharedMemoryStatus(&ctx, {}, &r);
    CHECK_MESSAGE(status.ok(), status.error_message());
    CHECK(r.regions().empty());
  }
  {
    grpc::ClientContext ctx;
    pb::CudaSharedMemoryStatusRequest req;
    req.set_name("nope");
    pb::CudaSharedMemoryStatusResponse r;
    auto status = stub->CudaSharedMemoryStatus(&ctx, req, &r);
    CHECK(status.error_code() == grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    pb::CudaSharedMemoryRegisterRequest req;
    req.set_name("gpu0");
    req.set_byte_size(64);
    pb::CudaSharedMemoryRegisterResponse r;
    auto status = stub->CudaSharedMemoryRegister(&ctx, req, &r);
    CHECK_FALSE(status.ok());
    CHECK(status.error_message().find("system shared memory") != std::string::npos);
  }
}

TEST_CASE("SIGTERM drains gRPC: a call in flight is answered, an idle stream is closed, "
          "then the server exits 0") {
  test_server server({test_model("slow_queue")});
  auto port = server.process->grpc_port();
  // A stream that answered once and stays open, as tritonclient keeps one
  // between requests: the drain must not wait for its client
  // (--exit-timeout-secs is 30 s, longer than the wait for the exit below).
  auto stream_stub = connect(port);
  grpc::ClientContext stream_ctx;
  auto stream = stream_stub->ModelStreamInfer(&stream_ctx);
  {
    pb::ModelInferRequest r;
    r.set_model_name("slow_queue");
    add_input(r, "INPUT0", "FP32", {1, 2});
    r.add_raw_input_contents(raw_bytes(std::vector<float>{5, 6}));
    REQUIRE(stream->Write(r));
    pb::ModelStreamInferResponse answer;
    REQUIRE(stream->Read(&answer));
    CHECK(answer.error_message().empty());
  }
  auto call = std::async(std::launch::async, [port] {
    auto stub = connect(port);
    pb::ModelInferRequest r;
    r.set_model_name("slow_queue");
    add_input(r, "INPUT0", "FP32", {1, 2});
    r.add_raw_input_contents(raw_bytes(std::vector<float>{3, 4}));
    grpc::ClientContext ctx;
    pb::ModelInferResponse reply;
    auto status = stub->ModelInfer(&ctx, r, &reply);
    return std::make_pair(status, reply);
  });
  REQUIRE(wait_pending(server, "slow_queue", 1));
  server.process->send_signal(SIGTERM);
  auto [status, reply] = call.get();
  REQUIRE_MESSAGE(status.ok(), status.error_message());
  CHECK(values_of<float>(output_bytes(reply, "OUTPUT0")) == std::vector<float>{3, 4});
  pb::ModelStreamInferResponse none;
  CHECK_FALSE(stream->Read(&none));
  auto closed = stream->Finish();
  CHECK(closed.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(contains(closed.error_message(), "shutting down"));
  CHECK(server.process->wait_exit(std::chrono::seconds(20)) == 0);
}

namespace {

pb::ModelInferRequest slow_drain_request(float v) {
  pb::ModelInferRequest r;
  r.set_model_name("slow_drain");
  add_input(r, "INPUT0", "FP32", {1, 3});
  r.add_raw_input_contents(raw_bytes(std::vector<float>{v, v + 1, v + 2}));
  return r;
}

} // namespace

TEST_CASE("SIGTERM with calls and streams cancelled by their clients still in the pipeline, "
          "and others in flight: the server exits 0, every call object gone before the "
          "grpc server (repeated, on one and on several completion queues)") {
  // A call the client cancelled is over for grpc, but its request stays in
  // the pipeline (slow_drain: 250 ms per batch of 2) and is answered after
  // the gRPC server has stopped; the answer must find a tombstone, not a
  // call whose ServerContext outlived its server.
  for (const char* threads : {"1", "4", "2", "1"}) {
    CAPTURE(threads);
    test_server server({test_model("slow_drain")}, {"--grpc-threads", threads});
    auto port = server.process->grpc_port();
    constexpr int unary = 10, streams = 4, per_stream = 3, kept = 2;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    for (int i = 0; i < unary + streams + kept; ++i)
      contexts.push_back(std::make_unique<grpc::ClientContext>());
    std::vector<std::future<grpc::StatusCode>> calls;
    for (int i = 0; i < unary + kept; ++i)
      calls.push_back(std::async(std::launch::async, [port, i, ctx = contexts[i].get()] {
        auto stub = connect(port);
        pb::ModelInferResponse reply;
        return stub->ModelInfer(ctx, slow_drain_request(static_cast<float>(i)), &reply)
          .error_code();
      }));
    for (int i = 0; i < streams; ++i)
      calls.push_back(std::async(std::launch::async,
                                 [port, i, ctx = contexts[unary + kept + i].get()] {
                                   auto stub = connect(port);
                                   auto stream = stub->ModelStreamInfer(ctx);
                                   for (int k = 0; k < per_stream; ++k)
                                     stream->Write(slow_drain_request(static_cast<float>(i + k)));
                                   pb::ModelStreamInferResponse answer;
                                   while (stream->Read(&answer)) {
                                   }
                                   return stream->Finish().error_code();
                                 }));
    int total = unary + kept + streams * per_stream;
    REQUIRE(eventually([&] { return pending_requests(server, "slow_drain") >= total - 2; }));
    // Cancel all but the `kept` unary calls (the first ones sent may be the
    // ones running; which ones does not matter).
    for (int i = kept; i < unary + kept + streams; ++i)
      contexts[i]->TryCancel();
    for (int i = kept; i < unary + kept + streams; ++i)
      CHECK(calls[i].get() == grpc::StatusCode::CANCELLED);
    server.process->send_signal(SIGTERM);
    for (int i = 0; i < kept; ++i) {
      auto code = calls[i].get();
      // Answered, or cancelled by the drain's deadline: never lost.
      CHECK((code == grpc::StatusCode::OK || code == grpc::StatusCode::UNAVAILABLE));
    }
    CHECK_MESSAGE(server.process->wait_exit(std::chrono::seconds(40)) == 0,
                  server.process->output());
  }
}

TEST_CASE("--allow-grpc false serves HTTP only") {
  test_server server({example_model("simple")}, {"--allow-grpc", "false"});
  CHECK(server.process->grpc_port() == 0);
  CHECK_FALSE(contains(server.process->output(), "GRPC listening"));
  CHECK(server.client().get("/v2/health/live").status == 200);
}

TEST_CASE("a gRPC port that is taken is an error naming --grpc-port") {
  // A port held by a listening socket of this process.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(fd >= 0);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd, 4) == 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto port = std::to_string(ntohs(addr.sin_port));
  temp_repository repo;
  repo.add_model(example_model("simple"));
  child_process child({{CAF_SERVING_BINARY, "--model-repository", repo.path().string(),
                        "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0",
                        "--grpc-address", "127.0.0.1", "--grpc-port", port},
                       true});
  auto status = child.wait_exit(std::chrono::seconds(20));
  ::close(fd);
  CHECK(status == 1);
  CHECK_MESSAGE(contains(child.output(), "gRPC port " + port + " of 127.0.0.1 (--grpc-port"),
                child.output());
}
