#include "executor/batch_run.hpp"

#include "core/clock.hpp"
#include "core/message_size.hpp"

#include <kj/exception.h>

#include <iostream>
#include <stdexcept>

namespace caf_serving::executor {

message_output_writer::message_output_writer(const model_config& cfg,
                                             capnp::List<wire::Tensor>::Builder outputs)
    : cfg_(cfg), outputs_(outputs), written_(cfg.outputs.size(), false) {}

uint8_t* message_output_writer::allocate(std::string_view name, datatype dtype,
                                         const std::vector<int64_t>& shape, size_t bytes) {
  for (size_t i = 0; i < cfg_.outputs.size(); ++i) {
    if (cfg_.outputs[i].name != name)
      continue;
    auto t = outputs_[i];
    t.setName(cfg_.outputs[i].name);
    t.setDatatype(static_cast<wire::DataType>(dtype));
    auto s = t.initShape(static_cast<unsigned>(shape.size()));
    for (size_t d = 0; d < shape.size(); ++d)
      s.set(static_cast<unsigned>(d), shape[d]);
    written_[i] = true;
    return t.initData(static_cast<unsigned>(bytes)).begin();
  }
  // The backend was built from this config; an unknown name is a bug there.
  throw std::logic_error("backend wrote output '" + std::string(name) + "' which model '"
                         + cfg_.name + "' does not declare");
}

const tensor_config* message_output_writer::missing() const {
  for (size_t i = 0; i < written_.size(); ++i)
    if (!written_[i])
      return &cfg_.outputs[i];
  return nullptr;
}

namespace {

void set_error(wire::BatchResult::Builder r, const serving_error& e) {
  auto err = r.initError();
  err.setStatus(static_cast<uint16_t>(e.status));
  err.setMessage(e.message);
  err.setReason(static_cast<wire::FailureReason>(reason_of(e)));
}

} // namespace

std::unique_ptr<prepared_batch> prepare_batch(const model_config& cfg,
                                              const wire::Batch::Reader& batch) {
  auto p = std::make_unique<prepared_batch>();
  p->start_ns = now_ns();
  p->batch_id = batch.getBatchId();
  auto& view = p->view;
  view.rows = batch.getRows();
  size_t input_bytes = 0;
  auto inputs = batch.getInputs();
  view.inputs.reserve(inputs.size());
  for (auto t : inputs) {
    tensor_view tv;
    tv.name = std::string_view(t.getName().cStr(), t.getName().size());
    tv.dtype = static_cast<datatype>(t.getDatatype());
    auto shape = t.getShape();
    tv.shape.reserve(shape.size());
    for (auto d : shape)
      tv.shape.push_back(d);
    tv.data = t.getData().begin();
    tv.size = t.getData().size();
    input_bytes += tv.size;
    view.inputs.push_back(std::move(tv));
  }
  // Sized from what the result will hold (message_size.hpp): each output's
  // name, shape and elements where the config fixes them; the inputs' bytes
  // stand in for outputs of variable size.
  size_t hint = 0;
  bool all_fixed = true;
  for (const auto& out : cfg.outputs) {
    hint += tensor_metadata_bytes(out.name.size(), out.dims.size() + 1);
    auto bytes = fixed_tensor_bytes(out, cfg.max_batch_size > 0, view.rows);
    if (bytes)
      hint += capnp_words_bytes(*bytes);
    else
      all_fixed = false;
  }
  if (!all_fixed)
    hint += capnp_words_bytes(input_bytes);
  p->result = batch_result_message::create(hint);
  auto r = p->result.builder();
  r.setBatchId(p->batch_id);
  p->writer = std::make_unique<message_output_writer>(
    cfg, r.initOutputs(static_cast<unsigned>(cfg.outputs.size())));
  return p;
}

batch_result_message finish_batch(prepared_batch& batch, const model_config& cfg, batch_end end) {
  auto result = batch.result;
  auto r = result.builder();
  auto status = std::move(end.status);
  if (!end.thrown.empty()) {
    std::cerr << "caf-serving: model '" << cfg.name << "': the backend threw while running batch "
              << batch.batch_id << " (" << batch.view.rows << " rows): " << end.thrown
              << std::endl;
    // The outputs written so far are dropped with a fresh result.
    result = batch_result_message::create(1024);
    r = result.builder();
    r.setBatchId(batch.batch_id);
    status = serving_error{status_code::internal,
                           "model '" + cfg.name + "' failed while running a batch of "
                             + std::to_string(batch.view.rows)
                             + " rows; the server log has the details",
                           failure_reason::internal};
  }
  if (auto* err = std::get_if<serving_error>(&status)) {
    set_error(r, *err);
  } else if (auto* m = batch.writer->missing()) {
    set_error(r, {status_code::internal,
                  "model '" + cfg.name + "': the backend produced no output '" + m->name + "'"});
  }
  r.setComputeInputNs(end.infer_start_ns - batch.start_ns);
  r.setComputeInferNs(end.infer_end_ns - end.infer_start_ns);
  r.setComputeOutputNs(now_ns() - end.infer_end_ns);
  return result;
}

std::string thrown_text(std::exception_ptr thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const executor_broken&) {
    throw;
  } catch (const kj::Exception& e) {
    return e.getDescription().cStr();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

} // namespace caf_serving::executor
