#include "support/gpu_zoo.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
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

/// splitmix64: a counter-based generator, so any element's value depends on
/// the seed and its index only.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Writes each FLOAT tensor of `stats` into `fd` as uniform values on
/// [mean - sqrt(3) sd, mean + sqrt(3) sd] (that mean and deviation).
result<bool> write_pseudo_random(int fd, const std::string& name,
                                 const std::vector<zoo_tensor_stats>& stats, uint64_t seed) {
  std::vector<float> chunk;
  for (size_t k = 0; k < stats.size(); ++k) {
    const auto& t = stats[k];
    if (t.type != "FLOAT" || t.length % 4 != 0)
      return fixture_error(name, "weights.stats: tensor '" + t.name + "' is " + t.type + " of "
                                   + std::to_string(t.length) + " bytes; only FLOAT is filled");
    const uint64_t stream = mix(seed ^ mix(k + 1));
    const double half = std::sqrt(3.0) * t.stddev;
    const uint64_t count = t.length / 4;
    for (uint64_t first = 0; first < count; first += chunk.size()) {
      chunk.resize(std::min<uint64_t>(count - first, 1u << 20));
      for (size_t i = 0; i < chunk.size(); ++i) {
        double u = static_cast<double>(mix(stream + first + i) >> 11) * 0x1.0p-53;
        chunk[i] = static_cast<float>(t.mean + half * (2 * u - 1));
      }
      auto bytes = chunk.size() * sizeof(float);
      auto at = static_cast<off_t>(t.offset + first * sizeof(float));
      if (::pwrite(fd, chunk.data(), bytes, at) != static_cast<ssize_t>(bytes))
        return fixture_error(name, std::string("writing weights.bin: ") + std::strerror(errno));
    }
  }
  return true;
}

} // namespace

fs::path gpu_zoo_dir() {
  // A build carried to another machine (scripts/device-bundle) finds the
  // fixtures in that machine's copy of the tree.
  if (const char* dir = std::getenv("CAF_SERVING_GPU_ZOO_DIR")) return dir;
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

result<std::vector<zoo_tensor_stats>> gpu_zoo_weights_stats(const std::string& name) {
  std::ifstream in(gpu_zoo_dir() / name / "weights.stats");
  if (!in) return fixture_error(name, "weights.stats is missing");
  std::vector<zoo_tensor_stats> stats;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    zoo_tensor_stats t;
    std::string rest;
    if (!(is >> t.name >> t.type >> t.offset >> t.length >> t.mean >> t.stddev) || (is >> rest))
      return fixture_error(name, "weights.stats line " + std::to_string(number) + " is '" + line
                                   + "'; expected: name type offset length mean stddev");
    stats.push_back(std::move(t));
  }
  return stats;
}

result<fs::path> stage_gpu_zoo_model(const std::string& name, const fs::path& dest_root,
                                     const gpu_zoo_stage_config& cfg) {
  const fs::path src = gpu_zoo_dir() / name;
  for (const char* f : {"config.pbtxt", "1/model.onnx"})
    if (!fs::is_regular_file(src / f)) return fixture_error(name, std::string(f) + " is missing");
  auto bytes = gpu_zoo_weights_size(name);
  if (!bytes) return bytes.error();
  std::vector<zoo_tensor_stats> stats;
  if (cfg.weights == zoo_weights::pseudo_random) {
    auto read = gpu_zoo_weights_stats(name);
    if (!read) return read.error();
    stats = std::move(*read);
    for (const auto& t : stats)
      if (t.offset + t.length > *bytes)
        return fixture_error(name, "weights.stats: tensor '" + t.name + "' ends at byte "
                                     + std::to_string(t.offset + t.length)
                                     + ", past weights.size " + std::to_string(*bytes));
  }
  const fs::path dst = dest_root / name;
  std::error_code ec;
  fs::remove_all(dst, ec);
  fs::create_directories(dst / "1", ec);
  if (ec) return fixture_error(name, "cannot create " + (dst / "1").string() + ": " + ec.message());
  for (const char* f : {"config.pbtxt", "1/model.onnx"})
    if (!fs::copy_file(src / f, dst / f, fs::copy_options::overwrite_existing, ec))
      return fixture_error(name, "cannot copy " + std::string(f) + " to " + dst.string() + ": "
                                   + ec.message());
  // A hole of the recorded length: reads as zeros, takes no disk blocks;
  // pseudo_random then writes the tensors into it (the alignment padding
  // between them stays a hole).
  const fs::path weights = dst / "1" / "weights.bin";
  int fd = ::open(weights.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return fixture_error(name, "cannot create " + weights.string() + ": " + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(*bytes)) != 0) {
    int err = errno;
    ::close(fd);
    return fixture_error(name, "cannot size " + weights.string() + " to "
                                 + std::to_string(*bytes) + " bytes: " + std::strerror(err));
  }
  auto written = cfg.weights == zoo_weights::pseudo_random
                   ? write_pseudo_random(fd, name, stats, cfg.seed)
                   : result<bool>(true);
  ::close(fd);
  if (!written) return written.error();
  return dst;
}

} // namespace caf_serving::testing
