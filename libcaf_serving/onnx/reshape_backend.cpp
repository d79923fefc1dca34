#include "onnx/reshape_backend.hpp"

#include <stdexcept>
#include <string>

namespace caf_serving::onnx {

namespace {

std::string shape_text(const std::vector<int64_t>& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i)
    out += (i > 0 ? "," : "") + std::to_string(d[i]);
  return out + "]";
}

const tensor_config* find(const std::vector<tensor_config>& tensors, std::string_view name) {
  for (const auto& t : tensors)
    if (t.name == name)
      return &t;
  return nullptr;
}

/// Hands the inner backend's allocations on with the client's output shapes.
class reshaping_writer final : public executor::output_writer {
public:
  reshaping_writer(executor::output_writer& out, const model_config& cfg) : out_(out), cfg_(cfg) {
  }

  uint8_t* allocate(std::string_view name, datatype dtype, const std::vector<int64_t>& shape,
                    size_t bytes) override {
    const auto* t = find(cfg_.outputs, name);
    if (!t || !t->reshape)
      return out_.allocate(name, dtype, shape, bytes);
    auto client = reshape_dims(shape, *t->reshape, t->dims, cfg_.max_batch_size > 0);
    if (!client)
      // Only a model whose output contradicts its checked config gets here;
      // the executor fails this batch alone with the message.
      throw std::runtime_error(client.error().message);
    return out_.allocate(name, dtype, *client, bytes);
  }

private:
  executor::output_writer& out_;
  const model_config& cfg_;
};

class reshape_backend final : public executor::backend {
public:
  reshape_backend(std::shared_ptr<executor::backend> inner, model_config cfg)
      : inner_(std::move(inner)), cfg_(std::move(cfg)) {
  }

  bool blocks() const override { return inner_->blocks(); }

  std::variant<std::monostate, serving_error> execute(const executor::batch_view& batch,
                                                      executor::output_writer& out) override {
    executor::batch_view model_batch = batch;
    for (auto& in : model_batch.inputs) {
      const auto* t = find(cfg_.inputs, in.name);
      if (!t || !t->reshape)
        continue;
      auto shape = reshape_dims(in.shape, t->dims, *t->reshape, cfg_.max_batch_size > 0);
      if (!shape)
        return shape.error();
      in.shape = std::move(*shape);
    }
    reshaping_writer writer{out, cfg_};
    return inner_->execute(model_batch, writer);
  }

private:
  std::shared_ptr<executor::backend> inner_;
  model_config cfg_;
};

} // namespace

bool has_reshape(const model_config& cfg) {
  for (const auto* list : {&cfg.inputs, &cfg.outputs})
    for (const auto& t : *list)
      if (t.reshape)
        return true;
  return false;
}

model_config model_side(model_config cfg) {
  for (auto* list : {&cfg.inputs, &cfg.outputs})
    for (auto& t : *list)
      if (t.reshape)
        t.dims = *t.reshape;
  return cfg;
}

result<std::vector<int64_t>> reshape_dims(const std::vector<int64_t>& actual,
                                          const std::vector<int64_t>& from,
                                          const std::vector<int64_t>& to, bool batched) {
  size_t lead = batched ? 1 : 0;
  auto fail = [&] {
    return bad_request("a tensor of shape " + shape_text(actual) + " cannot be reshaped from "
                       + shape_text(from) + " to " + shape_text(to)
                       + (batched ? " (after the batch dimension)" : "")
                       + "; the config's dims and reshape must hold the same elements");
  };
  if (actual.size() != from.size() + lead)
    return fail();
  std::vector<int64_t> variable;
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] == -1)
      variable.push_back(actual[lead + i]);
  std::vector<int64_t> out(actual.begin(), actual.begin() + static_cast<long>(lead));
  size_t next = 0;
  for (auto d : to) {
    if (d != -1) {
      out.push_back(d);
    } else {
      if (next >= variable.size())
        return fail();
      out.push_back(variable[next++]);
    }
  }
  int64_t a = 1, b = 1;
  for (size_t i = lead; i < actual.size(); ++i)
    a *= actual[i];
  for (size_t i = lead; i < out.size(); ++i)
    b *= out[i];
  if (a != b)
    return fail();
  return out;
}

std::shared_ptr<executor::backend> with_reshape(std::shared_ptr<executor::backend> inner,
                                                const model_config& cfg) {
  if (!has_reshape(cfg))
    return inner;
  return std::make_shared<reshape_backend>(std::move(inner), cfg);
}

} // namespace caf_serving::onnx
