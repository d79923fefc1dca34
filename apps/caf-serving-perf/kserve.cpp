#include "kserve.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include <simdjson.h>

namespace caf_serving::perf {

namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string parse_tensor_list(element list, std::vector<tensor_meta>& out,
                              std::string_view what) {
  array arr;
  if (list.get_array().get(arr))
    return std::string("'") + std::string(what) + "' is not an array";
  for (element e : arr) {
    tensor_meta t;
    std::string_view name, datatype;
    if (e["name"].get_string().get(name))
      return "an entry of '" + std::string(what) + "' has no name";
    if (e["datatype"].get_string().get(datatype))
      return "tensor '" + std::string(name) + "' has no datatype";
    t.name = std::string(name);
    t.datatype = std::string(datatype);
    array dims;
    if (!e["shape"].get_array().get(dims)) {
      for (element d : dims) {
        int64_t v = 0;
        if (d.get_int64().get(v))
          return "tensor '" + t.name + "' has a non-integer dimension";
        t.shape.push_back(v);
      }
    }
    out.push_back(std::move(t));
  }
  return {};
}

// -- element encoding ----------------------------------------------------------

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31)
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10)
      return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    auto shift = static_cast<uint32_t>(14 - exp);
    return static_cast<uint16_t>(sign | (mant >> shift));
  }
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10)
                               | (mant >> 13));
}

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400u),
                   static_cast<int>(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class T>
void append_raw(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

/// Appends one numeric element given as a double.
void append_element(std::string& out, std::string_view dt, double v) {
  if (dt == "FP32")
    append_raw(out, static_cast<float>(v));
  else if (dt == "FP64")
    append_raw(out, v);
  else if (dt == "FP16")
    append_raw(out, float_to_half(static_cast<float>(v)));
  else if (dt == "BF16") {
    auto f = static_cast<float>(v);
    uint32_t x;
    std::memcpy(&x, &f, 4);
    append_raw(out, static_cast<uint16_t>(x >> 16));
  } else if (dt == "BOOL")
    append_raw(out, static_cast<uint8_t>(v != 0));
  else if (dt == "INT8")
    append_raw(out, static_cast<int8_t>(v));
  else if (dt == "UINT8")
    append_raw(out, static_cast<uint8_t>(v));
  else if (dt == "INT16")
    append_raw(out, static_cast<int16_t>(v));
  else if (dt == "UINT16")
    append_raw(out, static_cast<uint16_t>(v));
  else if (dt == "INT32")
    append_raw(out, static_cast<int32_t>(v));
  else if (dt == "UINT32")
    append_raw(out, static_cast<uint32_t>(v));
  else if (dt == "INT64")
    append_raw(out, static_cast<int64_t>(v));
  else if (dt == "UINT64")
    append_raw(out, static_cast<uint64_t>(v));
}

void append_bytes_element(std::string& out, std::string_view s) {
  append_raw(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

template <class T>
T read_raw(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

/// Writes the tensor's elements as a flat JSON array.
void append_json_data(std::string& out, const tensor_value& t) {
  out += '[';
  const auto& b = t.bytes;
  const auto& dt = t.datatype;
  char num[64];
  bool first = true;
  auto sep = [&] {
    if (!first)
      out += ',';
    first = false;
  };
  if (dt == "BYTES") {
    std::size_t pos = 0;
    while (pos + 4 <= b.size()) {
      auto len = read_raw<uint32_t>(b.data() + pos);
      sep();
      append_json_string(out, std::string_view(b.data() + pos + 4, len));
      pos += 4 + len;
    }
    out += ']';
    return;
  }
  auto size = datatype_size(dt);
  for (std::size_t pos = 0; size > 0 && pos + size <= b.size(); pos += size) {
    sep();
    const char* p = b.data() + pos;
    if (dt == "FP32")
      std::snprintf(num, sizeof(num), "%.9g", read_raw<float>(p));
    else if (dt == "FP64")
      std::snprintf(num, sizeof(num), "%.17g", read_raw<double>(p));
    else if (dt == "FP16")
      std::snprintf(num, sizeof(num), "%.6g",
                    half_to_float(read_raw<uint16_t>(p)));
    else if (dt == "BF16") {
      uint32_t x = static_cast<uint32_t>(read_raw<uint16_t>(p)) << 16;
      float f;
      std::memcpy(&f, &x, 4);
      std::snprintf(num, sizeof(num), "%.6g", f);
    } else if (dt == "BOOL")
      std::snprintf(num, sizeof(num), "%s", *p ? "true" : "false");
    else if (dt == "INT8")
      std::snprintf(num, sizeof(num), "%d", read_raw<int8_t>(p));
    else if (dt == "UINT8")
      std::snprintf(num, sizeof(num), "%u", read_raw<uint8_t>(p));
    else if (dt == "INT16")
      std::snprintf(num, sizeof(num), "%d", read_raw<int16_t>(p));
    else if (dt == "UINT16")
      std::snprintf(num, sizeof(num), "%u", read_raw<uint16_t>(p));
    else if (dt == "INT32")
      std::snprintf(num, sizeof(num), "%d", read_raw<int32_t>(p));
    else if (dt == "UINT32")
      std::snprintf(num, sizeof(num), "%u", read_raw<uint32_t>(p));
    else if (dt == "INT64")
      std::snprintf(num, sizeof(num), "%lld",
                    static_cast<long long>(read_raw<int64_t>(p)));
    else
      std::snprintf(num, sizeof(num), "%llu",
                    static_cast<unsigned long long>(read_raw<uint64_t>(p)));
    out += num;
  }
  out += ']';
}

/// Flattens nested JSON arrays of numbers, strings or booleans.
std::string flatten(element e, const std::string& dt, std::string& out,
                    std::size_t& count) {
  if (e.is_array()) {
    array children = e.get_array().value_unsafe();
    for (element child : children) {
      auto err = flatten(child, dt, out, count);
      if (!err.empty())
        return err;
    }
    return {};
  }
  ++count;
  if (dt == "BYTES") {
    std::string_view s;
    if (e.get_string().get(s))
      return "BYTES data must be strings";
    append_bytes_element(out, s);
    return {};
  }
  double v = 0;
  bool b = false;
  if (!e.get_bool().get(b))
    v = b ? 1 : 0;
  else if (e.get_double().get(v))
    return "data must be numbers";
  append_element(out, dt, v);
  return {};
}

std::size_t product(const std::vector<int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape)
    n *= static_cast<std::size_t>(d);
  return n;
}

} // namespace

metadata_result parse_model_metadata(std::string_view json) {
  metadata_result result;
  simdjson::dom::parser parser;
  element doc;
  if (auto err = parser.parse(json.data(), json.size()).get(doc)) {
    result.error = std::string("model metadata is not valid JSON: ")
                   + simdjson::error_message(err);
    return result;
  }
  std::string_view name;
  if (!doc["name"].get_string().get(name))
    result.value.name = std::string(name);
  element list;
  if (doc["inputs"].get(list)) {
    result.error = "model metadata has no 'inputs'";
    return result;
  }
  result.error = parse_tensor_list(list, result.value.inputs, "inputs");
  if (!result.error.empty())
    return result;
  if (!doc["outputs"].get(list))
    result.error = parse_tensor_list(list, result.value.outputs, "outputs");
  return result;
}

std::size_t datatype_size(std::string_view dt) {
  if (dt == "BOOL" || dt == "INT8" || dt == "UINT8")
    return 1;
  if (dt == "INT16" || dt == "UINT16" || dt == "FP16" || dt == "BF16")
    return 2;
  if (dt == "INT32" || dt == "UINT32" || dt == "FP32")
    return 4;
  if (dt == "INT64" || dt == "UINT64" || dt == "FP64")
    return 8;
  return 0;
}

resolve_result resolve_shapes(const model_metadata& meta,
                              const shape_config& config) {
  resolve_result result;
  for (const auto& o : config.shapes) {
    bool known = false;
    for (const auto& in : meta.inputs)
      known = known || in.name == o.name;
    if (!known) {
      std::string names;
      for (const auto& in : meta.inputs)
        names += (names.empty() ? "" : ", ") + in.name;
      result.error = "--shape names input '" + o.name + "' but model '"
                     + meta.name + "' has inputs: " + names;
      return result;
    }
  }
  for (const auto& in : meta.inputs) {
    if (datatype_size(in.datatype) == 0 && in.datatype != "BYTES") {
      result.error = "input '" + in.name + "' has datatype '" + in.datatype
                     + "', which this tool cannot generate";
      return result;
    }
    resolved_input r;
    r.name = in.name;
    r.datatype = in.datatype;
    const shape_override* given = nullptr;
    for (const auto& o : config.shapes)
      if (o.name == in.name)
        given = &o;
    if (given != nullptr) {
      if (given->dims.size() == in.shape.size()) {
        r.shape = given->dims;
      } else if (given->dims.size() + 1 == in.shape.size()
                 && !in.shape.empty() && in.shape[0] == -1) {
        r.shape.push_back(config.batch_size);
        r.shape.insert(r.shape.end(), given->dims.begin(), given->dims.end());
      } else {
        result.error = "--shape " + in.name + " gives "
                       + std::to_string(given->dims.size())
                       + " dimensions but the model expects shape "
                       + shape_text(in.shape)
                       + "; give all dimensions, or all but the batch one";
        return result;
      }
      for (std::size_t i = 0; i < in.shape.size(); ++i) {
        if (in.shape[i] >= 0 && r.shape[i] != in.shape[i]) {
          result.error = "input '" + in.name + "' would have shape "
                         + shape_text(r.shape) + " but the model expects "
                         + shape_text(in.shape) + "; fix --shape "
                         + in.name;
          return result;
        }
        if (r.shape[i] < 0) {
          result.error = "--shape " + in.name
                         + " has a negative dimension; give concrete sizes";
          return result;
        }
      }
    } else {
      for (std::size_t i = 0; i < in.shape.size(); ++i) {
        auto d = in.shape[i];
        if (d >= 0) {
          r.shape.push_back(d);
        } else if (i == 0) {
          r.shape.push_back(config.batch_size);
        } else {
          result.error = "input '" + in.name + "' has shape "
                         + shape_text(in.shape)
                         + " with a variable dimension at position "
                         + std::to_string(i) + "; give its size with --shape "
                         + in.name + ":D1,D2,...";
          return result;
        }
      }
    }
    r.element_count = product(r.shape);
    result.inputs.push_back(std::move(r));
  }
  return result;
}

input_data_result make_input_data(const std::vector<resolved_input>& inputs,
                                  const input_data_config& config) {
  input_data_result result;
  if (config.kind != input_data_kind::file) {
    std::mt19937_64 rng(config.seed);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    std::uniform_int_distribution<int> small(0, 99);
    input_set set;
    for (const auto& in : inputs) {
      tensor_value t{in.name, in.datatype, in.shape, {}};
      auto size = datatype_size(in.datatype);
      t.bytes.reserve(size > 0 ? size * in.element_count : in.element_count);
      bool random = config.kind == input_data_kind::random;
      bool is_float = in.datatype.rfind("FP", 0) == 0 || in.datatype == "BF16";
      for (std::size_t i = 0; i < in.element_count; ++i) {
        if (in.datatype == "BYTES") {
          append_bytes_element(t.bytes,
                               random ? std::to_string(small(rng)) : "0");
        } else if (in.datatype == "BOOL") {
          append_element(t.bytes, in.datatype, random ? small(rng) % 2 : 0);
        } else {
          double v = 0;
          if (random)
            v = is_float ? unit(rng) : small(rng);
          append_element(t.bytes, in.datatype, v);
        }
      }
      set.push_back(std::move(t));
    }
    result.sets.push_back(std::move(set));
    return result;
  }
  // perf_analyzer's format: {"data": [{"IN": [..]} or {"IN": {"content":
  // [..], "shape": [..]}}, ...]}
  simdjson::dom::parser parser;
  element doc;
  if (auto err = parser.parse(config.file_text).get(doc)) {
    result.error = std::string("--input-data file is not valid JSON: ")
                   + simdjson::error_message(err);
    return result;
  }
  array entries;
  if (doc["data"].get_array().get(entries)) {
    result.error = "--input-data file needs a top-level \"data\" array, as "
                   "in {\"data\": [{\"INPUT0\": [1, 2, 3]}]}";
    return result;
  }
  std::size_t index = 0;
  for (element entry : entries) {
    input_set set;
    for (const auto& in : inputs) {
      tensor_value t{in.name, in.datatype, in.shape, {}};
      element value;
      if (entry[in.name].get(value)) {
        result.error = "--input-data entry " + std::to_string(index)
                       + " has no data for input '" + in.name + "'";
        return result;
      }
      element content = value;
      if (value.is_object()) {
        element shape;
        if (!value["shape"].get(shape) && shape.is_array()) {
          t.shape.clear();
          array dims = shape.get_array().value_unsafe();
          for (element d : dims) {
            int64_t v = 0;
            if (d.get_int64().get(v) || v < 0) {
              result.error = "--input-data input '" + in.name
                             + "' has a bad \"shape\"";
              return result;
            }
            t.shape.push_back(v);
          }
        }
        if (value["content"].get(content)) {
          result.error = "--input-data entry " + std::to_string(index)
                         + " input '" + in.name
                         + "' is an object without \"content\"";
          return result;
        }
      }
      std::size_t count = 0;
      auto err = flatten(content, in.datatype, t.bytes, count);
      if (!err.empty()) {
        result.error = "--input-data input '" + in.name + "': " + err;
        return result;
      }
      auto want = product(t.shape);
      if (count != want && !t.shape.empty() && t.shape[0] > 0
          && count * static_cast<std::size_t>(t.shape[0]) == want) {
        // One sample given for a batched input: repeat it for the batch.
        auto sample = t.bytes;
        for (int64_t i = 1; i < t.shape[0]; ++i)
          t.bytes += sample;
        count = want;
      }
      if (count != want) {
        result.error = "--input-data entry " + std::to_string(index)
                       + " gives " + std::to_string(count)
                       + " values for input '" + in.name + "' of shape "
                       + shape_text(t.shape) + ", which needs "
                       + std::to_string(want);
        return result;
      }
      set.push_back(std::move(t));
    }
    result.sets.push_back(std::move(set));
    ++index;
  }
  if (result.sets.empty())
    result.error = "--input-data file has an empty \"data\" array";
  return result;
}

request_parameter_result parse_request_parameter(std::string_view text) {
  request_parameter_result r;
  auto first = text.find(':');
  auto last = text.rfind(':');
  auto usage = "--request-parameter '" + std::string(text)
               + "' must be NAME:VALUE:TYPE with TYPE int, string or bool, "
                 "e.g. timeout:50000:int";
  if (first == std::string_view::npos || first == last || first == 0) {
    r.error = usage;
    return r;
  }
  r.value.name = std::string(text.substr(0, first));
  auto value = std::string(text.substr(first + 1, last - first - 1));
  auto type = text.substr(last + 1);
  if (type == "int") {
    char* end = nullptr;
    errno = 0;
    auto n = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno != 0) {
      r.error = "--request-parameter '" + std::string(text) + "': '" + value
                + "' is not a whole number";
      return r;
    }
    r.value.json_value = std::to_string(n);
  } else if (type == "bool") {
    if (value != "true" && value != "false") {
      r.error = "--request-parameter '" + std::string(text) + "': '" + value
                + "' is not true or false";
      return r;
    }
    r.value.json_value = value;
  } else if (type == "string") {
    append_json_string(r.value.json_value, value);
  } else {
    r.error = usage;
  }
  return r;
}

infer_body build_infer_body(const input_set& inputs,
                            const infer_body_config& config) {
  infer_body result;
  bool binary_in = config.input_format == tensor_format::binary;
  std::string& j = result.body;
  j += "{\"inputs\":[";
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& t = inputs[i];
    if (i > 0)
      j += ',';
    j += "{\"name\":";
    append_json_string(j, t.name);
    j += ",\"shape\":" + shape_text(t.shape) + ",\"datatype\":\"" + t.datatype
         + "\"";
    if (binary_in) {
      j += ",\"parameters\":{\"binary_data_size\":"
           + std::to_string(t.bytes.size()) + "}}";
    } else {
      j += ",\"data\":";
      append_json_data(j, t);
      j += '}';
    }
  }
  j += ']';
  if (config.output_format == tensor_format::binary
      && !config.output_names.empty()) {
    j += ",\"outputs\":[";
    for (std::size_t i = 0; i < config.output_names.size(); ++i) {
      if (i > 0)
        j += ',';
      j += "{\"name\":";
      append_json_string(j, config.output_names[i]);
      j += ",\"parameters\":{\"binary_data\":true}}";
    }
    j += ']';
  }
  if (!config.parameters.empty()) {
    j += ",\"parameters\":{";
    for (std::size_t i = 0; i < config.parameters.size(); ++i) {
      if (i > 0)
        j += ',';
      append_json_string(j, config.parameters[i].name);
      j += ':' + config.parameters[i].json_value;
    }
    j += '}';
  }
  j += '}';
  if (binary_in) {
    result.headers = "Inference-Header-Content-Length: "
                     + std::to_string(j.size()) + "\r\n"
                     + "Content-Type: application/octet-stream\r\n";
    for (const auto& t : inputs)
      j += t.bytes;
  } else {
    result.headers = "Content-Type: application/json\r\n";
  }
  return result;
}

stats_result parse_model_stats(std::string_view json, std::string_view model) {
  stats_result result;
  simdjson::dom::parser parser;
  element doc;
  if (auto err = parser.parse(json.data(), json.size()).get(doc)) {
    result.error = std::string("model statistics are not valid JSON: ")
                   + simdjson::error_message(err);
    return result;
  }
  array models;
  if (doc["model_stats"].get_array().get(models)) {
    result.error = "model statistics have no 'model_stats' array";
    return result;
  }
  auto read = [](element stats, const char* key, stat_duration& out) {
    element d;
    if (stats[key].get(d))
      return;
    uint64_t v = 0;
    if (!d["count"].get_uint64().get(v))
      out.count += v;
    if (!d["ns"].get_uint64().get(v))
      out.ns += v;
  };
  bool found = false;
  for (element m : models) {
    std::string_view name;
    if (!m["name"].get_string().get(name) && name != model)
      continue;
    found = true;
    auto& s = result.value;
    uint64_t v = 0;
    if (!m["inference_count"].get_uint64().get(v))
      s.inference_count += v;
    if (!m["execution_count"].get_uint64().get(v))
      s.execution_count += v;
    element inf;
    if (m["inference_stats"].get(inf))
      continue;
    read(inf, "success", s.success);
    read(inf, "fail", s.fail);
    read(inf, "queue", s.queue);
    read(inf, "compute_input", s.compute_input);
    read(inf, "compute_infer", s.compute_infer);
    read(inf, "compute_output", s.compute_output);
  }
  if (!found)
    result.error = "model statistics hold no entry for model '"
                   + std::string(model) + "'";
  return result;
}

server_breakdown stats_delta(const model_stats& before,
                             const model_stats& after) {
  server_breakdown b;
  auto avg = [](stat_duration x, stat_duration y) {
    if (y.count <= x.count)
      return 0.0;
    return static_cast<double>(y.ns - x.ns)
           / static_cast<double>(y.count - x.count) / 1000.0;
  };
  if (after.success.count < before.success.count)
    return b; // the server restarted or reset its counters
  b.valid = true;
  b.request_count = after.success.count - before.success.count;
  b.execution_count = after.execution_count - before.execution_count;
  b.request_us = avg(before.success, after.success);
  b.queue_us = avg(before.queue, after.queue);
  b.compute_input_us = avg(before.compute_input, after.compute_input);
  b.compute_infer_us = avg(before.compute_infer, after.compute_infer);
  b.compute_output_us = avg(before.compute_output, after.compute_output);
  b.overhead_us = b.request_us - b.queue_us - b.compute_input_us
                  - b.compute_infer_us - b.compute_output_us;
  if (b.overhead_us < 0)
    b.overhead_us = 0;
  return b;
}

} // namespace caf_serving::perf
