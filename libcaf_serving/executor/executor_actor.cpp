#include "executor/executor_actor.hpp"

#include "core/clock.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace caf_serving::executor {

namespace {

class message_output_writer final : public output_writer {
public:
  message_output_writer(const model_config& cfg, capnp::List<wire::Tensor>::Builder outputs)
      : cfg_(cfg), outputs_(outputs), written_(cfg.outputs.size(), false) {}

  uint8_t* allocate(std::string_view name, datatype dtype, const std::vector<int64_t>& shape,
                    size_t bytes) override {
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
    throw std::logic_error("backend wrote output '" + std::string(name)
                           + "' which model '" + cfg_.name + "' does not declare");
  }

  /// The first declared output the backend did not write, or nullptr.
  const tensor_config* missing() const {
    for (size_t i = 0; i < written_.size(); ++i)
      if (!written_[i])
        return &cfg_.outputs[i];
    return nullptr;
  }

private:
  const model_config& cfg_;
  capnp::List<wire::Tensor>::Builder outputs_;
  std::vector<bool> written_;
};

void set_error(wire::BatchResult::Builder r, const serving_error& e) {
  auto err = r.initError();
  err.setStatus(static_cast<uint16_t>(e.status));
  err.setMessage(e.message);
  err.setReason(static_cast<wire::FailureReason>(reason_of(e)));
}

} // namespace

batch_result_message run_one_batch(backend& be, const model_config& cfg,
                                   const wire::Batch::Reader& batch) {
  int64_t start = now_ns();
  batch_view view;
  view.rows = batch.getRows();
  size_t input_bytes = 0;
  for (auto t : batch.getInputs()) {
    tensor_view tv;
    tv.name = std::string_view(t.getName().cStr(), t.getName().size());
    tv.dtype = static_cast<datatype>(t.getDatatype());
    for (auto d : t.getShape())
      tv.shape.push_back(d);
    tv.data = t.getData().begin();
    tv.size = t.getData().size();
    input_bytes += tv.size;
    view.inputs.push_back(std::move(tv));
  }
  auto result = batch_result_message::create(input_bytes + 4096);
  auto r = result.builder();
  r.setBatchId(batch.getBatchId());
  message_output_writer writer(cfg, r.initOutputs(static_cast<unsigned>(cfg.outputs.size())));
  int64_t infer_start = now_ns();
  auto status = be.execute(view, writer);
  int64_t infer_end = now_ns();
  if (auto* err = std::get_if<serving_error>(&status)) {
    set_error(r, *err);
  } else if (auto* m = writer.missing()) {
    set_error(r, {status_code::internal,
                  "model '" + cfg.name + "': the backend produced no output '" + m->name + "'"});
  }
  r.setComputeInputNs(infer_start - start);
  r.setComputeInferNs(infer_end - infer_start);
  r.setComputeOutputNs(now_ns() - infer_end);
  return result;
}

executor_actor spawn_executor(caf::actor_system& sys, std::shared_ptr<backend> be,
                              const model_config& config) {
  auto body = [be, config](executor_actor::pointer) -> executor_actor::behavior_type {
    return {
      [be, config](run_batch& msg) -> batch_result_message {
        return run_one_batch(*be, config, msg.reader());
      },
    };
  };
  if (be->blocks())
    return sys.spawn<caf::detached>(body);
  return sys.spawn(body);
}

} // namespace caf_serving::executor
