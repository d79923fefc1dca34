#include "cluster/model_hash.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace caf_serving::cluster;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("caf-serving-hash-" + std::to_string(getpid()) + "-"
                                        + std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

} // namespace

TEST_CASE("the hash follows the files' contents and paths, not where the directory is") {
  temp_dir a, b;
  write(a.path / "config.pbtxt", "name: \"m\"");
  write(a.path / "1/model.onnx", "weights");
  write(b.path / "config.pbtxt", "name: \"m\"");
  write(b.path / "1/model.onnx", "weights");
  auto ha = hash_model_dir(a.path), hb = hash_model_dir(b.path);
  REQUIRE(ha);
  REQUIRE(hb);
  CHECK(*ha == *hb);
  CHECK(ha->size() == 64);
  write(b.path / "1/model.onnx", "weightz");
  CHECK(*hash_model_dir(b.path) != *ha);
  write(b.path / "1/model.onnx", "weights");
  write(b.path / "2/model.onnx", "");
  CHECK(*hash_model_dir(b.path) != *ha); // a new (empty) version file counts
  CHECK(!hash_model_dir(a.path / "missing"));
}

TEST_CASE("a config override is part of the hash: a config-only load changes it") {
  temp_dir a, b;
  for (auto* d : {&a, &b}) {
    write(d->path / "config.pbtxt", "name: \"m\"\nbackend: \"builtin\"");
    write(d->path / "1/model.txt", "builtin");
  }
  auto plain = hash_model_dir(a.path);
  auto with_16 = hash_model_dir(a.path, R"({"max_batch_size": 16})");
  auto with_32 = hash_model_dir(a.path, R"({"max_batch_size": 32})");
  REQUIRE(plain);
  REQUIRE(with_16);
  REQUIRE(with_32);
  CHECK(*with_16 != *plain);
  CHECK(*with_32 != *with_16);
  // The same files with the same override hash alike wherever they are.
  CHECK(*hash_model_dir(b.path, R"({"max_batch_size": 16})") == *with_16);
  CHECK(*hash_model_dir(b.path, "") == *plain);
  // The override is not a file: one of that text in the directory hashes otherwise.
  write(b.path / "config override", R"({"max_batch_size": 16})");
  CHECK(*hash_model_dir(b.path) != *with_16);
}

TEST_CASE("shipped files are written as a whole directory with the same hash") {
  temp_dir src, dst;
  write(src.path / "config.pbtxt", "name: \"m\"");
  write(src.path / "1/model.onnx", std::string(100000, 'x'));
  auto files = read_model_files(src.path, 1 << 20);
  REQUIRE(files);
  CHECK(files->size() == 2);
  auto target = dst.path / "m";
  write(target / "stale.txt", "left from an older version");
  REQUIRE(write_model_files(target, *files));
  CHECK(!fs::exists(target / "stale.txt"));
  CHECK(*hash_model_dir(target) == *hash_model_dir(src.path));
  auto too_big = read_model_files(src.path, 1000);
  REQUIRE(!too_big);
  CHECK(too_big.error().message.find("--max-ship-bytes") != std::string::npos);
}

TEST_CASE("a shipped path that leaves the model directory is refused") {
  temp_dir dst;
  for (const char* bad : {"../evil", "/etc/passwd", "", "1/../../x"}) {
    auto r = write_model_files(dst.path / "m", {model_file{bad, "x"}});
    CHECK_MESSAGE(!r, bad);
  }
}
