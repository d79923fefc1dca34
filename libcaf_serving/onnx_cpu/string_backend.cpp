#include "onnx_cpu/string_backend.hpp"

#include <algorithm>
#include <cstring>

namespace caf_serving::onnx {

namespace {

using exec_result = std::variant<std::monostate, serving_error>;

class string_backend final : public executor::backend {
public:
  string_backend(std::shared_ptr<executor::backend> inner, string_passthrough strings)
      : inner_(std::move(inner)), strings_(std::move(strings)) {
  }

  bool blocks() const override { return inner_ && inner_->blocks(); }

  exec_result execute(const executor::batch_view& batch, executor::output_writer& out) override {
    executor::batch_view numeric;
    numeric.rows = batch.rows;
    for (const auto& t : batch.inputs)
      if (std::none_of(strings_.inputs.begin(), strings_.inputs.end(),
                       [&](const string_passthrough::input& i) { return i.name == t.name; }))
        numeric.inputs.push_back(t);
    if (inner_) {
      auto r = inner_->execute(numeric, out);
      if (std::holds_alternative<serving_error>(r))
        return r;
    }
    for (const auto& o : strings_.outputs) {
      auto in = std::find_if(batch.inputs.begin(), batch.inputs.end(),
                             [&](const executor::tensor_view& t) { return t.name == o.input; });
      if (in == batch.inputs.end())
        return bad_request("output '" + o.name + "' copies STRING input '" + o.input
                           + "', which the request does not send");
      // The serialized elements (length, bytes) are the output's as they are.
      auto* dst = out.allocate(o.name, datatype::bytes, in->shape, in->size);
      if (in->size)
        std::memcpy(dst, in->data, in->size);
    }
    return {};
  }

private:
  std::shared_ptr<executor::backend> inner_;
  string_passthrough strings_;
};

} // namespace

std::shared_ptr<executor::backend> with_strings(std::shared_ptr<executor::backend> inner,
                                                const string_passthrough& strings) {
  return std::make_shared<string_backend>(std::move(inner), strings);
}

} // namespace caf_serving::onnx
