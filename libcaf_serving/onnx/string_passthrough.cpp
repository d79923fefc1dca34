#include "onnx/string_passthrough.hpp"

#include <algorithm>
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

} // namespace caf_serving::onnx
