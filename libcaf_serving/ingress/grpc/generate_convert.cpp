#include "ingress/grpc/generate_convert.hpp"

#include "core/json.hpp"
#include "ingress/grpc/convert.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace caf_serving::ingress::grpc_api {

namespace {

namespace pb = inference;

/// Request parameters that mean something to Triton's gRPC front end rather
/// than to the model; a generation has no priority level or queue timeout.
bool transport_parameter(const std::string& key) {
  return key == "priority" || key == "timeout" || key == "binary_data_output"
         || key == "triton_enable_empty_final_response";
}

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint32_t load_le32(const char* p) {
  auto b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

void append_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xff);
}

template <class T>
void append_integer(std::string& out, T v) {
  char buf[32];
  auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  out.append(buf, end);
}

/// A finite double as JSON; false for NaN and infinities, which JSON has no
/// words for.
bool append_double(std::string& out, double v) {
  if (!std::isfinite(v))
    return false;
  char buf[40];
  auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  out.append(buf, end);
  return true;
}

/// Elements of `shape`, or a 400 for a negative or overflowing one.
result<uint64_t> element_count(const infer_input& in, const request_limits& limits) {
  uint64_t n = 1;
  for (int64_t d : in.shape) {
    if (d < 0)
      return bad_request("input '" + in.name + "' has a negative dimension in its shape; "
                         "send the shape of the data, such as [1]");
    if (d != 0 && n > limits.max_elements / static_cast<uint64_t>(d))
      return bad_request("input '" + in.name + "' has more than "
                         + std::to_string(limits.max_elements) + " elements");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

/// The input's elements as JSON: one value when it holds one, else an array.
result<std::string> input_json(const infer_input& in, uint64_t count) {
  std::string what = "input '" + in.name + "'";
  std::string out;
  std::string_view data = in.data;
  if (count != 1)
    out += '[';
  if (in.dtype == datatype::bytes) {
    uint64_t seen = 0;
    while (!data.empty()) {
      if (data.size() < 4)
        return bad_request(what + ": its BYTES data ends inside an element's 4-byte length");
      uint32_t len = load_le32(data.data());
      data.remove_prefix(4);
      if (len > data.size())
        return bad_request(what + ": a BYTES element says it has " + std::to_string(len)
                           + " bytes but only " + std::to_string(data.size()) + " follow");
      std::string_view element = data.substr(0, len);
      data.remove_prefix(len);
      if (repair_utf8(element) != element)
        return bad_request(what + ": element " + std::to_string(seen)
                           + " is not valid UTF-8; send text as UTF-8");
      if (seen++ > 0)
        out += ',';
      append_json_string(out, element);
    }
    if (seen != count)
      return bad_request(what + " has " + std::to_string(seen) + " BYTES elements but its shape "
                         "holds " + std::to_string(count));
  } else {
    if (in.dtype == datatype::fp16 || in.dtype == datatype::bf16)
      return bad_request(what + " is " + std::string(to_string(in.dtype))
                         + ", which the generative inputs do not take; send FP32");
    size_t size = element_size(in.dtype);
    if (data.size() != count * size)
      return bad_request(what + " has " + std::to_string(data.size()) + " bytes of data but its "
                         "shape holds " + std::to_string(count) + " elements of "
                         + std::to_string(size) + " bytes");
    for (uint64_t i = 0; i < count; ++i) {
      if (i > 0)
        out += ',';
      const char* p = data.data() + i * size;
      switch (in.dtype) {
        case datatype::bool_: out += *p ? "true" : "false"; break;
        case datatype::uint8: append_integer(out, load<uint8_t>(p)); break;
        case datatype::uint16: append_integer(out, load<uint16_t>(p)); break;
        case datatype::uint32: append_integer(out, load<uint32_t>(p)); break;
        case datatype::uint64: append_integer(out, load<uint64_t>(p)); break;
        case datatype::int8: append_integer(out, load<int8_t>(p)); break;
        case datatype::int16: append_integer(out, load<int16_t>(p)); break;
        case datatype::int32: append_integer(out, load<int32_t>(p)); break;
        case datatype::int64: append_integer(out, load<int64_t>(p)); break;
        case datatype::fp32:
          if (!append_double(out, load<float>(p)))
            return bad_request(what + " holds NaN or infinity; send finite numbers");
          break;
        case datatype::fp64:
          if (!append_double(out, load<double>(p)))
            return bad_request(what + " holds NaN or infinity; send finite numbers");
          break;
        default: break;
      }
    }
  }
  if (count != 1)
    out += ']';
  return out;
}

/// A request parameter as JSON.
result<std::string> parameter_json(const std::string& key, const pb::InferParameter& p) {
  std::string out;
  switch (p.parameter_choice_case()) {
    case pb::InferParameter::kBoolParam: out = p.bool_param() ? "true" : "false"; break;
    case pb::InferParameter::kInt64Param: append_integer(out, p.int64_param()); break;
    case pb::InferParameter::kUint64Param: append_integer(out, p.uint64_param()); break;
    case pb::InferParameter::kDoubleParam:
      if (!append_double(out, p.double_param()))
        return bad_request("parameter '" + key + "' is NaN or infinite; send a finite number");
      break;
    case pb::InferParameter::kStringParam: append_json_string(out, p.string_param()); break;
    default:
      return bad_request("parameter '" + key + "' has no value; set one of bool_param, "
                         "int64_param, uint64_param, double_param or string_param");
  }
  return out;
}

void add_output(pb::ModelInferResponse& r, const char* name, const char* dtype,
                std::string raw) {
  auto* o = r.add_outputs();
  o->set_name(name);
  o->set_datatype(dtype);
  o->add_shape(1);
  r.add_raw_output_contents(std::move(raw));
}

void add_bytes_output(pb::ModelInferResponse& r, const char* name, std::string_view value) {
  std::string raw;
  raw.reserve(4 + value.size());
  append_le32(raw, static_cast<uint32_t>(value.size()));
  raw.append(value.data(), value.size());
  add_output(r, name, "BYTES", std::move(raw));
}

void add_uint32_output(pb::ModelInferResponse& r, const char* name, uint32_t value) {
  std::string raw;
  append_le32(raw, value);
  add_output(r, name, "UINT32", std::move(raw));
}

void set_meta(pb::ModelInferResponse& r, const generate_response_meta& meta, bool final) {
  r.set_model_name(std::string(meta.model_name));
  r.set_model_version(std::string(meta.model_version));
  r.set_id(std::string(meta.id));
  (*r.mutable_parameters())["triton_final_response"].set_bool_param(final);
}

} // namespace

result<stream_generate_request> to_generate_request(const pb::ModelInferRequest& request,
                                                    const generate_model_info& model,
                                                    const request_limits& limits) {
  stream_generate_request out;
  auto parsed = to_infer_request(request, limits);
  if (!parsed)
    return parsed.error();
  // The request as the body of Triton's generate endpoint.
  std::string body = "{";
  bool first = true;
  auto key = [&](std::string_view name) {
    if (!first)
      body += ',';
    first = false;
    append_json_string(body, name);
    body += ':';
  };
  if (!request.id().empty()) {
    key("id");
    append_json_string(body, request.id());
  }
  for (const auto& in : parsed->inputs) {
    if (in.shared_memory)
      return bad_request("input '" + in.name + "' names shared memory region '"
                         + in.shared_memory->region
                         + "'; generative requests carry their inputs in the request (typed "
                           "contents or raw_input_contents)");
    auto count = element_count(in, limits);
    if (!count)
      return count.error();
    auto value = input_json(in, *count);
    if (!value)
      return value.error();
    key(in.name);
    body += *value;
  }
  std::string parameters;
  for (const auto& [name, value] : request.parameters()) {
    if (name == "triton_enable_empty_final_response") {
      if (value.parameter_choice_case() != pb::InferParameter::kBoolParam)
        return bad_request("parameter 'triton_enable_empty_final_response' must be a "
                           "bool_param");
      out.empty_final_response = value.bool_param();
    }
    if (transport_parameter(name))
      continue;
    auto v = parameter_json(name, value);
    if (!v)
      return v.error();
    if (!parameters.empty())
      parameters += ',';
    append_json_string(parameters, name);
    parameters += ':';
    parameters += *v;
  }
  if (!parameters.empty()) {
    key("parameters");
    body += '{' + parameters + '}';
  }
  body += '}';
  auto generate = parse_triton_generate(body, model);
  if (!generate)
    return generate.error();
  out.request = std::move(*generate);
  return out;
}

pb::ModelStreamInferResponse to_generate_response(const generate_response& r) {
  pb::ModelStreamInferResponse out;
  auto& infer = *out.mutable_infer_response();
  set_meta(infer, r.meta, r.final);
  if (!r.text_output)
    return out;
  add_bytes_output(infer, "text_output", *r.text_output);
  if (r.finish_reason) {
    std::string_view reason = to_string(*r.finish_reason);
    add_bytes_output(infer, "finish_reason", reason.empty() ? "None" : reason);
  }
  if (r.num_input_tokens)
    add_uint32_output(infer, "num_input_tokens", *r.num_input_tokens);
  if (r.num_output_tokens)
    add_uint32_output(infer, "num_output_tokens", *r.num_output_tokens);
  return out;
}

pb::ModelStreamInferResponse to_generate_error(const generate_response_meta& meta,
                                               std::string_view message) {
  pb::ModelStreamInferResponse out;
  out.set_error_message(std::string(message));
  set_meta(*out.mutable_infer_response(), meta, true);
  return out;
}

} // namespace caf_serving::ingress::grpc_api
