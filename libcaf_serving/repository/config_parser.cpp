#include "repository/config_parser.hpp"

#include "repository/config_proto.hpp"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

namespace caf_serving::repository {

namespace {

namespace pb = google::protobuf;

// -- syntax errors -------------------------------------------------------------

/// The quoted substrings of a protobuf parser message, in order.
std::vector<std::string> quoted(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    auto open = text.find('"', pos);
    if (open == std::string::npos)
      break;
    auto close = text.find('"', open + 1);
    if (close == std::string::npos)
      break;
    out.push_back(text.substr(open + 1, close - open - 1));
    pos = close + 1;
  }
  return out;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0)
      out += sep;
    out += items[i];
  }
  return out;
}

/// The short type name a user recognises ("ModelInput"), or "parameters entry"
/// for the map entry types that protobuf synthesises.
std::string short_type_name(const pb::Descriptor& type) {
  if (type.options().map_entry())
    return "map entry";
  return type.name();
}

/// Rewrites protobuf's "Message type "x.y.ModelConfig" has no field named
/// "foo"" into a message that names the field, suggests the closest name, and
/// lists what is allowed there.
std::string explain_unknown_field(const std::string& full_type,
                                  const std::string& field) {
  const auto* pool = config::ModelConfig::descriptor()->file()->pool();
  const auto* type = pool->FindMessageTypeByName(full_type);
  if (type == nullptr)
    return "unknown field '" + field + "'";
  std::vector<std::string> names;
  std::string closest;
  size_t best = 3; // suggest only names at most two edits away
  for (int i = 0; i < type->field_count(); ++i) {
    const auto& name = type->field(i)->name();
    names.push_back(name);
    auto d = edit_distance(field, name);
    if (d < best) {
      best = d;
      closest = name;
    }
  }
  auto where = short_type_name(*type);
  // Every field of Triton's ModelConfig is declared, so an unknown one is a
  // misspelling (or a field newer than Triton 2.51).
  std::string out = "unknown field '" + field + "' in " + where;
  if (!closest.empty())
    out += "; did you mean '" + closest + "'?";
  out += " (supported fields of " + where + ": " + join(names, ", ") + ")";
  return out;
}

/// Rewrites "Unknown enumeration value of "TYPE_FP33" for field "data_type"."
/// into a message listing the allowed values.
std::string explain_unknown_enum(const std::string& value,
                                 const std::string& field) {
  const auto* pool = config::ModelConfig::descriptor()->file()->pool();
  std::vector<std::string> allowed;
  // Field names are unique enough in this schema to find the enum by field.
  for (const auto* type :
       {pool->FindMessageTypeByName("caf_serving.config.ModelInput"),
        pool->FindMessageTypeByName("caf_serving.config.ModelInstanceGroup"),
        pool->FindMessageTypeByName("caf_serving.config.ModelQueuePolicy")}) {
    const auto* f = type ? type->FindFieldByName(field) : nullptr;
    if (f != nullptr && f->enum_type() != nullptr) {
      for (int i = 0; i < f->enum_type()->value_count(); ++i) {
        const auto& name = f->enum_type()->value(i)->name();
        if (name != "TYPE_INVALID")
          allowed.push_back(name);
      }
      break;
    }
  }
  auto out = "unknown value '" + value + "' for field '" + field + "'";
  if (!allowed.empty())
    out += "; use one of: " + join(allowed, ", ");
  return out;
}

std::string explain_parser_message(const std::string& message) {
  auto q = quoted(message);
  if (message.find("has no field named") != std::string::npos && q.size() >= 2)
    return explain_unknown_field(q[0], q[1]);
  if (message.find("Unknown enumeration value") != std::string::npos
      && q.size() >= 2)
    return explain_unknown_enum(q[0], q[1]);
  return message;
}

/// Keeps the first error the text-format parser reports, with its position.
class first_error_collector : public pb::io::ErrorCollector {
public:
  void AddError(int line, pb::io::ColumnNumber column,
                const std::string& message) override {
    if (has_error_)
      return;
    has_error_ = true;
    // The parser counts from 0; editors count from 1.
    line_ = line + 1;
    column_ = column + 1;
    message_ = message;
  }

  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {
    // Warnings (deprecated fields) do not exist in this schema.
  }

  bool has_error() const { return has_error_; }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& message() const { return message_; }

private:
  bool has_error_ = false;
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

// -- semantic validation ---------------------------------------------------------

/// The "model 'x': path" prefix of every message.
std::string prefix(const std::string& model, const parse_context& ctx) {
  auto shown = model.empty() ? std::string{"<unnamed>"} : model;
  return "model '" + shown + "': " + ctx.config_path;
}

std::string dims_text(const pb::RepeatedField<int64_t>& dims) {
  std::string out = "[";
  for (int i = 0; i < dims.size(); ++i) {
    if (i > 0)
      out += ",";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

/// Collects every semantic problem of one config, so that a user fixes them in
/// one round instead of one per reload.
struct problems {
  std::vector<std::string> items;
  void add(std::string text) { items.push_back(std::move(text)); }
  bool empty() const { return items.empty(); }
};

/// The product of `dims` per run between -1 entries: [2,4,-1,6] gives
/// {8, 6}. Triton accepts a reshape whose runs match those of `dims`.
std::vector<int64_t> element_runs(const std::vector<int64_t>& dims) {
  std::vector<int64_t> runs{1};
  for (auto d : dims) {
    if (d == -1)
      runs.push_back(1);
    else if (d > 0 && runs.back() <= std::numeric_limits<int64_t>::max() / d)
      runs.back() *= d;
    else
      runs.back() = -1; // overflow: matches nothing
  }
  return runs;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    out += (i > 0 ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}

/// Triton's reshape rules: every entry >= 1 or -1; the same elements as
/// `dims` (run by run between -1 entries); an empty shape (a scalar per row)
/// only for a batching model, from dims [1].
std::vector<int64_t> convert_reshape(const config::ModelTensorReshape& in,
                                     const std::vector<int64_t>& dims, int max_batch_size,
                                     const std::string& label, problems& out) {
  std::vector<int64_t> shape(in.shape().begin(), in.shape().end());
  if (shape.empty() && max_batch_size == 0) {
    out.add(label + " cannot have empty reshape for non-batching model as scalar tensors are "
                    "not supported; give reshape: { shape: [ 1 ] } or set max_batch_size");
    return shape;
  }
  for (auto d : shape)
    if (d < 1 && d != -1) {
      out.add(label + " has reshape " + dims_text(shape)
              + "; reshape dimensions must be integer >= 1, or -1 to indicate a "
                "variable-size dimension");
      return shape;
    }
  bool scalar_from_one = shape.empty() && element_runs(dims) == std::vector<int64_t>{1};
  if (!scalar_from_one && element_runs(dims) != element_runs(shape))
    out.add(label + " has different size for dims and reshape: dims " + dims_text(dims)
            + " and reshape " + dims_text(shape)
            + " must hold the same number of elements (between -1 entries too); fix one "
              "of them");
  return shape;
}

/// The input-only fields of Triton's ModelInput.
void convert_input_fields(const config::ModelInput& in, tensor_config& tc, problems& out) {
  auto label = "input '" + in.name() + "'";
  switch (in.format()) {
    case config::ModelInput::FORMAT_NHWC:
      tc.format = tensor_format::nhwc;
      break;
    case config::ModelInput::FORMAT_NCHW:
      tc.format = tensor_format::nchw;
      break;
    default:
      tc.format = tensor_format::none;
      break;
  }
  if (tc.format != tensor_format::none && in.dims_size() != 3)
    out.add(label + " has format " + config::ModelInput::Format_Name(in.format())
            + " and dims " + dims_text(tc.dims)
            + ": model input NHWC/NCHW require 3 dims (batch dimension excluded); give "
              "dims: [ C, H, W ] or [ H, W, C ], or remove format");
  tc.optional = in.optional();
  if (in.allow_ragged_batch())
    out.add(label + " sets allow_ragged_batch, which is not supported by caf-serving (ragged "
                    "batches need Triton's batch_input, which the engine does not have); "
                    "remove it: requests of different shapes are then batched separately");
}

template <class Tensor>
std::vector<tensor_config>
convert_tensors(const pb::RepeatedPtrField<Tensor>& tensors,
                std::string_view kind, int max_batch_size, problems& out) {
  std::vector<tensor_config> result;
  std::set<std::string> seen;
  for (int i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    auto label = std::string{kind} + " '" + t.name() + "'";
    if (t.name().empty()) {
      label = std::string{kind} + " #" + std::to_string(i + 1);
      out.add(label + " has no name; add name: \"...\" as the model file "
                      "names that tensor");
    } else if (!seen.insert(t.name()).second) {
      out.add(std::string{kind} + " name '" + t.name()
              + "' appears more than once; give each " + std::string{kind}
              + " its own name");
    }
    tensor_config tc;
    tc.name = t.name();
    auto dtype = datatype_from_config(config::DataType_Name(t.data_type()));
    if (t.data_type() == config::TYPE_INVALID) {
      out.add(label + " has no data_type; set one such as data_type: "
                      "TYPE_FP32");
    } else if (!dtype) {
      out.add(label + " has data_type " + std::to_string(t.data_type())
              + ", which is no known TYPE_ value; use a name such as "
                "TYPE_FP32");
    } else {
      tc.dtype = *dtype;
    }
    if (t.dims().empty()) {
      out.add(label + " has no dims; list its shape without the batch "
                      "dimension, e.g. dims: [ 16 ], with -1 for a variable "
                      "dimension");
    }
    for (auto d : t.dims()) {
      if (d < 1 && d != -1) {
        // Triton's phrase (model_config_utils.cc), then what to do.
        out.add(label + " has dims " + dims_text(t.dims()) + ": dimension must be integer >= 1, "
                + "or -1 to indicate a variable-size dimension; " + std::to_string(d)
                + " is neither");
        break;
      }
    }
    tc.dims.assign(t.dims().begin(), t.dims().end());
    if (t.has_reshape())
      tc.reshape = convert_reshape(t.reshape(), tc.dims, max_batch_size, label, out);
    if (t.is_shape_tensor())
      out.add(label + " sets is_shape_tensor: shape tensors are only supported for TensorRT "
                      "platform (Triton's rule; this engine has no TensorRT backend); remove "
                      "is_shape_tensor and send the shape as an ordinary tensor");
    if (t.is_non_linear_format_io())
      out.add(label + " sets is_non_linear_format_io: Non-linear IO format is only supported "
                      "for the TensorRT platform (Triton's rule); remove it");
    result.push_back(std::move(tc));
  }
  return result;
}

queue_policy convert_queue_policy(const config::ModelQueuePolicy& p) {
  queue_policy out;
  out.action = p.timeout_action() == config::ModelQueuePolicy::DELAY
                 ? timeout_action::delay
                 : timeout_action::reject;
  out.default_timeout_us = p.default_timeout_microseconds();
  out.allow_timeout_override = p.allow_timeout_override();
  out.max_queue_size = p.max_queue_size();
  return out;
}

void convert_dynamic_batching(const config::ModelConfig& in,
                              model_config& cfg, problems& out) {
  if (!in.has_dynamic_batching())
    return;
  const auto& db = in.dynamic_batching();
  cfg.dynamic_batching_enabled = true;
  auto& dst = cfg.dynamic_batching;
  if (in.max_batch_size() == 0) {
    out.add("dynamic_batching needs batching, but max_batch_size is 0; set "
            "max_batch_size to the largest batch the model accepts, or remove "
            "dynamic_batching");
  }
  for (auto size : db.preferred_batch_size()) {
    if (size < 1) {
      out.add("preferred_batch_size " + std::to_string(size)
              + " is not a batch size; use values from 1 to max_batch_size");
    } else if (in.max_batch_size() > 0 && size > in.max_batch_size()) {
      out.add("preferred_batch_size " + std::to_string(size)
              + " is larger than max_batch_size "
              + std::to_string(in.max_batch_size())
              + "; lower it or raise max_batch_size");
    }
    dst.preferred_batch_sizes.push_back(size);
  }
  dst.max_queue_delay_us = db.max_queue_delay_microseconds();
  dst.preserve_ordering = db.preserve_ordering();
  auto levels = db.priority_levels();
  if (levels > std::numeric_limits<uint32_t>::max()) {
    out.add("priority_levels " + std::to_string(levels)
            + " is too many; use at most a few dozen levels");
    levels = 0;
  }
  dst.priority_levels = static_cast<uint32_t>(levels);
  auto def = db.default_priority_level();
  if (levels == 0 && def != 0) {
    out.add("default_priority_level is " + std::to_string(def)
            + " but priority_levels is 0; set priority_levels to enable "
              "priorities, or remove default_priority_level");
  } else if (levels > 0 && (def < 1 || def > levels)) {
    out.add("default_priority_level " + std::to_string(def)
            + " is outside [1, " + std::to_string(levels)
            + "] (priority_levels is " + std::to_string(levels)
            + "); set it to a level in that range");
  } else {
    dst.default_priority_level = static_cast<uint32_t>(def);
  }
  dst.default_queue_policy = convert_queue_policy(db.default_queue_policy());
  // Sorted, so that messages come out in a stable order.
  std::map<uint64_t, const config::ModelQueuePolicy*> sorted;
  for (const auto& [level, policy] : db.priority_queue_policy())
    sorted.emplace(level, &policy);
  for (const auto& [level, policy] : sorted) {
    if (level < 1 || level > levels) {
      out.add("priority_queue_policy names level " + std::to_string(level)
              + ", but the levels are "
              + (levels == 0 ? std::string{"not enabled (priority_levels is 0)"}
                             : "1 to " + std::to_string(levels))
              + "; use a level in range or raise priority_levels");
      continue;
    }
    dst.priority_queue_policy[static_cast<uint32_t>(level)]
      = convert_queue_policy(*policy);
  }
}

void convert_instance_groups(const config::ModelConfig& in,
                             model_config& cfg, problems& out) {
  for (int i = 0; i < in.instance_group_size(); ++i) {
    const auto& g = in.instance_group(i);
    instance_group_config dst;
    dst.name = g.name().empty() ? cfg.name + "_" + std::to_string(i) : g.name();
    auto label = "instance_group '" + dst.name + "'";
    switch (g.kind()) {
      case config::ModelInstanceGroup::KIND_GPU:
        dst.kind = instance_kind::gpu;
        break;
      case config::ModelInstanceGroup::KIND_CPU:
        dst.kind = instance_kind::cpu;
        break;
      case config::ModelInstanceGroup::KIND_MODEL:
        dst.kind = instance_kind::model;
        break;
      default:
        dst.kind = instance_kind::automatic;
        break;
    }
    if (g.has_count()) {
      if (g.count() < 1)
        out.add(label + " has count " + std::to_string(g.count())
                + "; a group needs at least one instance, so set count: 1 or "
                  "more, or remove the group");
      dst.count = g.count();
    }
    bool host_only = dst.kind == instance_kind::cpu
                     || dst.kind == instance_kind::model;
    if (host_only && g.gpus_size() > 0) {
      out.add(label + " lists gpus but its kind is "
              + config::ModelInstanceGroup::Kind_Name(g.kind())
              + "; remove gpus or use kind: KIND_GPU");
    }
    for (auto gpu : g.gpus()) {
      if (gpu < 0) {
        out.add(label + " lists gpu " + std::to_string(gpu)
                + "; GPU ids start at 0");
        break;
      }
      dst.gpus.push_back(gpu);
    }
    cfg.instance_groups.push_back(std::move(dst));
  }
}

void convert_warmup(const config::ModelConfig& in, model_config& cfg, problems& out) {
  for (int i = 0; i < in.model_warmup_size(); ++i) {
    const auto& w = in.model_warmup(i);
    warmup_sample dst;
    dst.name = w.name();
    auto label = "model_warmup '" + w.name() + "'";
    if (w.name().empty()) {
      label = "model_warmup #" + std::to_string(i + 1);
      out.add(label + " has no name; add name: \"...\" (errors and logs use it)");
    }
    dst.batch_size = w.batch_size();
    dst.count = std::max(w.count(), 1u);
    if (w.batch_size() == 0)
      out.add(label + " has batch_size 0; set batch_size: 1 or more");
    else if (in.max_batch_size() > 0 && w.batch_size() > static_cast<uint32_t>(in.max_batch_size()))
      out.add(label + " has batch_size " + std::to_string(w.batch_size())
              + ", more than max_batch_size " + std::to_string(in.max_batch_size())
              + "; lower it");
    else if (in.max_batch_size() <= 0 && w.batch_size() != 1)
      out.add(label + " has batch_size " + std::to_string(w.batch_size())
              + ", but the model does not batch (max_batch_size 0); set batch_size: 1");
    if (w.inputs().empty())
      out.add(label + " has no inputs; add inputs { key: \"<input>\" value: { data_type: "
                      "... dims: [ ... ] zero_data: true } } for each model input");
    // Sorted, so that inputs and messages come out in a stable order.
    std::map<std::string, const config::ModelWarmup::Input*> sorted;
    for (const auto& [name, input] : w.inputs())
      sorted.emplace(name, &input);
    for (const auto& [name, input] : sorted) {
      auto input_label = label + " input '" + name + "'";
      warmup_input wi;
      wi.name = name;
      auto dtype = datatype_from_config(config::DataType_Name(input->data_type()));
      if (input->data_type() == config::TYPE_INVALID || !dtype)
        out.add(input_label + " has no data_type; set the input's, such as data_type: TYPE_FP32");
      else
        wi.dtype = *dtype;
      wi.dims.assign(input->dims().begin(), input->dims().end());
      for (auto d : wi.dims)
        if (d < 0) {
          out.add(input_label + " has dims " + dims_text(input->dims())
                  + "; warmup data needs a fixed size for every dimension");
          break;
        }
      switch (input->input_data_type_case()) {
        case config::ModelWarmup::Input::kZeroData:
          wi.data = warmup_data::zero;
          break;
        case config::ModelWarmup::Input::kRandomData:
          wi.data = warmup_data::random;
          break;
        case config::ModelWarmup::Input::kInputDataFile:
          wi.data = warmup_data::file;
          wi.file = input->input_data_file();
          if (wi.file.empty() || wi.file.find('/') != std::string::npos || wi.file == ".."
              || wi.file == ".")
            out.add(input_label + " has input_data_file '" + wi.file
                    + "'; give a file name inside the model's warmup/ folder");
          break;
        default:
          out.add(input_label + " has no data; set zero_data: true, random_data: true or "
                                "input_data_file: \"<file in the model's warmup/ folder>\"");
          break;
      }
      dst.inputs.push_back(std::move(wi));
    }
    cfg.warmup.push_back(std::move(dst));
  }
}

version_policy convert_version_policy(const config::ModelVersionPolicy& in,
                                      problems& out) {
  version_policy vp;
  switch (in.policy_choice_case()) {
    case config::ModelVersionPolicy::kLatest:
      vp.kind = version_policy_kind::latest;
      vp.num_versions = in.latest().num_versions();
      if (vp.num_versions == 0) {
        out.add("version_policy latest has num_versions 0, which would serve "
                "nothing; set num_versions: 1 or more");
        vp.num_versions = 1;
      }
      break;
    case config::ModelVersionPolicy::kAll:
      vp.kind = version_policy_kind::all;
      break;
    case config::ModelVersionPolicy::kSpecific: {
      vp.kind = version_policy_kind::specific;
      std::set<int64_t> versions;
      for (auto v : in.specific().versions()) {
        if (v < 0)
          out.add("version_policy specific lists version " + std::to_string(v)
                  + "; versions are the non-negative numbers of the model's "
                    "version directories");
        else
          versions.insert(v);
      }
      if (in.specific().versions().empty())
        out.add("version_policy specific lists no versions; add versions: [ 1 ] "
                "or use latest { num_versions: 1 }");
      vp.versions.assign(versions.begin(), versions.end());
      break;
    }
    default:
      break; // latest 1, Triton's default
  }
  return vp;
}

/// The names of the fields of `m` that are set (non-default scalars,
/// present messages, non-empty repeated fields), in field-number order.
std::vector<std::string> set_fields(const pb::Message& m) {
  std::vector<const pb::FieldDescriptor*> fields;
  m.GetReflection()->ListFields(m, &fields);
  std::vector<std::string> names;
  for (const auto* f : fields)
    names.push_back(f->name());
  return names;
}

/// Triton's fields that the engine cannot carry out: accepted and reported in
/// `ignored` (logged once per model by the loader) when they only concern
/// Triton's other backends, a load error in `out` when leaving them out would
/// change results.
void check_triton_only_fields(const config::ModelConfig& in, std::vector<std::string>& ignored,
                              problems& out) {
  auto refuse = [&](const std::string& field, const std::string& why) {
    out.add("field '" + field + "' of Triton's ModelConfig is not supported by caf-serving ("
            + why + "); remove it");
  };
  if (in.has_sequence_batching())
    refuse("sequence_batching", "the engine keeps no per-sequence state, so a stateful model "
                                "would answer wrongly; serve it with dynamic_batching only if it "
                                "is stateless");
  if (in.has_ensemble_scheduling())
    refuse("ensemble_scheduling", "the engine does not chain models; call the models one "
                                  "after another from the client");
  if (in.batch_input_size() > 0)
    refuse("batch_input", "the engine does not compute ragged-batch inputs for a model");
  if (in.batch_output_size() > 0)
    refuse("batch_output", "the engine does not scatter ragged-batch outputs");

  // Only Triton's backends read these; the answers do not depend on them.
  for (const auto& field : set_fields(in.optimization()))
    ignored.push_back("optimization." + field);
  for (int i = 0; i < in.instance_group_size(); ++i)
    for (const auto& field : set_fields(in.instance_group(i)))
      if (field != "name" && field != "kind" && field != "count" && field != "gpus")
        ignored.push_back("instance_group." + field);
  if (!in.runtime().empty())
    ignored.push_back("runtime");
  if (in.cc_model_filenames_size() > 0)
    ignored.push_back("cc_model_filenames");
  if (in.metric_tags_size() > 0)
    ignored.push_back("metric_tags");
  if (in.has_model_operations())
    ignored.push_back("model_operations");
  if (in.has_model_repository_agents())
    ignored.push_back("model_repository_agents");
  if (in.has_model_metrics())
    ignored.push_back("model_metrics");
  // Several instance groups may set the same field: name it once.
  std::sort(ignored.begin(), ignored.end());
  ignored.erase(std::unique(ignored.begin(), ignored.end()), ignored.end());
}

/// A default_model_filename must name a file inside the version directory.
void convert_model_filename(const config::ModelConfig& in, model_config& cfg, problems& out) {
  const auto& name = in.default_model_filename();
  cfg.default_model_filename = name;
  if (name.empty())
    return;
  bool escapes = name.front() == '/' || name == "." || name == ".." || name.rfind("../", 0) == 0
                 || name.find("/../") != std::string::npos
                 || (name.size() >= 3 && name.compare(name.size() - 3, 3, "/..") == 0)
                 || name.find('\0') != std::string::npos;
  if (escapes)
    out.add("default_model_filename '" + name
            + "' does not name a file inside the version directory; give a file name such as "
              "\"model.onnx\"");
}

} // namespace

result<parsed_model_config>
parse_model_config_full(std::string_view text, const parse_context& ctx) {
  config::ModelConfig proto;
  first_error_collector errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string{text}, &proto)) {
    std::ostringstream msg;
    msg << prefix(ctx.model_name, ctx);
    if (errors.has_error())
      msg << " line " << errors.line() << ", column " << errors.column()
          << ": " << explain_parser_message(errors.message());
    else
      msg << ": cannot be parsed as a Triton model configuration";
    return bad_request(msg.str());
  }

  return convert_model_config(proto, ctx);
}

result<parsed_model_config> convert_model_config(const config::ModelConfig& proto,
                                                 const parse_context& ctx) {
  parsed_model_config parsed;
  auto& cfg = parsed.config;
  parsed.original = proto.SerializeAsString();
  problems out;

  // Name: the directory decides; the file may repeat it but not contradict it.
  if (proto.name().empty()) {
    cfg.name = ctx.model_name;
    if (cfg.name.empty())
      out.add("the config has no name; add name: \"<model>\"");
  } else {
    cfg.name = proto.name();
    if (!ctx.model_name.empty() && proto.name() != ctx.model_name)
      out.add("name is '" + proto.name() + "' but the model directory is '"
              + ctx.model_name + "'; a model is named by its directory, so "
              + "change name to '" + ctx.model_name
              + "' or rename the directory");
  }

  cfg.platform = proto.platform();
  cfg.backend = proto.backend();
  if (cfg.platform.empty() && cfg.backend.empty() && !ctx.allow_missing_io)
    out.add("neither backend nor platform is set; add backend: \"onnxruntime\" "
            "for an ONNX model or backend: \"builtin\" for a built-in function");

  if (proto.max_batch_size() < 0)
    out.add("max_batch_size is " + std::to_string(proto.max_batch_size())
            + "; use 0 for a model without a batch dimension, or the largest "
              "batch it accepts");
  cfg.max_batch_size = std::max(0, proto.max_batch_size());

  cfg.inputs = convert_tensors(proto.input(), "input", proto.max_batch_size(), out);
  for (int i = 0; i < proto.input_size(); ++i)
    convert_input_fields(proto.input(i), cfg.inputs[i], out);
  cfg.outputs = convert_tensors(proto.output(), "output", proto.max_batch_size(), out);
  if (!ctx.allow_missing_io) {
    if (cfg.inputs.empty())
      out.add("no input is declared; add input [ { name: \"...\" data_type: "
              "TYPE_FP32 dims: [ ... ] } ]");
    if (cfg.outputs.empty())
      out.add("no output is declared; add output [ { name: \"...\" data_type: "
              "TYPE_FP32 dims: [ ... ] } ]");
  }
  for (const auto& o : proto.output())
    if (!o.label_filename().empty())
      parsed.label_filenames[o.name()] = o.label_filename();

  convert_dynamic_batching(proto, cfg, out);
  convert_instance_groups(proto, cfg, out);

  for (const auto& [key, value] : proto.parameters())
    cfg.parameters[key] = value.string_value();
  convert_warmup(proto, cfg, out);

  convert_model_filename(proto, cfg, out);
  cfg.response_cache_enabled = proto.response_cache().enable();
  // A decoupled model answers any number of times per request: the engine
  // serves generative decoders so (server/generative_model.hpp), and refuses
  // it for any other model at load.
  cfg.decoupled = proto.model_transaction_policy().decoupled();
  check_triton_only_fields(proto, parsed.ignored_fields, out);

  parsed.versions = convert_version_policy(proto.version_policy(), out);
  if (parsed.versions.kind == version_policy_kind::specific)
    cfg.specific_versions = parsed.versions.versions;

  if (!out.empty()) {
    // The directory name identifies the model even when `name` disagrees.
    auto head = prefix(ctx.model_name.empty() ? cfg.name : ctx.model_name, ctx);
    if (out.items.size() == 1)
      return bad_request(head + ": " + out.items.front());
    std::string msg = head + ": " + std::to_string(out.items.size())
                      + " problems:";
    for (const auto& item : out.items)
      msg += "\n  - " + item;
    return bad_request(std::move(msg));
  }
  return parsed;
}

result<model_config>
parse_model_config(std::string_view text, const parse_context& ctx) {
  auto parsed = parse_model_config_full(text, ctx);
  if (!parsed)
    return parsed.error();
  return std::move(parsed->config);
}

result<parsed_model_config>
parse_model_config_json(std::string_view json, const parse_context& ctx) {
  config::ModelConfig proto;
  pb::util::JsonParseOptions options;
  // As Triton: enum names in any case ("type_fp32"), and no unknown field
  // passes silently.
  options.case_insensitive_enum_parsing = true;
  options.ignore_unknown_fields = false;
  auto status = pb::util::JsonStringToMessage(std::string{json}, &proto, options);
  if (!status.ok())
    return bad_request("Invalid config override: " + std::string{status.message()} + " ("
                       + prefix(ctx.model_name, ctx)
                       + "); send a ModelConfig in protobuf's JSON mapping with the field "
                         "names of config.pbtxt, e.g. {\"max_batch_size\": 16}");
  // The same checks and conversion as config.pbtxt, through its text form:
  // one path, so that a config means the same whichever way it arrives.
  std::string text;
  if (!pb::TextFormat::PrintToString(proto, &text))
    return bad_request(prefix(ctx.model_name, ctx) + ": the configuration could not be "
                                                     "converted to config.pbtxt form");
  return parse_model_config_full(text, ctx);
}

result<parsed_model_config>
parse_model_config_json_over(std::string_view json, std::string_view base_text,
                             const parse_context& ctx) {
  config::ModelConfig base;
  bool builtin_base = false;
  if (!base_text.empty()) {
    pb::TextFormat::Parser parser;
    first_error_collector quiet; // a broken file is simply not used
    parser.RecordErrorsTo(&quiet);
    builtin_base = parser.ParseFromString(std::string{base_text}, &base)
                   && base.backend() == "builtin";
  }
  if (!builtin_base)
    return parse_model_config_json(json, ctx);
  config::ModelConfig override_config;
  pb::util::JsonParseOptions options;
  options.case_insensitive_enum_parsing = true;
  options.ignore_unknown_fields = false;
  auto status = pb::util::JsonStringToMessage(std::string{json}, &override_config, options);
  if (!status.ok() || !override_config.backend().empty() || !override_config.platform().empty())
    return parse_model_config_json(json, ctx);
  // Field by field: a field the JSON sets replaces the file's whole field
  // (a list is not appended to).
  std::vector<const pb::FieldDescriptor*> set;
  override_config.GetReflection()->ListFields(override_config, &set);
  for (const auto* field : set)
    base.GetReflection()->ClearField(&base, field);
  base.MergeFrom(override_config);
  std::string text;
  if (!pb::TextFormat::PrintToString(base, &text))
    return bad_request(prefix(ctx.model_name, ctx) + ": the configuration could not be "
                                                     "converted to config.pbtxt form");
  return parse_model_config_full(text, ctx);
}

} // namespace caf_serving::repository
