#include "executor/reshape_backend.hpp"

#include "core/reshape.hpp"

#include <stdexcept>
#include <string_view>

namespace caf_serving::executor {

namespace {

const tensor_config* find(const std::vector<tensor_config>& tensors, std::string_view name) {
  for (const auto& t : tensors)
    if (t.name == name)
      return &t;
  return nullptr;
}

/// Hands the inner backend's allocations on with the client's output shapes.
class reshaping_writer final : public output_writer {
public:
  reshaping_writer(output_writer& out, const model_config& cfg) : out_(out), cfg_(cfg) {
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
  output_writer& out_;
  const model_config& cfg_;
};

class reshape_backend final : public backend {
public:
  reshape_backend(std::shared_ptr<backend> inner, model_config cfg)
      : inner_(std::move(inner)), cfg_(std::move(cfg)) {
  }

  bool blocks() const override { return inner_->blocks(); }

  std::variant<std::monostate, serving_error> execute(const batch_view& batch,
                                                      output_writer& out) override {
    batch_view model_batch = batch;
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
  std::shared_ptr<backend> inner_;
  model_config cfg_;
};

} // namespace

std::shared_ptr<backend> with_reshape(std::shared_ptr<backend> inner, const model_config& cfg) {
  if (!has_reshape(cfg))
    return inner;
  return std::make_shared<reshape_backend>(std::move(inner), cfg);
}

} // namespace caf_serving::executor
