#pragma once
/// Error flags that device steps set (Gather's out-of-range indices) and the
/// executor reads once per batch, after it has synchronized its streams anyway:
/// no step synchronizes, and captured graphs keep working.
///
///   int* flag = ctx.flags.add("Gather 'emb': an index of 'ids' is out of range ...", slot);
///   ... kernel sets *flag = 1 (device pointer of mapped page-locked memory) ...
///   if (auto what = ctx.flags.take(slot)) return error(*what); // after the slot's batch
///
/// The flags are page-locked host memory mapped into the device, so reading them
/// needs no copy; take() clears what it read, so a batch only sees its own.

#include <cstddef>
#include <cstdint>
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

  /// A new flag of `group` (the staging slot whose steps set it), zero, that
  /// names `what` when set; the device address to pass to a kernel. Allocates
  /// (at load only) a page-locked block per `block_flags`.
  int* add(std::string what, uint32_t group);

  /// The message of the first set flag of `group` (nullopt when none is set),
  /// clearing that group's flags. Call only when the steps that may set them
  /// have completed; the other groups' batches may still be running.
  std::optional<std::string> take(uint32_t group);

  size_t size() const { return flags_.size(); }

  static constexpr size_t block_flags = 1024;

private:
  struct block {
    int* host = nullptr;
    int* device = nullptr;
  };
  std::vector<block> blocks_;
  struct flag {
    int* host = nullptr;
    uint32_t group = 0;
    std::string what;
  };
  std::vector<flag> flags_;
};

} // namespace caf_serving::cuda
