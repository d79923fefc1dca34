#include "cpu/data_reference.hpp"

#include <cstring>
#include <stdexcept>

namespace caf_serving::kernels::ref {
namespace {

std::uintptr_t address(const std::vector<std::uint8_t>& v) {
  return reinterpret_cast<std::uintptr_t>(v.data());
}

} // namespace

std::vector<std::uint8_t> run_copy_plan(const copy_plan& plan,
                                        const std::vector<std::uint8_t>& src,
                                        std::vector<std::uint8_t> dst) {
  std::int64_t count = box_count(plan.box);
  auto size = static_cast<std::int64_t>(plan.element_size);
  for (std::int64_t i = 0; i < count; ++i) {
    offset_pair o = box_offsets(plan.box, i);
    std::memcpy(dst.data() + o.dst * size, src.data() + o.src * size, plan.element_size);
  }
  return dst;
}

std::vector<std::uint8_t> permute(const std::vector<std::uint8_t>& input,
                                  std::size_t element_size, const permute_shape& shape) {
  std::vector<std::uint8_t> out(input.size());
  permute_plan plan = plan_permute(shape, element_size, address(input), address(out));
  if (!plan.tiled)
    return run_copy_plan(plan.plain, input, std::move(out));
  const tile_plan& t = plan.tile;
  auto size = static_cast<std::int64_t>(element_size);
  std::int64_t batches = box_count(t.batch);
  for (std::int64_t n = 0; n < batches; ++n) {
    offset_pair base = box_offsets(t.batch, n);
    for (std::int64_t ib = 0; ib < t.b_size; ++ib)
      for (std::int64_t ia = 0; ia < t.a_size; ++ia) {
        offset_pair o = tile_offsets(t, base, ia, ib);
        std::memcpy(out.data() + o.dst * size, input.data() + o.src * size, element_size);
      }
  }
  return out;
}

std::vector<std::uint8_t> strided_copy(const std::vector<std::uint8_t>& src,
                                       std::vector<std::uint8_t> dst,
                                       std::size_t element_size, const strided_box& box) {
  auto elements = [element_size](const std::vector<std::uint8_t>& v) {
    return static_cast<std::int64_t>(v.size() / element_size);
  };
  check_box(box, element_size, elements(src), elements(dst), "strided_copy");
  copy_plan plan = widen_box(collapse_box(box), element_size, address(src), address(dst));
  return run_copy_plan(plan, src, std::move(dst));
}

gather_result gather_axis(const std::vector<std::uint8_t>& data, std::size_t element_size,
                          const gather_shape& g, const std::vector<std::int64_t>& indices) {
  if (static_cast<std::int64_t>(indices.size()) != g.index_count)
    throw std::invalid_argument("gather_axis reference: index count does not match");
  std::size_t row_bytes = static_cast<std::size_t>(g.inner) * element_size;
  gather_result r;
  r.output.assign(static_cast<std::size_t>(g.outer * g.index_count) * row_bytes, 0);
  for (std::int64_t row = 0; row < g.outer * g.index_count; ++row) {
    std::int64_t resolved = resolve_index(indices[row % g.index_count], g.axis_dim);
    if (resolved < 0) {
      r.out_of_range = true;
      continue;
    }
    std::int64_t from = gather_source_row(g, row, resolved);
    std::memcpy(r.output.data() + row * row_bytes, data.data() + from * row_bytes, row_bytes);
  }
  return r;
}

std::vector<float> reduce(const std::vector<float>& x, const reduce_shape& s, reduce_op op) {
  std::vector<float> out(static_cast<std::size_t>(s.outer * s.inner));
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      double acc = reduce_identity<double>(op);
      for (std::int64_t r = 0; r < s.reduced; ++r)
        acc = reduce_step<double>(op, acc, x[(o * s.reduced + r) * s.inner + i]);
      out[o * s.inner + i] = static_cast<float>(reduce_finish<double>(op, acc, s.reduced));
    }
  return out;
}

} // namespace caf_serving::kernels::ref
