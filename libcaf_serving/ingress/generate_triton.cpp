// Triton's generate extension requests (generate_codec.hpp), mapped as
// Triton's http_server.cc maps them: each key of the body, and each key of its
// "parameters" object, is an input when the model declares one of that name
// and a request parameter otherwise.

#include "ingress/generate_codec.hpp"
#include "ingress/generate_fields.hpp"

#include <limits>

namespace caf_serving::ingress {

using namespace generate_detail;

generate_model_info generate_model_info_of(const model_config& model) {
  generate_model_info info;
  info.name = model.name;
  for (const auto& in : model.inputs) {
    generate_input_info i;
    i.name = in.name;
    i.dtype = in.dtype;
    // The metadata (and so Triton's generate endpoint) shows the batch
    // dimension as a leading -1.
    if (model.max_batch_size > 0)
      i.dims.push_back(-1);
    i.dims.insert(i.dims.end(), in.dims.begin(), in.dims.end());
    i.optional = in.optional;
    info.inputs.push_back(std::move(i));
  }
  return info;
}

namespace {

/// Triton's words for a JSON value of the wrong type (TritonJson's), after
/// ReadDataFromJson's "Unable to parse 'data'".
[[noreturn]] void wrong_element(std::string_view tritonjson_message) {
  fail("Unable to parse 'data': " + std::string{tritonjson_message});
}

/// The input names as Triton lists them: ['a','b'].
template <class Names>
std::string name_list(const Names& names) {
  std::string s = "[";
  bool first = true;
  for (const auto& n : names) {
    if (!first)
      s += ',';
    first = false;
    s += in_quotes(n);
  }
  return s + "]";
}

class triton_walk {
public:
  triton_walk(const generate_model_info& model, const generate_codec_limits& limits,
              generate_request& req)
    : model_(model), limits_(limits), req_(req) {}

  void top(dom::object obj) {
    // Triton reads "id" first (ParseJsonTritonRequestID), the first one if
    // repeated.
    dom::element id;
    if (obj["id"].get(id) == simdjson::SUCCESS) {
      std::string_view s;
      if (id.get_string().get(s) != simdjson::SUCCESS)
        fail("Unable to parse 'id': attempt to access JSON non-string as string");
      req_.request_id = std::string{s};
    }
    for (auto field : obj) {
      if (field.key == "id" && !find_input(field.key))
        continue;
      if (field.key == "parameters") {
        if (find_input(field.key))
          fail("Keyword 'parameters' for nested schema also given as input tensor name");
        dom::object nested;
        if (field.value.get_object().get(nested) != simdjson::SUCCESS)
          fail("Expected JSON object for keyword: 'parameters': attempt to access JSON "
               "non-object as object");
        try {
          for (auto inner : nested)
            member(inner.key, inner.value);
        } catch (field_failure& f) {
          f.error.message = "Converting keyword: 'parameters': " + f.error.message;
          throw;
        }
        continue;
      }
      member(field.key, field.value);
    }
  }

  void finish() {
    std::vector<std::string_view> missing;
    size_t required = 0;
    for (const auto& in : model_.inputs) {
      if (in.optional)
        continue;
      ++required;
      if (!present(in.name))
        missing.push_back(in.name);
    }
    if (!missing.empty()) {
      std::string expected = required == model_.inputs.size()
                               ? "expected " + std::to_string(required) + " inputs"
                               : "expected number of inputs between " + std::to_string(required)
                                   + " and " + std::to_string(model_.inputs.size());
      fail(expected + " but got " + std::to_string(present_.size()) + " inputs for model "
           + in_quotes(model_.name) + ". Got input(s) " + name_list(present_)
           + ", but missing required input(s) " + name_list(missing)
           + ". Please provide all required input(s).");
    }
    if (!has_prompt_)
      fail("the request has no prompt: send the text to continue as " + in_quotes(model_.prompt_input)
           + " (a string)");
    if (exclude_input_in_output_) {
      req_.echo = !*exclude_input_in_output_;
      if (req_.echo && req_.stream)
        fail("When streaming, `exclude_input_in_output` = False is not allowed.");
    } else {
      // vLLM's backend: the prompt leads the text unless streaming.
      req_.echo = !req_.stream;
    }
    check_across_fields(req_, "");
  }

private:
  const generate_input_info* find_input(std::string_view name) const {
    for (const auto& in : model_.inputs)
      if (in.name == name)
        return &in;
    return nullptr;
  }

  bool present(std::string_view name) const {
    for (auto p : present_)
      if (p == name)
        return true;
    return false;
  }

  void member(std::string_view key, dom::element v) {
    if (const generate_input_info* in = find_input(key))
      input(*in, v);
    else
      parameter(key, v);
  }

  // -- inputs -----------------------------------------------------------------

  /// Checks one element against the input's datatype, as Triton's
  /// ReadDataFromJson does, and returns its byte size.
  size_t check_element(const generate_input_info& in, dom::element e) {
    auto integer_in = [&](auto lo, auto hi) {
      int64_t x = 0;
      uint64_t u = 0;
      bool is_unsigned = lo == 0;
      if (is_unsigned ? e.get_uint64().get(u) != simdjson::SUCCESS
                      : e.get_int64().get(x) != simdjson::SUCCESS)
        wrong_element(is_unsigned
                        ? "attempt to access JSON non-unsigned-integer as unsigned-integer"
                        : "attempt to access JSON non-signed-integer as signed-integer");
      // Triton truncates silently here; a value the type cannot hold is refused.
      bool in_range = is_unsigned ? u <= static_cast<uint64_t>(hi)
                                  : x >= static_cast<int64_t>(lo) && x <= static_cast<int64_t>(hi);
      if (!in_range)
        fail("input " + in_quotes(in.name) + " holds " + shown(e) + ", which " +
             std::string{to_string(in.dtype)} + " cannot hold");
    };
    switch (in.dtype) {
      case datatype::bool_:
        if (!e.is_bool())
          wrong_element("attempt to access JSON non-boolean as boolean");
        return 1;
      case datatype::uint8: integer_in(0, std::numeric_limits<uint8_t>::max()); return 1;
      case datatype::uint16: integer_in(0, std::numeric_limits<uint16_t>::max()); return 2;
      case datatype::uint32: integer_in(0, std::numeric_limits<uint32_t>::max()); return 4;
      case datatype::uint64: integer_in(0, std::numeric_limits<uint64_t>::max()); return 8;
      case datatype::int8:
        integer_in(std::numeric_limits<int8_t>::min(), std::numeric_limits<int8_t>::max());
        return 1;
      case datatype::int16:
        integer_in(std::numeric_limits<int16_t>::min(), std::numeric_limits<int16_t>::max());
        return 2;
      case datatype::int32:
        integer_in(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
        return 4;
      case datatype::int64:
        integer_in(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
        return 8;
      case datatype::fp32:
      case datatype::fp64:
        if (!e.is_number())
          wrong_element("attempt to access JSON non-number as double");
        return in.dtype == datatype::fp32 ? 4 : 8;
      case datatype::fp16:
      case datatype::bf16:
        fail("receiving " + std::string{to_string(in.dtype)}
             + " data via JSON is not supported. Please use the binary data format for input "
             + in.name);
      case datatype::bytes: {
        std::string_view s;
        if (e.get_string().get(s) != simdjson::SUCCESS)
          wrong_element("attempt to access JSON non-string as string");
        return s.size() + sizeof(uint32_t);
      }
    }
    return 0;
  }

  /// Triton's shape check: fixed dims must divide the element count, the
  /// innermost variable dim takes what is left.
  void check_shape(const generate_input_info& in, uint64_t count) {
    if (in.dims.empty() || count == 0)
      return;
    for (auto it = in.dims.rbegin(); it != in.dims.rend(); ++it) {
      if (*it == -1)
        continue;
      if (*it <= 0 || count % static_cast<uint64_t>(*it) != 0)
        fail("The schema can not convert input " + in_quotes(in.name)
             + " to tensor with proper shape");
      count /= static_cast<uint64_t>(*it);
    }
    bool has_variable = false;
    for (auto d : in.dims)
      has_variable = has_variable || d == -1;
    if (!has_variable && count != 1)
      fail("The schema can not convert input " + in_quotes(in.name)
           + " to tensor with proper shape");
  }

  void input(const generate_input_info& in, dom::element v) {
    if (present(in.name))
      fail("input " + in_quotes(in.name) + " already exists in request");
    present_.push_back(in.name);
    dom::array arr;
    uint64_t count = 1;
    size_t bytes = 0;
    if (v.get_array().get(arr) == simdjson::SUCCESS) {
      count = arr.size();
      for (dom::element e : arr) {
        if (e.is_array())
          fail("input " + in_quotes(in.name)
               + " must be a value or a flat array of values; nested arrays are not taken");
        bytes += check_element(in, e);
      }
    } else {
      bytes = check_element(in, v);
    }
    if (bytes + consumed_bytes_ > limits_.max_triton_input_bytes)
      fail("request size of " + std::to_string(consumed_bytes_) + " bytes with input "
           + in_quotes(in.name) + " of size " + std::to_string(bytes)
           + " bytes exceeds the maximum allowed input size of "
           + std::to_string(limits_.max_triton_input_bytes)
           + ". Use --http-max-input-size to increase the limit.");
    consumed_bytes_ += bytes;
    check_shape(in, count);
    interpret(in, v, count);
  }

  /// The one element of an input that must hold one.
  dom::element single(const generate_input_info& in, dom::element v, uint64_t count,
                      std::string_view what) {
    if (count != 1)
      fail("input " + in_quotes(in.name) + " must hold one " + std::string{what} + ", got "
           + std::to_string(count) + " elements");
    dom::array arr;
    if (v.get_array().get(arr) == simdjson::SUCCESS)
      return arr.at(0).value_unsafe();
    return v;
  }

  bool bool_input(const generate_input_info& in, dom::element v, uint64_t count) {
    if (in.dtype != datatype::bool_)
      fail("input " + in_quotes(in.name) + " must be declared BOOL to be read as a flag, but the "
           "model declares it " + std::string{to_string(in.dtype)});
    return single(in, v, count, "boolean").get_bool().value_unsafe();
  }

  void interpret(const generate_input_info& in, dom::element v, uint64_t count) {
    const std::string& name = in.name;
    if (name == model_.prompt_input) {
      if (in.dtype != datatype::bytes)
        fail("the prompt input " + in_quotes(name) + " must be declared BYTES, but the model "
             "declares it " + std::string{to_string(in.dtype)});
      std::string_view text = single(in, v, count, "prompt string").get_string().value_unsafe();
      if (text.size() > limits_.max_prompt_bytes)
        fail("input " + in_quotes(name) + " has " + std::to_string(text.size())
             + " bytes of prompt; at most " + std::to_string(limits_.max_prompt_bytes)
             + " are allowed");
      req_.prompt = std::string{text};
      has_prompt_ = true;
    } else if (name == model_.stream_input) {
      req_.stream = bool_input(in, v, count);
    } else if (name == "exclude_input_in_output") {
      exclude_input_in_output_ = bool_input(in, v, count);
    } else if (name == "return_finish_reason") {
      req_.triton.return_finish_reason = bool_input(in, v, count);
    } else if (name == "return_cumulative_logprob") {
      req_.triton.return_cumulative_logprob = bool_input(in, v, count);
    } else if (name == "return_num_input_tokens") {
      req_.triton.return_num_input_tokens = bool_input(in, v, count);
    } else if (name == "return_num_output_tokens") {
      req_.triton.return_num_output_tokens = bool_input(in, v, count);
    } else if (name == "return_logprobs") {
      if (bool_input(in, v, count))
        fail("input 'return_logprobs' is not supported by this server yet; leave it out or "
             "set it false");
    } else if (name == "sampling_parameters") {
      if (in.dtype != datatype::bytes)
        fail("input 'sampling_parameters' must be declared BYTES (a JSON string)");
      sampling_parameters(single(in, v, count, "JSON string").get_string().value_unsafe());
    } else if (!interpret_sampling_input(in, v, count)) {
      req_.triton.inputs.push_back({name, simdjson::minify(v)});
    }
  }

  /// An input named as a sampling field (TensorRT-LLM's backend takes
  /// max_tokens, temperature, ... as inputs): its one element, or for stop
  /// and stop_token_ids all of them.
  bool interpret_sampling_input(const generate_input_info& in, dom::element v, uint64_t count) {
    std::string_view key = in.name;
    if (key == "random_seed")
      key = "seed";
    else if (key == "min_length")
      key = "min_tokens";
    field_reader reader{"", false};
    std::string where = "input " + in_quotes(in.name) + ": ";
    reader.where = where;
    if (key == "stop" || key == "stop_token_ids")
      return apply_shared_field(key, v, reader, limits_, req_);
    if (!is_shared_field(key))
      return false;
    apply_shared_field(key, single(in, v, count, "value"), reader, limits_, req_);
    return true;
  }

  /// vLLM's sampling_parameters input: a JSON object of SamplingParams
  /// fields, numbers possibly as strings.
  void sampling_parameters(std::string_view text) {
    thread_local dom::parser parser;
    dom::element doc = parse_document(parser, text, "input 'sampling_parameters'");
    dom::object obj;
    if (doc.get_object().get(obj) != simdjson::SUCCESS)
      fail("input 'sampling_parameters' must hold a JSON object of sampling fields, got "
           + shown(doc));
    const field_reader reader{"sampling_parameters: ", true};
    for (auto field : obj) {
      if (apply_shared_field(field.key, field.value, reader, limits_, req_))
        continue;
      if (field.key == "logprobs" || field.key == "prompt_logprobs"
          || field.key == "best_of" || field.key == "use_beam_search"
          || field.key == "lora_name" || field.key == "structured_outputs"
          || field.key == "guided_decoding" || field.key == "logits_processors") {
        if (field.value.is_null())
          continue;
        fail("sampling_parameters: " + in_quotes(field.key)
             + " is not supported by this server; leave it out");
      }
      fail("sampling_parameters: unknown field " + in_quotes(field.key)
           + "; the fields taken are temperature, top_p, top_k, min_p, repetition_penalty, "
             "presence_penalty, frequency_penalty, seed, max_tokens, min_tokens, ignore_eos, "
             "stop, stop_token_ids, skip_special_tokens, include_stop_str_in_output, n");
    }
  }

  // -- parameters -------------------------------------------------------------

  void parameter(std::string_view key, dom::element v) {
    // Triton's SetTritonParameterFromJsonParameter: strings, integers,
    // booleans and other numbers only.
    if (!(v.is_string() || v.is_number() || v.is_bool()))
      fail("parameter " + in_quotes(key)
           + " has invalid type. It should be either 'int', 'bool', or 'string'.");
    const field_reader reader{"parameter ", true};
    if (key == "stream") {
      req_.stream = reader.boolean(key, v);
      return;
    }
    if (apply_shared_field(key, v, reader, limits_, req_))
      return;
    req_.triton.parameters.push_back({std::string{key}, simdjson::minify(v)});
  }

  const generate_model_info& model_;
  const generate_codec_limits& limits_;
  generate_request& req_;
  std::vector<std::string_view> present_;
  size_t consumed_bytes_ = 0;
  bool has_prompt_ = false;
  std::optional<bool> exclude_input_in_output_;
};

} // namespace

result<generate_request> parse_triton_generate(std::string_view body,
                                               const generate_model_info& model,
                                               const generate_codec_limits& limits) {
  const generate_input_info* prompt = nullptr;
  for (const auto& in : model.inputs)
    if (in.name == model.prompt_input)
      prompt = &in;
  if (!prompt)
    return serving_error{status_code::internal,
                         "model " + in_quotes(model.name) + " declares no input "
                           + in_quotes(model.prompt_input)
                           + " for the prompt, so it cannot serve the generate endpoint"};
  thread_local dom::parser cached;
  dom::parser one_off;
  dom::parser& parser = body.size() <= (size_t{8} << 20) ? cached : one_off;
  try {
    generate_request req;
    req.api = generate_api::triton_generate;
    req.model = model.name;
    // Triton takes an empty body as an empty request (whose inputs are then
    // missing).
    std::string_view text = body.find_first_not_of(" \t\r\n") == std::string_view::npos
                              ? std::string_view{"{}"}
                              : body;
    dom::element doc = parse_document(parser, text, "the request body");
    dom::object top;
    if (doc.get_object().get(top) != simdjson::SUCCESS)
      fail("the request body must be a JSON object such as {\"" + model.prompt_input
           + "\": \"...\", \"parameters\": {...}}, not " + shown(doc));
    triton_walk walk{model, limits, req};
    walk.top(top);
    walk.finish();
    return req;
  } catch (const field_failure& f) {
    return f.error;
  }
}

} // namespace caf_serving::ingress
