#pragma once
/// Helpers that the reference kernels share (ops.cpp, ops_simple.cpp): axes,
/// integer tensors, strides and the numpy-broadcast loop, and the dispatch from
/// a datatype to a C++ element type. Internal to the ONNX backend.

#include "onnx/ir.hpp"
#include "onnx/ops.hpp"

#include <array>
#include <cassert>
#include <cstdint>
#include <vector>

namespace caf_serving::onnx::ops_internal {

using shape_t = std::vector<int64_t>;

inline int64_t norm_axis(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

inline std::vector<int64_t> const_ints(const graph& g, int v) {
  std::vector<int64_t> out;
  if (v < 0 || !g.values[v].constant)
    return out;
  const auto& t = *g.values[v].constant;
  for (int64_t i = 0; i < t.elements(); ++i)
    out.push_back(t.dtype == datatype::int32 ? t.as<int32_t>()[i] : t.as<int64_t>()[i]);
  return out;
}

inline std::vector<int64_t> ref_ints(const tensor_ref& t) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < t.elements(); ++i)
    out.push_back(t.dtype == datatype::int32 ? t.as<int32_t>()[i] : t.as<int64_t>()[i]);
  return out;
}

inline shape_t strides_of(const shape_t& s) {
  shape_t st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i)
    st[i] = st[i + 1] * s[i + 1];
  return st;
}

/// Strides of `in` read as if broadcast to `out` (0 on broadcast dimensions).
inline shape_t broadcast_strides(const shape_t& in, const shape_t& out) {
  shape_t st(out.size(), 0);
  auto own = strides_of(in);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    st[off + i] = in[i] == 1 ? 0 : own[i];
  return st;
}

/// Calls f(out_index, offsets) for every element of `out`, with each input's
/// element offset under broadcasting.
template <size_t N, class F>
void broadcast_loop(const shape_t& out, const std::array<shape_t, N>& st, F f) {
  int64_t total = element_count(out);
  if (total == 0)
    return;
  size_t rank = out.size();
  shape_t idx(rank, 0);
  std::array<int64_t, N> off{};
  for (int64_t i = 0; i < total; ++i) {
    f(i, off);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      ++idx[d];
      for (size_t k = 0; k < N; ++k)
        off[k] += st[k][d];
      if (idx[d] < out[d])
        break;
      for (size_t k = 0; k < N; ++k)
        off[k] -= st[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

/// Whether dispatch() has an element type for `t`: what the reference kernels
/// that dispatch on their input's type take.
inline bool dispatchable(datatype t) {
  return t == datatype::fp32 || t == datatype::int64 || t == datatype::int32
         || t == datatype::bool_ || t == datatype::uint8 || t == datatype::int8
         || t == datatype::int16 || t == datatype::uint16 || t == datatype::uint32
         || t == datatype::uint64;
}

template <class F>
void dispatch(datatype t, F f) {
  switch (t) {
    case datatype::fp32: f(float{}); break;
    case datatype::int64: f(int64_t{}); break;
    case datatype::int32: f(int32_t{}); break;
    case datatype::bool_: f(bool{}); break;
    case datatype::uint8: f(uint8_t{}); break;
    case datatype::int8: f(int8_t{}); break;
    case datatype::int16: f(int16_t{}); break;
    case datatype::uint16: f(uint16_t{}); break;
    case datatype::uint32: f(uint32_t{}); break;
    case datatype::uint64: f(uint64_t{}); break;
    default: assert(!"unsupported datatype in a reference kernel");
  }
}

} // namespace caf_serving::onnx::ops_internal
