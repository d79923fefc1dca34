#include "options.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace caf_serving::app;

namespace {

auto parse(std::vector<const char*> args) {
  args.insert(args.begin(), "caf-serving");
  return parse_options(static_cast<int>(args.size()), const_cast<char**>(args.data()));
}

} // namespace

TEST_CASE("Triton's flag names parse") {
  auto r = parse({"--model-repository", "/m", "--http-port", "0", "--metrics-port=9000",
                  "--max-queue-size", "7", "--caf-workers", "3", "--allow-metrics", "false"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->model_repository == "/m");
  CHECK(o->http.http_port == 0);
  CHECK(o->http.metrics_port == 9000);
  CHECK(o->max_queue_size == 7);
  CHECK(o->threads.caf_workers == 3);
  CHECK_FALSE(o->http.metrics_enabled);
}

TEST_CASE("bad flags say what is wrong") {
  auto r = parse({"--model-repository", "/m", "--http-port", "70000"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("'70000' is not a port number") != std::string::npos);
  r = parse({"--http-port", "1"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("--model-repository DIR is required") != std::string::npos);
  r = parse({"--model-repository", "/m", "--frobnicate", "1"});
  CHECK(std::get<std::string>(r).find("unknown flag --frobnicate") != std::string::npos);
  CHECK(std::holds_alternative<show_help>(parse({"--help"})));
}

TEST_CASE("--print-plan takes a model name and a batch size") {
  auto r = parse({"--model-repository", "/m", "--print-plan", "resnet", "--print-plan-batch", "4"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  REQUIRE(o->print_plan);
  CHECK(*o->print_plan == "resnet");
  CHECK(o->print_plan_batch == 4);
  CHECK_FALSE(std::get<server_options>(parse({"--model-repository", "/m"})).print_plan);
  r = parse({"--model-repository", "/m", "--print-plan", "a/b"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("is not a model name") != std::string::npos);
  r = parse({"--model-repository", "/m", "--print-plan", "x", "--print-plan-batch", "0"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("'0' is not a batch size") != std::string::npos);
}

TEST_CASE("--worker must be HOST:PORT with a port from 1 to 65535") {
  // Port 0 once passed this check and aborted start-up with bad_variant_access.
  for (const char* bad : {"127.0.0.1:0", "127.0.0.1", "127.0.0.1:", ":9100", "127.0.0.1:65536",
                          "127.0.0.1:x1", "127.0.0.1:-1"}) {
    CAPTURE(bad);
    auto r = parse({"--model-repository", "/m", "--worker", bad});
    REQUIRE(std::holds_alternative<std::string>(r));
    auto& message = std::get<std::string>(r);
    CHECK(message.find("--worker") != std::string::npos);
    CHECK(message.find(std::string("'") + bad + "'") != std::string::npos);
  }
  auto r = parse({"--model-repository", "/m", "--worker", "127.0.0.1:9100", "--worker=h:1"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->cluster.workers == std::vector<std::string>{"127.0.0.1:9100", "h:1"});
}

TEST_CASE("limits for clients and the exit timeout have defaults and bounds") {
  auto r = parse({"--model-repository", "/m"});
  auto* d = std::get_if<server_options>(&r);
  REQUIRE(d);
  CHECK(d->http.exit_timeout_secs == 30);
  CHECK(d->http.max_connections == 1024);
  CHECK(d->http.max_header_bytes == 65536);
  CHECK(d->http.idle_timeout_ms == 60000);
  CHECK(d->http.header_timeout_ms == 10000);
  r = parse({"--model-repository", "/m", "--exit-timeout-secs", "0", "--max-connections", "4",
             "--max-header-bytes", "2048", "--idle-timeout-ms", "200", "--header-timeout-ms",
             "300"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->http.exit_timeout_secs == 0);
  CHECK(o->http.max_connections == 4);
  CHECK(o->http.max_header_bytes == 2048);
  CHECK(o->http.idle_timeout_ms == 200);
  CHECK(o->http.header_timeout_ms == 300);
  auto error_of = [&](std::vector<const char*> args) {
    args.insert(args.begin(), {"--model-repository", "/m"});
    auto e = parse(args);
    return std::holds_alternative<std::string>(e) ? std::get<std::string>(e) : std::string();
  };
  CHECK(error_of({"--max-connections", "0"}).find("flag --max-connections: '0'")
        != std::string::npos);
  // kj cannot buffer headers past 128 KiB: a larger limit would be a lie.
  CHECK(error_of({"--max-header-bytes", "200000"}).find("flag --max-header-bytes")
        != std::string::npos);
  CHECK(error_of({"--idle-timeout-ms", "0"}).find("flag --idle-timeout-ms") != std::string::npos);
  CHECK(error_of({"--exit-timeout-secs", "x"}).find("flag --exit-timeout-secs: 'x'")
        != std::string::npos);
}

TEST_CASE("client shared memory is off by default, as in Triton, and its region limit is bounded") {
  auto r = parse({"--model-repository", "/m"});
  auto* d = std::get_if<server_options>(&r);
  REQUIRE(d);
  CHECK_FALSE(d->http.shared_memory.allow_client_shm);
  CHECK(d->http.shared_memory.max_regions == 64);
  r = parse({"--model-repository", "/m", "--allow-client-shm=true", "--shm-region-limit", "3"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->http.shared_memory.allow_client_shm);
  CHECK(o->http.shared_memory.max_regions == 3);
  r = parse({"--model-repository", "/m", "--shm-region-limit", "0"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("flag --shm-region-limit: '0'") != std::string::npos);
}

TEST_CASE("--cache-config local,size=N sizes the response cache, as in Triton") {
  auto cache_bytes = [](std::vector<const char*> flags) {
    flags.insert(flags.begin(), {"--model-repository", "/m"});
    auto r = parse(flags);
    auto* o = std::get_if<server_options>(&r);
    REQUIRE_MESSAGE(o, std::get<std::string>(r));
    return o->cache.max_bytes;
  };
  CHECK(cache_bytes({}) == 0); // no cache unless asked for, as in Triton
  CHECK(cache_bytes({"--cache-config", "local,size=1048576"}) == 1048576);
  CHECK(cache_bytes({"--cache-config=local,size=4096"}) == 4096);
  CHECK(cache_bytes({"--cache-config", "local,size=0"}) == 0);
  CHECK(cache_bytes({"--response-cache-byte-size", "65536"}) == 65536);

  auto error = [](std::vector<const char*> flags) {
    flags.insert(flags.begin(), {"--model-repository", "/m"});
    auto r = parse(flags);
    REQUIRE(std::holds_alternative<std::string>(r));
    return std::get<std::string>(r);
  };
  CHECK(error({"--cache-config", "redis,host=localhost"})
          .find("cache 'redis' is not supported") != std::string::npos);
  CHECK(error({"--cache-config", "local"}).find("local,size=BYTES") != std::string::npos);
  CHECK(error({"--cache-config", "local,bytes=10"}).find("no setting 'bytes'")
        != std::string::npos);
  CHECK(error({"--cache-config", "local,size=-1"}).find("size '-1' is not a byte count")
        != std::string::npos);
}

TEST_CASE("--http-restricted-api: Triton's format, repeatable, each API once") {
  using caf_serving::ingress::api_group;
  auto r = parse({"--model-repository", "/m",
                  "--http-restricted-api=model-repository:admin-key=admin-value",
                  "--http-restricted-api", "inference,metadata:infer-key=infer-value"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  const auto& apis = o->http.restricted;
  REQUIRE(apis.find(api_group::model_repository));
  CHECK(apis.find(api_group::model_repository)->header == "admin-key");
  CHECK(apis.find(api_group::model_repository)->value == "admin-value");
  REQUIRE(apis.find(api_group::inference));
  CHECK(apis.find(api_group::metadata)->value == "infer-value");
  CHECK_FALSE(apis.find(api_group::health));
  CHECK_FALSE(apis.find(api_group::statistics));
  CHECK(std::get<server_options>(parse({"--model-repository", "/m"})).http.restricted.empty());

  // Triton's own start-up checks (qa/L0_http/test.sh matches these phrases).
  r = parse({"--model-repository", "/m", "--http-restricted-api=model-repository,health:k1=v1",
             "--http-restricted-api=metadata,health:k2=v2"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("api 'health' can not be specified in multiple config "
                                      "groups")
        != std::string::npos);
  r = parse({"--model-repository", "/m", "--http-restricted-api=model-reposit,health:k1=v1"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("unknown restricted api 'model-reposit'")
        != std::string::npos);
  for (const char* bad : {"--http-restricted-api=inference", "--http-restricted-api=inference:k",
                          "--http-restricted-api=:k=v", "--http-restricted-api=inference:=v",
                          "--http-restricted-api=inference:k="}) {
    r = parse({"--model-repository", "/m", bad});
    REQUIRE_MESSAGE(std::holds_alternative<std::string>(r), bad);
    CHECK_MESSAGE(std::get<std::string>(r).find("API[,API...]:KEY=VALUE") != std::string::npos,
                  bad);
  }
}

TEST_CASE("--http-max-input-size is Triton's name for --max-body-bytes") {
  auto r = parse({"--model-repository", "/m", "--http-max-input-size", "67108864"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->http.limits.max_body_bytes == 67108864);
}

TEST_CASE("--disable-auto-complete-config takes no value and means a strict model config") {
  auto r = parse({"--disable-auto-complete-config", "--model-repository", "/m"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->strict_model_config);
  CHECK(o->model_repository == "/m");
}

TEST_CASE("model control flags: Triton's names, defaults and checks") {
  using caf_serving::server::model_control_mode;
  auto d = parse({"--model-repository", "/m"});
  auto* o = std::get_if<server_options>(&d);
  REQUIRE(o);
  CHECK(o->model_control_mode == model_control_mode::none);
  CHECK(o->load_models.empty());
  CHECK(o->repository_poll_secs == 15);
  CHECK_FALSE(o->strict_model_config);
  CHECK(o->model_load_max_file_bytes == (uint64_t{256} << 20));

  auto r = parse({"--model-repository", "/m", "--model-control-mode", "explicit", "--load-model",
                  "a", "--load-model=b", "--strict-model-config", "true",
                  "--model-load-max-file-bytes", "1024"});
  o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->model_control_mode == model_control_mode::explicit_control);
  CHECK(o->load_models == std::vector<std::string>{"a", "b"});
  CHECK(o->strict_model_config);
  CHECK(o->model_load_max_file_bytes == 1024);

  r = parse({"--model-repository", "/m", "--model-control-mode=POLL", "--repository-poll-secs",
             "2"});
  o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->model_control_mode == model_control_mode::poll);
  CHECK(o->repository_poll_secs == 2);

  auto error = [](std::vector<const char*> args) {
    auto p = parse(args);
    auto* e = std::get_if<std::string>(&p);
    REQUIRE(e);
    return *e;
  };
  CHECK(error({"--model-repository", "/m", "--model-control-mode", "manual"}).find("none, explicit or poll")
        != std::string::npos);
  CHECK(error({"--model-repository", "/m", "--load-model", "a"})
        == "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well.");
  CHECK(error({"--model-repository", "/m", "--model-control-mode", "explicit", "--load-model", "*",
               "--load-model", "a"})
          .find("Wildcard model name '*' must be the ONLY startup model") == 0);
  CHECK(error({"--model-repository", "/m", "--repository-poll-secs", "-1"}).find("seconds")
        != std::string::npos);
  CHECK(error({"--model-repository", "/m", "--strict-model-config", "maybe"}).find("true or false")
        != std::string::npos);
}

TEST_CASE("cluster TLS files and the remote timeout's cost-model terms are flags") {
  auto r = parse({"--model-repository", "/m", "--cluster-port", "0", "--tls-certificate", "c.pem",
                  "--tls-key", "k.pem", "--tls-ca", "ca.pem", "--tls-passphrase-file", "p",
                  "--remote-timeout-factor", "2.5", "--remote-timeout-floor-ms", "50"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->cluster.tls.certificate == "c.pem");
  CHECK(o->cluster.tls.key == "k.pem");
  CHECK(o->cluster.tls.ca == "ca.pem");
  CHECK(o->cluster.tls.passphrase_file == "p");
  CHECK(o->cluster.remote_timeout_factor == 2.5);
  CHECK(o->cluster.remote_timeout_floor_ms == 50);
  auto d = parse({"--model-repository", "/m"});
  REQUIRE(std::holds_alternative<server_options>(d));
  CHECK(std::get<server_options>(d).cluster.remote_timeout_factor == 4.0);
  CHECK(std::get<server_options>(d).cluster.remote_timeout_floor_ms == 500);
  // TLS without any cluster link secures nothing: said, not ignored.
  auto lone = parse({"--model-repository", "/m", "--tls-ca", "ca.pem"});
  REQUIRE(std::holds_alternative<std::string>(lone));
  CHECK(std::get<std::string>(lone).find("--cluster-port") != std::string::npos);
  for (const char* bad : {"0.5", "x", "", "1e9"}) {
    CAPTURE(bad);
    auto e = parse({"--model-repository", "/m", "--remote-timeout-factor", bad});
    REQUIRE(std::holds_alternative<std::string>(e));
    CHECK(std::get<std::string>(e).find("--remote-timeout-factor") != std::string::npos);
  }
}

TEST_CASE("gRPC flags: Triton's names and defaults, HTTP's limits") {
  auto r = parse({"--model-repository", "/m", "--max-body-bytes", "4096",
                  "--allow-client-shm", "true"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->grpc_enabled);
  CHECK(o->grpc.port == 8001);
  CHECK(o->grpc.address == "0.0.0.0");
  CHECK(o->grpc.compression == caf_serving::ingress::grpc_response_compression::none);
  CHECK(o->grpc.stream_max_in_flight == 64);
  CHECK(o->grpc.limits.max_body_bytes == 4096);
  CHECK(o->grpc.shared_memory.allow_client_shm);

  r = parse({"--model-repository", "/m", "--grpc-port", "9001", "--grpc-address", "127.0.0.1",
             "--grpc-infer-response-compression-level", "high", "--allow-grpc", "false",
             "--grpc-stream-max-in-flight", "8"});
  o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->grpc.port == 9001);
  CHECK(o->grpc.address == "127.0.0.1");
  CHECK(o->grpc.compression == caf_serving::ingress::grpc_response_compression::high);
  CHECK_FALSE(o->grpc_enabled);
  CHECK(o->grpc.stream_max_in_flight == 8);

  // --grpc-threads: the engine's ingress thread count unless given (never 0:
  // at least one HTTP event loop); 0, grpc's callback API, is gone.
  r = parse({"--model-repository", "/m"});
  CHECK(std::get<server_options>(r).grpc.threads
        == std::get<server_options>(r).threads.ingress_threads);
  CHECK(std::get<server_options>(r).grpc.threads >= 1);
  r = parse({"--model-repository", "/m", "--grpc-threads", "3"});
  CHECK(std::get<server_options>(r).grpc.threads == 3);
  r = parse({"--model-repository", "/m", "--grpc-threads", "0"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("--grpc-threads: 0 (grpc's callback API) is no longer "
                                      "served; give 1 to 256")
        != std::string::npos);
  CHECK(std::get<server_options>(parse({"--model-repository", "/m"})).grpc.max_concurrent_streams
        == 1024);
  r = parse({"--model-repository", "/m", "--grpc-max-concurrent-streams", "2"});
  CHECK(std::get<server_options>(r).grpc.max_concurrent_streams == 2);
  r = parse({"--model-repository", "/m", "--grpc-max-concurrent-streams", "0"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("--grpc-max-concurrent-streams") != std::string::npos);
  r = parse({"--model-repository", "/m", "--grpc-max-open-calls", "5"});
  CHECK(std::get<server_options>(r).grpc.max_open_calls == 5);
  r = parse({"--model-repository", "/m", "--grpc-threads", "many"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("--grpc-threads") != std::string::npos);

  // --http-port 0 picks the gRPC port too, unless --grpc-port says otherwise.
  r = parse({"--model-repository", "/m", "--http-port", "0"});
  CHECK(std::get<server_options>(r).grpc.port == 0);
  r = parse({"--model-repository", "/m", "--http-port", "0", "--grpc-port", "8001"});
  CHECK(std::get<server_options>(r).grpc.port == 8001);

  r = parse({"--model-repository", "/m", "--grpc-infer-response-compression-level", "max"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("none, low, medium or high") != std::string::npos);
}

TEST_CASE("--http-threads sets the number of HTTP event loops") {
  auto r = parse({"--model-repository", "/m", "--http-threads", "3"});
  auto* o = std::get_if<server_options>(&r);
  REQUIRE(o);
  CHECK(o->threads.ingress_threads == 3);
  r = parse({"--model-repository", "/m", "--http-threads", "0"});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("'0' is not a count of HTTP event loops")
        != std::string::npos);
  CHECK(usage().find("--http-threads N") != std::string::npos);
}

TEST_CASE("--bulk-threshold-bytes: bytes from which batches take the bulk channel, 0 off") {
  auto d = parse({"--model-repository", "/m"});
  REQUIRE(std::holds_alternative<server_options>(d));
  CHECK(std::get<server_options>(d).cluster.bulk_threshold_bytes == 1048576);
  for (auto [text, bytes] : {std::pair{"0", 0ull}, std::pair{"65536", 65536ull}}) {
    auto r = parse({"--model-repository", "/m", "--bulk-threshold-bytes", text});
    REQUIRE(std::holds_alternative<server_options>(r));
    CHECK(std::get<server_options>(r).cluster.bulk_threshold_bytes == bytes);
  }
  for (const char* bad : {"-1", "x", "", "1e6"}) {
    CAPTURE(bad);
    auto e = parse({"--model-repository", "/m", "--bulk-threshold-bytes", bad});
    REQUIRE(std::holds_alternative<std::string>(e));
    CHECK(std::get<std::string>(e).find("--bulk-threshold-bytes") != std::string::npos);
  }
}
