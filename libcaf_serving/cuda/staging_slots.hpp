#pragma once
/// Which of a CUDA instance's pinned staging slots hold a batch in flight
/// (cuda_backend.cpp, issue 20 item 6). A slot is taken when a batch is
/// submitted (its inputs are staged in it, its I/O buffers on the device are
/// the slot's) and given back when the batch's outputs have been copied out of
/// it, so that two batches never share one. No CUDA here: tested without a GPU.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace caf_serving::cuda {

class staging_slot_pool {
public:
  explicit staging_slot_pool(uint32_t slots);

  /// A free slot, the next after the last one taken where it is free
  /// (round-robin); waits while every slot holds a batch. Thread-safe.
  uint32_t acquire();

  /// Gives `slot` back and wakes a waiting acquire(). Giving back a slot that
  /// is free is a bug (std::logic_error).
  void release(uint32_t slot);

  /// Slots that hold a batch now.
  uint32_t busy() const;

  uint32_t size() const { return static_cast<uint32_t>(busy_.size()); }

private:
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<bool> busy_;
  uint32_t next_ = 0;
};

} // namespace caf_serving::cuda
