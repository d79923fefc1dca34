#include "server/load_files.hpp"

#include <cerrno>
#include <cstring>
#include <system_error>

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

namespace caf_serving::server {

namespace fs = std::filesystem;

namespace {

/// Closes a file descriptor when it goes out of scope.
class fd_guard {
public:
  explicit fd_guard(int fd) : fd_(fd) {}
  ~fd_guard() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = fd;
  }

private:
  int fd_;
};

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

std::vector<std::string_view> components(std::string_view path) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    auto slash = path.find('/', at);
    out.push_back(path.substr(at, slash == std::string_view::npos ? slash : slash - at));
    if (slash == std::string_view::npos)
      return out;
    at = slash + 1;
  }
}

serving_error refused(const std::string& path, const std::string& why) {
  return {status_code::internal, "file:" + path + " " + why};
}

/// Writes `bytes` to `path` below the directory `root_fd`, creating the
/// directories on the way; no step follows a link or reuses a file.
std::optional<serving_error> write_one(int root_fd, const std::string& path,
                                       const std::string& bytes) {
  auto parts = components(path);
  fd_guard dir(::dup(root_fd));
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    std::string name(parts[i]);
    if (::mkdirat(dir.get(), name.c_str(), 0700) != 0 && errno != EEXIST)
      return refused(path, "cannot be written: directory '" + name + "': "
                             + std::strerror(errno));
    int next = ::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0)
      return refused(path, "cannot be written: '" + name + "' is not a directory of this load ("
                             + std::strerror(errno) + ")");
    dir.reset(next);
  }
  std::string leaf(parts.back());
  fd_guard file(::openat(dir.get(), leaf.c_str(),
                         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (file.get() < 0)
    return refused(path, errno == EEXIST
                           ? std::string("is sent twice, or is also a directory of another "
                                         "file: parameter; send each file once")
                           : "cannot be written: " + std::string(std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    auto n = ::write(file.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return refused(path, "cannot be written: " + std::string(std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return std::nullopt;
}

} // namespace

load_directory::~load_directory() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::optional<std::string> check_load_file_path(std::string_view path) {
  if (path.empty())
    return "names no file; write file:<path in the model directory>, e.g. file:1/model.onnx";
  if (path.size() > 4096)
    return "is longer than 4096 bytes";
  if (path.front() == '/')
    return "is an absolute path; name the file relative to the model directory, e.g. "
           "file:1/model.onnx";
  if (path.find('\0') != std::string_view::npos || path.find('\\') != std::string_view::npos)
    return "holds a NUL or a backslash; separate directories with '/'";
  auto parts = components(path);
  if (parts.size() > 16)
    return "is more than 16 directories deep";
  for (auto part : parts) {
    if (part.empty())
      return "has an empty component ('//' or a trailing '/'); name a file";
    if (part == "." || part == "..")
      return "has a '" + std::string(part) + "' component; a file may only be named below "
             "the model directory";
    if (part.size() > NAME_MAX)
      return "has a component of " + std::to_string(part.size()) + " bytes, over the "
             + std::to_string(NAME_MAX) + " a file name may have";
  }
  return std::nullopt;
}

result<std::string> decode_base64(std::string_view text) {
  auto end = text.size();
  while (end > 0 && text[end - 1] == '=' && text.size() - end < 2)
    --end;
  std::string out;
  out.reserve(end / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < end; ++i) {
    int v = base64_value(text[i]);
    if (v < 0)
      return bad_request("byte " + std::to_string(i) + " is not base64 ('"
                         + std::string(1, text[i]) + "'); encode the file with standard "
                         "base64 (A-Z, a-z, 0-9, '+', '/', '=' padding)");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  // Leftover bits must be padding zeros, and at most 4 bits may be left.
  if (bits >= 6 || (acc & ((1u << bits) - 1)) != 0)
    return bad_request("the base64 text ends in the middle of a byte (" + std::to_string(end)
                       + " characters); send the whole encoded file");
  return out;
}

result<std::shared_ptr<const load_directory>>
write_load_files(const std::vector<load_file>& files, const load_files_config& cfg) {
  uint64_t total = 0;
  for (const auto& f : files) {
    if (auto why = check_load_file_path(f.path))
      return refused(f.path, *why);
    total += f.base64.size() / 4 * 3;
  }
  // Checked on the encoded size first, so that nothing is decoded past the limit.
  auto too_large = [&](uint64_t bytes) -> serving_error {
    return {status_code::payload_too_large,
            "the file: parameters hold " + std::to_string(bytes) + " bytes, over the limit of "
              + std::to_string(cfg.max_total_bytes)
              + " bytes for one load (--model-load-max-file-bytes)"};
  };
  if (total > cfg.max_total_bytes + 2 * files.size())
    return too_large(total);
  std::error_code ec;
  auto parent = cfg.parent.empty() ? fs::temp_directory_path(ec) : cfg.parent;
  if (ec)
    parent = "/tmp";
  std::string pattern = (parent / "caf-serving-load-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    return serving_error{status_code::internal,
                         "cannot make a directory for the load's files under " + parent.string()
                           + ": " + std::strerror(errno)};
  auto dir = std::make_shared<const load_directory>(pattern);
  fd_guard root(::open(pattern.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (root.get() < 0)
    return serving_error{status_code::internal,
                         "cannot open " + pattern + ": " + std::strerror(errno)};
  uint64_t written = 0;
  for (const auto& f : files) {
    auto bytes = decode_base64(f.base64);
    if (!bytes)
      return bad_request("file:" + f.path + ": " + bytes.error().message);
    written += bytes->size();
    if (written > cfg.max_total_bytes)
      return too_large(written);
    if (auto e = write_one(root.get(), f.path, *bytes))
      return *e;
  }
  return dir;
}

} // namespace caf_serving::server
