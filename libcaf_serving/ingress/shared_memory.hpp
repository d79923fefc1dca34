#pragma once
/// The shared-memory regions that clients register, Triton's shared-memory
/// extension: a co-located client puts tensors in a POSIX shared-memory object
/// it created (shm_open + ftruncate), registers a window of it under a name,
/// and then names that window in an inference request instead of sending the
/// bytes over HTTP.
///
/// Usage:
///
///   shared_memory_registry regions({/*allow_client_shm*/ true, /*max_regions*/ 64});
///   auto ok = regions.register_system("in0", "/my_key", 0, 4096);   // 400s as Triton
///   auto s = regions.slice("in0", 0, 64);          // bounds-checked, holds the mapping
///   if (s && copy_from_shared_memory(dst, s->data, s->size)) ...
///   regions.unregister("in0", region_kind::system);
///
/// Lifetime, as in Triton: unregistering a region that no request is using
/// removes it at once. While requests hold slices of it, unregistering only
/// marks it: it stays listed (and usable, and its name taken) until the last
/// of those slices is released, and then goes without another call. Each
/// slice also holds the mapping itself, so a region is never unmapped under a
/// request.
///
/// Faults: a client can shrink its object (ftruncate) after registering it,
/// or tmpfs can run out of space when an output is written; touching such a
/// page raises SIGBUS. Every access to region memory goes through
/// copy_from_shared_memory / copy_to_shared_memory, which turn that fault into
/// a failed copy (a 400 for the request) instead of a dead server.
///
/// CUDA shared memory (/v2/cudasharedmemory) is not built yet. It fits here as
/// a second region_kind: region names share one namespace across kinds (as in
/// Triton), register_cuda() would open a cudaIpcMemHandle_t on a device
/// instead of mmap-ing a key, shared_memory_region would carry the device id
/// and device pointer in place of the mapping (its destructor calling
/// cudaIpcCloseMemHandle), and slice() would return the device pointer with its
/// kind so the infer path can hand it to a CUDA executor instead of memcpy-ing.
/// status() and unregister() already filter by kind.

#include "core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::ingress {

struct shared_memory_config {
  /// Whether clients may register and unregister regions (Triton's
  /// --allow-client-shm, false by default there too: a client that can reach
  /// the HTTP port could otherwise have the server map, and echo back through
  /// an identity model, any shared-memory object the server's user can open).
  bool allow_client_shm = false;
  /// Most regions registered at once (--shm-region-limit); one more is a 400.
  /// Each region is one mapping; its memory is the client's object, not the
  /// server's.
  size_t max_regions = 64;
};

/// Where a region's memory lives. Only system memory is built (see above).
enum class region_kind { system };

/// One registered window [offset, offset + byte_size) of a POSIX
/// shared-memory object, mapped read-write. Unmapped when the last holder
/// (the registry or a request) lets go.
class shared_memory_region {
public:
  shared_memory_region(std::string name, std::string key, uint64_t offset, uint64_t byte_size,
                       void* mapping, size_t mapping_length, size_t data_offset);
  ~shared_memory_region();
  shared_memory_region(const shared_memory_region&) = delete;
  shared_memory_region& operator=(const shared_memory_region&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  uint64_t offset() const { return offset_; }
  uint64_t byte_size() const { return byte_size_; }
  region_kind kind() const { return region_kind::system; }
  /// The first byte of the registered window.
  char* data() const { return static_cast<char*>(mapping_) + data_offset_; }

private:
  std::string name_;
  std::string key_;
  uint64_t offset_;
  uint64_t byte_size_;
  /// mmap needs a page-aligned file offset; the mapping starts at the page
  /// holding `offset` and the window begins data_offset_ bytes into it.
  void* mapping_;
  size_t mapping_length_;
  size_t data_offset_;
};

/// A bounds-checked window of a registered region, holding the region mapped
/// and counted as in use (see Lifetime above) until it is destroyed.
struct region_slice {
  std::shared_ptr<const shared_memory_region> region;
  char* data = nullptr;
  size_t size = 0;
  /// Releases the use when the last copy goes.
  std::shared_ptr<void> use;
};

/// What GET .../status reports per region.
struct region_status {
  std::string name;
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

/// The registered regions of one server. Thread-safe.
class shared_memory_registry {
public:
  explicit shared_memory_registry(shared_memory_config cfg);

  const shared_memory_config& config() const { return cfg_; }

  /// Opens the shared-memory object `key` (as shm_open names it: "/name"),
  /// checks that [offset, offset + byte_size) lies inside it, and maps that
  /// window under `name`. Errors carry Triton's status and leading phrase:
  /// a name taken ("shared memory region 'n' already in manager"), a key that
  /// cannot be opened ("Unable to open shared memory region: 'k'"), a window
  /// past the object's end ("failed to register shared memory region 'n':
  /// invalid args"), then what to do about it.
  result<region_status> register_system(const std::string& name, const std::string& key,
                                        uint64_t offset, uint64_t byte_size);

  /// Removes `name`, or marks it to go when its last slice is released; a
  /// name not registered (or of another kind) is no error, as in Triton.
  void unregister(const std::string& name, region_kind kind);
  void unregister_all(region_kind kind);

  /// Every region of `kind` in name order, or just `name` (404 when it is not
  /// registered, or registered as another kind).
  result<std::vector<region_status>> status(std::optional<std::string> name,
                                            region_kind kind) const;

  /// The window [offset, offset + byte_size) of region `name`, checked as
  /// Triton checks it: 404 "Unable to find shared memory region: 'n'", 400
  /// "Invalid offset for shared memory region: 'n'", "Integer overflow
  /// detected: ...", "Invalid offset + byte size for shared memory region: 'n'".
  result<region_slice> slice(const std::string& name, uint64_t offset, uint64_t byte_size) const;

  size_t size() const;

  /// The table, shared with the slices' release hooks (which may run after
  /// the registry is gone, and then do nothing).
  struct entry {
    std::shared_ptr<const shared_memory_region> region;
    /// Slices alive.
    size_t in_use = 0;
    /// Unregistered while in use: removed when in_use reaches 0.
    bool awaiting_unregister = false;
  };
  struct table {
    std::mutex mutex;
    std::map<std::string, entry> regions;
  };

private:
  /// Removes or marks `it` (mutex held).
  void unregister_locked(std::map<std::string, entry>::iterator it);

  shared_memory_config cfg_;
  std::shared_ptr<table> table_ = std::make_shared<table>();
};

/// memcpy from region memory; false (nothing else happens) when the memory
/// faults, e.g. because the client truncated its object under the mapping.
bool copy_from_shared_memory(void* to, const void* from, size_t bytes);
/// memcpy into region memory; false when it faults (object truncated, or
/// tmpfs out of space for a page not yet allocated).
bool copy_to_shared_memory(void* to, const void* from, size_t bytes);

} // namespace caf_serving::ingress
