#pragma once
/// Size hints for Cap'n Proto messages built per request or batch.
///
/// MallocMessageBuilder zeroes its whole first segment, so a hint far above what
/// a message holds costs a memset per message (a fixed +2 KiB on every batch and
/// +4 KiB on every batch result used to be a visible share of a small request's
/// CPU). These count the bytes a Tensor list entry takes so that the hint follows
/// the message's actual contents; message<S>::create adds a fixed slack (64 words)
/// for the root struct and small fields on top.

#include "core/model_config.hpp"

#include <cstddef>

namespace caf_serving {

/// `bytes` rounded up to whole Cap'n Proto words.
constexpr size_t capnp_words_bytes(size_t bytes) {
  return (bytes + 7) / 8 * 8;
}

/// Bytes one wire::Tensor takes in a message apart from its data: the struct in
/// its list (1 data word and 3 pointers), the name's text (NUL-terminated) and
/// the shape's Int64 list.
constexpr size_t tensor_metadata_bytes(size_t name_size, size_t rank) {
  return 4 * 8 + capnp_words_bytes(name_size + 1) + 8 * rank;
}

/// Bytes of `t`'s elements for `rows` batch rows (the batch dimension counted
/// when `batched`), or nothing when a dimension is variable or the elements are
/// variable-length (BYTES).
inline std::optional<size_t> fixed_tensor_bytes(const tensor_config& t, bool batched,
                                                uint64_t rows) {
  size_t n = element_size(t.dtype);
  if (n == 0)
    return std::nullopt;
  if (batched)
    n *= rows;
  for (auto d : t.dims) {
    if (d < 0)
      return std::nullopt;
    n *= static_cast<size_t>(d);
  }
  return n;
}

} // namespace caf_serving
