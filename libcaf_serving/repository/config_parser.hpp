#pragma once
/// Reads one model's config.pbtxt (Triton's text format) into the plain
/// caf_serving::model_config.
///
/// Usage:
///
///     repository::parse_context ctx{"resnet", "/models/resnet/config.pbtxt"};
///     auto cfg = repository::parse_model_config(text, ctx);
///     if (!cfg)
///       log(cfg.error().message); // says what is wrong, where, and the fix
///
/// Two kinds of error, both `bad_request` values whose message starts with
/// "model '<name>': <config path>":
/// - syntax: a misspelled or unsupported field, a bad enum value, a malformed
///   line. The message names the field and the line, and lists the fields that
///   are supported at that place.
/// - meaning: a value that parses but cannot work (negative max_batch_size,
///   preferred_batch_size above max_batch_size, a reshape of another size,
///   ...) or a Triton feature the engine cannot carry out without changing
///   results (sequence_batching, ensemble_scheduling, batch_input, decoupled
///   transactions, shape tensors). All such problems of one file are reported
///   together, one per line.
///
/// Triton fields that only Triton's other backends use (optimization,
/// instance_group.rate_limiter, model_metrics, ...) parse and are listed in
/// parsed_model_config::ignored_fields for the loader to log.

#include "core/error.hpp"
#include "core/model_config.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::repository {

/// Where the text came from, for defaults and for error messages.
struct parse_context {
  /// The model's directory name: the default for `name`, and what an explicit
  /// `name` must equal. Empty when the text has no directory (then `name` is
  /// required).
  std::string model_name;
  /// Shown in messages, e.g. "/models/resnet/config.pbtxt".
  std::string config_path = "config.pbtxt";
  /// Accept a config without inputs, outputs, backend or platform, for loaders
  /// that complete them from the model file itself (as Triton does for ONNX).
  bool allow_missing_io = false;
};

/// Triton's version_policy.
enum class version_policy_kind { latest, all, specific };

struct version_policy {
  version_policy_kind kind = version_policy_kind::latest;
  /// For `latest`: how many of the highest-numbered versions are served.
  uint32_t num_versions = 1;
  /// For `specific`: exactly these versions, ascending, no duplicates.
  std::vector<int64_t> versions;
};

/// What config.pbtxt says beyond the engine-wide model_config: the repository
/// needs the version policy to pick version directories, and the
/// post-processor needs the label files.
struct parsed_model_config {
  model_config config;
  version_policy versions;
  /// Output name → label_filename as written (relative to the model directory).
  /// Only outputs that name one appear.
  std::map<std::string, std::string> label_filenames;
  /// Triton fields the config sets that only Triton's other backends use
  /// ("optimization.execution_accelerators", "instance_group.rate_limiter",
  /// ...): accepted, and for the loader to log once per model as ignored.
  /// Sorted, each once.
  std::vector<std::string> ignored_fields;
  /// The config as parsed (Triton's ModelConfig, protobuf binary), so that
  /// GET /v2/models/{m}/config shows the ignored fields too, as Triton does.
  std::string original;
};

/// Parses and validates config.pbtxt text. `config.specific_versions` is filled
/// when the policy is `specific`; instance groups without a name get
/// "<model>_<index>".
result<parsed_model_config>
parse_model_config_full(std::string_view text, const parse_context& ctx);

/// A model configuration sent as JSON (Triton's "config" load parameter: a
/// ModelConfig in protobuf's JSON mapping, e.g. {"max_batch_size": 16}),
/// checked and converted exactly as config.pbtxt is. A JSON that does not map
/// onto the schema (bad syntax, an unknown field, a wrong type) is a
/// `bad_request` starting with Triton's "Invalid config override: ".
/// `ctx.config_path` names the source in messages (e.g. "the 'config' load
/// parameter").
result<parsed_model_config>
parse_model_config_json(std::string_view json, const parse_context& ctx);

/// parse_model_config_json() for a model whose config.pbtxt text is
/// `base_text` (empty: none). As in Triton the JSON replaces the file, and
/// what it leaves out is completed from the model itself; a builtin model has
/// no model file, its config.pbtxt is its definition, so when `base_text`
/// declares backend "builtin" and the JSON names no other backend or platform,
/// each top-level field the JSON sets replaces the file's and the rest is kept
/// (e.g. {"max_batch_size": 16} changes only that). A `base_text` that does not
/// parse is left out.
result<parsed_model_config>
parse_model_config_json_over(std::string_view json, std::string_view base_text,
                             const parse_context& ctx);

/// parse_model_config_full(), keeping only the model_config.
result<model_config>
parse_model_config(std::string_view text, const parse_context& ctx);

} // namespace caf_serving::repository
