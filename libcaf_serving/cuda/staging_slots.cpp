#include "cuda/staging_slots.hpp"

#include <stdexcept>
#include <string>

namespace caf_serving::cuda {

staging_slot_pool::staging_slot_pool(uint32_t slots) : busy_(slots, false) {
  if (slots == 0)
    throw std::logic_error("staging_slot_pool: an instance needs at least one staging slot");
}

uint32_t staging_slot_pool::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  uint32_t slot = 0;
  freed_.wait(lock, [&] {
    for (uint32_t k = 0; k < size(); ++k) {
      slot = (next_ + k) % size();
      if (!busy_[slot])
        return true;
    }
    return false;
  });
  busy_[slot] = true;
  next_ = (slot + 1) % size();
  return slot;
}

void staging_slot_pool::release(uint32_t slot) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (slot >= size() || !busy_[slot])
      throw std::logic_error("staging_slot_pool: slot " + std::to_string(slot)
                             + " given back while it holds no batch");
    busy_[slot] = false;
  }
  freed_.notify_one();
}

uint32_t staging_slot_pool::busy() const {
  std::lock_guard<std::mutex> guard(mutex_);
  uint32_t n = 0;
  for (bool b : busy_)
    n += b ? 1 : 0;
  return n;
}

} // namespace caf_serving::cuda
