#include "ingress/validate.hpp"

#include "core/limits.hpp"

#include <cstring>
#include <limits>

namespace caf_serving::ingress {

namespace {

std::string single_quoted(std::string_view s) {
  return "'" + std::string{s} + "'";
}

} // namespace

std::string tensor_label::text() const {
  return kind_ ? kind_ + (" " + single_quoted(name_)) : std::string{name_};
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

result<uint64_t> checked_element_count(const std::vector<int64_t>& shape, uint64_t max_elements,
                                       const tensor_label& what) {
  uint64_t count = 1;
  bool overflow = false;
  for (auto dim : shape) {
    if (dim < 0)
      return bad_request(what.text() + " has shape " + format_shape(shape)
                         + " with a negative dimension; every dimension must be 0 or more");
    auto d = static_cast<uint64_t>(dim);
    if (d != 0 && count > std::numeric_limits<uint64_t>::max() / d)
      overflow = true; // keep looking: a later 0 makes the product 0
    else
      count *= d;
  }
  if (count == 0)
    return uint64_t{0};
  if (overflow || count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return bad_request("invalid shape for " + what.text() + ": shape "
                       + format_shape(shape)
                       + " causes total element count to exceed maximum size of "
                       + std::to_string(std::numeric_limits<int64_t>::max())
                       + (max_elements < std::numeric_limits<uint64_t>::max()
                            ? "; this server takes at most " + std::to_string(max_elements)
                                + " elements per tensor"
                            : std::string()));
  if (count > max_elements)
    return bad_request(what.text() + " has shape " + format_shape(shape)
                       + ", more than the limit of " + std::to_string(max_elements)
                       + " elements per tensor");
  return count;
}

std::string byte_size_overflow(const tensor_label& what, uint64_t count, uint64_t element_bytes) {
  return "byte size overflow for " + what.text() + ": element count ("
         + std::to_string(count) + ") * data type size (" + std::to_string(element_bytes)
         + ") exceeds maximum allowed size ("
         + std::to_string(std::numeric_limits<int64_t>::max()) + ")";
}

result<uint64_t> count_bytes_elements(std::string_view data, const tensor_label& what) {
  uint64_t count = 0;
  size_t pos = 0;
  while (pos < data.size()) {
    if (data.size() - pos < 4)
      return bad_request(what.text() + " has BYTES data ending in a partial "
                         "4-byte length at byte " + std::to_string(pos)
                         + "; each element is a 4-byte little-endian length followed by "
                           "that many bytes");
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);
    pos += 4;
    if (len > data.size() - pos)
      return bad_request(what.text() + " has BYTES element " + std::to_string(count)
                         + " of length " + std::to_string(len) + " but only "
                         + std::to_string(data.size() - pos) + " bytes of data remain");
    pos += len;
    ++count;
  }
  return count;
}

namespace {

template <class Tensors>
std::string name_list(const Tensors& tensors) {
  std::string s;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i > 0)
      s += ", ";
    s += single_quoted(tensors[i].name);
  }
  return s.empty() ? "(none)" : s;
}

const tensor_config* find_tensor(const std::vector<tensor_config>& tensors, std::string_view name) {
  for (const auto& t : tensors)
    if (t.name == name)
      return &t;
  return nullptr;
}

bool is_numeric(datatype t) {
  return t != datatype::bytes && t != datatype::bool_;
}

} // namespace

result<validated_request> validate(const infer_request& request, const model_config& model,
                                   const request_limits& limits) {
  const bool batched = model.max_batch_size > 0;
  validated_request out;
  std::optional<int64_t> batch;
  const infer_input* batch_source = nullptr;

  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const infer_input& input = request.inputs[i];
    const tensor_label what{"input", input.name};
    for (size_t j = 0; j < i; ++j)
      if (request.inputs[j].name == input.name)
        return bad_request(what.text() + " already exists in request: it appears more than once; "
                                  "send each input once");
    const tensor_config* cfg = find_tensor(model.inputs, input.name);
    if (!cfg)
      return bad_request("unexpected inference " + what.text() + " for model "
                         + single_quoted(model.name) + "; the model's inputs are "
                         + name_list(model.inputs));
    if (input.dtype != cfg->dtype)
      return bad_request("inference " + what.text() + " data-type is '"
                         + std::string{to_string(input.dtype)} + "', but model "
                         + single_quoted(model.name) + " expects '"
                         + std::string{to_string(cfg->dtype)} + "'; send it as "
                         + std::string{to_string(cfg->dtype)});

    // The model's dims, after the batch dimension (any size) when it batches.
    const size_t first_dim = batched ? 1 : 0;
    bool shape_ok = input.shape.size() == first_dim + cfg->dims.size();
    for (size_t d = 0; shape_ok && d < cfg->dims.size(); ++d)
      shape_ok = cfg->dims[d] < 0 || cfg->dims[d] == input.shape[first_dim + d];
    if (!shape_ok) {
      std::vector<int64_t> expected;
      if (batched)
        expected.push_back(-1);
      expected.insert(expected.end(), cfg->dims.begin(), cfg->dims.end());
      return bad_request("unexpected shape for " + what.text() + " for model "
                         + single_quoted(model.name) + ". Expected " + format_shape(expected)
                         + ", got " + format_shape(input.shape) + ". "
                         + (batched ? "The model batches (max_batch_size "
                                        + std::to_string(model.max_batch_size)
                                        + "), so the first dimension is the batch size "
                                          "and -1 marks any size."
                                    : "-1 marks a dimension of any size."));
    }

    auto count = checked_element_count(input.shape, limits.max_elements, what);
    if (!count)
      return count.error();

    if (batched) {
      int64_t b = input.shape[0];
      if (b < 1)
        return bad_request(what.text() + " has batch size " + std::to_string(b)
                           + " (shape " + format_shape(input.shape)
                           + "); the first dimension is the batch size and must be at least 1");
      if (b > model.max_batch_size)
        return bad_request("inference request batch-size must be <= "
                           + std::to_string(model.max_batch_size) + " for "
                           + single_quoted(model.name) + ": " + what.text() + " has batch size "
                           + std::to_string(b) + " (shape " + format_shape(input.shape)
                           + "); split the request");
      if (batch && *batch != b)
        return bad_request(what.text() + " batch size does not match other inputs for "
                           + single_quoted(model.name) + ": input "
                           + single_quoted(batch_source->name) + " has "
                           + std::to_string(*batch) + " but " + what.text() + " has "
                           + std::to_string(b) + "; the first dimension of every input is the "
                             "batch size");
      if (!batch) {
        batch = b;
        batch_source = &input;
      }
    } else {
      for (auto d : input.shape)
        if (d < 0)
          return bad_request(what.text() + " has shape " + format_shape(input.shape)
                             + " with a negative dimension");
    }

    if (input.data.size() > max_data_field_bytes)
      return serving_error{status_code::payload_too_large,
                           what.text() + " holds " + std::to_string(input.data.size())
                             + " bytes; one tensor may hold at most "
                             + std::to_string(max_data_field_bytes)
                             + " bytes (512 MiB - 1); split it into smaller requests"};
    if (input.dtype == datatype::bytes) {
      auto n = count_bytes_elements(input.data, what);
      if (!n)
        return n.error();
      if (*n != *count)
        return bad_request("expected " + std::to_string(*count)
                           + " string elements for inference " + what.text() + " for model "
                           + single_quoted(model.name) + ", got " + std::to_string(*n)
                           + ": shape " + format_shape(input.shape) + " needs "
                           + std::to_string(*count) + " BYTES elements");
    } else {
      uint64_t esize = element_size(input.dtype);
      if (*count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / esize)
        return bad_request(byte_size_overflow(what, *count, esize));
      uint64_t need = *count * esize;
      if (input.data.size() != need)
        return bad_request("input byte size mismatch for " + what.text() + " for model "
                           + single_quoted(model.name) + ". Expected " + std::to_string(need)
                           + ", got " + std::to_string(input.data.size()) + ": shape "
                           + format_shape(input.shape) + " of "
                           + std::string{to_string(input.dtype)} + " needs "
                           + std::to_string(need) + " bytes");
    }
  }

  std::string missing;
  for (const auto& cfg : model.inputs) {
    bool present = false;
    for (const auto& input : request.inputs)
      present = present || input.name == cfg.name;
    // Triton's `optional`: the config allows leaving the input out, but both of
    // the engine's backends need every input (an ONNX graph input has no
    // default here), so the request is refused with the reason.
    if (!present && cfg.optional)
      return bad_request("missing input " + single_quoted(cfg.name) + " for model "
                         + single_quoted(model.name)
                         + ": the model config marks it optional, but this engine runs the "
                           "model only with every input (its graph takes this one); send it");
    if (!present)
      missing += (missing.empty() ? "" : ",") + single_quoted(cfg.name);
  }
  if (!missing.empty()) {
    std::string got;
    for (const auto& input : request.inputs)
      got += (got.empty() ? "" : ",") + single_quoted(input.name);
    return bad_request("expected " + std::to_string(model.inputs.size()) + " inputs but got "
                       + std::to_string(request.inputs.size()) + " inputs for model "
                       + single_quoted(model.name) + ". Got input(s) [" + got
                       + "], but missing required input(s) [" + missing
                       + "]. Please provide all required input(s).");
  }

  for (size_t i = 0; i < request.outputs.size(); ++i) {
    const requested_output& output = request.outputs[i];
    for (size_t j = 0; j < i; ++j)
      if (request.outputs[j].name == output.name)
        return bad_request("output " + single_quoted(output.name)
                           + " already exists in request: it is listed more than once in "
                             "\"outputs\"; list each output once");
    const tensor_config* cfg = find_tensor(model.outputs, output.name);
    if (!cfg)
      return bad_request("unexpected inference output " + single_quoted(output.name)
                         + " for model " + single_quoted(model.name)
                         + "; the model's outputs are " + name_list(model.outputs));
    if (output.classification > 0 && !is_numeric(cfg->dtype))
      return bad_request("requested output " + single_quoted(output.name)
                         + " asks for classification, but its datatype "
                         + std::string{to_string(cfg->dtype)}
                         + " is not numeric; classify only numeric outputs");
  }

  if (model.dynamic_batching.priority_levels > 0
      && request.priority > model.dynamic_batching.priority_levels)
    return bad_request("priority " + std::to_string(request.priority) + " is not a level of model "
                       + single_quoted(model.name) + ", which has levels 1 to "
                       + std::to_string(model.dynamic_batching.priority_levels)
                       + " (0 for the default)");

  if (batch)
    out.batch_size = static_cast<uint32_t>(*batch);
  return out;
}

} // namespace caf_serving::ingress
