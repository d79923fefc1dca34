#include "onnx/external_data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace caf_serving::onnx {

namespace fs = std::filesystem;

/// A whole file mapped read-only; unmapped when the last view goes.
struct external_files::mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;

  mapping() = default;
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping() {
    if (data)
      munmap(const_cast<uint8_t*>(data), size);
  }
};

external_files::external_files(fs::path model_dir) : dir_(std::move(model_dir)) {
}

result<std::shared_ptr<const external_files::mapping>>
external_files::open(const std::string& location, const std::string& tensor) {
  auto refuse = [&](const std::string& why) {
    return bad_request("tensor '" + tensor + "' keeps its data in external file '" + location
                       + "', " + why);
  };
  fs::path rel(location);
  if (location.empty())
    return refuse("an empty location; re-save the model with onnx.save_model(..., "
                  "save_as_external_data=True)");
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
    return refuse("an absolute path; external data must be a relative path inside the "
                  "model's directory");
  for (const auto& part : rel)
    if (part == "..")
      return refuse("which leads out of the model's directory ('..'); external data must be "
                    "a relative path inside the model's directory");
  std::error_code ec;
  auto dir = fs::canonical(dir_, ec);
  if (ec)
    return refuse("but the model's directory " + dir_.string() + " cannot be resolved: "
                  + ec.message());
  auto file = fs::canonical(dir / rel, ec);
  if (ec)
    return refuse("which cannot be opened (" + ec.message() + "); put it next to model.onnx");
  // A symbolic link inside the directory may point anywhere: the resolved
  // path must still be inside it.
  auto [d, f] = std::mismatch(dir.begin(), dir.end(), file.begin(), file.end());
  if (d != dir.end())
    return refuse("which resolves to " + file.string() + ", outside the model's directory "
                  "(a symbolic link); copy the file into the model's directory");
  if (auto it = files_.find(file); it != files_.end())
    return it->second;
  // O_NOFOLLOW: a link swapped in after the check above is not followed.
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return refuse("which cannot be opened (" + std::string(std::strerror(errno)) + ")");
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return refuse("which is not a regular file");
  }
  auto m = std::make_shared<mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    void* p = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return refuse("which cannot be mapped (" + std::string(std::strerror(err)) + ")");
    }
    m->data = static_cast<const uint8_t*>(p);
  }
  ::close(fd); // the mapping keeps the file
  files_[file] = m;
  return std::shared_ptr<const mapping>(m);
}

result<tensor_bytes> external_files::read(const external_location& where, size_t bytes,
                                          size_t align, const std::string& tensor) {
  auto m = open(where.location, tensor);
  if (!m)
    return m.error();
  const auto& file = **m;
  auto range = [&] {
    return "offset " + std::to_string(where.offset)
           + (where.length ? ", length " + std::to_string(*where.length) : std::string())
           + " in '" + where.location + "' (" + std::to_string(file.size) + " bytes)";
  };
  if (where.offset > file.size
      || (where.length && *where.length > file.size - where.offset))
    return bad_request("tensor '" + tensor + "' reads " + range()
                       + ", past the end of the file; the file is truncated or belongs to "
                         "another export of the model");
  uint64_t length = where.length ? *where.length : file.size - where.offset;
  if (length != bytes)
    return bad_request("tensor '" + tensor + "' needs " + std::to_string(bytes)
                       + " bytes, but its external data is " + std::to_string(length)
                       + " bytes at " + range() + "; the file is damaged");
  const uint8_t* p = file.data + where.offset;
  if (align > 1 && reinterpret_cast<uintptr_t>(p) % align != 0) {
    tensor_bytes copy;
    copy.assign(p, p + bytes);
    return copy;
  }
  return tensor_bytes::view(*m, p, bytes);
}

} // namespace caf_serving::onnx
