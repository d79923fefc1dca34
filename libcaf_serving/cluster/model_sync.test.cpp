#include "cluster/model_sync.hpp"

#include <doctest/doctest.h>

using namespace caf_serving::cluster;

TEST_CASE("the same hash on both sides: attached, nothing to load") {
  model_sync_input in;
  in.served = {{"m", "aaa"}};
  in.worker = {{"m", "aaa"}};
  auto plan = plan_model_sync(in);
  CHECK(plan.attach == std::vector<std::string>{"m"});
  CHECK(plan.ship.empty());
  CHECK(plan.reload.empty());
  CHECK(plan.mismatched.empty());
}

TEST_CASE("a worker with its own repository and another copy: reloaded once, then kept out") {
  model_sync_input in;
  in.served = {{"m", "aaa"}};
  in.worker = {{"m", "bbb"}};
  auto first = plan_model_sync(in);
  CHECK(first.attach.empty());
  CHECK(first.reload == std::vector<std::string>{"m"});
  in.tried["m"] = "aaa"; // the reload gave "bbb" again
  auto second = plan_model_sync(in);
  CHECK(second.attach.empty());
  CHECK(second.reload.empty());
  REQUIRE(second.mismatched.count("m") == 1);
  CHECK(second.mismatched["m"].find("bbb") != std::string::npos);
  // The server reloads a new version of it: the worker is asked again.
  in.served["m"] = "ccc";
  CHECK(plan_model_sync(in).reload == std::vector<std::string>{"m"});
}

TEST_CASE("a worker without a repository gets the files of what it lacks or holds otherwise") {
  model_sync_input in;
  in.accepts_files = true;
  in.served = {{"a", "1"}, {"b", "2"}, {"c", "3"}};
  in.worker = {{"b", "old"}, {"c", "3"}};
  auto plan = plan_model_sync(in);
  CHECK(plan.ship == std::vector<std::string>{"a", "b"});
  CHECK(plan.attach == std::vector<std::string>{"c"});
  in.pending = {"a", "b"};
  auto waiting = plan_model_sync(in);
  CHECK(waiting.ship.empty());
  CHECK(waiting.mismatched.empty());
}

TEST_CASE("placement and unloads") {
  model_sync_input in;
  in.placement = {"a"};
  in.served = {{"a", "1"}, {"b", "2"}};
  in.worker = {{"a", "1"}, {"z", "9"}};
  auto plan = plan_model_sync(in);
  CHECK(plan.attach == std::vector<std::string>{"a"});
  CHECK(plan.reload.empty()); // b is not placed on this worker
  CHECK(plan.unload == std::vector<std::string>{"z"});
}

TEST_CASE("a worker with a repository gets shipped what it lacks, and reloads its own copies") {
  model_sync_input in;
  in.accepts_files = true;
  in.own_repository = true;
  in.served = {{"missing", "1"}, {"own", "2"}, {"was_shipped", "3"}};
  in.worker = {{"own", "old"}, {"was_shipped", "old"}};
  in.shipped = {"was_shipped"};
  auto plan = plan_model_sync(in);
  CHECK(plan.ship == std::vector<std::string>{"missing", "was_shipped"});
  CHECK(plan.reload == std::vector<std::string>{"own"});
}
