#include "scheduler/gather_batch.hpp"

#include "core/limits.hpp"
#include "core/message_size.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace caf_serving::scheduler {

namespace {

std::string dims_text(capnp::List<int64_t>::Reader dims) {
  std::string out = "[";
  for (unsigned d = 0; d < dims.size(); ++d)
    out += (d > 0 ? "," : "") + std::to_string(dims[d]);
  return out + "]";
}

/// Whether `a` and `b` agree past the batch dimension (all dims when the model
/// does not batch).
/// `skip_dim`: a padded dimension, where they may differ (0: none).
bool same_item_shape(capnp::List<int64_t>::Reader a, capnp::List<int64_t>::Reader b,
                     bool batched, unsigned skip_dim = 0) {
  if (a.size() != b.size())
    return false;
  for (unsigned d = batched ? 1 : 0; d < a.size(); ++d)
    if (a[d] != b[d] && !(skip_dim != 0 && d == skip_dim))
      return false;
  return true;
}

/// The padded dimension of input `t` (0: not padded).
unsigned padded_dim_of(const padded_batching_config& padding, wire::Tensor::Reader t) {
  if (!padding.enabled())
    return 0;
  const auto* in = padding.input(t.getName().cStr());
  return in && in->dim < t.getShape().size() ? in->dim : 0;
}

} // namespace

uint64_t shape_class_of(const model_config& model, wire::InferRequest::Reader request,
                        const padded_batching_config& padding) {
  bool batched = model.max_batch_size > 0;
  bool varies = false;
  for (const auto& in : model.inputs)
    for (auto d : in.dims)
      varies = varies || d < 0;
  if (!varies)
    return 0;
  // FNV-1a over (rank, dims) of every input past the batch dimension.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (auto t : request.getInputs()) {
    auto shape = t.getShape();
    unsigned skip = padded_dim_of(padding, t);
    mix(shape.size());
    for (unsigned d = batched ? 1 : 0; d < shape.size(); ++d)
      mix(skip != 0 && d == skip ? ~uint64_t{0} : static_cast<uint64_t>(shape[d]));
  }
  // 0 stays the key of models whose shapes cannot vary.
  return h == 0 ? 1 : h;
}

result<batch_message> gather_batch(const model_config& model, uint64_t batch_id,
                                   const std::vector<batched_job>& jobs,
                                   const padded_batching_config& padding) {
  const bool batched = model.max_batch_size > 0;
  auto first = jobs.front().job.request.reader();
  auto first_inputs = first.getInputs();
  // What is learnt about each input while the shapes are checked (one
  // allocation per batch, not one per field).
  struct input_plan {
    /// Bytes of the input across the batch.
    uint64_t bytes = 0;
    /// Padded batching: the padded dimension (0: none) and the batch's longest
    /// length along it; the input is padded when some request is shorter.
    unsigned pad_dim = 0;
    int64_t longest = 0;
    bool needs_pad = false;
  };
  std::vector<input_plan> plan(first_inputs.size());
  for (unsigned i = 0; i < first_inputs.size(); ++i)
    plan[i].pad_dim = batched ? padded_dim_of(padding, first_inputs[i]) : 0;
  for (const auto& j : jobs) {
    const bool is_first = &j == &jobs.front();
    auto inputs = is_first ? first_inputs : j.job.request.reader().getInputs();
    if (inputs.size() != first_inputs.size())
      return serving_error{status_code::internal,
                           "model '" + model.name + "': requests with "
                             + std::to_string(first_inputs.size()) + " and "
                             + std::to_string(inputs.size())
                             + " inputs reached one batch; this is a bug, please report it"};
    for (unsigned i = 0; i < inputs.size(); ++i) {
      auto a = first_inputs[i];
      auto b = inputs[i];
      // The first request agrees with itself: its shapes are not read twice.
      if (!is_first
          && (a.getDatatype() != b.getDatatype()
              || !same_item_shape(a.getShape(), b.getShape(), batched, plan[i].pad_dim)))
        return serving_error{status_code::internal,
                             "model '" + model.name + "': requests of shapes "
                               + dims_text(a.getShape()) + " and " + dims_text(b.getShape())
                               + " of input '" + a.getName().cStr()
                               + "' reached one batch; this is a bug, please report it"};
      auto& p = plan[i];
      p.bytes += b.getData().size();
      if (p.pad_dim != 0) {
        int64_t len = b.getShape()[p.pad_dim];
        p.needs_pad = p.needs_pad || (len != p.longest && !is_first);
        p.longest = std::max(p.longest, len);
      }
    }
  }
  for (unsigned i = 0; i < first_inputs.size(); ++i) {
    if (!plan[i].needs_pad)
      continue;
    // Padded size: every request's rows at the longest length.
    auto dtype = static_cast<datatype>(first_inputs[i].getDatatype());
    uint64_t bytes = 0;
    for (const auto& j : jobs) {
      auto shape = j.job.request.reader().getInputs()[i].getShape();
      uint64_t n = element_size(dtype);
      for (unsigned d = 0; d < shape.size(); ++d)
        n *= static_cast<uint64_t>(d == plan[i].pad_dim ? plan[i].longest : shape[d]);
      bytes += n;
    }
    plan[i].bytes = bytes;
  }
  uint64_t total = 0;
  for (unsigned i = 0; i < first_inputs.size(); ++i) {
    uint64_t bytes = plan[i].bytes;
    total += bytes;
    if (bytes > max_data_field_bytes)
      return serving_error{status_code::internal,
                           "model '" + model.name + "': a batch's input '"
                             + first_inputs[i].getName().cStr() + "' would hold "
                             + std::to_string(bytes) + " bytes, more than a Cap'n Proto "
                             "Data field holds; lower --max-batch-bytes"};
  }
  // Sized from what the batch holds (message_size.hpp): the copied inputs
  // (none for a lone request, whose bytes are referenced), the requests' row
  // counts and each input's name and shape.
  size_t hint = capnp_words_bytes(model.name.size() + 1) + capnp_words_bytes(4 * jobs.size())
                + (jobs.size() == 1 ? 0 : static_cast<size_t>(total));
  for (unsigned i = 0; i < first_inputs.size(); ++i)
    hint += tensor_metadata_bytes(first_inputs[i].getName().size(),
                                  first_inputs[i].getShape().size())
            + (jobs.size() == 1 ? 0 : capnp_words_bytes(plan[i].bytes) - plan[i].bytes);
  auto msg = batch_message::create(hint);
  auto b = msg.builder();
  b.setBatchId(batch_id);
  b.setModelName(model.name);
  b.setModelVersion(first.getModelVersion());
  auto request_rows = b.initRequestRows(static_cast<unsigned>(jobs.size()));
  uint32_t rows = 0;
  for (unsigned i = 0; i < jobs.size(); ++i) {
    uint32_t r = jobs[i].job.request.reader().getRows();
    request_rows.set(i, r);
    rows += r;
  }
  b.setRows(rows);
  auto inputs = b.initInputs(first_inputs.size());
  for (unsigned i = 0; i < first_inputs.size(); ++i) {
    auto src = first_inputs[i];
    auto dst = inputs[i];
    dst.setName(src.getName());
    dst.setDatatype(src.getDatatype());
    auto src_shape = src.getShape();
    auto shape = dst.initShape(src_shape.size());
    for (unsigned d = 0; d < src_shape.size(); ++d)
      shape.set(d, d == 0 && batched ? int64_t{rows}
                   : plan[i].needs_pad && d == plan[i].pad_dim ? plan[i].longest
                                                                : src_shape[d]);
    if (jobs.size() == 1) {
      dst.adoptData(msg.reference(src.getData(), jobs[0].job.request.owner()));
      continue;
    }
    auto data = dst.initData(static_cast<unsigned>(plan[i].bytes));
    size_t at = 0;
    if (plan[i].needs_pad) {
      // Each request's block [outer][length][inner] becomes [outer][longest][inner].
      auto dtype = static_cast<datatype>(src.getDatatype());
      double pad_value = padding.input(src.getName().cStr())->pad_value;
      for (const auto& j : jobs) {
        auto t = j.job.request.reader().getInputs()[i];
        auto shape = t.getShape();
        uint64_t outer = 1, inner = element_size(dtype);
        for (unsigned d = 0; d < plan[i].pad_dim; ++d)
          outer *= static_cast<uint64_t>(shape[d]);
        for (unsigned d = plan[i].pad_dim + 1; d < shape.size(); ++d)
          inner *= static_cast<uint64_t>(shape[d]);
        uint64_t len = static_cast<uint64_t>(shape[plan[i].pad_dim]);
        uint64_t fill = static_cast<uint64_t>(plan[i].longest) - len;
        const uint8_t* from = t.getData().begin();
        for (uint64_t o = 0; o < outer; ++o) {
          std::memcpy(data.begin() + at, from + o * len * inner, len * inner);
          at += len * inner;
          fill_pad(data.begin() + at, fill * inner / element_size(dtype), dtype, pad_value);
          at += fill * inner;
        }
      }
      continue;
    }
    for (const auto& j : jobs) {
      auto d = j.job.request.reader().getInputs()[i].getData();
      std::memcpy(data.begin() + at, d.begin(), d.size());
      at += d.size();
    }
  }
  return msg;
}

} // namespace caf_serving::scheduler
