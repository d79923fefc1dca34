#pragma once
/// An output_writer for the tests that run a whole model through the CPU
/// backend (ops_simple.test.cpp, ops_more.test.cpp): it keeps every output by
/// name, with its type and shape.
///
///     named_writer out;
///     instance->run(inputs, rows, out);
///     CHECK(out.values<float>("y") == std::vector<float>{...});

#include "core/datatype.hpp"
#include "executor/backend.hpp"

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::onnx::testing {

struct named_writer final : executor::output_writer {
  std::map<std::string, std::vector<uint8_t>> buffers;
  std::map<std::string, datatype> types;
  std::map<std::string, std::vector<int64_t>> shapes;

  uint8_t* allocate(std::string_view name, datatype t, const std::vector<int64_t>& shape,
                    size_t bytes) override {
    std::string key(name);
    types[key] = t;
    shapes[key] = shape;
    buffers[key].resize(bytes);
    return buffers[key].data();
  }

  /// Output `name`'s elements as T (uint16_t for FP16 bits).
  template <class T>
  std::vector<T> values(const std::string& name) const {
    const auto& b = buffers.at(name);
    std::vector<T> v(b.size() / sizeof(T));
    std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
    return v;
  }
};

} // namespace caf_serving::onnx::testing
