#include "ingress/shared_memory.hpp"

#include <atomic>
#include <cerrno>
#include <climits>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace caf_serving::ingress {

// -- copies that survive SIGBUS -----------------------------------------------

namespace {

/// The jump target of the copy running on this thread, if any. Initial-exec
/// TLS, so that reading it from the signal handler allocates nothing;
/// volatile, so that the compiler keeps the stores around the memcpy (it
/// knows memcpy does not read it, and would otherwise drop the first one).
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* volatile guarded_copy_exit
  = nullptr;

struct sigaction previous_sigbus_action;

extern "C" void on_sigbus(int signal, siginfo_t* info, void* context) {
  if (sigjmp_buf* jump = guarded_copy_exit) {
    guarded_copy_exit = nullptr;
    siglongjmp(*jump, 1);
  }
  // A fault outside a guarded copy is not ours to handle: put the previous
  // action back; the faulting instruction runs again and meets it.
  sigaction(SIGBUS, &previous_sigbus_action, nullptr);
  if (!(previous_sigbus_action.sa_flags & SA_SIGINFO)
      && previous_sigbus_action.sa_handler != SIG_DFL
      && previous_sigbus_action.sa_handler != SIG_IGN)
    previous_sigbus_action.sa_handler(signal);
  else if ((previous_sigbus_action.sa_flags & SA_SIGINFO)
           && previous_sigbus_action.sa_sigaction != nullptr)
    previous_sigbus_action.sa_sigaction(signal, info, context);
}

/// Installs on_sigbus once per process. A signal disposition is process-wide
/// by nature; the once-flag only keeps a second registry from installing it
/// over itself (and losing the handler it replaced).
void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    sigemptyset(&action.sa_mask);
    // SA_NODEFER: SIGBUS stays unblocked after the jump out of the handler,
    // so sigsetjmp need not save the signal mask (a system call per copy).
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGBUS, &action, &previous_sigbus_action);
  });
}

bool guarded_copy(void* to, const void* from, size_t bytes) {
  if (bytes == 0)
    return true;
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0)
    return false;
  guarded_copy_exit = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(to, from, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guarded_copy_exit = nullptr;
  return true;
}

std::string quoted(std::string_view s) {
  return "'" + std::string(s) + "'";
}

/// Whether `key` is one POSIX shared-memory name: slashes, then a name of
/// 1 to NAME_MAX bytes without a slash, not "." or "..". shm_open refuses
/// most others itself; checking first gives a message that says why.
bool valid_key(std::string_view key) {
  auto first = key.find_first_not_of('/');
  if (first == std::string_view::npos)
    return false;
  auto name = key.substr(first);
  return name.size() <= NAME_MAX && name.find('/') == std::string_view::npos
         && name.find('\0') == std::string_view::npos && name != "." && name != "..";
}

} // namespace

bool copy_from_shared_memory(void* to, const void* from, size_t bytes) {
  return guarded_copy(to, from, bytes);
}

bool copy_to_shared_memory(void* to, const void* from, size_t bytes) {
  return guarded_copy(to, from, bytes);
}

// -- shared_memory_region -----------------------------------------------------

shared_memory_region::shared_memory_region(std::string name, std::string key, uint64_t offset,
                                           uint64_t byte_size, void* mapping,
                                           size_t mapping_length, size_t data_offset)
    : name_(std::move(name)),
      key_(std::move(key)),
      offset_(offset),
      byte_size_(byte_size),
      mapping_(mapping),
      mapping_length_(mapping_length),
      data_offset_(data_offset) {}

shared_memory_region::~shared_memory_region() {
  munmap(mapping_, mapping_length_);
}

// -- shared_memory_registry ---------------------------------------------------

shared_memory_registry::shared_memory_registry(shared_memory_config cfg) : cfg_(cfg) {
  install_sigbus_handler();
}

result<region_status> shared_memory_registry::register_system(const std::string& name,
                                                              const std::string& key,
                                                              uint64_t offset,
                                                              uint64_t byte_size) {
  std::string failed = "failed to register shared memory region " + quoted(name) + ": ";
  if (!valid_key(key))
    return bad_request("cannot register shared memory region " + quoted(name)
                       + " - invalid shm key " + quoted(key)
                       + "; the key is the name the client gave shm_open, one name after a "
                         "leading '/', e.g. '/input0_data'");
  if (byte_size == 0)
    return bad_request(failed + "invalid args; byte_size is 0, register at least one byte");
  for (auto prefix : {std::string_view("triton_python_backend_shm_region_")}) {
    // Triton reserves this prefix for its Python backend's own regions;
    // refused here too, so that a client written against Triton sees the same.
    if (key.substr(key.find_first_not_of('/')).rfind(prefix, 0) == 0)
      return bad_request("cannot register shared memory region " + quoted(name) + " with key "
                         + quoted(key) + " as the key contains the reserved prefix "
                         + quoted(prefix) + "; choose a key without it");
  }
  std::lock_guard<std::mutex> guard(table_->mutex);
  auto& regions = table_->regions;
  if (regions.count(name) != 0)
    return bad_request("shared memory region " + quoted(name)
                       + " already in manager; unregister it first (POST "
                         "/v2/systemsharedmemory/region/"
                       + name + "/unregister) or register under another name");
  if (regions.size() >= cfg_.max_regions)
    return bad_request("cannot register shared memory region " + quoted(name) + ": "
                       + std::to_string(regions.size())
                       + " regions are registered, the server's limit (--shm-region-limit); "
                         "unregister regions that are no longer used");
  int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    int err = errno;
    std::string why = err == ENOENT
                        ? "no shared-memory object has that key on the server's machine; "
                          "create it first (shm_open with O_CREAT, then ftruncate) on the "
                          "machine the server runs on"
                      : err == EACCES ? "the server's user may not open it for reading and "
                                        "writing; give that user read-write permission"
                                      : std::string("shm_open failed: ") + std::strerror(err);
    return bad_request("Unable to open shared memory region: " + quoted(key) + "; " + why);
  }
  struct stat st {};
  bool sized = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0;
  if (!sized) {
    close(fd);
    return bad_request("Invalid shared memory region: " + quoted(key)
                       + "; it is not a shared-memory object whose size can be read");
  }
  auto object_size = static_cast<uint64_t>(st.st_size);
  if (offset > object_size || byte_size > object_size - offset) {
    close(fd);
    return bad_request(failed + "invalid args; offset " + std::to_string(offset)
                       + " + byte_size " + std::to_string(byte_size) + " is past the end of "
                       + quoted(key) + ", which has " + std::to_string(object_size)
                       + " bytes");
  }
  // mmap's file offset must be a multiple of the page size; the window may
  // start anywhere, so the mapping starts at its page.
  auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t map_offset = offset - offset % page;
  size_t data_offset = static_cast<size_t>(offset - map_offset);
  size_t length = data_offset + static_cast<size_t>(byte_size);
  void* mapping = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       static_cast<off_t>(map_offset));
  int map_errno = errno;
  close(fd);
  if (mapping == MAP_FAILED)
    return bad_request(failed + "cannot map it: " + std::strerror(map_errno));
  auto region = std::make_shared<const shared_memory_region>(name, key, offset, byte_size,
                                                             mapping, length, data_offset);
  regions.emplace(name, entry{region});
  return region_status{name, key, offset, byte_size};
}

void shared_memory_registry::unregister_locked(std::map<std::string, entry>::iterator it) {
  if (it->second.in_use > 0)
    it->second.awaiting_unregister = true;
  else
    table_->regions.erase(it);
}

void shared_memory_registry::unregister(const std::string& name, region_kind kind) {
  std::lock_guard<std::mutex> guard(table_->mutex);
  auto it = table_->regions.find(name);
  if (it != table_->regions.end() && it->second.region->kind() == kind)
    unregister_locked(it);
}

void shared_memory_registry::unregister_all(region_kind kind) {
  std::lock_guard<std::mutex> guard(table_->mutex);
  auto& regions = table_->regions;
  for (auto it = regions.begin(); it != regions.end();) {
    auto next = std::next(it);
    if (it->second.region->kind() == kind)
      unregister_locked(it);
    it = next;
  }
}

result<std::vector<region_status>> shared_memory_registry::status(std::optional<std::string> name,
                                                                  region_kind kind) const {
  std::lock_guard<std::mutex> guard(table_->mutex);
  const auto& regions = table_->regions;
  std::vector<region_status> out;
  auto add = [&out](const shared_memory_region& r) {
    out.push_back({r.name(), r.key(), r.offset(), r.byte_size()});
  };
  if (!name) {
    for (const auto& [n, e] : regions)
      if (e.region->kind() == kind)
        add(*e.region);
    return out;
  }
  auto it = regions.find(*name);
  if (it == regions.end() || it->second.region->kind() != kind)
    return not_found("Unable to find system shared memory region: " + quoted(*name)
                     + "; GET /v2/systemsharedmemory/status lists the registered regions");
  add(*it->second.region);
  return out;
}

result<region_slice> shared_memory_registry::slice(const std::string& name, uint64_t offset,
                                                   uint64_t byte_size) const {
  std::lock_guard<std::mutex> guard(table_->mutex);
  auto it = table_->regions.find(name);
  if (it == table_->regions.end())
    return not_found("Unable to find shared memory region: " + quoted(name)
                     + "; register it first (POST /v2/systemsharedmemory/region/" + name
                     + "/register)");
  const auto& region = it->second.region;
  uint64_t size = region->byte_size();
  std::string has = "; region " + quoted(name) + " has " + std::to_string(size) + " bytes";
  if (offset >= size)
    return bad_request("Invalid offset for shared memory region: " + quoted(name) + has
                       + " and shared_memory_offset " + std::to_string(offset)
                       + " is not inside it");
  if (byte_size > UINT64_MAX - offset)
    return bad_request("Integer overflow detected: byte_size (" + std::to_string(byte_size)
                       + ") + offset (" + std::to_string(offset) + ") exceeds maximum value ("
                       + std::to_string(UINT64_MAX) + ") for region " + quoted(name));
  if (offset + byte_size > size)
    return bad_request("Invalid offset + byte size for shared memory region: " + quoted(name)
                       + has + "; shared_memory_offset " + std::to_string(offset)
                       + " + shared_memory_byte_size " + std::to_string(byte_size)
                       + " passes its end");
  region_slice s;
  s.data = region->data() + offset;
  s.size = static_cast<size_t>(byte_size);
  s.region = region;
  ++it->second.in_use;
  // While in use the entry cannot be erased (unregistering only marks it),
  // so the name finds the same entry when the use ends.
  std::weak_ptr<table> weak = table_;
  s.use = std::shared_ptr<void>(nullptr, [weak, name](void*) {
    auto t = weak.lock();
    if (!t)
      return;
    std::lock_guard<std::mutex> guard(t->mutex);
    auto e = t->regions.find(name);
    if (e != t->regions.end() && --e->second.in_use == 0 && e->second.awaiting_unregister)
      t->regions.erase(e);
  });
  return s;
}

size_t shared_memory_registry::size() const {
  std::lock_guard<std::mutex> guard(table_->mutex);
  return table_->regions.size();
}

} // namespace caf_serving::ingress
