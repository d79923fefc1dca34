#include "cluster/model_hash.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <memory>
#include <system_error>

namespace caf_serving::cluster {

namespace fs = std::filesystem;

namespace {

/// The regular files under `dir`, relative, in a fixed order.
result<std::vector<fs::path>> list_files(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return not_found("model directory " + dir.string() + " does not exist");
  std::vector<fs::path> out;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec))
      out.push_back(it->path().lexically_relative(dir));
  if (ec)
    return serving_error{status_code::internal,
                         "cannot read model directory " + dir.string() + ": " + ec.message()};
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return a.generic_string() < b.generic_string(); });
  return out;
}

} // namespace

result<std::string> hash_model_dir(const fs::path& dir, const std::string& config_override) {
  auto files = list_files(dir);
  if (!files)
    return files.error();
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buffer(1 << 20);
  for (const auto& rel : *files) {
    auto name = rel.generic_string();
    std::ifstream in(dir / rel, std::ios::binary);
    if (!in)
      return serving_error{status_code::internal, "cannot read " + (dir / rel).string()};
    std::error_code ec;
    auto size = std::to_string(fs::file_size(dir / rel, ec));
    // Path and size first, each with its terminator, so that no two different
    // directories give the same byte stream.
    EVP_DigestUpdate(ctx.get(), name.c_str(), name.size() + 1);
    EVP_DigestUpdate(ctx.get(), size.c_str(), size.size() + 1);
    while (in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<size_t>(in.gcount()));
    }
  }
  if (!config_override.empty()) {
    // A name no file can have (a path holds no NUL), then the override's size
    // and text, as for a file.
    static const char marker[] = "\0config override";
    auto size = std::to_string(config_override.size());
    EVP_DigestUpdate(ctx.get(), marker, sizeof(marker));
    EVP_DigestUpdate(ctx.get(), size.c_str(), size.size() + 1);
    EVP_DigestUpdate(ctx.get(), config_override.data(), config_override.size());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

result<std::vector<model_file>> read_model_files(const fs::path& dir, uint64_t max_bytes) {
  auto files = list_files(dir);
  if (!files)
    return files.error();
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& rel : *files)
    total += fs::file_size(dir / rel, ec);
  if (total > max_bytes)
    return serving_error{status_code::payload_too_large,
                         "model directory " + dir.string() + " holds " + std::to_string(total)
                           + " bytes, more than --max-ship-bytes (" + std::to_string(max_bytes)
                           + "); raise it, or give the worker a copy of the repository "
                             "(--model-repository)"};
  std::vector<model_file> out;
  for (const auto& rel : *files) {
    std::ifstream in(dir / rel, std::ios::binary);
    if (!in)
      return serving_error{status_code::internal, "cannot read " + (dir / rel).string()};
    model_file f;
    f.path = rel.generic_string();
    f.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    out.push_back(std::move(f));
  }
  return out;
}

result<fs::path> write_model_files(const fs::path& dir, const std::vector<model_file>& files) {
  for (const auto& f : files) {
    fs::path p(f.path);
    bool bad = f.path.empty() || p.is_absolute() || f.path.find('\0') != std::string::npos;
    for (const auto& part : p)
      bad = bad || part == ".." || part == ".";
    if (bad)
      return bad_request("shipped file '" + f.path + "' is not a plain path inside the model "
                         "directory");
  }
  std::error_code ec;
  auto staging = dir;
  staging += ".incoming";
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec)
    return serving_error{status_code::internal,
                         "cannot create " + staging.string() + ": " + ec.message()};
  for (const auto& f : files) {
    auto target = staging / fs::path(f.path);
    fs::create_directories(target.parent_path(), ec);
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    out.write(f.bytes.data(), static_cast<std::streamsize>(f.bytes.size()));
    if (!out)
      return serving_error{status_code::internal, "cannot write " + target.string()};
  }
  auto old = dir;
  old += ".old";
  fs::remove_all(old, ec);
  if (fs::exists(dir, ec))
    fs::rename(dir, old, ec);
  fs::rename(staging, dir, ec);
  if (ec)
    return serving_error{status_code::internal,
                         "cannot move " + staging.string() + " to " + dir.string() + ": "
                           + ec.message()};
  fs::remove_all(old, ec);
  return dir;
}

} // namespace caf_serving::cluster
