#include "postprocess/response_builder.hpp"

#include "core/clock.hpp"
#include "core/responses.hpp"
#include "postprocess/classification.hpp"
#include "scheduler/padded_request.hpp"

#include <cstring>

namespace caf_serving::postprocess {

namespace {

bool wanted(const wire::InferRequest::Reader& req, capnp::Text::Reader name, uint32_t& k) {
  auto outs = req.getOutputs();
  k = 0;
  if (outs.size() == 0)
    return true;
  for (auto o : outs)
    if (o.getName() == name) {
      k = o.getClassification();
      return true;
    }
  return false;
}

} // namespace

result<byte_range> row_range(const wire::Tensor::Reader& t, uint32_t first_row, uint32_t rows) {
  auto data = t.getData();
  auto shape = t.getShape();
  if (shape.size() == 0)
    return serving_error{status_code::internal, "output '" + std::string(t.getName().cStr())
                                                  + "' has no batch dimension"};
  uint64_t per_row = 1;
  for (unsigned i = 1; i < shape.size(); ++i)
    per_row *= static_cast<uint64_t>(shape[i]);
  auto dtype = static_cast<datatype>(t.getDatatype());
  if (dtype != datatype::bytes) {
    uint64_t row_bytes = per_row * element_size(dtype);
    byte_range r{first_row * row_bytes, (first_row + rows) * row_bytes};
    if (r.end > data.size())
      return serving_error{status_code::internal,
                           "output '" + std::string(t.getName().cStr()) + "' holds "
                             + std::to_string(data.size()) + " bytes, fewer than its shape needs"};
    return r;
  }
  size_t pos = 0;
  byte_range r;
  uint64_t first_element = per_row * first_row;
  uint64_t last_element = per_row * (first_row + rows);
  for (uint64_t e = 0; e < last_element; ++e) {
    if (e == first_element)
      r.begin = pos;
    if (pos + 4 > data.size())
      return serving_error{status_code::internal, "BYTES output '"
                                                    + std::string(t.getName().cStr())
                                                    + "' ends inside an element"};
    uint32_t len;
    std::memcpy(&len, data.begin() + pos, 4);
    pos += 4 + size_t{len};
    if (pos > data.size())
      return serving_error{status_code::internal, "BYTES output '"
                                                    + std::string(t.getName().cStr())
                                                    + "' has an element past its end"};
  }
  if (first_element == last_element)
    r.begin = pos;
  r.end = pos;
  return r;
}

std::vector<response_message> split_batch(const finished_batch& fb, const response_config& cfg) {
  std::vector<response_message> responses;
  responses.reserve(fb.jobs.size());
  auto result = fb.result.reader();
  if (result.getError().getStatus() != 0) {
    serving_error e{static_cast<status_code>(result.getError().getStatus()),
                    result.getError().getMessage().cStr(),
                    static_cast<failure_reason>(result.getError().getReason())};
    for (const auto& j : fb.jobs)
      responses.push_back(error_response(j.job.request.reader(), e));
    return responses;
  }
  uint32_t row = 0;
  for (const auto& j : fb.jobs) {
    auto req = j.job.request.reader();
    uint32_t rows = req.getRows();
    auto msg = response_message::create(1024);
    auto out = msg.builder();
    start_response(out, req);
    auto times = out.getTimes();
    times.setEnqueuedNs(j.enqueued_ns);
    times.setBatchFormedNs(j.batch_formed_ns);
    times.setComputeStartNs(fb.compute_start_ns);
    times.setComputeEndNs(fb.compute_end_ns);

    // Count the outputs first: a capnp list is sized once.
    unsigned count = 0;
    uint32_t k = 0;
    for (auto t : result.getOutputs())
      count += wanted(req, t.getName(), k) ? 1 : 0;
    auto outs = out.initOutputs(count);
    unsigned i = 0;
    std::optional<serving_error> failure;
    for (auto t : result.getOutputs()) {
      if (!wanted(req, t.getName(), k))
        continue;
      // A model without a batch dimension answers one request per batch, whole.
      auto range = cfg.batched ? row_range(t, row, rows)
                               : caf_serving::result<byte_range>(byte_range{0, t.getData().size()});
      if (!range) {
        failure = range.error();
        break;
      }
      auto o = outs[i++];
      o.setName(t.getName());
      auto in_shape = t.getShape();
      const auto* sliced = cfg.batched && cfg.padding.enabled()
                             ? cfg.padding.output(t.getName().cStr()) : nullptr;
      if (k == 0 && sliced && sliced->dim < in_shape.size()
          && static_cast<uint64_t>(in_shape[sliced->dim]) > scheduler::padded_length(cfg.padding, req)) {
        // Padded batching: [rows][outer][longest][inner] -> [rows][outer][length][inner].
        uint64_t longest = static_cast<uint64_t>(in_shape[sliced->dim]);
        uint64_t length = scheduler::padded_length(cfg.padding, req);
        uint64_t outer = rows, inner = element_size(static_cast<datatype>(t.getDatatype()));
        for (unsigned d = 1; d < sliced->dim; ++d)
          outer *= static_cast<uint64_t>(in_shape[d]);
        for (unsigned d = sliced->dim + 1; d < in_shape.size(); ++d)
          inner *= static_cast<uint64_t>(in_shape[d]);
        o.setDatatype(t.getDatatype());
        auto s = o.initShape(in_shape.size());
        for (unsigned d = 0; d < in_shape.size(); ++d)
          s.set(d, d == 0 ? int64_t{rows}
                   : d == sliced->dim ? static_cast<int64_t>(length) : in_shape[d]);
        auto from = t.getData().slice(range->begin, range->end);
        auto data = o.initData(static_cast<unsigned>(outer * length * inner));
        for (uint64_t i = 0; i < outer; ++i)
          std::memcpy(data.begin() + i * length * inner, from.begin() + i * longest * inner,
                      length * inner);
        continue;
      }
      if (k == 0) {
        o.setDatatype(t.getDatatype());
        auto s = o.initShape(in_shape.size());
        for (unsigned d = 0; d < in_shape.size(); ++d)
          s.set(d, d == 0 && cfg.batched ? int64_t{rows} : in_shape[d]);
        auto bytes = t.getData().slice(range->begin, range->end);
        o.adoptData(msg.reference(bytes, fb.result.owner()));
        continue;
      }
      // Classification extension: the top k of each row, as BYTES strings.
      classify_input ci;
      ci.dtype = static_cast<datatype>(t.getDatatype());
      for (auto d : in_shape)
        ci.shape.push_back(d);
      if (cfg.batched)
        ci.shape[0] = rows;
      auto bytes = t.getData().slice(range->begin, range->end);
      ci.data = std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
      ci.k = k;
      ci.batch = cfg.batched ? batch_dimension::present : batch_dimension::absent;
      auto labels = cfg.labels.find(t.getName().cStr());
      ci.labels = labels == cfg.labels.end() ? nullptr : &labels->second;
      auto classes = classify(ci);
      if (!classes) {
        failure = classes.error();
        break;
      }
      o.setDatatype(wire::DataType::BYTES);
      auto s = o.initShape(static_cast<unsigned>(classes->shape.size()));
      for (unsigned d = 0; d < classes->shape.size(); ++d)
        s.set(d, classes->shape[d]);
      auto data = o.initData(static_cast<unsigned>(classes->data.size()));
      std::memcpy(data.begin(), classes->data.data(), classes->data.size());
    }
    row += rows;
    if (failure) {
      responses.push_back(error_response(req, *failure));
      continue;
    }
    times.setPostprocessEndNs(now_ns());
    responses.push_back(std::move(msg));
  }
  return responses;
}

} // namespace caf_serving::postprocess
