#include "core/reshape.hpp"

#include <string>

namespace caf_serving {

namespace {

std::string shape_text(const std::vector<int64_t>& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i)
    out += (i > 0 ? "," : "") + std::to_string(d[i]);
  return out + "]";
}

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

} // namespace caf_serving
