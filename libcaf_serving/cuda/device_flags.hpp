#pragma once
/// Error flags that device steps set (Gather's out-of-range indices) and the
/// executor reads once per batch, after it has synchronized its streams anyway:
/// no step synchronizes, and captured graphs keep working.
///
///   int* flag = ctx.flags.add("Gather 'emb': an index of 'ids' is out of range ..."); // at load
///   ... kernel sets *flag = 1 (device pointer of mapped page-locked memory) ...
///   if (auto what = ctx.flags.take()) return error(*what); // after the batch
///
/// The flags are page-locked host memory mapped into the device, so reading them
/// needs no copy; take() clears what it read, so a batch only sees its own.

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace caf_serving::cuda {

class device_flags {
public:
  device_flags() = default;
  device_flags(const device_flags&) = delete;
  device_flags& operator=(const device_flags&) = delete;
  ~device_flags();

  /// A new flag, zero, that names `what` when set; the device address to pass to
  /// a kernel. Allocates (at load only) a page-locked block per `block_flags`.
  int* add(std::string what);

  /// The message of the first set flag (nullopt when none is set), clearing every
  /// flag. Call only when the steps that may set them have completed.
  std::optional<std::string> take();

  size_t size() const { return flags_.size(); }

  static constexpr size_t block_flags = 1024;

private:
  struct block {
    int* host = nullptr;
    int* device = nullptr;
  };
  std::vector<block> blocks_;
  std::vector<std::pair<int*, std::string>> flags_; ///< (host address, what)
};

} // namespace caf_serving::cuda
