#include "onnx/shape_plans.hpp"

#include "onnx/passes.hpp"

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

namespace {

/// The inputs' non-batch dims in `cfg` (completed), for check_shape_set().
input_dims dims_of_inputs(const model_config& cfg) {
  input_dims out;
  for (const auto& t : cfg.inputs)
    out.emplace_back(t.name, t.dims);
  return out;
}

} // namespace

bool has_variable_dims(const model_config& cfg) {
  for (const auto& t : cfg.inputs)
    for (auto d : t.dims)
      if (d < 0)
        return true;
  return false;
}

result<std::vector<shape_set>> known_shape_sets(const model_config& cfg,
                                                const std::vector<shape_set>& expected) {
  std::vector<shape_set> sets;
  auto inputs = dims_of_inputs(cfg);
  for (size_t i = 0; i < expected.size(); ++i) {
    auto s = check_shape_set(expected[i], inputs);
    if (!s)
      return bad_request("parameters \"expected_shapes\" set " + std::to_string(i + 1) + " "
                         + s.error().message);
    sets.push_back(*s);
  }
  for (const auto& w : cfg.warmup) {
    shape_set s;
    for (const auto& in : w.inputs)
      s[in.name] = in.dims;
    // A sample that does not fit fails the load later, with its own message.
    if (auto checked = check_shape_set(s, inputs))
      sets.push_back(*checked);
  }
  return sets;
}

std::vector<std::vector<int64_t>> shapes_with(const graph& g, const model_config& cfg, int64_t batch,
                                const shape_set* set, int64_t fill) {
  std::vector<std::vector<int64_t>> shapes;
  for (int v : g.inputs) {
    const auto& name = g.values[v].name;
    const auto& in = *std::find_if(cfg.inputs.begin(), cfg.inputs.end(),
                                   [&](const tensor_config& t) { return t.name == name; });
    std::vector<int64_t> s = in.dims;
    for (size_t d = 0; d < s.size(); ++d)
      if (s[d] < 0)
        s[d] = set ? set->at(name)[d] : fill;
    if (cfg.max_batch_size > 0) s.insert(s.begin(), batch);
    shapes.push_back(s);
  }
  return shapes;
}

namespace {

/// Sizes a variable dimension takes in shape inference when no listed shape
/// serves: moderate ones first (a text model's position table, an image
/// model's downsampling), distinct so that what follows them shows.
constexpr int64_t probe_sizes[] = {32, 64, 16, 48, 8, 128};

} // namespace

result<std::pair<graph, std::optional<graph>>> probe_shapes(
  const graph& g, const model_config& cfg, const std::vector<shape_set>& expected) {
  if (!has_variable_dims(cfg)) {
    auto spec = specialize(g, shapes_with(g, cfg, 1, nullptr, 1));
    if (!spec)
      return spec.error();
    return std::make_pair(std::move(*spec), std::optional<graph>());
  }
  auto sets = known_shape_sets(cfg, expected);
  if (!sets)
    return sets.error();
  std::vector<std::vector<std::vector<int64_t>>> candidates;
  for (const auto& s : *sets)
    candidates.push_back(shapes_with(g, cfg, 1, &s, 0));
  for (auto size : probe_sizes)
    candidates.push_back(shapes_with(g, cfg, 1, nullptr, size));
  // Every variable dimension must differ between the two probes.
  auto all_differ = [&](const std::vector<std::vector<int64_t>>& a, const std::vector<std::vector<int64_t>>& b) {
    auto variable = shapes_with(g, cfg, 1, nullptr, -1);
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t d = 0; d < a[i].size(); ++d)
        if (variable[i][d] < 0 && a[i][d] == b[i][d])
          return false;
    return true;
  };
  std::optional<graph> first;
  std::vector<std::vector<int64_t>> first_shapes;
  std::string first_error;
  for (const auto& shapes : candidates) {
    if (first && !all_differ(first_shapes, shapes))
      continue;
    auto spec = specialize(g, shapes);
    if (!spec) {
      if (first_error.empty())
        first_error = spec.error().message;
      continue;
    }
    if (!first) {
      first = std::move(*spec);
      first_shapes = shapes;
      continue;
    }
    return std::make_pair(std::move(*first), std::optional<graph>(std::move(*spec)));
  }
  std::string which;
  for (const auto& t : cfg.inputs)
    if (std::any_of(t.dims.begin(), t.dims.end(), [](int64_t d) { return d < 0; }))
      which += (which.empty() ? "'" : ", '") + t.name + "' " + dims_string(t.dims);
  return bad_request("input " + which + " has variable dimensions besides the batch, and "
                            "shape inference failed at "
                            + (first ? std::string("all but one of the") : std::string("all"))
                            + " sizes tried for them (the listed shapes, then 32, 64, 16, 48, 8, "
                              "128): "
                            + first_error + "; give the dimension a fixed size in config.pbtxt "
                                            "dims, or list shapes the model takes in parameters "
                                            "\"expected_shapes\"");
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
