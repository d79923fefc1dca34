#include "server/model_manager.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <filesystem>
#include <future>
#include <memory>
#include <fstream>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include <unistd.h>

using namespace caf_serving;
namespace fs = std::filesystem;

namespace {
/// Allocations made by this thread (the operator new below counts them).
thread_local size_t thread_allocations = 0;
} // namespace

void* operator new(std::size_t n) {
  ++thread_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n))
    return p;
  throw std::bad_alloc{};
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace {

/// A repository with one builtin identity model, removed at the end.
struct repository_dir {
  fs::path path = fs::temp_directory_path()
                  / ("model_manager_test_" + std::to_string(::getpid()));
  repository_dir() {
    fs::create_directories(path / "echo" / "1");
    std::ofstream(path / "echo" / "config.pbtxt")
      << "name: \"echo\"\nbackend: \"builtin\"\nmax_batch_size: 4\n"
         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
         "parameters { key: \"function\" value: { string_value: \"identity\" } }\n";
    std::ofstream(path / "echo" / "1" / "model.builtin") << "builtin\n";
  }
  ~repository_dir() { fs::remove_all(path); }
};

template <class F>
bool eventually(F&& condition) {
  for (int i = 0; i < 2000; ++i) {
    if (condition())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

/// An actor system and a model manager over a fresh repository; the manager
/// goes first, then every actor is awaited.
struct running_manager {
  repository_dir repo;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<server::model_manager> models;

  explicit running_manager(
    const std::function<void(server::model_manager_config&)>& configure = {}) {
    cfg.set("scheduler.max-threads", size_t{2});
    sys = std::make_unique<caf::actor_system>(cfg);
    server::model_manager_config mc;
    mc.repository = repo.path;
    if (configure)
      configure(mc);
    models = std::make_unique<server::model_manager>(*sys, mc);
  }
  ~running_manager() {
    models.reset();
    sys->await_all_actors_done();
  }
};

} // namespace

TEST_CASE("a scheduler that stops abnormally is replaced by loading the model again") {
  running_manager running;
  auto& models = *running.models;
  {
    REQUIRE(std::holds_alternative<std::monostate>(models.load_all()));
    auto first = models.find("echo");
    REQUIRE(first.ok());
    auto old_scheduler = (*first)->scheduler;

    caf::anon_send_exit(old_scheduler, caf::exit_reason::kill);
    // Until the new pipeline is up the model is not ready, and says why.
    CHECK(eventually([&] {
      auto p = models.find("echo");
      return p.ok() && (*p)->scheduler != old_scheduler;
    }));
    auto second = models.find("echo");
    REQUIRE(second.ok());
    CHECK((*second)->stats->scheduler_running.load());
    CHECK((*second)->stats->healthy_executors.load() == 1);
    CHECK(models.all_ready());
    // An unload is not a failure: nothing is loaded again. The scheduler's
    // supervision runs as it stops, before a monitor hears of it; a reload it
    // began would show at once as LOADING in the index.
    caf::scoped_actor self{*running.sys};
    self->monitor((*second)->scheduler);
    REQUIRE(std::holds_alternative<std::monostate>(models.unload("echo")));
    bool stopped = false;
    self->receive([&](const caf::down_msg&) { stopped = true; },
                  caf::after(std::chrono::seconds(30)) >> [] {});
    REQUIRE(stopped);
    CHECK_FALSE(models.find("echo").ok());
    for (const auto& row : models.index())
      if (row.name == "echo")
        CHECK(row.state != "LOADING");
  }
}

TEST_CASE("find allocates nothing for a served model, whatever the length of its name") {
  // find() runs once per inference request; it used to build the quoted name
  // for its error messages up front, a heap allocation for names past the
  // short-string buffer.
  running_manager running;
  const std::string name = "a_model_name_longer_than_the_short_string_buffer";
  fs::copy(running.repo.path / "echo", running.repo.path / name,
           fs::copy_options::recursive);
  {
    std::ofstream config(running.repo.path / name / "config.pbtxt");
    config << "name: \"" << name << "\"\nbackend: \"builtin\"\nmax_batch_size: 4\n"
           << "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
           << "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
           << "parameters { key: \"function\" value: { string_value: \"identity\" } }\n";
  }
  std::promise<std::variant<std::monostate, serving_error>> loaded;
  running.models->load_async(name, [&](auto r) { loaded.set_value(std::move(r)); });
  REQUIRE(std::holds_alternative<std::monostate>(loaded.get_future().get()));
  size_t before = thread_allocations;
  auto found = running.models->find(name);
  size_t allocations = thread_allocations - before;
  REQUIRE(found.ok());
  CHECK(allocations == 0);
  // The error messages still quote the name.
  auto missing = running.models->find(name + "_missing");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("'" + name + "_missing'") != std::string::npos);
}

TEST_CASE("load_async reports on the loader thread; an unknown model is a 404") {
  running_manager running;
  auto& models = *running.models;
  {
    std::promise<std::variant<std::monostate, serving_error>> loaded;
    models.load_async("echo", [&](auto r) { loaded.set_value(std::move(r)); });
    CHECK(std::holds_alternative<std::monostate>(loaded.get_future().get()));
    CHECK(models.find("echo").ok());
    std::promise<std::variant<std::monostate, serving_error>> missing;
    models.load_async("nope", [&](auto r) { missing.set_value(std::move(r)); });
    auto r = missing.get_future().get();
    REQUIRE(std::holds_alternative<serving_error>(r));
    CHECK(std::get<serving_error>(r).status == status_code::not_found);
  }
}

TEST_CASE("strict_model_config: an ONNX model without config.pbtxt loads only when it is off") {
  for (bool strict : {false, true}) {
    CAPTURE(strict);
    running_manager running([&](auto& mc) { mc.strict_model_config = strict; });
    fs::create_directories(running.repo.path / "auto" / "1");
    fs::copy_file(fs::path(CAF_SERVING_ONNX_FIXTURES) / "models" / "op_gemm" / "1" / "model.onnx",
                  running.repo.path / "auto" / "1" / "model.onnx");
    auto r = running.models->load("auto");
    if (!strict) {
      REQUIRE(std::holds_alternative<std::monostate>(r));
      auto p = running.models->find("auto");
      REQUIRE(p.ok());
      CHECK((*p)->config.max_batch_size == 4);
      CHECK((*p)->config.dynamic_batching_enabled);
    } else {
      REQUIRE(std::holds_alternative<serving_error>(r));
      CHECK(std::get<serving_error>(r).message.find("no config.pbtxt") != std::string::npos);
    }
  }
}

TEST_CASE("default_max_batch_size sets what auto-complete fills in") {
  running_manager running([](auto& mc) { mc.default_max_batch_size = 16; });
  fs::create_directories(running.repo.path / "auto" / "1");
  fs::copy_file(fs::path(CAF_SERVING_ONNX_FIXTURES) / "models" / "op_gemm" / "1" / "model.onnx",
                running.repo.path / "auto" / "1" / "model.onnx");
  REQUIRE(std::holds_alternative<std::monostate>(running.models->load("auto")));
  auto p = running.models->find("auto");
  REQUIRE(p.ok());
  CHECK((*p)->config.max_batch_size == 16);
}

namespace {

using outcome = std::variant<std::monostate, serving_error>;

/// request_load, waited for.
outcome request_load(server::model_manager& models, const std::string& name,
                     server::load_parameters params = {}) {
  std::promise<outcome> done;
  models.request_load(name, std::move(params), [&](outcome r) { done.set_value(std::move(r)); });
  return done.get_future().get();
}

std::string error_text(const outcome& r) {
  auto* e = std::get_if<serving_error>(&r);
  return e ? e->message : std::string();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void explicit_mode(server::model_manager_config& mc) {
  mc.control_mode = server::model_control_mode::explicit_control;
}

const char* echo_json_config(int max_batch_size) {
  static std::string text;
  text = R"({"backend":"builtin","max_batch_size":)" + std::to_string(max_batch_size)
         + R"(,"input":[{"name":"INPUT0","data_type":"TYPE_FP32","dims":[2]}],)"
           R"("output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[2]}],)"
           R"("parameters":{"function":{"string_value":"identity"}}})";
  return text.c_str();
}

} // namespace

TEST_CASE("control modes: 'none' loads everything and refuses the API with Triton's message") {
  CHECK(server::parse_model_control_mode("EXPLICIT") == server::model_control_mode::explicit_control);
  CHECK(server::parse_model_control_mode("poll") == server::model_control_mode::poll);
  CHECK(server::parse_model_control_mode("none") == server::model_control_mode::none);
  CHECK_FALSE(server::parse_model_control_mode("manual"));

  running_manager running;
  auto& models = *running.models;
  REQUIRE(std::holds_alternative<std::monostate>(models.start()));
  CHECK(models.find("echo").ok());
  auto r = request_load(models, "echo");
  REQUIRE(std::holds_alternative<serving_error>(r));
  CHECK(std::get<serving_error>(r).status == status_code::unavailable);
  CHECK(contains(error_text(r), "explicit model load / unload is not allowed if polling is enabled"));
  CHECK(contains(error_text(r), "--model-control-mode explicit"));
  auto u = models.request_unload("echo", {});
  REQUIRE(std::holds_alternative<serving_error>(u));
  CHECK(std::get<serving_error>(u).status == status_code::unavailable);
  CHECK(models.find("echo").ok());
}

TEST_CASE("explicit mode loads only --load-model models; the index lists the others by name") {
  running_manager running([](auto& mc) { explicit_mode(mc); });
  auto& models = *running.models;
  REQUIRE(std::holds_alternative<std::monostate>(models.start()));
  CHECK_FALSE(models.find("echo").ok());
  auto rows = models.index();
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].name == "echo");
  CHECK(rows[0].state.empty());
  CHECK(models.all_ready());

  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo")));
  CHECK(models.find("echo").ok());
  REQUIRE(std::holds_alternative<std::monostate>(models.request_unload("echo", {true})));
  CHECK_FALSE(models.find("echo").ok());
  CHECK(models.all_ready()); // unloaded on purpose does not count
  // Unloading what is not loaded is no error, as in Triton.
  CHECK(std::holds_alternative<std::monostate>(models.request_unload("nope", {})));

  running_manager with_startup([](auto& mc) {
    explicit_mode(mc);
    mc.startup_models = {"echo"};
  });
  REQUIRE(std::holds_alternative<std::monostate>(with_startup.models->start()));
  CHECK(with_startup.models->find("echo").ok());
}

TEST_CASE("a config override replaces config.pbtxt and stays while the repository is unchanged") {
  running_manager running([](auto& mc) { explicit_mode(mc); });
  auto& models = *running.models;
  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo")));
  CHECK((*models.find("echo"))->config.max_batch_size == 4);

  server::load_parameters p;
  p.config = echo_json_config(16);
  auto r = request_load(models, "echo", p);
  REQUIRE_MESSAGE(std::holds_alternative<std::monostate>(r), error_text(r));
  auto served = models.find("echo");
  REQUIRE(served.ok());
  CHECK((*served)->config.max_batch_size == 16);
  CHECK(contains((*served)->config_json, "\"max_batch_size\":16"));

  // A load without parameters keeps the override (Triton: nothing changed)...
  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo")));
  CHECK((*models.find("echo"))->config.max_batch_size == 16);
  // ...until the repository's files change, or the model is unloaded.
  auto file = running.repo.path / "echo" / "1" / "model.builtin";
  auto written = fs::last_write_time(file);
  std::ofstream(file) << "builtin, changed\n";
  fs::last_write_time(file, written + std::chrono::seconds(1)); // a later mtime, whatever the clock
  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo")));
  CHECK((*models.find("echo"))->config.max_batch_size == 4);
  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo", p)));
  REQUIRE(std::holds_alternative<std::monostate>(models.request_unload("echo", {})));
  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo")));
  CHECK((*models.find("echo"))->config.max_batch_size == 4);

  // tritonclient's example sends only max_batch_size: a builtin model keeps
  // the rest of its config.pbtxt (it has no model file to complete it from).
  server::load_parameters only_batch;
  only_batch.config = R"({"max_batch_size":"16"})";
  r = request_load(models, "echo", only_batch);
  REQUIRE_MESSAGE(std::holds_alternative<std::monostate>(r), error_text(r));
  served = models.find("echo");
  REQUIRE(served.ok());
  CHECK((*served)->config.max_batch_size == 16);
  CHECK((*served)->config.parameters.at("function") == "identity");
}

TEST_CASE("failed loads answer in Triton's words and status; served versions keep serving") {
  running_manager running([](auto& mc) { explicit_mode(mc); });
  auto& models = *running.models;
  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo")));

  auto unknown = request_load(models, "unknown_model");
  REQUIRE(std::holds_alternative<serving_error>(unknown));
  CHECK(std::get<serving_error>(unknown).status == status_code::internal);
  CHECK(error_text(unknown).rfind(
          "failed to load 'unknown_model', failed to poll from model repository: ", 0) == 0);
  CHECK(contains(error_text(unknown), "is not in the repository"));

  server::load_parameters bad_json;
  bad_json.config = R"("parameters": {"config": {{"max_batch_size": "16"}}})";
  auto r = request_load(models, "echo", bad_json);
  CHECK(std::get<serving_error>(r).status == status_code::internal);
  CHECK(contains(error_text(r), "failed to load 'echo'"));
  CHECK(contains(error_text(r), "Invalid config override"));

  server::load_parameters wrong_meaning;
  wrong_meaning.config = R"({"backend":"builtin","max_batch_size":-1})";
  r = request_load(models, "echo", wrong_meaning);
  CHECK(contains(error_text(r), "failed to poll from model repository"));
  CHECK(contains(error_text(r), "max_batch_size is -1"));

  server::load_parameters files_only;
  files_only.files = {{"1/model.builtin", "YQ=="}};
  r = request_load(models, "echo", files_only);
  CHECK(std::get<serving_error>(r).status == status_code::internal);
  CHECK(contains(error_text(r), "failed to load 'echo', failed to poll from model repository"));
  CHECK(contains(error_text(r), "a \"config\" parameter must come with them"));

  server::load_parameters no_function;
  no_function.config = R"({"backend":"builtin","max_batch_size":4,)"
                       R"("input":[{"name":"I","data_type":"TYPE_FP32","dims":[2]}],)"
                       R"("output":[{"name":"O","data_type":"TYPE_FP32","dims":[2]}]})";
  r = request_load(models, "echo", no_function);
  REQUIRE(std::holds_alternative<serving_error>(r));
  CHECK(std::get<serving_error>(r).status == status_code::bad_request);
  CHECK(error_text(r).rfind("load failed for model 'echo': ", 0) == 0);

  // Every failure left the loaded version serving.
  auto served = models.find("echo");
  REQUIRE(served.ok());
  CHECK((*served)->config.max_batch_size == 4);
  for (const auto& row : models.index())
    if (row.name == "echo")
      CHECK(row.state == "READY");
}

TEST_CASE("a model sent as files loads from its own directory, removed when unloaded") {
  running_manager running([](auto& mc) { explicit_mode(mc); });
  auto& models = *running.models;
  server::load_parameters p;
  p.config = echo_json_config(8);
  p.files = {{"3/model.builtin", "YnVpbHRpbgo="}};
  auto r = request_load(models, "sent", p);
  REQUIRE_MESSAGE(std::holds_alternative<std::monostate>(r), error_text(r));
  fs::path where;
  {
    auto served = models.find("sent");
    REQUIRE(served.ok());
    CHECK((*served)->version == 3);
    REQUIRE((*served)->files);
    where = (*served)->files->path();
    CHECK(fs::exists(where / "3" / "model.builtin"));
    CHECK_FALSE(fs::exists(running.repo.path / "sent"));
  }
  REQUIRE(std::holds_alternative<std::monostate>(models.request_unload("sent", {})));
  CHECK(eventually([&] { return !fs::exists(where); }));

  server::load_parameters escape;
  escape.config = echo_json_config(8);
  escape.files = {{"../../escaped", "YQ=="}};
  r = request_load(models, "sent", escape);
  CHECK(std::get<serving_error>(r).status == status_code::internal);
  CHECK(contains(error_text(r), "failed to load 'sent', failed to poll from model repository"));
  CHECK(contains(error_text(r), "'..' component"));
}

TEST_CASE("poll mode picks up added, changed and removed models") {
  running_manager running([](auto& mc) {
    mc.control_mode = server::model_control_mode::poll;
    mc.poll_interval = std::chrono::seconds(0); // this test scans by hand
  });
  auto& models = *running.models;
  REQUIRE(std::holds_alternative<std::monostate>(models.start()));
  REQUIRE(models.find("echo").ok());
  auto echo_before = (*models.find("echo"))->scheduler;
  CHECK(std::holds_alternative<serving_error>(request_load(models, "echo")));

  // Added.
  fs::copy(running.repo.path / "echo", running.repo.path / "echo2", fs::copy_options::recursive);
  {
    std::ofstream cfg(running.repo.path / "echo2" / "config.pbtxt");
    cfg << "name: \"echo2\"\nbackend: \"builtin\"\nmax_batch_size: 4\n"
           "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
           "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
           "parameters { key: \"function\" value: { string_value: \"identity\" } }\n";
  }
  models.poll_repository();
  CHECK(eventually([&] { return models.find("echo2").ok(); }));
  // Unchanged models were not touched.
  CHECK((*models.find("echo"))->scheduler == echo_before);

  // Changed: a new version directory.
  fs::create_directories(running.repo.path / "echo2" / "2");
  std::ofstream(running.repo.path / "echo2" / "2" / "model.builtin") << "builtin\n";
  models.poll_repository();
  CHECK(eventually([&] {
    auto p = models.find("echo2");
    return p.ok() && (*p)->version == 2;
  }));

  // Removed.
  fs::remove_all(running.repo.path / "echo2");
  models.poll_repository();
  auto gone = models.find("echo2");
  REQUIRE_FALSE(gone.ok());
  CHECK(gone.error().status == status_code::not_found);
  for (const auto& row : models.index())
    CHECK(row.name != "echo2");
  CHECK((*models.find("echo"))->scheduler == echo_before);
}

namespace {

/// Collects one response.
struct promised_sink : response_sink {
  std::promise<response_message> answer;
  void deliver(response_message r) override { answer.set_value(std::move(r)); }
};

/// An echo request of [1, 2] FP32.
infer_job echo_job(const std::shared_ptr<promised_sink>& sink) {
  auto msg = request_message::create();
  auto b = msg.builder();
  b.setId("late");
  b.setModelName("echo");
  b.setModelVersion(1);
  b.setRows(1);
  auto in = b.initInputs(1)[0];
  in.setName("INPUT0");
  in.setDatatype(wire::DataType::FP32);
  auto shape = in.initShape(2);
  shape.set(0, 1);
  shape.set(1, 2);
  float values[2] = {3.5f, -1.0f};
  auto data = in.initData(sizeof(values));
  std::memcpy(data.begin(), values, sizeof(values));
  return {msg, sink};
}

} // namespace

TEST_CASE("after a reload the replaced pipeline serves requests that found it, then drains") {
  running_manager running([](auto& mc) {
    explicit_mode(mc);
    mc.reload_grace = std::chrono::milliseconds(300);
  });
  auto& models = *running.models;
  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo")));
  auto old = models.find("echo");
  REQUIRE(old.ok());
  REQUIRE(std::holds_alternative<std::monostate>(request_load(models, "echo")));
  auto fresh = models.find("echo");
  REQUIRE(fresh.ok());
  CHECK((*fresh)->scheduler != (*old)->scheduler);

  // A request that found the old pipeline before the swap reaches it after.
  auto sink = std::make_shared<promised_sink>();
  auto answer = sink->answer.get_future();
  caf::anon_send((*old)->scheduler, echo_job(sink));
  REQUIRE(answer.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto r = answer.get();
  CHECK(r.reader().getError().getStatus() == 0);
  CHECK(r.reader().getOutputs().size() == 1);
  // Then it drains; the new one serves on.
  CHECK(eventually([&] { return !(*old)->stats->scheduler_running.load(); }));
  CHECK((*fresh)->stats->scheduler_running.load());
}
