#include "scheduler/padded_batching.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace caf_serving::scheduler {

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    auto end = text.find(sep, start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos)
      return out;
    start = end + 1;
  }
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos)
    return {};
  auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::optional<double> parse_number(const std::string& text) {
  if (text.empty())
    return std::nullopt;
  try {
    size_t used = 0;
    double v = std::stod(text, &used);
    if (used != text.size() || !std::isfinite(v))
      return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<unsigned> parse_dim(const std::string& text) {
  auto v = parse_number(text);
  if (!v || *v < 0 || *v > 64 || *v != std::floor(*v))
    return std::nullopt;
  return static_cast<unsigned>(*v);
}

const tensor_config* find(const std::vector<tensor_config>& list, const std::string& name) {
  for (const auto& t : list)
    if (t.name == name)
      return &t;
  return nullptr;
}

/// Whether `v` survives a round trip through `dtype` unchanged.
bool representable(double v, datatype dtype) {
  auto in = [&](double lo, double hi) { return v >= lo && v <= hi && v == std::floor(v); };
  switch (dtype) {
    case datatype::bool_: return v == 0 || v == 1;
    case datatype::uint8: return in(0, 255);
    case datatype::uint16: return in(0, 65535);
    case datatype::uint32: return in(0, 4294967295.0);
    case datatype::uint64: return in(0, 1.8e19);
    case datatype::int8: return in(-128, 127);
    case datatype::int16: return in(-32768, 32767);
    case datatype::int32: return in(-2147483648.0, 2147483647.0);
    case datatype::int64: return in(-9.2e18, 9.2e18);
    case datatype::fp32: return std::fabs(v) <= std::numeric_limits<float>::max();
    case datatype::fp64: return true;
    default: return false;
  }
}

} // namespace

const padded_input* padded_batching_config::input(const std::string& name) const {
  for (const auto& i : inputs)
    if (i.name == name)
      return &i;
  return nullptr;
}

const padded_output* padded_batching_config::output(const std::string& name) const {
  for (const auto& o : outputs)
    if (o.name == name)
      return &o;
  return nullptr;
}

result<padded_batching_config> read_padded_batching(const model_config& model) {
  padded_batching_config cfg;
  const auto& params = model.parameters;
  auto get = [&](const char* key) -> std::optional<std::string> {
    auto i = params.find(key);
    if (i == params.end())
      return std::nullopt;
    return trim(i->second);
  };
  auto spec = get("padded_batching");
  auto waste = get("padded_batching_max_waste");
  auto outputs = get("padded_outputs");
  auto where = "model '" + model.name + "': ";
  if (!spec || spec->empty()) {
    if (waste || outputs)
      return bad_request(where + "parameters padded_batching_max_waste or padded_outputs "
                         "are set without padded_batching; add padded_batching "
                         "(\"input:dim:pad value;...\") or drop them");
    return cfg;
  }
  if (model.max_batch_size <= 0)
    return bad_request(where + "padded_batching needs a batch dimension (max_batch_size > 0); "
                       "set max_batch_size or drop padded_batching");
  if (!model.dynamic_batching_enabled)
    return bad_request(where + "padded_batching only applies with dynamic_batching; add a "
                       "dynamic_batching block or drop padded_batching");
  for (const auto& raw : split(*spec, ';')) {
    auto item = trim(raw);
    if (item.empty())
      continue;
    auto parts = split(item, ':');
    if (parts.size() != 3)
      return bad_request(where + "padded_batching entry '" + item
                         + "' is not input:dim:pad value (e.g. \"input_ids:1:0\")");
    padded_input in;
    in.name = trim(parts[0]);
    auto dim = parse_dim(trim(parts[1]));
    auto value = parse_number(trim(parts[2]));
    const auto* t = find(model.inputs, in.name);
    if (!t)
      return bad_request(where + "padded_batching names input '" + in.name
                         + "', which the model does not have");
    if (cfg.input(in.name))
      return bad_request(where + "padded_batching names input '" + in.name + "' twice");
    if (!dim || *dim == 0 || *dim > t->dims.size())
      return bad_request(where + "padded_batching entry '" + item + "': dim '" + trim(parts[1])
                         + "' must be an index into the request shape past the batch "
                           "dimension (1.." + std::to_string(t->dims.size()) + ")");
    if (t->dims[*dim - 1] >= 0)
      return bad_request(where + "padded_batching entry '" + item + "': dimension " + trim(parts[1])
                         + " of input '" + in.name + "' is fixed ("
                         + std::to_string(t->dims[*dim - 1])
                         + "); only a variable (-1) dimension can be padded");
    if (t->reshape)
      return bad_request(where + "padded_batching: input '" + in.name
                         + "' has a reshape; padding a reshaped input is not supported");
    if (!value || !representable(*value, t->dtype))
      return bad_request(where + "padded_batching entry '" + item + "': pad value '"
                         + trim(parts[2]) + "' is not a number that "
                         + std::string(to_config_string(t->dtype))
                         + " holds (the datatypes that can be padded are BOOL, the integer "
                           "types, FP32 and FP64)");
    in.dim = *dim;
    in.pad_value = *value;
    cfg.inputs.push_back(std::move(in));
  }
  if (cfg.inputs.empty())
    return bad_request(where + "padded_batching is empty; name input:dim:pad value entries "
                       "separated by ';' or drop the parameter");
  if (waste) {
    auto v = parse_number(*waste);
    if (!v || *v < 0 || *v >= 1)
      return bad_request(where + "padded_batching_max_waste '" + *waste
                         + "' must be a number in [0, 1) (the largest fraction of a batch's "
                           "elements that may be padding), e.g. \"0.25\"");
    cfg.max_waste = *v;
  }
  if (outputs) {
    for (const auto& raw : split(*outputs, ';')) {
      auto item = trim(raw);
      if (item.empty())
        continue;
      auto parts = split(item, ':');
      padded_output out;
      out.name = trim(parts[0]);
      auto dim = parts.size() == 2 ? parse_dim(trim(parts[1])) : std::nullopt;
      if (parts.size() != 2 || !dim || *dim == 0)
        return bad_request(where + "padded_outputs entry '" + item
                           + "' is not output:dim with dim >= 1 (e.g. \"last_hidden_state:1\")");
      const auto* t = find(model.outputs, out.name);
      if (!t)
        return bad_request(where + "padded_outputs names output '" + out.name
                           + "', which the model does not have");
      if (t->dtype == datatype::bytes)
        return bad_request(where + "padded_outputs: output '" + out.name
                           + "' is BYTES, which cannot be sliced");
      if (*dim > t->dims.size())
        return bad_request(where + "padded_outputs entry '" + item + "': output '" + out.name
                           + "' has " + std::to_string(t->dims.size() + 1)
                           + " dimensions with the batch dimension");
      out.dim = *dim;
      cfg.outputs.push_back(std::move(out));
    }
  }
  return cfg;
}

void fill_pad(uint8_t* out, size_t count, datatype dtype, double v) {
  auto fill = [&](auto typed) {
    using T = decltype(typed);
    T x = static_cast<T>(v);
    for (size_t i = 0; i < count; ++i)
      std::memcpy(out + i * sizeof(T), &x, sizeof(T));
  };
  switch (dtype) {
    case datatype::bool_: case datatype::uint8: fill(uint8_t{}); break;
    case datatype::uint16: fill(uint16_t{}); break;
    case datatype::uint32: fill(uint32_t{}); break;
    case datatype::uint64: fill(uint64_t{}); break;
    case datatype::int8: fill(int8_t{}); break;
    case datatype::int16: fill(int16_t{}); break;
    case datatype::int32: fill(int32_t{}); break;
    case datatype::int64: fill(int64_t{}); break;
    case datatype::fp32: fill(float{}); break;
    case datatype::fp64: fill(double{}); break;
    default: std::memset(out, 0, count * element_size(dtype)); break;
  }
}

} // namespace caf_serving::scheduler
