#include "executor/kv_cache.hpp"

#include <sys/mman.h>

#include <cassert>
#include <new>
#include <stdexcept>
#include <string>

namespace caf_serving::executor {

size_t kv_block_bytes(const kv_cache_layout& l) {
  return size_t{l.layers} * 2 * l.kv_heads * l.block_tokens * l.head_dim * sizeof(float);
}

kv_cache::kv_cache(kv_cache_layout layout) : layout_(layout) {
  if (layout.block_tokens == 0 || layout.layers == 0 || layout.kv_heads == 0
      || layout.head_dim == 0)
    throw std::invalid_argument("kv_cache: a layout with a zero dimension");
  // An anonymous mapping, which the kernel backs with 2 MiB pages where the
  // machine allows them (transparent huge pages in "madvise" mode, Debian's
  // default, gives them only when asked): a decode step reads every running
  // sequence's blocks of every layer, scattered over the pool, and with 4 KiB
  // pages each 4 KiB of keys costs a TLB miss. Zero pages until written.
  const size_t bytes = block_floats() * layout.blocks * sizeof(float);
  void* p = bytes == 0 ? nullptr
                       : ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (p)
    ::madvise(p, bytes, MADV_HUGEPAGE); // advice only: without it the pages stay 4 KiB
#endif
  storage_ = std::unique_ptr<float, kv_storage_unmap>(static_cast<float*>(p), kv_storage_unmap{bytes});
  free_.reserve(layout.blocks);
  for (uint32_t b = layout.blocks; b > 0; --b)
    free_.push_back(b - 1);
}

void kv_storage_unmap::operator()(float* p) const {
  if (p)
    ::munmap(p, bytes);
}

size_t kv_cache::block_floats() const { return kv_block_bytes(layout_) / sizeof(float); }

bool kv_cache::reserve(uint64_t seq, uint32_t tokens) {
  auto& table = tables_[seq];
  size_t wanted = (size_t{tokens} + layout_.block_tokens - 1) / layout_.block_tokens;
  if (wanted > table.size() && wanted - table.size() > free_.size())
    return false;
  while (table.size() < wanted) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void kv_cache::release(uint64_t seq) {
  auto i = tables_.find(seq);
  if (i == tables_.end())
    return;
  free_.insert(free_.end(), i->second.rbegin(), i->second.rend());
  tables_.erase(i);
}

uint32_t kv_cache::capacity(uint64_t seq) const {
  auto i = tables_.find(seq);
  return i == tables_.end() ? 0
                            : static_cast<uint32_t>(i->second.size()) * layout_.block_tokens;
}

const std::vector<uint32_t>& kv_cache::blocks(uint64_t seq) const {
  static const std::vector<uint32_t> none;
  auto i = tables_.find(seq);
  return i == tables_.end() ? none : i->second;
}

const float* kv_cache::row(uint64_t seq, uint32_t layer, bool value, uint32_t head,
                           uint32_t position) const {
  auto i = tables_.find(seq);
  uint32_t block = position / layout_.block_tokens;
  if (i == tables_.end() || block >= i->second.size() || layer >= layout_.layers
      || head >= layout_.kv_heads)
    throw std::logic_error("kv_cache: sequence " + std::to_string(seq) + " position "
                           + std::to_string(position) + " layer " + std::to_string(layer)
                           + " head " + std::to_string(head) + " is not reserved");
  size_t offset = ((size_t{layer} * 2 + (value ? 1 : 0)) * layout_.kv_heads + head)
                    * layout_.block_tokens
                  + position % layout_.block_tokens;
  return storage_.get() + i->second[block] * block_floats() + offset * layout_.head_dim;
}

float* kv_cache::row(uint64_t seq, uint32_t layer, bool value, uint32_t head,
                     uint32_t position) {
  return const_cast<float*>(static_cast<const kv_cache&>(*this).row(seq, layer, value, head, position));
}

} // namespace caf_serving::executor
