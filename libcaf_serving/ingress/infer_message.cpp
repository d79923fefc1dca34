#include "ingress/infer_message.hpp"

#include "core/clock.hpp"
#include "ingress/shm_tensors.hpp"

#include <algorithm>
#include <chrono>

namespace caf_serving::ingress {

result<request_message> make_request_message(const infer_request& request,
                                             const server::model_pipeline& model,
                                             uint32_t rows, int64_t received_ns) {
  const auto& cfg = model.config;
  size_t bytes = 0;
  for (const auto& in : request.inputs)
    bytes += in.data.size();
  auto msg = request_message::create(bytes + 1024);
  auto b = msg.builder();
  b.setId(request.id);
  b.setModelName(cfg.name);
  b.setModelVersion(model.version);
  b.setPriority(request.priority);
  b.setTimeoutUs(request.timeout_us);
  b.setRows(cfg.max_batch_size > 0 ? rows : 1);
  auto times = b.initTimes();
  times.setReceivedNs(received_ns);
  // Inputs in the model's order, so the scheduler gathers them by position.
  auto inputs = b.initInputs(static_cast<unsigned>(cfg.inputs.size()));
  for (unsigned i = 0; i < cfg.inputs.size(); ++i) {
    for (const auto& in : request.inputs) {
      if (in.name != cfg.inputs[i].name)
        continue;
      auto t = inputs[i];
      t.setName(in.name);
      t.setDatatype(static_cast<wire::DataType>(in.dtype));
      auto shape = t.initShape(static_cast<unsigned>(in.shape.size()));
      for (unsigned d = 0; d < in.shape.size(); ++d)
        shape.set(d, in.shape[d]);
      auto data = t.initData(static_cast<unsigned>(in.data.size()));
      auto copied = copy_input_data(reinterpret_cast<char*>(data.begin()), in);
      if (!copied)
        return copied.error();
    }
  }
  auto outs = b.initOutputs(static_cast<unsigned>(request.outputs.size()));
  for (unsigned i = 0; i < request.outputs.size(); ++i) {
    outs[i].setName(request.outputs[i].name);
    outs[i].setBinary(request.outputs[i].binary);
    outs[i].setClassification(request.outputs[i].classification);
  }
  times.setValidatedNs(now_ns());
  return msg;
}

void record_success(model_stats& stats, uint64_t elapsed_ns, uint64_t timeout_us) {
  stats.success.add(elapsed_ns);
  stats.request_us.observe(static_cast<double>(elapsed_ns) / 1e3);
  if (uint64_t target_us = stats.slo.target_us.load(std::memory_order_relaxed)) {
    // Goodput: answered within the request's deadline, the target or its
    // tighter `timeout` (docs/latency-target.md).
    uint64_t deadline_us = timeout_us != 0 ? std::min(target_us, timeout_us) : target_us;
    (elapsed_ns / 1000 <= deadline_us ? stats.slo.goodput : stats.slo.deadline_miss)
      .fetch_add(1, std::memory_order_relaxed);
  }
  stats.last_inference_ms.store(static_cast<uint64_t>(
    std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch())
      .count()));
}

response_view make_response_view(wire::InferResponse::Reader r, bool timing) {
  response_view view;
  auto outputs = r.getOutputs();
  view.outputs.reserve(outputs.size());
  for (auto t : outputs) {
    output_view o;
    o.name = std::string_view(t.getName().cStr(), t.getName().size());
    o.dtype = static_cast<datatype>(t.getDatatype());
    auto shape = t.getShape();
    o.shape.reserve(shape.size());
    for (auto d : shape)
      o.shape.push_back(d);
    o.data = std::string_view(reinterpret_cast<const char*>(t.getData().begin()),
                              t.getData().size());
    view.outputs.push_back(std::move(o));
  }
  if (timing) {
    auto t = r.getTimes();
    auto us = [](int64_t from, int64_t to) -> uint64_t {
      return from > 0 && to >= from ? static_cast<uint64_t>(to - from) / 1000 : 0;
    };
    view.parameters = {
      {"ingress_us", us(t.getReceivedNs(), t.getValidatedNs())},
      {"queue_us", us(t.getEnqueuedNs(), t.getBatchFormedNs())},
      {"compute_input_us", us(t.getBatchFormedNs(), t.getComputeStartNs())},
      {"compute_infer_us", us(t.getComputeStartNs(), t.getComputeEndNs())},
      {"compute_output_us", us(t.getComputeEndNs(), t.getPostprocessEndNs())},
      {"until_response_us", us(t.getReceivedNs(), now_ns())},
    };
  }
  return view;
}

} // namespace caf_serving::ingress
