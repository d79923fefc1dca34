#include "executor/executor_actor.hpp"

#include "core/clock.hpp"
#include "core/message_size.hpp"

#include <kj/exception.h>

#include <iostream>

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
  auto result = batch_result_message::create(hint);
  auto r = result.builder();
  r.setBatchId(batch.getBatchId());
  message_output_writer writer(cfg, r.initOutputs(static_cast<unsigned>(cfg.outputs.size())));
  int64_t infer_start = now_ns();
  // A backend that throws fails this batch, not the executor: the clients get a
  // KServe error naming the model; the exception's text goes to the log only.
  std::variant<std::monostate, serving_error> status;
  std::string thrown;
  try {
    status = be.execute(view, writer);
  } catch (const executor_broken&) {
    throw; // stops the executor actor (spawn_executor)
  } catch (const kj::Exception& e) {
    thrown = e.getDescription().cStr();
  } catch (const std::exception& e) {
    thrown = e.what();
  } catch (...) {
    thrown = "an exception of unknown type";
  }
  if (!thrown.empty()) {
    std::cerr << "caf-serving: model '" << cfg.name << "': the backend threw while running batch "
              << batch.getBatchId() << " (" << view.rows << " rows): " << thrown << std::endl;
    // The outputs written so far are dropped with a fresh result.
    result = batch_result_message::create(1024);
    r = result.builder();
    r.setBatchId(batch.getBatchId());
    status = serving_error{status_code::internal,
                           "model '" + cfg.name + "' failed while running a batch of "
                             + std::to_string(view.rows)
                             + " rows; the server log has the details",
                           failure_reason::internal};
  }
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
  auto body = [be, config](executor_actor::pointer self) -> executor_actor::behavior_type {
    return {
      [self, be, config](run_batch& msg) -> caf::result<batch_result_message> {
        try {
          return run_one_batch(*be, config, msg.reader());
        } catch (const executor_broken& e) {
          // The batch gets this error; the scheduler sees the actor stop.
          std::cerr << "caf-serving: model '" << config.name
                    << "': an executor stopped: " << e.what() << std::endl;
          self->quit(caf::sec::runtime_error);
          return caf::make_error(caf::sec::request_receiver_down);
        }
      },
    };
  };
  if (be->blocks())
    return sys.spawn<caf::detached>(body);
  return sys.spawn(body);
}

} // namespace caf_serving::executor
