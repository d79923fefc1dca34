#include "cpu/reference_elementwise.hpp"

#include "cpu/half.hpp"

#include <cstring>

namespace caf_serving::kernels::ref {
namespace {

template <class T>
T read(const std::uint8_t* data, std::size_t i) {
  T v;
  std::memcpy(&v, data + i * sizeof(T), sizeof(T));
  return v;
}

template <class T>
void write(std::uint8_t* data, std::size_t i, T v) {
  std::memcpy(data + i * sizeof(T), &v, sizeof(T));
}

/// An f32/f16/bf16 element widened to float (exact).
float load_float(dtype type, const std::uint8_t* data, std::size_t i) {
  switch (type) {
    case dtype::f16:
      return to_float(fp16_bits{read<std::uint16_t>(data, i)});
    case dtype::bf16:
      return to_float(bf16_bits{read<std::uint16_t>(data, i)});
    default:
      return read<float>(data, i);
  }
}

/// Rounds `x` to an f32/f16/bf16 element (nearest even).
void store_float(dtype type, float x, std::uint8_t* data, std::size_t i) {
  switch (type) {
    case dtype::f16:
      write(data, i, to_fp16(x).bits);
      break;
    case dtype::bf16:
      write(data, i, to_bf16(x).bits);
      break;
    default:
      write(data, i, x);
  }
}

/// Stores an integer into an integer or bool element with Cast's rules.
void store_integer(dtype type, std::int64_t x, std::uint8_t* data, std::size_t i) {
  switch (type) {
    case dtype::i64:
      write(data, i, x);
      break;
    case dtype::i32:
      write(data, i, int_to_int<std::int32_t>(x));
      break;
    case dtype::i8:
      write(data, i, int_to_int<std::int8_t>(x));
      break;
    case dtype::u8:
      write(data, i, int_to_int<std::uint8_t>(x));
      break;
    default: // boolean
      write<std::uint8_t>(data, i, x != 0 ? 1 : 0);
  }
}

/// Stores a float into an integer or bool element with Cast's rules.
void store_float_as_integer(dtype type, float x, std::uint8_t* data, std::size_t i) {
  switch (type) {
    case dtype::i64:
      write(data, i, float_to_int<std::int64_t>(x));
      break;
    case dtype::i32:
      write(data, i, float_to_int<std::int32_t>(x));
      break;
    case dtype::i8:
      write(data, i, float_to_int<std::int8_t>(x));
      break;
    case dtype::u8:
      write(data, i, float_to_int<std::uint8_t>(x));
      break;
    default: // boolean: NaN is nonzero, so true
      write<std::uint8_t>(data, i, x != 0.0f ? 1 : 0);
  }
}

template <class C>
C load_compute(dtype type, const std::uint8_t* data, std::size_t i) {
  if constexpr (std::is_same_v<C, float>)
    return load_float(type, data, i);
  else if constexpr (std::is_same_v<C, bool>)
    return data[i] != 0;
  else
    return read<C>(data, i);
}

template <class C>
void store_compute(dtype type, C v, std::uint8_t* data, std::size_t i) {
  if constexpr (std::is_same_v<C, float>)
    store_float(type, v, data, i);
  else if constexpr (std::is_same_v<C, bool>)
    data[i] = v ? 1 : 0;
  else
    write(data, i, v);
}

template <class C>
std::vector<std::uint8_t> binary_typed(binary_op op, dtype type, const broadcast_layout<2>& l,
                                       const std::uint8_t* a, const std::uint8_t* b) {
  dtype out_type = binary_output_type(op, type);
  auto count = static_cast<std::size_t>(element_count(l));
  std::vector<std::uint8_t> out(count * dtype_size(out_type));
  broadcast_cursor<2, std::int64_t> cursor;
  cursor.seek(l, 0);
  for (std::size_t i = 0; i < count; ++i) {
    if (i > 0)
      cursor.next(l, static_cast<std::int64_t>(i));
    C x = load_compute<C>(type, a, static_cast<std::size_t>(cursor.offsets[0]));
    C y = load_compute<C>(type, b, static_cast<std::size_t>(cursor.offsets[1]));
    if (is_comparison(op))
      out[i] = apply_compare(op, x, y) ? 1 : 0;
    else
      store_compute<C>(type, apply_binary(op, x, y), out.data(), i);
  }
  return out;
}

} // namespace

double load_value(dtype type, const std::uint8_t* data, std::size_t i) {
  if (is_floating(type))
    return load_float(type, data, i);
  return static_cast<double>(load_integer(type, data, i));
}

std::int64_t load_integer(dtype type, const std::uint8_t* data, std::size_t i) {
  switch (type) {
    case dtype::i64:
      return read<std::int64_t>(data, i);
    case dtype::i32:
      return read<std::int32_t>(data, i);
    case dtype::i8:
      return read<std::int8_t>(data, i);
    case dtype::u8:
      return read<std::uint8_t>(data, i);
    case dtype::boolean:
      return data[i] != 0 ? 1 : 0;
    default:
      return static_cast<std::int64_t>(load_float(type, data, i));
  }
}

void store_value(dtype type, double x, std::uint8_t* data, std::size_t i) {
  if (is_floating(type))
    store_float(type, static_cast<float>(x), data, i);
  else
    store_float_as_integer(type, static_cast<float>(x), data, i);
}

std::vector<std::uint8_t> binary(binary_op op, dtype type, const broadcast_layout<2>& layout,
                                 const std::uint8_t* a, const std::uint8_t* b) {
  require_binary_supported(op, type);
  require_valid_layout(layout, "binary");
  auto l = collapse(layout);
  switch (type) {
    case dtype::i64:
      return binary_typed<std::int64_t>(op, type, l, a, b);
    case dtype::i32:
      return binary_typed<std::int32_t>(op, type, l, a, b);
    case dtype::boolean:
      return binary_typed<bool>(op, type, l, a, b);
    default:
      return binary_typed<float>(op, type, l, a, b);
  }
}

std::vector<std::uint8_t> unary(unary_op op, dtype type, const unary_params& params,
                                const std::uint8_t* x, std::size_t count) {
  require_unary_supported(op, type);
  std::vector<std::uint8_t> out(count * dtype_size(type));
  for (std::size_t i = 0; i < count; ++i) {
    if (op == unary_op::identity)
      std::memcpy(out.data() + i * dtype_size(type), x + i * dtype_size(type), dtype_size(type));
    else if (type == dtype::boolean) // logical_not
      out[i] = x[i] != 0 ? 0 : 1;
    else if (type == dtype::i64)
      write(out.data(), i, apply_unary_int(op, read<std::int64_t>(x, i)));
    else if (type == dtype::i32)
      write(out.data(), i, apply_unary_int(op, read<std::int32_t>(x, i)));
    else
      store_float(type, apply_unary(op, load_float(type, x, i), params), out.data(), i);
  }
  return out;
}

std::vector<std::uint8_t> where(dtype type, const broadcast_layout<3>& layout,
                                const std::uint8_t* condition, const std::uint8_t* x,
                                const std::uint8_t* y) {
  require_valid_layout(layout, "where");
  auto l = collapse(layout);
  auto count = static_cast<std::size_t>(element_count(l));
  std::size_t size = dtype_size(type);
  std::vector<std::uint8_t> out(count * size);
  broadcast_cursor<3, std::int64_t> cursor;
  cursor.seek(l, 0);
  for (std::size_t i = 0; i < count; ++i) {
    if (i > 0)
      cursor.next(l, static_cast<std::int64_t>(i));
    bool take_x = condition[cursor.offsets[0]] != 0;
    const std::uint8_t* src = take_x ? x + cursor.offsets[1] * size : y + cursor.offsets[2] * size;
    std::memcpy(out.data() + i * size, src, size);
  }
  return out;
}

std::vector<std::uint8_t> cast(dtype from, dtype to, const std::uint8_t* x, std::size_t count) {
  std::vector<std::uint8_t> out(count * dtype_size(to));
  for (std::size_t i = 0; i < count; ++i) {
    if (is_floating(from)) {
      float v = load_float(from, x, i);
      if (is_floating(to))
        store_float(to, v, out.data(), i);
      else
        store_float_as_integer(to, v, out.data(), i);
    } else {
      std::int64_t v = load_integer(from, x, i);
      if (is_floating(to)) // through f32, as ONNX Runtime does
        store_float(to, static_cast<float>(v), out.data(), i);
      else
        store_integer(to, v, out.data(), i);
    }
  }
  return out;
}

} // namespace caf_serving::kernels::ref
