#pragma once
/// Tensor element types, named as KServe v2 names them ("FP32") and as Triton's
/// config.pbtxt names them ("TYPE_FP32").

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace caf_serving {

enum class datatype : uint8_t {
  bool_, uint8, uint16, uint32, uint64, int8, int16, int32, int64,
  fp16, bf16, fp32, fp64, bytes,
};

/// KServe's name, e.g. "FP32".
std::string_view to_string(datatype t);

/// Parses KServe's name ("FP32"); nullopt for anything else.
std::optional<datatype> datatype_from_kserve(std::string_view name);

/// Parses Triton's config name ("TYPE_FP32"); nullopt for anything else.
std::optional<datatype> datatype_from_config(std::string_view name);

/// Triton's config name, e.g. "TYPE_FP32".
std::string_view to_config_string(datatype t);

/// Bytes per element; 0 for BYTES, whose elements have their own lengths.
size_t element_size(datatype t);

/// Appends one element of a BYTES tensor as KServe's binary form and the wire
/// hold it: a 4-byte little-endian length, then the bytes.
void append_bytes_element(std::string& out, std::string_view element);

} // namespace caf_serving
