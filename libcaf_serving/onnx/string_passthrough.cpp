#include "onnx/string_passthrough.hpp"

#include <algorithm>
#include <cstring>
#include <map>

namespace caf_serving::onnx {

namespace {

bool is_string_tensor(const graph& g, const std::string& name) {
  for (const auto& i : g.strings.inputs)
    if (i.name == name)
      return true;
  for (const auto& o : g.strings.outputs)
    if (o.name == name)
      return true;
  return false;
}

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

result<string_configs> string_tensors(const string_passthrough& strings,
                                      const model_config& given, int max_batch_size) {
  bool batched = max_batch_size > 0;
  string_configs out;
  auto check = [&](const std::vector<tensor_config>& declared, tensor_config t,
                   const char* kind) -> result<tensor_config> {
    auto it = std::find_if(declared.begin(), declared.end(),
                           [&](const tensor_config& d) { return d.name == t.name; });
    if (it == declared.end())
      return t;
    if (it->dtype != datatype::bytes)
      return bad_request(std::string("config.pbtxt gives ") + kind + " '" + t.name
                         + "' data_type " + std::string(to_config_string(it->dtype))
                         + ", but the ONNX graph has STRING: declare it TYPE_STRING");
    if (!it->dims.empty() && !t.dims.empty() && it->dims.size() != t.dims.size())
      return bad_request(std::string("config.pbtxt gives ") + kind + " '" + t.name + "' dims "
                         + shape_string(it->dims) + ", but the ONNX graph has "
                         + shape_string(t.dims) + " (batch dimension excluded)");
    tensor_config c = *it;
    if (c.dims.empty()) c.dims = t.dims;
    return c;
  };
  std::map<std::string, std::vector<int64_t>> dims_of;
  for (const auto& val : strings.inputs) {
    std::vector<int64_t> dims = val.shape;
    if (batched) {
      if (dims.empty() || dims[0] > 1)
        return bad_request("STRING input '" + val.name + "' has shape "
                           + shape_string(val.shape) + ", without a variable batch dimension, "
                           "but max_batch_size is " + std::to_string(max_batch_size)
                           + "; set max_batch_size: 0 or export with a batch axis");
      dims.erase(dims.begin());
    }
    auto c = check(given.inputs, {val.name, datatype::bytes, dims}, "input");
    if (!c)
      return c.error();
    dims_of[val.name] = c->dims;
    out.inputs.push_back(*c);
  }
  for (const auto& o : strings.outputs) {
    auto c = check(given.outputs, {o.name, datatype::bytes, dims_of[o.input]}, "output");
    if (!c)
      return c.error();
    out.outputs.push_back(*c);
  }
  return out;
}

model_config without_strings(model_config given, const graph& g) {
  for (auto* list : {&given.inputs, &given.outputs})
    list->erase(std::remove_if(list->begin(), list->end(),
                               [&](const tensor_config& t) { return is_string_tensor(g, t.name); }),
                list->end());
  return given;
}

std::shared_ptr<executor::backend> with_strings(std::shared_ptr<executor::backend> inner,
                                                const string_passthrough& strings) {
  return std::make_shared<string_backend>(std::move(inner), strings);
}

} // namespace caf_serving::onnx
