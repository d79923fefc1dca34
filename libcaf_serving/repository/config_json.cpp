#include "repository/config_json.hpp"

#include "repository/model_config.pb.h"

#include "core/json.hpp"

#include <google/protobuf/util/json_util.h>
#include <simdjson.h>

#include <cstdio>
#include <string_view>

namespace caf_serving::repository {

namespace {

namespace pb = google::protobuf;

// -- Triton's numbers ----------------------------------------------------------

/// The 64-bit fields that Triton prints as JSON numbers although protobuf's
/// JSON printer quotes them (Triton's core fixes them up after printing, in
/// model_config_utils.cc): dims, reshape shapes, specific versions and the
/// batchers' microseconds and priority levels. Clients read them as numbers
/// (tritonclient's image_client takes dims from the config).
bool triton_prints_as_number(std::string_view key) {
  return key == "dims" || key == "shape" || key == "versions"
         || key == "max_queue_delay_microseconds" || key == "priority_levels"
         || key == "default_priority_level" || key == "default_timeout_microseconds"
         || key == "max_sequence_idle_microseconds";
}

bool is_integer_text(std::string_view s) {
  size_t i = !s.empty() && s[0] == '-' ? 1 : 0;
  if (i == s.size() || s.size() - i > 20)
    return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9')
      return false;
  return true;
}

/// Writes `e` as compact JSON; below a key that Triton prints as a number, a
/// quoted integer is written as the number.
void write_fixed(simdjson::dom::element e, bool as_number, std::string& out) {
  switch (e.type()) {
    case simdjson::dom::element_type::ARRAY: {
      // Named: value_unsafe() refers into its temporary result, which a
      // range-for would outlive.
      simdjson::dom::array array = e.get_array().value_unsafe();
      out += '[';
      bool first = true;
      for (auto v : array) {
        if (!first)
          out += ',';
        first = false;
        write_fixed(v, as_number, out);
      }
      out += ']';
      break;
    }
    case simdjson::dom::element_type::OBJECT: {
      simdjson::dom::object object = e.get_object().value_unsafe();
      out += '{';
      bool first = true;
      for (auto field : object) {
        if (!first)
          out += ',';
        first = false;
        append_json_string(out, field.key);
        out += ':';
        write_fixed(field.value, triton_prints_as_number(field.key), out);
      }
      out += '}';
      break;
    }
    case simdjson::dom::element_type::STRING: {
      std::string_view s = e.get_string().value_unsafe();
      if (as_number && is_integer_text(s))
        out += s;
      else
        append_json_string(out, s);
      break;
    }
    default:
      out += simdjson::minify(e);
  }
}

/// protobuf's JSON of a config, with Triton's numbers (above); unchanged if it
/// does not parse (it always does: it is the printer's own output).
std::string with_triton_numbers(const std::string& json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(json).get(root) != simdjson::SUCCESS)
    return json;
  std::string out;
  out.reserve(json.size());
  write_fixed(root, false, out);
  return out;
}

config::DataType to_proto(datatype t) {
  config::DataType out = config::TYPE_INVALID;
  // The proto's enum names are Triton's config names, which datatype.hpp
  // already knows; going through the name keeps one table.
  config::DataType_Parse(std::string{to_config_string(t)}, &out);
  return out;
}

void to_proto(const queue_policy& in, config::ModelQueuePolicy& out) {
  out.set_timeout_action(in.action == timeout_action::delay
                           ? config::ModelQueuePolicy::DELAY
                           : config::ModelQueuePolicy::REJECT);
  out.set_default_timeout_microseconds(in.default_timeout_us);
  out.set_allow_timeout_override(in.allow_timeout_override);
  out.set_max_queue_size(in.max_queue_size);
}

config::ModelInstanceGroup::Kind to_proto(instance_kind k) {
  switch (k) {
    case instance_kind::cpu:
      return config::ModelInstanceGroup::KIND_CPU;
    case instance_kind::gpu:
      return config::ModelInstanceGroup::KIND_GPU;
    case instance_kind::model:
      return config::ModelInstanceGroup::KIND_MODEL;
    default:
      return config::ModelInstanceGroup::KIND_AUTO;
  }
}

config::ModelInput::Format to_proto(tensor_format f) {
  switch (f) {
    case tensor_format::nhwc:
      return config::ModelInput::FORMAT_NHWC;
    case tensor_format::nchw:
      return config::ModelInput::FORMAT_NCHW;
    default:
      return config::ModelInput::FORMAT_NONE;
  }
}

template <class Tensor>
void set_shape(const tensor_config& t, Tensor& out) {
  out.set_name(t.name);
  out.set_data_type(to_proto(t.dtype));
  for (auto d : t.dims)
    out.add_dims(d);
  if (t.reshape) {
    auto* r = out.mutable_reshape(); // present even when empty (a scalar per row)
    for (auto d : *t.reshape)
      r->add_shape(d);
  }
}

config::ModelConfig to_proto(const parsed_model_config& parsed) {
  const auto& in = parsed.config;
  // Starts from the config as written, so that the fields the engine accepts
  // and ignores show as Triton shows them; every field the engine carries
  // out is then written from `in`, which holds what the loader completed.
  config::ModelConfig out;
  if (!parsed.original.empty())
    out.ParseFromString(parsed.original);
  auto written_groups = out.instance_group();
  out.clear_input();
  out.clear_output();
  out.clear_instance_group();
  out.clear_dynamic_batching();
  out.clear_parameters();
  out.clear_model_warmup();
  out.set_name(in.name);
  out.set_platform(in.platform);
  out.set_backend(in.backend);
  auto* vp = out.mutable_version_policy();
  switch (parsed.versions.kind) {
    case version_policy_kind::all:
      vp->mutable_all();
      break;
    case version_policy_kind::specific:
      for (auto v : parsed.versions.versions)
        vp->mutable_specific()->add_versions(v);
      vp->mutable_specific(); // present even when empty
      break;
    default:
      vp->mutable_latest()->set_num_versions(parsed.versions.num_versions);
      break;
  }
  out.set_max_batch_size(in.max_batch_size);
  for (const auto& t : in.inputs) {
    auto* i = out.add_input();
    set_shape(t, *i);
    i->set_format(to_proto(t.format));
    i->set_optional(t.optional);
  }
  for (const auto& t : in.outputs) {
    auto* o = out.add_output();
    set_shape(t, *o);
    if (auto it = parsed.label_filenames.find(t.name);
        it != parsed.label_filenames.end())
      o->set_label_filename(it->second);
  }
  if (in.dynamic_batching_enabled) {
    const auto& db = in.dynamic_batching;
    auto* d = out.mutable_dynamic_batching();
    for (auto size : db.preferred_batch_sizes)
      d->add_preferred_batch_size(size);
    d->set_max_queue_delay_microseconds(db.max_queue_delay_us);
    d->set_preserve_ordering(db.preserve_ordering);
    d->set_priority_levels(db.priority_levels);
    d->set_default_priority_level(db.default_priority_level);
    to_proto(db.default_queue_policy, *d->mutable_default_queue_policy());
    for (const auto& [level, policy] : db.priority_queue_policy)
      to_proto(policy, (*d->mutable_priority_queue_policy())[level]);
  }
  for (size_t i = 0; i < in.instance_groups.size(); ++i) {
    const auto& g = in.instance_groups[i];
    auto* o = out.add_instance_group();
    // The ignored fields of the group as written (rate_limiter, ...).
    if (i < static_cast<size_t>(written_groups.size()))
      *o = written_groups[static_cast<int>(i)];
    o->clear_gpus();
    o->set_name(g.name);
    o->set_kind(to_proto(g.kind));
    o->set_count(g.count);
    for (auto gpu : g.gpus)
      o->add_gpus(gpu);
  }
  for (const auto& [key, value] : in.parameters)
    (*out.mutable_parameters())[key].set_string_value(value);
  for (const auto& w : in.warmup) {
    auto* o = out.add_model_warmup();
    o->set_name(w.name);
    o->set_batch_size(w.batch_size);
    o->set_count(w.count);
    for (const auto& wi : w.inputs) {
      auto& i = (*o->mutable_inputs())[wi.name];
      i.set_data_type(to_proto(wi.dtype));
      for (auto d : wi.dims)
        i.add_dims(d);
      switch (wi.data) {
        case warmup_data::random:
          i.set_random_data(true);
          break;
        case warmup_data::file:
          i.set_input_data_file(wi.file);
          break;
        default:
          i.set_zero_data(true);
          break;
      }
    }
  }
  out.set_default_model_filename(in.default_model_filename);
  if (in.response_cache_enabled)
    out.mutable_response_cache()->set_enable(true);
  if (in.decoupled)
    out.mutable_model_transaction_policy()->set_decoupled(true);
  return out;
}

} // namespace


std::string model_config_json(const parsed_model_config& parsed) {
  // Triton prints its config with exactly these options, which is where the
  // always-present default fields come from; then it writes its int64 fields
  // back as numbers (with_triton_numbers).
  pb::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = pb::util::MessageToJsonString(to_proto(parsed), &out, options);
  // The printer writes the bytes of a string field as they are, so a name that
  // is not UTF-8 (a "\xff" escape in config.pbtxt, a tensor name from an ONNX
  // file) would make the body invalid JSON.
  out = repair_utf8(out);
  if (status.ok())
    out = with_triton_numbers(out);
  if (!status.ok()) {
    // Only invalid UTF-8 in a name or parameter gets here; say so in JSON
    // rather than sending a half-written body.
    out = "{\"error\":";
    append_json_string(out, "cannot print the configuration of model '"
                              + parsed.config.name
                              + "' as JSON: " + status.ToString());
    out += "}";
  }
  return out;
}

std::string model_config_json(const model_config& config) {
  parsed_model_config parsed;
  parsed.config = config;
  if (!config.specific_versions.empty()) {
    parsed.versions.kind = version_policy_kind::specific;
    parsed.versions.versions = config.specific_versions;
  }
  return model_config_json(parsed);
}

namespace {

void append_tensors(std::string& out, const std::vector<tensor_config>& tensors,
                    bool batched) {
  out += '[';
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (i > 0)
      out += ',';
    out += "{\"name\":";
    append_json_string(out, t.name);
    out += ",\"datatype\":";
    append_json_string(out, to_string(t.dtype));
    out += ",\"shape\":[";
    bool first = true;
    if (batched) {
      out += "-1";
      first = false;
    }
    for (auto d : t.dims) {
      if (!first)
        out += ',';
      first = false;
      out += std::to_string(d);
    }
    out += "]}";
  }
  out += ']';
}

} // namespace

std::string model_metadata_json(const model_config& config,
                                const std::vector<int64_t>& versions) {
  std::string out = "{\"name\":";
  append_json_string(out, config.name);
  out += ",\"versions\":[";
  for (size_t i = 0; i < versions.size(); ++i) {
    if (i > 0)
      out += ',';
    // KServe's metadata lists versions as strings.
    append_json_string(out, std::to_string(versions[i]));
  }
  out += "],\"platform\":";
  append_json_string(out,
                     config.platform.empty() ? config.backend : config.platform);
  bool batched = config.max_batch_size > 0;
  out += ",\"inputs\":";
  append_tensors(out, config.inputs, batched);
  out += ",\"outputs\":";
  append_tensors(out, config.outputs, batched);
  out += '}';
  return out;
}

} // namespace caf_serving::repository
