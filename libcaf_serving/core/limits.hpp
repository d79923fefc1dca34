#pragma once
/// Limits that come from the libraries the engine is built on.

#include <cstdint>

namespace caf_serving {

/// The largest `Data` field Cap'n Proto builds (2^29 - 1 bytes); building a
/// larger one throws inside kj ("integer overflow"). Every tensor a request
/// carries, and every input of a batch, must stay at or below it.
inline constexpr uint64_t max_data_field_bytes = (uint64_t{1} << 29) - 1;

} // namespace caf_serving
