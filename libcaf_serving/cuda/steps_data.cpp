/// The data-movement and reduction device steps: Transpose, Concat, Split, Slice,
/// Gather, Expand, Pad (constant), Tile, the reductions (ReduceMean/Sum/Max/Min/
/// Prod/L2/SumSquare, GlobalMaxPool) and GlobalAveragePool where cuDNN's pool step
/// (steps_core.cpp) does not take it, over the kernels of
/// kernels/cuda/{permute,strided_copy,gather_axis,reduce}. ReduceL1, ReduceLogSum
/// and ReduceLogSumExp have no device kernel: they run on the host.
///
/// The movement steps work on the element size alone (1, 2, 4 or 8 bytes: any
/// dtype); the reductions on fp32, fp16 and bf16 (fp32 accumulation). Boxes,
/// offsets and strides are planned from the bucket's fixed shapes (data_plan.hpp)
/// and checked by the kernels' own planners before `b.dry()`, so that a dry run
/// chooses exactly as a real build does; a node they refuse stays a host step.
/// Nothing is allocated per batch.

#include "cuda/steps.hpp"

#include "cuda/data_plan.hpp"
#include "cuda/gather_axis.hpp"
#include "cuda/permute.hpp"
#include "cuda/reduce.hpp"
#include "cuda/strided_copy.hpp"

namespace caf_serving::cuda {

namespace {

namespace k = caf_serving::kernels;

/// The message of a Gather's error flag: which indices, which range, what to do.
std::string gather_error(const onnx::graph& g, const onnx::node& n, const data_plan& p) {
  auto dim = std::to_string(p.gather_dims[p.gather_axis]);
  return "Gather '" + n.name + "': an index in '" + g.values[p.indices].name + "' lies outside [-"
         + dim + ", " + dim + ") of axis " + std::to_string(p.gather_axis) + " of '"
         + g.values[p.input].name + "'; send indices within that range (token ids below the "
         "vocabulary size)";
}

std::optional<gpu_step> data_step(step_builder& b, const onnx::node& n) {
  auto p = plan_data_step(b.g, n);
  if (!p) return std::nullopt;
  if (b.dry()) return b.planned(p->kernel);
  std::vector<k::strided_copy_args> copies;
  for (const auto& c : p->copies) {
    k::strided_copy_args a;
    a.src = b.ptrs[c.src];
    a.dst = b.ptrs[c.dst];
    a.element_size = p->element_size;
    a.box = c.box;
    a.src_elements = c.src_elements;
    a.dst_elements = c.dst_elements;
    copies.push_back(a);
  }
  if (p->kernel == "permute") {
    k::permute_args a;
    a.input = b.ptrs[p->input];
    a.output = b.ptrs[p->output];
    a.element_size = p->element_size;
    a.shape = p->permute;
    bool empty = p->output_elements == 0;
    return gpu_step{"permute", false, [a, empty](cudaStream_t s) {
      if (!empty) k::launch_permute(a, s);
    }};
  }
  if (p->kernel == "gather") {
    k::gather_axis_args a;
    a.data = b.ptrs[p->input];
    a.indices = b.ptrs[p->indices];
    a.output = b.ptrs[p->output];
    a.indices_type = p->indices_type;
    a.element_size = p->element_size;
    a.rank = p->gather_rank;
    std::copy(p->gather_dims, p->gather_dims + k::max_rank, a.dims);
    a.axis = p->gather_axis;
    a.index_count = p->index_count;
    // Runtime indices are checked on the device: the flag is read after the batch.
    a.error_flag = b.ctx->flags.add(gather_error(b.g, n, *p), b.slot);
    bool empty = p->index_count == 0 || p->output_elements == 0;
    return gpu_step{"gather", false, [a, empty](cudaStream_t s) {
      if (!empty) k::launch_gather_axis(a, s);
    }};
  }
  if (p->kernel == "reduce") {
    k::reduce_args a;
    a.type = p->reduce_type;
    a.input = b.ptrs[p->input];
    a.output = b.ptrs[p->output];
    a.op = p->reduce_op;
    a.rank = p->reduce_rank;
    std::copy(p->reduce_dims, p->reduce_dims + k::max_rank, a.dims);
    std::copy(p->reduce_axes, p->reduce_axes + k::max_rank, a.axes);
    a.axis_count = p->reduce_axis_count;
    bool empty = p->output_elements == 0;
    return gpu_step{"reduce", false, [a, empty](cudaStream_t s) {
      if (!empty) k::launch_reduce(a, s);
    }};
  }
  std::optional<k::fill_args> fill;
  if (p->fill && p->output_elements > 0) {
    fill.emplace();
    fill->dst = b.ptrs[p->output];
    fill->element_size = p->element_size;
    fill->count = p->output_elements;
    fill->value = p->fill_value;
  }
  // concat, split, slice, expand, tile, pad: the fill, then the boxes.
  return gpu_step{p->kernel, false, [fill, copies = std::move(copies)](cudaStream_t s) {
    if (fill) k::launch_fill(*fill, s);
    if (!copies.empty()) k::launch_strided_copies(copies, s);
  }};
}

} // namespace

std::vector<device_kernel> data_steps() {
  std::vector<device_kernel> steps;
  for (auto [op, kernel] : {std::pair{"Transpose", "permute"}, {"Concat", "concat"}, {"Split", "split"},
                            {"Slice", "slice"}, {"Gather", "gather"}, {"Expand", "expand"},
                            {"Tile", "tile"}, {"Pad", "pad"}})
    steps.push_back({op, {}, kernel, any_type(data_step)});
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL2", "ReduceSumSquare", "GlobalAveragePool", "GlobalMaxPool"})
    steps.push_back({op, {}, "reduce", any_type(data_step)});
  return steps;
}

} // namespace caf_serving::cuda
