#include "support/gpu_zoo.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace caf_serving::testing {

namespace {

serving_error fixture_error(const std::string& name, const std::string& what) {
  return serving_error{status_code::bad_request,
                       "GPU zoo fixture '" + name + "' (" + gpu_zoo_dir().string() + "): " + what
                         + "; regenerate it with tools/gpu_target_models.py (tests/gpu/zoo/"
                           "README.md)"};
}

} // namespace

fs::path gpu_zoo_dir() {
  return CAF_SERVING_GPU_ZOO_DIR;
}

std::vector<std::string> gpu_zoo_models() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(gpu_zoo_dir(), ec))
    if (e.is_directory() && fs::exists(e.path() / "config.pbtxt"))
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

result<uint64_t> gpu_zoo_weights_size(const std::string& name) {
  std::ifstream in(gpu_zoo_dir() / name / "weights.size");
  if (!in) return fixture_error(name, "weights.size is missing");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream is(text);
  uint64_t bytes = 0;
  std::string rest;
  if (!(is >> bytes) || (is >> rest))
    return fixture_error(name, "weights.size must hold one number (weights.bin's length in "
                               "bytes), not '" + text + "'");
  return bytes;
}

result<fs::path> stage_gpu_zoo_model(const std::string& name, const fs::path& dest_root) {
  const fs::path src = gpu_zoo_dir() / name;
  for (const char* f : {"config.pbtxt", "1/model.onnx"})
    if (!fs::is_regular_file(src / f)) return fixture_error(name, std::string(f) + " is missing");
  auto bytes = gpu_zoo_weights_size(name);
  if (!bytes) return bytes.error();
  const fs::path dst = dest_root / name;
  std::error_code ec;
  fs::remove_all(dst, ec);
  fs::create_directories(dst / "1", ec);
  if (ec) return fixture_error(name, "cannot create " + (dst / "1").string() + ": " + ec.message());
  for (const char* f : {"config.pbtxt", "1/model.onnx"})
    if (!fs::copy_file(src / f, dst / f, fs::copy_options::overwrite_existing, ec))
      return fixture_error(name, "cannot copy " + std::string(f) + " to " + dst.string() + ": "
                                   + ec.message());
  // A hole of the recorded length: reads as zeros, takes no disk blocks.
  const fs::path weights = dst / "1" / "weights.bin";
  int fd = ::open(weights.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return fixture_error(name, "cannot create " + weights.string() + ": " + std::strerror(errno));
  int rc = ::ftruncate(fd, static_cast<off_t>(*bytes));
  int err = errno;
  ::close(fd);
  if (rc != 0)
    return fixture_error(name, "cannot size " + weights.string() + " to " + std::to_string(*bytes)
                                 + " bytes: " + std::strerror(err));
  return dst;
}

} // namespace caf_serving::testing
