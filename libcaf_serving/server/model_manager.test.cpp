#include "server/model_manager.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <fstream>
#include <thread>

#include <unistd.h>

using namespace caf_serving;
namespace fs = std::filesystem;

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

  explicit running_manager(bool strict_model_config = false, int default_max_batch_size = 4) {
    cfg.set("scheduler.max-threads", size_t{2});
    sys = std::make_unique<caf::actor_system>(cfg);
    server::model_manager_config mc;
    mc.repository = repo.path;
    mc.strict_model_config = strict_model_config;
    mc.default_max_batch_size = default_max_batch_size;
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
    // An unload is not a failure: nothing is loaded again.
    REQUIRE(std::holds_alternative<std::monostate>(models.unload("echo")));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK_FALSE(models.find("echo").ok());
  }
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
    running_manager running(strict);
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
  running_manager running(false, 16);
  fs::create_directories(running.repo.path / "auto" / "1");
  fs::copy_file(fs::path(CAF_SERVING_ONNX_FIXTURES) / "models" / "op_gemm" / "1" / "model.onnx",
                running.repo.path / "auto" / "1" / "model.onnx");
  REQUIRE(std::holds_alternative<std::monostate>(running.models->load("auto")));
  auto p = running.models->find("auto");
  REQUIRE(p.ok());
  CHECK((*p)->config.max_batch_size == 16);
}
