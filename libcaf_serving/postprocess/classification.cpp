#include "postprocess/classification.hpp"

#include "core/half.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

namespace caf_serving::postprocess {

namespace {

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
void append_number(std::string& out, T value) {
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) {
      out += std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
      return;
    }
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, res.ptr);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

template <class T>
struct typed_values {
  const char* base;
  T operator[](size_t i) const { return load<T>(base + i * sizeof(T)); }
};

struct half_values {
  const char* base;
  bool brain = {};
  float operator[](size_t i) const {
    auto bits = load<uint16_t>(base + 2 * i);
    return brain ? bf16_to_float(bits) : fp16_to_float(bits);
  }
};

/// Strict "greater", NaN ranking below every number.
template <class T>
bool ranks_higher(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a))
      return false;
    if (std::isnan(b))
      return true;
  }
  return a > b;
}

template <class Values>
void top_k(const Values& values, size_t rows, size_t classes, size_t k,
           const std::vector<std::string>* labels, std::string& out) {
  std::vector<size_t> order(classes);
  std::string element;
  for (size_t r = 0; r < rows; ++r) {
    size_t row_base = r * classes;
    std::iota(order.begin(), order.end(), size_t{0});
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](size_t a, size_t b) {
                        auto va = values[row_base + a];
                        auto vb = values[row_base + b];
                        if (ranks_higher(va, vb))
                          return true;
                        if (ranks_higher(vb, va))
                          return false;
                        return a < b;
                      });
    for (size_t i = 0; i < k; ++i) {
      size_t cls = order[i];
      element.clear();
      auto v = values[row_base + cls];
      append_number(element, v);
      element += ':';
      append_number(element, cls);
      if (labels && cls < labels->size()) {
        element += ':';
        element += (*labels)[cls];
      }
      append_bytes_element(out, element);
    }
  }
}

} // namespace

result<classified_tensor> classify(const classify_input& in) {
  if (in.dtype == datatype::bytes || in.dtype == datatype::bool_)
    return bad_request("classification needs a numeric output, but this output has datatype "
                       + std::string{to_string(in.dtype)});
  uint64_t elements = 1;
  for (int64_t d : in.shape)
    if (d < 0 || __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements))
      return serving_error{status_code::internal,
                           "classification input has shape " + shape_text(in.shape)
                             + ", which no tensor has"};
  size_t esize = element_size(in.dtype);
  if (in.data.size() / esize != elements || in.data.size() % esize != 0)
    return serving_error{status_code::internal,
                         "classification input has " + std::to_string(in.data.size())
                           + " bytes but shape " + shape_text(in.shape) + " of "
                           + std::string{to_string(in.dtype)} + " needs "
                           + std::to_string(elements * esize)};
  bool batched = in.batch == batch_dimension::present;
  if (batched && in.shape.empty())
    return serving_error{status_code::internal, "a batched output must have a batch dimension"};
  size_t rows = batched ? static_cast<size_t>(in.shape[0]) : 1;
  size_t classes = rows == 0 ? 0 : static_cast<size_t>(elements) / rows;
  size_t k = std::min<size_t>(in.k, classes);
  classified_tensor out;
  if (batched)
    out.shape = {static_cast<int64_t>(rows), static_cast<int64_t>(k)};
  else
    out.shape = {static_cast<int64_t>(k)};
  if (k == 0)
    return out;
  const char* base = in.data.data();
  auto rank = [&](const auto& values) { top_k(values, rows, classes, k, in.labels, out.data); };
  switch (in.dtype) {
    case datatype::uint8: rank(typed_values<uint8_t>{base}); break;
    case datatype::uint16: rank(typed_values<uint16_t>{base}); break;
    case datatype::uint32: rank(typed_values<uint32_t>{base}); break;
    case datatype::uint64: rank(typed_values<uint64_t>{base}); break;
    case datatype::int8: rank(typed_values<int8_t>{base}); break;
    case datatype::int16: rank(typed_values<int16_t>{base}); break;
    case datatype::int32: rank(typed_values<int32_t>{base}); break;
    case datatype::int64: rank(typed_values<int64_t>{base}); break;
    case datatype::fp16: rank(half_values{base, false}); break;
    case datatype::bf16: rank(half_values{base, true}); break;
    case datatype::fp32: rank(typed_values<float>{base}); break;
    case datatype::fp64: rank(typed_values<double>{base}); break;
    case datatype::bool_:
    case datatype::bytes: break;
  }
  return out;
}

} // namespace caf_serving::postprocess
