#include "server/load_files.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <sstream>

using namespace caf_serving;
using namespace caf_serving::server;
namespace fs = std::filesystem;

namespace {

/// A fresh parent directory for the loads of one test, removed at its end.
struct temp_parent {
  fs::path path = fs::temp_directory_path()
                  / ("caf_serving_load_files_test_"
                     + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  temp_parent() { fs::create_directories(path); }
  ~temp_parent() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t entries(const fs::path& dir) {
  size_t n = 0;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
       ++it)
    ++n;
  return n;
}

} // namespace

TEST_CASE("base64 decodes with and without padding, and names where it is broken") {
  CHECK(*decode_base64("") == "");
  CHECK(*decode_base64("YQ==") == "a");
  CHECK(*decode_base64("YQ") == "a");
  CHECK(*decode_base64("YWI=") == "ab");
  CHECK(*decode_base64("YWJj") == "abc");
  CHECK(*decode_base64("+/8A") == std::string("\xfb\xff\x00", 3));
  auto bad = decode_base64("YW*j");
  REQUIRE(!bad);
  CHECK(bad.error().status == status_code::bad_request);
  CHECK(bad.error().message.find("byte 2 is not base64") != std::string::npos);
  CHECK(!decode_base64("YWJjZ"));  // one character past a whole group
  CHECK(!decode_base64("YR=="));   // non-zero bits in the padding
  CHECK(!decode_base64("YQ=a"));   // '=' in the middle
}

TEST_CASE("a file path must stay below the load's directory") {
  CHECK_FALSE(check_load_file_path("1/model.onnx"));
  CHECK_FALSE(check_load_file_path("labels.txt"));
  for (const char* bad : {"", "/etc/passwd", "../x", "1/../../x", "./x", "1//x", "1/", "a\\b",
                          "..", "1/./x"})
    CHECK_MESSAGE(check_load_file_path(bad), bad);
  CHECK(check_load_file_path(std::string(256, 'A'))->find("255") != std::string::npos);
}

TEST_CASE("files are written into a fresh directory that goes with its last owner") {
  temp_parent parent;
  load_files_config cfg;
  cfg.parent = parent.path;
  fs::path where;
  {
    auto dir = write_load_files({{"1/model.onnx", "b25ueA=="}, {"labels.txt", "YQpi"}}, cfg);
    REQUIRE_MESSAGE(dir, dir.error().message);
    where = (*dir)->path();
    CHECK(where.parent_path() == parent.path);
    CHECK(read(where / "1" / "model.onnx") == "onnx");
    CHECK(read(where / "labels.txt") == "a\nb");
  }
  CHECK_FALSE(fs::exists(where));
}

TEST_CASE("refused files write nothing outside, and the limit is an answer") {
  temp_parent parent;
  load_files_config cfg;
  cfg.parent = parent.path;
  // A link planted where a path would lead is never followed (the directory is
  // fresh, so only a racing process could plant one; O_NOFOLLOW refuses it).
  auto outside = parent.path / "outside";
  fs::create_directories(outside);
  for (const char* path : {"../outside/x", "/tmp/x", "1/../../outside/x"}) {
    auto r = write_load_files({{path, "YQ=="}}, cfg);
    REQUIRE_MESSAGE(!r, path);
    CHECK(r.error().status == status_code::internal);
    CHECK(r.error().message.find(std::string("file:") + path) == 0);
  }
  CHECK(entries(outside) == 0);

  auto twice = write_load_files({{"1/m", "YQ=="}, {"1/m", "Yg=="}}, cfg);
  REQUIRE(!twice);
  CHECK(twice.error().message.find("sent twice") != std::string::npos);
  auto dir_and_file = write_load_files({{"1", "YQ=="}, {"1/m", "Yg=="}}, cfg);
  REQUIRE(!dir_and_file);

  auto not_base64 = write_load_files({{"1/m", "%%%%"}}, cfg);
  REQUIRE(!not_base64);
  CHECK(not_base64.error().status == status_code::bad_request);

  cfg.max_total_bytes = 4;
  auto big = write_load_files({{"1/m", "YWJjZGVm"}}, cfg);  // 6 bytes
  REQUIRE(!big);
  CHECK(big.error().status == status_code::payload_too_large);
  CHECK(big.error().message.find("--model-load-max-file-bytes") != std::string::npos);
  auto split = write_load_files({{"1/a", "YWJj"}, {"1/b", "YWJj"}}, cfg);  // 3 + 3
  REQUIRE(!split);
  CHECK(split.error().status == status_code::payload_too_large);
  // Every refused load has removed its directory again.
  CHECK(entries(parent.path) == 1); // "outside" only
}
