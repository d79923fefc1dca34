#include "onnx/shape_plans.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace caf_serving::onnx {

namespace {

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos)
    return {};
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    auto at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos)
      return out;
    start = at + 1;
  }
}

std::string dims_string(const std::vector<int64_t>& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i)
    out += (i ? "," : "") + std::to_string(d[i]);
  return out + "]";
}

const char* syntax = "; write shape sets separated by '|', each 'input:dims' entries separated "
                     "by ';', dims separated by 'x' without the batch dimension, e.g. "
                     "\"input_ids:128;attention_mask:128|input_ids:32;attention_mask:32\"";

} // namespace

result<std::vector<shape_set>> parse_expected_shapes(const std::string& text) {
  std::vector<shape_set> sets;
  auto fail = [&](const std::string& what) {
    return bad_request("parameters \"expected_shapes\" " + what + syntax);
  };
  if (trim(text).empty())
    return fail("is empty");
  auto set_texts = split(text, '|');
  for (size_t s = 0; s < set_texts.size(); ++s) {
    std::string where = "set " + std::to_string(s + 1) + " ('" + trim(set_texts[s]) + "')";
    if (trim(set_texts[s]).empty())
      return fail(where + " is empty");
    shape_set set;
    for (const auto& raw : split(set_texts[s], ';')) {
      auto entry = trim(raw);
      auto colon = entry.rfind(':');
      if (entry.empty() || colon == std::string::npos || colon == 0)
        return fail(where + " has entry '" + entry + "', which is not 'input:dims'");
      auto name = trim(entry.substr(0, colon));
      auto dims_text = trim(entry.substr(colon + 1));
      std::vector<int64_t> dims;
      if (!dims_text.empty())
        for (const auto& d : split(dims_text, 'x')) {
          auto t = trim(d);
          char* end = nullptr;
          errno = 0;
          long long v = std::strtoll(t.c_str(), &end, 10);
          if (t.empty() || *end != '\0' || errno == ERANGE || v < 1)
            return fail(where + " gives input '" + name + "' dims '" + dims_text
                        + "'; each dimension is a whole number of at least 1");
          dims.push_back(v);
        }
      if (!set.emplace(name, dims).second)
        return fail(where + " names input '" + name + "' twice");
    }
    sets.push_back(std::move(set));
  }
  return sets;
}

result<shape_set> check_shape_set(const shape_set& set, const input_dims& inputs) {
  for (const auto& [name, dims] : set)
    if (std::none_of(inputs.begin(), inputs.end(),
                     [&, n = name](const auto& in) { return in.first == n; })) {
      std::string names;
      for (const auto& in : inputs)
        names += (names.empty() ? "'" : ", '") + in.first + "'";
      return bad_request("names input '" + name + "', but the model's inputs are " + names);
    }
  for (const auto& [name, want] : inputs) {
    auto it = set.find(name);
    if (it == set.end())
      return bad_request("gives no shape for input '" + name + "' (dims " + dims_string(want)
                         + "); name every input in each set");
    bool ok = it->second.size() == want.size();
    for (size_t i = 0; ok && i < want.size(); ++i)
      ok = it->second[i] >= 1 && (want[i] < 0 || want[i] == it->second[i]);
    if (!ok)
      return bad_request("gives input '" + name + "' dims " + dims_string(it->second)
                         + ", but the model's are " + dims_string(want)
                         + " (batch dimension excluded, -1 any size; a shape set's dims are "
                           "sizes of at least 1)");
  }
  return set;
}

std::string shapes_text(const std::vector<std::string>& names,
                        const std::vector<std::vector<int64_t>>& shapes) {
  std::string out;
  for (size_t i = 0; i < shapes.size(); ++i)
    out += (i ? ", " : "") + (i < names.size() ? names[i] + " " : std::string())
           + dims_string(shapes[i]);
  return out;
}

} // namespace caf_serving::onnx
