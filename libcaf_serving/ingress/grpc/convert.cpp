#include "ingress/grpc/convert.hpp"

#include "core/datatype.hpp"
#include "ingress/validate.hpp"

#include <cstring>
#include <limits>

namespace caf_serving::ingress::grpc_api {

namespace {

using google::protobuf::Map;
using inference::InferParameter;

/// Appends `values` converted element by element to T's little-endian bytes.
template <class T, class Values>
void append_as(std::string& out, const Values& values) {
  size_t at = out.size();
  out.resize(at + values.size() * sizeof(T));
  char* p = out.data() + at;
  for (const auto& v : values) {
    T t = static_cast<T>(v);
    std::memcpy(p, &t, sizeof(T));
    p += sizeof(T);
  }
}

/// The typed-contents field that holds `t`, as Triton's protocol assigns them.
const char* contents_field(datatype t) {
  switch (t) {
    case datatype::bool_: return "bool_contents";
    case datatype::int8:
    case datatype::int16:
    case datatype::int32: return "int_contents";
    case datatype::int64: return "int64_contents";
    case datatype::uint8:
    case datatype::uint16:
    case datatype::uint32: return "uint_contents";
    case datatype::uint64: return "uint64_contents";
    case datatype::fp32: return "fp32_contents";
    case datatype::fp64: return "fp64_contents";
    case datatype::bytes: return "bytes_contents";
    case datatype::fp16:
    case datatype::bf16: return nullptr;
  }
  return nullptr;
}

/// How many values each typed field holds, and which fields hold any.
struct contents_counts {
  size_t total_fields = 0;
  size_t values = 0;
  std::string first_field;
};

contents_counts count_contents(const inference::InferTensorContents& c) {
  contents_counts out;
  auto note = [&](int n, const char* name) {
    if (n == 0)
      return;
    if (out.total_fields++ == 0)
      out.first_field = name;
    out.values = static_cast<size_t>(n);
  };
  note(c.bool_contents_size(), "bool_contents");
  note(c.int_contents_size(), "int_contents");
  note(c.int64_contents_size(), "int64_contents");
  note(c.uint_contents_size(), "uint_contents");
  note(c.uint64_contents_size(), "uint64_contents");
  note(c.fp32_contents_size(), "fp32_contents");
  note(c.fp64_contents_size(), "fp64_contents");
  note(c.bytes_contents_size(), "bytes_contents");
  return out;
}

/// The raw bytes of typed contents already checked to be in `field`.
std::string raw_of(const inference::InferTensorContents& c, datatype t) {
  std::string out;
  switch (t) {
    case datatype::bool_: append_as<uint8_t>(out, c.bool_contents()); break;
    case datatype::int8: append_as<int8_t>(out, c.int_contents()); break;
    case datatype::int16: append_as<int16_t>(out, c.int_contents()); break;
    case datatype::int32: append_as<int32_t>(out, c.int_contents()); break;
    case datatype::int64: append_as<int64_t>(out, c.int64_contents()); break;
    case datatype::uint8: append_as<uint8_t>(out, c.uint_contents()); break;
    case datatype::uint16: append_as<uint16_t>(out, c.uint_contents()); break;
    case datatype::uint32: append_as<uint32_t>(out, c.uint_contents()); break;
    case datatype::uint64: append_as<uint64_t>(out, c.uint64_contents()); break;
    case datatype::fp32: append_as<float>(out, c.fp32_contents()); break;
    case datatype::fp64: append_as<double>(out, c.fp64_contents()); break;
    case datatype::bytes:
      for (const auto& s : c.bytes_contents()) {
        uint32_t n = static_cast<uint32_t>(s.size());
        out.append(reinterpret_cast<const char*>(&n), 4);
        out += s;
      }
      break;
    case datatype::fp16:
    case datatype::bf16: break;
  }
  return out;
}

/// A parameter as the HTTP codec keeps unknown ones: its JSON text.
std::string text_of(const InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case InferParameter::kBoolParam: return p.bool_param() ? "true" : "false";
    case InferParameter::kInt64Param: return std::to_string(p.int64_param());
    case InferParameter::kStringParam: return p.string_param();
    case InferParameter::kDoubleParam: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.17g", p.double_param());
      return buf;
    }
    case InferParameter::kUint64Param: return std::to_string(p.uint64_param());
    case InferParameter::PARAMETER_CHOICE_NOT_SET: break;
  }
  return {};
}

/// A non-negative integer parameter (int64_param or uint64_param).
result<uint64_t> unsigned_param(const InferParameter& p, const std::string& what) {
  if (p.parameter_choice_case() == InferParameter::kUint64Param)
    return p.uint64_param();
  if (p.parameter_choice_case() == InferParameter::kInt64Param && p.int64_param() >= 0)
    return static_cast<uint64_t>(p.int64_param());
  return bad_request("parameter '" + what
                     + "' must be a non-negative integer (int64_param or uint64_param)");
}

/// The shared-memory parameters of an input or output, when it has them.
result<std::optional<shared_memory_ref>> shared_memory_of(
  const Map<std::string, InferParameter>& params, const std::string& what) {
  auto region = params.find("shared_memory_region");
  if (region == params.end())
    return std::optional<shared_memory_ref>();
  if (region->second.parameter_choice_case() != InferParameter::kStringParam)
    return bad_request(what + ": parameter 'shared_memory_region' must be a string_param");
  shared_memory_ref ref;
  ref.region = region->second.string_param();
  auto size = params.find("shared_memory_byte_size");
  if (size == params.end())
    return bad_request(what + ": 'shared_memory_region' needs 'shared_memory_byte_size' too");
  auto n = unsigned_param(size->second, "shared_memory_byte_size");
  if (!n)
    return bad_request(what + ": " + n.error().message);
  ref.byte_size = *n;
  if (auto offset = params.find("shared_memory_offset"); offset != params.end()) {
    auto o = unsigned_param(offset->second, "shared_memory_offset");
    if (!o)
      return bad_request(what + ": " + o.error().message);
    ref.offset = *o;
  }
  return std::optional<shared_memory_ref>(ref);
}

} // namespace

::grpc::Status to_status(const serving_error& e) {
  ::grpc::StatusCode code = ::grpc::StatusCode::INTERNAL;
  switch (static_cast<int>(e.status)) {
    case 400: code = ::grpc::StatusCode::INVALID_ARGUMENT; break;
    case 403: code = ::grpc::StatusCode::PERMISSION_DENIED; break;
    case 404: code = ::grpc::StatusCode::NOT_FOUND; break;
    case 405:
    case 501: code = ::grpc::StatusCode::UNIMPLEMENTED; break;
    case 408: code = ::grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case 413: code = ::grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case 429:
    case 503: code = ::grpc::StatusCode::UNAVAILABLE; break;
    default: break;
  }
  return {code, e.message};
}

result<int64_t> parse_version(const std::string& text, const std::string& model) {
  if (text.empty())
    return int64_t{0};
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || v <= 0)
    return bad_request("version '" + text + "' of model '" + model
                       + "' is not a positive integer; leave it empty for the newest version");
  return static_cast<int64_t>(v);
}

result<infer_request> to_infer_request(const inference::ModelInferRequest& request,
                                       const request_limits& limits) {
  infer_request out;
  out.id = request.id();
  // gRPC answers always carry raw contents.
  out.binary_data_output = true;
  for (const auto& [key, value] : request.parameters()) {
    if (key == "priority") {
      auto n = unsigned_param(value, key);
      if (!n)
        return n.error();
      if (*n > std::numeric_limits<uint32_t>::max())
        return bad_request("parameter 'priority' is " + std::to_string(*n)
                           + ", past the largest priority level");
      out.priority = static_cast<uint32_t>(*n);
    } else if (key == "timeout") {
      auto n = unsigned_param(value, key);
      if (!n)
        return n.error();
      out.timeout_us = *n;
    } else if (key == "binary_data_output") {
      // HTTP's choice between JSON and binary: over gRPC every output is raw.
    } else {
      out.parameters[key] = text_of(value);
    }
  }
  size_t n_inputs = static_cast<size_t>(request.inputs_size());
  if (n_inputs > limits.max_tensors)
    return bad_request("the request has " + std::to_string(n_inputs)
                       + " inputs, more than the limit of " + std::to_string(limits.max_tensors));
  if (request.outputs_size() > 0 && static_cast<size_t>(request.outputs_size()) > limits.max_tensors)
    return bad_request("the request asks for " + std::to_string(request.outputs_size())
                       + " outputs, more than the limit of " + std::to_string(limits.max_tensors));
  size_t n_raw = static_cast<size_t>(request.raw_input_contents_size());
  if (n_raw > 0 && n_raw != n_inputs)
    return bad_request("the request has " + std::to_string(n_inputs) + " inputs but "
                       + std::to_string(n_raw)
                       + " raw_input_contents; send one raw entry per input, in the order of "
                         "the inputs, or none and typed contents instead");
  out.inputs.reserve(n_inputs);
  for (size_t i = 0; i < n_inputs; ++i) {
    const auto& t = request.inputs(static_cast<int>(i));
    std::string what = "input '" + t.name() + "'";
    infer_input in;
    in.name = t.name();
    auto dtype = datatype_from_kserve(t.datatype());
    if (!dtype)
      return bad_request(what + " has datatype '" + t.datatype()
                         + "', which is not a KServe datatype (BOOL, UINT8..UINT64, "
                           "INT8..INT64, FP16, BF16, FP32, FP64, BYTES)");
    in.dtype = *dtype;
    if (static_cast<size_t>(t.shape_size()) > limits.max_rank)
      return bad_request(what + " has " + std::to_string(t.shape_size())
                         + " dimensions, more than the limit of "
                         + std::to_string(limits.max_rank));
    in.shape.assign(t.shape().begin(), t.shape().end());
    auto shm = shared_memory_of(t.parameters(), what);
    if (!shm)
      return shm.error();
    in.shared_memory = *shm;
    auto counts = count_contents(t.contents());
    bool has_raw = n_raw > 0 && !request.raw_input_contents(static_cast<int>(i)).empty();
    if (counts.total_fields > 0 && n_raw > 0)
      return bad_request(what + " has both typed contents (" + counts.first_field
                         + ") and raw_input_contents; send one of them");
    if (in.shared_memory && (counts.total_fields > 0 || has_raw))
      return bad_request(what + " names shared memory region '" + in.shared_memory->region
                         + "' and also carries data; send one of them");
    if (in.shared_memory) {
      // bind_shared_memory points `data` into the region.
    } else if (n_raw > 0) {
      const auto& raw = request.raw_input_contents(static_cast<int>(i));
      in.data = std::string_view(raw.data(), raw.size());
    } else if (counts.total_fields > 0) {
      const char* field = contents_field(in.dtype);
      if (field == nullptr)
        return bad_request(what + " has datatype " + t.datatype()
                           + ", which has no typed contents in KServe's gRPC protocol; send "
                             "it in raw_input_contents");
      if (counts.total_fields > 1 || counts.first_field != field)
        return bad_request(what + " has datatype " + t.datatype() + " but its data is in "
                           + counts.first_field + "; " + t.datatype() + " data goes in "
                           + field);
      auto elements = checked_element_count(in.shape, limits.max_elements, what);
      if (!elements)
        return elements.error();
      if (counts.values != *elements)
        return bad_request(what + " has " + std::to_string(counts.values) + " values in "
                           + field + " but shape " + format_shape(in.shape) + " holds "
                           + std::to_string(*elements));
      in.owned = raw_of(t.contents(), in.dtype);
      in.data = in.owned;
    } else {
      auto elements = checked_element_count(in.shape, limits.max_elements, what);
      if (!elements)
        return elements.error();
      if (*elements != 0)
        return bad_request(what + " has no data: give it typed contents, a raw_input_contents "
                                  "entry, or a shared memory region");
    }
    out.inputs.push_back(std::move(in));
  }
  for (const auto& o : request.outputs()) {
    std::string what = "output '" + o.name() + "'";
    requested_output r;
    r.name = o.name();
    r.binary = true;
    if (auto c = o.parameters().find("classification"); c != o.parameters().end()) {
      auto k = unsigned_param(c->second, "classification");
      if (!k)
        return bad_request(what + ": " + k.error().message);
      if (*k > std::numeric_limits<uint32_t>::max())
        return bad_request(what + ": classification " + std::to_string(*k) + " is too large");
      r.classification = static_cast<uint32_t>(*k);
    }
    auto shm = shared_memory_of(o.parameters(), what);
    if (!shm)
      return shm.error();
    r.shared_memory = *shm;
    out.outputs.push_back(std::move(r));
  }
  return out;
}

inference::ModelInferResponse to_infer_response(const response_view& view,
                                                const std::vector<requested_output>& requested) {
  inference::ModelInferResponse out;
  out.set_model_name(std::string(view.model_name));
  out.set_model_version(std::string(view.model_version));
  out.set_id(std::string(view.id));
  for (const auto& [key, value] : view.parameters)
    (*out.mutable_parameters())[key].set_uint64_param(value);
  for (const auto& o : view.outputs) {
    auto* t = out.add_outputs();
    t->set_name(std::string(o.name));
    t->set_datatype(std::string(to_string(o.dtype)));
    for (auto d : o.shape)
      t->add_shape(d);
    bool in_shared_memory = false;
    for (const auto& r : requested)
      if (r.name == o.name && r.shared_memory) {
        in_shared_memory = true;
        auto& params = *t->mutable_parameters();
        params["shared_memory_region"].set_string_param(r.shared_memory->region);
        params["shared_memory_byte_size"].set_int64_param(
          static_cast<int64_t>(r.shared_memory->byte_size));
        if (r.shared_memory->offset != 0)
          params["shared_memory_offset"].set_int64_param(
            static_cast<int64_t>(r.shared_memory->offset));
      }
    if (in_shared_memory)
      out.add_raw_output_contents();
    else
      out.add_raw_output_contents(o.data.data(), o.data.size());
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static constexpr char alphabet[]
    = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8)
                 | uint32_t(uint8_t(bytes[i + 2]));
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    out += alphabet[(v >> 6) & 63];
    out += alphabet[v & 63];
  }
  if (size_t rest = bytes.size() - i; rest > 0) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2)
      v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    out += rest == 2 ? alphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

} // namespace caf_serving::ingress::grpc_api
