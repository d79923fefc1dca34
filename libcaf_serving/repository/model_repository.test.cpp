#include "repository/model_repository.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>

using namespace caf_serving;
using namespace caf_serving::repository;
namespace fs = std::filesystem;

namespace {

/// A fresh directory under the system's temp dir, removed again at the end of
/// the test.
class temp_repo {
public:
  temp_repo() {
    static std::atomic<int> counter{0};
    auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = fs::temp_directory_path()
            / ("caf_serving_repo_test_" + std::to_string(stamp) + "_"
               + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~temp_repo() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  temp_repo(const temp_repo&) = delete;
  temp_repo& operator=(const temp_repo&) = delete;

  const fs::path& path() const { return path_; }

  void write(const fs::path& relative, const std::string& text) const {
    auto file = path_ / relative;
    fs::create_directories(file.parent_path());
    std::ofstream out{file};
    out << text;
  }

  /// A valid model with the given version directories and extra config lines.
  void add_model(const std::string& name, std::vector<int> versions,
                 const std::string& extra = "") const {
    write(name + "/config.pbtxt",
          "backend: \"builtin\"\n"
          "input [ { name: \"I\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n"
          "output [ { name: \"O\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n"
            + extra);
    for (auto v : versions)
      write(name + "/" + std::to_string(v) + "/model.builtin", "test\n");
  }

private:
  fs::path path_;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const model_entry& find(const std::vector<model_entry>& entries,
                        const std::string& name) {
  for (const auto& e : entries)
    if (e.name == name)
      return e;
  FAIL("no entry for " << name);
  throw std::logic_error("unreachable");
}

} // namespace

TEST_CASE("versions are the numeric directories, ascending") {
  temp_repo repo;
  repo.write("m/3/x", "");
  repo.write("m/10/x", "");
  repo.write("m/1/x", "");
  repo.write("m/latest/x", "");  // not numeric
  repo.write("m/01/x", "");      // leading zero: ambiguous, ignored
  repo.write("m/7", "a file, not a directory");
  CHECK(list_versions(repo.path() / "m") == std::vector<int64_t>{1, 3, 10});
  CHECK(list_versions(repo.path() / "missing").empty());
}

TEST_CASE("select_versions follows the policy") {
  const std::vector<int64_t> available{1, 2, 5, 9};
  version_policy latest;
  CHECK(*select_versions(latest, available, "m") == std::vector<int64_t>{9});
  latest.num_versions = 3;
  CHECK(*select_versions(latest, available, "m")
        == std::vector<int64_t>{2, 5, 9});
  latest.num_versions = 10;
  CHECK(*select_versions(latest, available, "m") == available);

  version_policy all{version_policy_kind::all, 1, {}};
  CHECK(*select_versions(all, available, "m") == available);

  version_policy specific{version_policy_kind::specific, 1, {2, 9}};
  CHECK(*select_versions(specific, available, "m")
        == std::vector<int64_t>{2, 9});
  specific.versions = {2, 3, 4};
  auto missing = select_versions(specific, available, "m");
  REQUIRE_FALSE(missing.ok());
  CHECK(contains(missing.error().message,
                 "model 'm': version_policy asks for version 3, 4, but only "
                 "version 1, 2, 5, 9 exist"));
}

TEST_CASE("a scan loads good models and reports broken ones") {
  temp_repo repo;
  repo.add_model("good", {1, 2});
  repo.add_model("all_versions", {1, 4, 2}, "version_policy { all { } }");
  repo.add_model("typo", {1}, "max_batch_sise: 4\n");
  repo.add_model("no_versions", {});
  repo.add_model("wants_v3", {1, 2}, "version_policy { specific { versions: [3] } }");
  repo.add_model("labels", {1});
  repo.write("labels/config.pbtxt",
             "backend: \"builtin\"\n"
             "input [ { name: \"I\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n"
             "output [ { name: \"O\" data_type: TYPE_INT32 dims: [ 4 ]"
             " label_filename: \"labels.txt\" } ]\n");
  repo.write("no_config/1/model.onnx", "");
  repo.write(".hidden/config.pbtxt", "garbage");
  repo.write("README.md", "a file in the repository root is not a model");

  auto scanned = scan_repository(repo.path(), {});
  REQUIRE_MESSAGE(scanned.ok(), scanned.error().message);
  const auto& entries = *scanned;
  std::vector<std::string> names;
  for (const auto& e : entries)
    names.push_back(e.name);
  CHECK(names
        == std::vector<std::string>{"all_versions", "good", "labels",
                                    "no_config", "no_versions", "typo",
                                    "wants_v3"});

  const auto& good = find(entries, "good");
  REQUIRE_MESSAGE(good.config.ok(), good.config.error().message);
  CHECK(good.config->config.name == "good");
  CHECK(good.versions == std::vector<int64_t>{2});
  CHECK(good.model_dir == repo.path() / "good");
  CHECK(good.version_dirs == std::vector<fs::path>{repo.path() / "good" / "2"});

  const auto& all = find(entries, "all_versions");
  REQUIRE(all.config.ok());
  CHECK(all.versions == std::vector<int64_t>{1, 2, 4});
  CHECK(all.version_dirs.size() == 3);

  const auto& typo = find(entries, "typo");
  REQUIRE_FALSE(typo.config.ok());
  CHECK(typo.versions.empty());
  CHECK(contains(typo.config.error().message, "model 'typo': "));
  CHECK(contains(typo.config.error().message, "line 4"));
  CHECK(contains(typo.config.error().message, "'max_batch_sise'"));

  const auto& no_versions = find(entries, "no_versions");
  REQUIRE_FALSE(no_versions.config.ok());
  CHECK(contains(no_versions.config.error().message,
                 "model 'no_versions': no version directory in"));

  const auto& wants = find(entries, "wants_v3");
  REQUIRE_FALSE(wants.config.ok());
  CHECK(contains(wants.config.error().message, "asks for version 3"));

  const auto& labels = find(entries, "labels");
  REQUIRE_FALSE(labels.config.ok());
  CHECK(contains(labels.config.error().message,
                 "output 'O' names label_filename 'labels.txt'"));

  const auto& no_config = find(entries, "no_config");
  REQUIRE_FALSE(no_config.config.ok());
  CHECK(contains(no_config.config.error().message,
                 "model 'no_config': no config.pbtxt in"));
}

TEST_CASE("allow_missing_io loads a model without config.pbtxt") {
  temp_repo repo;
  repo.write("auto/1/model.onnx", "");
  auto entry = load_model_config(repo.path(), "auto", {true});
  REQUIRE_MESSAGE(entry.config.ok(), entry.config.error().message);
  CHECK(entry.config->config.name == "auto");
  CHECK(entry.config->config.inputs.empty());
  CHECK(entry.versions == std::vector<int64_t>{1});
}

TEST_CASE("a present label file loads") {
  temp_repo repo;
  repo.add_model("cls", {1});
  repo.write("cls/config.pbtxt",
             "backend: \"builtin\"\n"
             "input [ { name: \"I\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n"
             "output [ { name: \"O\" data_type: TYPE_FP32 dims: [ 4 ]"
             " label_filename: \"labels.txt\" } ]\n");
  repo.write("cls/labels.txt", "a\nb\nc\nd\n");
  auto entry = load_model_config(repo.path(), "cls", {});
  REQUIRE_MESSAGE(entry.config.ok(), entry.config.error().message);
  CHECK(entry.config->label_filenames.at("O") == "labels.txt");
}

TEST_CASE("load_model_config reloads one model and refuses odd names") {
  temp_repo repo;
  repo.add_model("m", {1});
  auto first = load_model_config(repo.path(), "m", {});
  REQUIRE(first.config.ok());
  CHECK(first.config->config.max_batch_size == 0);

  repo.add_model("m", {1, 2}, "max_batch_size: 16\n");
  auto second = load_model_config(repo.path(), "m", {});
  REQUIRE(second.config.ok());
  CHECK(second.config->config.max_batch_size == 16);
  CHECK(second.versions == std::vector<int64_t>{2});

  auto missing = load_model_config(repo.path(), "nope", {});
  REQUIRE_FALSE(missing.config.ok());
  CHECK(missing.config.error().status == status_code::not_found);
  CHECK(contains(missing.config.error().message,
                 "model 'nope' is not in the repository"));

  for (const char* bad : {"../m", "a/b", "..", ".hidden", ""}) {
    CAPTURE(bad);
    auto e = load_model_config(repo.path(), bad, {});
    REQUIRE_FALSE(e.config.ok());
    CHECK(e.config.error().status == status_code::bad_request);
    CHECK(contains(e.config.error().message, "is not a model name"));
  }
}

TEST_CASE("a missing repository is an error") {
  temp_repo repo;
  auto r = scan_repository(repo.path() / "absent", {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::not_found);
  CHECK(contains(r.error().message, "is no directory"));
}

TEST_CASE("the example repository loads") {
  auto scanned = scan_repository(CAF_SERVING_EXAMPLES_DIR, {});
  REQUIRE_MESSAGE(scanned.ok(), scanned.error().message);
  // Checks the builtin models by name, so that adding an example does not
  // break this test.
  for (const char* name : {"identity_fp32", "simple", "simple_identity", "simple_string"}) {
    CAPTURE(std::string{name});
    const auto& e = find(*scanned, name);
    REQUIRE_MESSAGE(e.config.ok(), e.config.error().message);
    CHECK(e.versions == std::vector<int64_t>{1});
    CHECK(fs::is_regular_file(e.version_dirs.at(0) / "model.builtin"));
    CHECK(e.config->config.backend == "builtin");
  }
  const auto& simple = find(*scanned, "simple");
  REQUIRE(simple.config.ok());
  const auto& c = simple.config->config;
  CHECK(c.max_batch_size == 8);
  CHECK(c.inputs.size() == 2);
  CHECK(c.outputs.size() == 2);
  CHECK(c.inputs[1].name == "INPUT1");
  CHECK(c.inputs[1].dtype == datatype::int32);
  CHECK(c.outputs[1].name == "OUTPUT1");
  CHECK(c.parameters.at("function") == "add_sub");
  CHECK_FALSE(c.dynamic_batching_enabled);
  const auto& bytes = find(*scanned, "simple_identity");
  REQUIRE(bytes.config.ok());
  CHECK(bytes.config->config.inputs[0].dtype == datatype::bytes);
  CHECK(bytes.config->config.inputs[0].dims == std::vector<int64_t>{-1});
  CHECK(bytes.config->config.parameters.at("function") == "identity");
  const auto& fp32 = find(*scanned, "identity_fp32");
  REQUIRE(fp32.config.ok());
  CHECK(fp32.config->config.max_batch_size == 64);
  CHECK(fp32.config->config.inputs[0].dtype == datatype::fp32);
  CHECK(fp32.config->config.dynamic_batching.max_queue_delay_us == 100);
}

TEST_CASE("a model with a configuration from a load request: versions from its directory") {
  temp_repo repo;
  repo.add_model("m", {1, 2, 3}, "max_batch_size: 8\n");
  parse_context ctx{"m", "the 'config' load parameter", true};
  auto parsed = parse_model_config_json(
    R"({"backend":"builtin","max_batch_size":16,"version_policy":{"specific":{"versions":[2]}}})",
    ctx);
  REQUIRE(parsed);
  auto entry = load_model_with_config(repo.path() / "m", "m", *parsed);
  REQUIRE_MESSAGE(entry.config, entry.config.error().message);
  CHECK(entry.config->config.max_batch_size == 16); // not config.pbtxt's 8
  CHECK(entry.versions == std::vector<int64_t>{2});
  CHECK(entry.version_dirs == std::vector<fs::path>{repo.path() / "m" / "2"});

  auto asks_missing = parse_model_config_json(
    R"({"backend":"builtin","version_policy":{"specific":{"versions":[7]}}})", ctx);
  REQUIRE(asks_missing);
  auto missing = load_model_with_config(repo.path() / "m", "m", *asks_missing);
  REQUIRE(!missing.config);
  CHECK(contains(missing.config.error().message, "asks for version 7"));
  auto no_dir = load_model_with_config(repo.path() / "absent", "absent", *parsed);
  REQUIRE(!no_dir.config);
  CHECK(contains(no_dir.config.error().message, "no version directory"));
}

TEST_CASE("model names are listed without reading them; the fingerprint follows changes") {
  temp_repo repo;
  repo.add_model("b", {1});
  repo.add_model("a", {1});
  repo.write(".hidden/config.pbtxt", "");
  repo.write("file.txt", "");
  CHECK(list_model_names(repo.path()) == std::vector<std::string>{"a", "b"});
  CHECK(list_model_names(repo.path() / "absent").empty());

  auto dir = repo.path() / "a";
  auto first = model_fingerprint(dir);
  CHECK(first != 0);
  CHECK(model_fingerprint(dir) == first);
  CHECK(model_fingerprint(repo.path() / "absent") == 0);

  // A new version directory, a rewritten file, a removed one: each a change.
  repo.write("a/2/model.builtin", "test\n");
  auto with_v2 = model_fingerprint(dir);
  CHECK(with_v2 != first);
  repo.write("a/config.pbtxt", "backend: \"builtin\"\nmax_batch_size: 4\n");
  auto rewritten = model_fingerprint(dir);
  CHECK(rewritten != with_v2);
  fs::remove_all(dir / "2");
  CHECK(model_fingerprint(dir) != rewritten);
}
