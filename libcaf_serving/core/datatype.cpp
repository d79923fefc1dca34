#include "core/datatype.hpp"

#include <array>
#include <cstring>

namespace caf_serving {

namespace {

struct datatype_names {
  datatype type;
  std::string_view kserve;
  std::string_view config;
  size_t size;
};

constexpr std::array<datatype_names, 14> names{{
  {datatype::bool_, "BOOL", "TYPE_BOOL", 1},
  {datatype::uint8, "UINT8", "TYPE_UINT8", 1},
  {datatype::uint16, "UINT16", "TYPE_UINT16", 2},
  {datatype::uint32, "UINT32", "TYPE_UINT32", 4},
  {datatype::uint64, "UINT64", "TYPE_UINT64", 8},
  {datatype::int8, "INT8", "TYPE_INT8", 1},
  {datatype::int16, "INT16", "TYPE_INT16", 2},
  {datatype::int32, "INT32", "TYPE_INT32", 4},
  {datatype::int64, "INT64", "TYPE_INT64", 8},
  {datatype::fp16, "FP16", "TYPE_FP16", 2},
  {datatype::bf16, "BF16", "TYPE_BF16", 2},
  {datatype::fp32, "FP32", "TYPE_FP32", 4},
  {datatype::fp64, "FP64", "TYPE_FP64", 8},
  {datatype::bytes, "BYTES", "TYPE_STRING", 0},
}};

const datatype_names& entry(datatype t) {
  return names[static_cast<size_t>(t)];
}

} // namespace

std::string_view to_string(datatype t) {
  return entry(t).kserve;
}

std::string_view to_config_string(datatype t) {
  return entry(t).config;
}

size_t element_size(datatype t) {
  return entry(t).size;
}

std::optional<datatype> datatype_from_kserve(std::string_view name) {
  for (const auto& n : names)
    if (n.kserve == name)
      return n.type;
  return std::nullopt;
}

std::optional<datatype> datatype_from_config(std::string_view name) {
  for (const auto& n : names)
    if (n.config == name)
      return n.type;
  return std::nullopt;
}

void append_bytes_element(std::string& out, std::string_view element) {
  auto len = static_cast<uint32_t>(element.size());
  char buf[4];
  std::memcpy(buf, &len, 4);
  out.append(buf, 4);
  out += element;
}

} // namespace caf_serving
