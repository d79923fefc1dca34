#include "server/generative_loader.hpp"

#include "executor/decoder_runner.hpp"
#include "core/external_memory.hpp"
#include "onnx/importer.hpp"
#include "onnx/paged_attention.hpp"
#include "onnx/passes_decoder.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

#include <simdjson.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

namespace caf_serving::server {
namespace {

serving_error load_error(const model_config& c, const std::string& what) {
  return bad_request("generative model '" + c.name + "': " + what);
}

/// A whole file, or nothing when it does not exist.
std::optional<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in)
    return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The file `name` in the version directory, else in the model directory.
std::optional<std::filesystem::path> find_file(const generative_load_config& cfg,
                                               const std::string& name) {
  for (const auto& dir : {cfg.version_dir, cfg.model_dir}) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(dir / name, ec))
      return dir / name;
  }
  return std::nullopt;
}

/// A parameter as a positive integer, `fallback` when absent.
result<uint64_t> parameter(const model_config& c, const std::string& key, uint64_t fallback,
                           uint64_t min, uint64_t max) {
  auto i = c.parameters.find(key);
  if (i == c.parameters.end())
    return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(i->second.c_str(), &end, 10);
  if (i->second.empty() || *end != '\0' || errno != 0 || v < min || v > max
      || i->second[0] == '-')
    return load_error(c, "parameters \"" + key + "\" is '" + i->second + "'; it must be an "
                         "integer from " + std::to_string(min) + " to " + std::to_string(max));
  return uint64_t{v};
}

/// A JSON file's object, parsed into `parser`; errors name the file.
result<simdjson::dom::element> parse_json(simdjson::dom::parser& parser, const std::string& text,
                                          const std::filesystem::path& path,
                                          const model_config& c) {
  simdjson::dom::element e;
  if (auto err = parser.parse(text).get(e); err || !e.is_object())
    return load_error(c, path.string() + " is not a JSON object"
                           + (err ? std::string(": ") + simdjson::error_message(err) : ""));
  return e;
}

/// A special token in tokenizer_config.json: a string, or {"content": ...}.
std::string token_text(simdjson::dom::element config, const char* key) {
  simdjson::dom::element v;
  if (config[key].get(v))
    return {};
  std::string_view s;
  if (!v.get(s))
    return std::string(s);
  if (!v["content"].get(s))
    return std::string(s);
  return {};
}

/// `eos_token_id` of a JSON object: an id or a list of ids (generation_config.json,
/// genai_config.json's model); none when absent.
std::vector<int32_t> eos_ids_of(simdjson::dom::element object) {
  std::vector<int32_t> ids;
  simdjson::dom::element eos;
  if (object["eos_token_id"].get(eos))
    return ids;
  int64_t one = 0;
  simdjson::dom::array many;
  if (!eos.get(one))
    ids.push_back(static_cast<int32_t>(one));
  else if (!eos.get(many))
    for (simdjson::dom::element e : many)
      if (!e.get(one))
        ids.push_back(static_cast<int32_t>(one));
  return ids;
}

uint64_t machine_memory() {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? uint64_t(pages) * uint64_t(size) : uint64_t{8} << 30;
}

/// What the model's metadata shows: the inputs and output of Triton's vLLM
/// backend, which the generate endpoints map request fields to, not the
/// decoder's tensors (those are the engine's business).
model_config public_config(const model_config& c) {
  model_config out = c;
  out.decoupled = true;
  out.max_batch_size = 0;
  out.dynamic_batching_enabled = false;
  auto tensor = [](std::string name, datatype dt, bool optional) {
    tensor_config t;
    t.name = std::move(name);
    t.dtype = dt;
    t.dims = {1};
    t.optional = optional;
    return t;
  };
  out.inputs = {tensor("text_input", datatype::bytes, false),
                tensor("stream", datatype::bool_, true),
                tensor("sampling_parameters", datatype::bytes, true),
                tensor("exclude_input_in_output", datatype::bool_, true),
                tensor("return_finish_reason", datatype::bool_, true),
                tensor("return_num_input_tokens", datatype::bool_, true),
                tensor("return_num_output_tokens", datatype::bool_, true)};
  tensor_config text_output = tensor("text_output", datatype::bytes, false);
  text_output.dims = {-1};
  out.outputs = {text_output};
  return out;
}

} // namespace

result<loaded_generative> load_generative(const generative_load_config& cfg) {
  const model_config& c = cfg.config;
  auto max_sequences = parameter(c, "max_sequences", 64, 1, 4096);
  if (!max_sequences)
    return max_sequences.error();
  auto max_step_tokens = parameter(c, "max_step_tokens", 512, 1, 1 << 20);
  if (!max_step_tokens)
    return max_step_tokens.error();
  auto block_tokens = parameter(c, "kv_block_tokens", 16, 1, 4096);
  if (!block_tokens)
    return block_tokens.error();
  auto past_bucket = parameter(c, "past_bucket", 32, 1, 1 << 16);
  if (!past_bucket)
    return past_bucket.error();
  auto max_waiting = parameter(c, "max_waiting", cfg.max_waiting, 1, 1 << 24);
  if (!max_waiting)
    return max_waiting.error();
  // Latency targets (issue 35; generation_policy.hpp): 0, the default, is none.
  auto ttft_target_ms = parameter(c, "ttft_target_ms", 0, 0, 1 << 24);
  if (!ttft_target_ms)
    return ttft_target_ms.error();
  auto tpot_target_ms = parameter(c, "tpot_target_ms", 0, 0, 1 << 24);
  if (!tpot_target_ms)
    return tpot_target_ms.error();

  // The tokenizer and the model's own files.
  auto tokenizer_path = find_file(cfg, "tokenizer.json");
  if (!tokenizer_path)
    return load_error(c, "no tokenizer.json in " + cfg.version_dir.string() + " or "
                           + cfg.model_dir.string() + "; put the model's Hugging Face "
                             "tokenizer.json beside model.onnx");
  auto tok = text::tokenizer::load_file(tokenizer_path->string());
  if (!tok)
    return load_error(c, tokenizer_path->string() + ": " + tok.error().message);
  auto tokenizer = std::make_shared<const text::tokenizer>(std::move(*tok));

  simdjson::dom::parser parser;
  uint64_t context_hint = 0;
  std::vector<int32_t> eos_ids;
  std::string bos_token, eos_token, template_source;
  bool add_special_tokens = true;
  if (auto p = find_file(cfg, "config.json")) {
    auto text = read_file(*p).value_or("");
    auto doc = parse_json(parser, text, *p, c);
    if (!doc)
      return doc.error();
    for (const char* key : {"n_positions", "max_position_embeddings", "n_ctx"}) {
      uint64_t v = 0;
      if (!(*doc)[key].get(v) && v > 0) {
        context_hint = v;
        break;
      }
    }
  }
  if (auto p = find_file(cfg, "generation_config.json")) {
    auto text = read_file(*p).value_or("");
    auto doc = parse_json(parser, text, *p, c);
    if (!doc)
      return doc.error();
    eos_ids = eos_ids_of(*doc);
    uint64_t max_length = 0;
    if (context_hint == 0 && !(*doc)["max_length"].get(max_length) && max_length > 0)
      context_hint = max_length;
  }
  // onnxruntime-genai's model directory: GroupQueryAttention reads the past
  // left-aligned, the cache tensors' head size is symbolic.
  executor::decoder_hints hints;
  std::optional<executor::cache_dims> genai_cache;
  if (auto p = find_file(cfg, "genai_config.json")) {
    auto text = read_file(*p).value_or("");
    auto doc = parse_json(parser, text, *p, c);
    if (!doc)
      return doc.error();
    hints.layout = executor::past_layout::left_aligned;
    simdjson::dom::element model;
    if (!(*doc)["model"].get(model)) {
      uint64_t v = 0;
      if (context_hint == 0 && !model["context_length"].get(v) && v > 0)
        context_hint = v;
      executor::cache_dims dims;
      if (!model["decoder"]["head_size"].get(v) && v > 0 && v < (uint64_t{1} << 16))
        hints.head_dim = dims.head_dim = static_cast<uint32_t>(v);
      if (!model["decoder"]["num_key_value_heads"].get(v) && v > 0 && v < (uint64_t{1} << 16))
        dims.kv_heads = static_cast<uint32_t>(v);
      if (!model["decoder"]["num_hidden_layers"].get(v) && v > 0 && v < (uint64_t{1} << 16))
        dims.layers = static_cast<uint32_t>(v);
      if (!model["vocab_size"].get(v) && v > 0 && v < (uint64_t{1} << 24))
        dims.vocab = static_cast<uint32_t>(v);
      if (dims.head_dim > 0 && dims.kv_heads > 0 && dims.vocab > 0 && c.inputs.empty()
          && c.outputs.empty())
        genai_cache = dims;
      if (eos_ids.empty())
        eos_ids = eos_ids_of(model);
    }
  }
  if (auto i = c.parameters.find("past_layout"); i != c.parameters.end()) {
    auto layout = executor::past_layout_from_name(i->second);
    if (!layout)
      return load_error(c, "parameters \"past_layout\" is '" + i->second + "'; it must be "
                           "\"masked\" (torch.onnx.export, optimum) or \"left_aligned\" "
                           "(onnxruntime-genai's GroupQueryAttention)");
    hints.layout = *layout;
  }
  if (auto p = find_file(cfg, "tokenizer_config.json")) {
    auto text = read_file(*p).value_or("");
    auto doc = parse_json(parser, text, *p, c);
    if (!doc)
      return doc.error();
    bos_token = token_text(*doc, "bos_token");
    eos_token = token_text(*doc, "eos_token");
    bool add_bos = true;
    if (!(*doc)["add_bos_token"].get(add_bos))
      add_special_tokens = add_bos;
    std::string_view source;
    simdjson::dom::array named;
    if (!(*doc)["chat_template"].get(source)) {
      template_source = std::string(source);
    } else if (!(*doc)["chat_template"].get(named)) {
      // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
      for (simdjson::dom::element e : named) {
        std::string_view name, body;
        if (!e["name"].get(name) && name == "default" && !e["template"].get(body))
          template_source = std::string(body);
      }
    }
    uint64_t model_max = 0;
    if (context_hint == 0 && !(*doc)["model_max_length"].get(model_max) && model_max > 0
        && model_max < (uint64_t{1} << 24))
      context_hint = model_max;
    if (eos_ids.empty() && !eos_token.empty())
      if (auto id = tokenizer->token_to_id(eos_token))
        eos_ids.push_back(*id);
  }
  if (auto p = find_file(cfg, "chat_template.jinja"))
    template_source = read_file(*p).value_or("");
  if (eos_ids.empty() && tokenizer->special_ids().eos)
    eos_ids.push_back(*tokenizer->special_ids().eos);
  std::shared_ptr<const text::chat_template> chat;
  if (!template_source.empty()) {
    auto parsed = text::chat_template::parse(template_source);
    if (!parsed)
      return load_error(c, "its chat template does not parse: " + parsed.error().message);
    chat = std::make_shared<const text::chat_template>(std::move(*parsed));
  }
  auto max_context = parameter(c, "max_context", context_hint, 1, 1 << 24);
  if (!max_context)
    return max_context.error();
  if (*max_context == 0)
    return load_error(c, "its context length is unknown: set parameters \"max_context\" in "
                         "config.pbtxt, or ship config.json with n_positions or "
                         "max_position_embeddings");

  // The decoder, with a batch as large as the running set.
  onnx::onnx_model_config oc;
  oc.model_file = cfg.version_dir / (c.default_model_filename.empty()
                                       ? std::string("model.onnx")
                                       : c.default_model_filename);
  oc.config = genai_cache ? executor::with_cache_dims(c, *genai_cache) : c;
  oc.config.max_batch_size = static_cast<int>(*max_sequences);
  oc.pool = cfg.compute_pool;
  // A torch export's attention as GroupQueryAttention (onnx/passes_decoder.hpp).
  auto rewrite = c.parameters.find("rewrite_attention");
  if (rewrite != c.parameters.end() && rewrite->second != "true" && rewrite->second != "false")
    return load_error(c, "parameters \"rewrite_attention\" is '" + rewrite->second
                           + "'; it must be \"true\" or \"false\"");
  // GroupQueryAttention reads the left-aligned past: not with "past_layout" "masked".
  const bool masked = c.parameters.count("past_layout") > 0
                      && hints.layout == executor::past_layout::masked;
  if (rewrite != c.parameters.end() && rewrite->second == "true" && masked)
    return load_error(c, "parameters \"rewrite_attention\" \"true\" needs the left-aligned "
                         "past; drop parameters \"past_layout\" \"masked\"");
  oc.passes.rewrite_decoder_attention =
    rewrite != c.parameters.end() ? rewrite->second == "true"
                                  : !masked && !find_file(cfg, "genai_config.json");
  oc.threads = std::max(cfg.threads, 1u);
  // One plan per batch bucket (powers of two) and past bucket.
  size_t batch_buckets = 1;
  while ((uint64_t{1} << (batch_buckets - 1)) < *max_sequences)
    ++batch_buckets;
  uint64_t past_buckets = (*max_context + *past_bucket) / *past_bucket + 1;
  oc.plan_cache_size = static_cast<size_t>(
    std::min<uint64_t>(1024, std::max<uint64_t>(8, batch_buckets * 2 + past_buckets * 2)));
  auto imported = onnx::import_model(oc.model_file);
  if (!imported)
    return load_error(c, imported.error().message);
  // A torch export's attention chains become GroupQueryAttention first
  // (onnx/passes_decoder.hpp), so that the paged rewrite below takes them too.
  const bool rewrite_wanted = oc.passes.rewrite_decoder_attention;
  oc.passes.rewrite_decoder_attention = false;
  onnx::decoder_attention_result decoder_attention;
  if (rewrite_wanted)
    decoder_attention = onnx::rewrite_decoder_attention(*imported);
  // The engine's own cache, read in place: GroupQueryAttention becomes the
  // paged operator (onnx/paged_attention.hpp) unless parameters
  // "paged_attention" is "false".
  const uint64_t kv_pool = new_external_memory_handle();
  onnx::paged_attention_result paged;
  bool paged_wanted = true;
  if (auto i = c.parameters.find("paged_attention"); i != c.parameters.end()) {
    if (i->second != "true" && i->second != "false")
      return load_error(c, "parameters \"paged_attention\" is '" + i->second + "'; it must be "
                           "\"true\" or \"false\"");
    paged_wanted = i->second == "true";
  }
  if (paged_wanted)
    paged = onnx::rewrite_paged_attention(
      *imported, {kv_pool, static_cast<uint32_t>(*block_tokens)});
  else
    paged.refused = "parameters \"paged_attention\" is \"false\"";
  if (paged.layers > 0 && genai_cache) {
    genai_cache->paged = true;
    oc.config = executor::with_cache_dims(c, *genai_cache);
    oc.config.max_batch_size = static_cast<int>(*max_sequences);
  }
  // Logits of the position a step samples from only.
  const bool last_logits = onnx::last_position_logits(*imported);
  auto model = onnx::load_onnx_graph(std::move(*imported), oc);
  if (!model)
    return model.error();
  if (decoder_attention.layers > 0)
    hints.layout = executor::past_layout::left_aligned;
  auto sig = executor::find_decoder_signature(model->config, hints);
  if (!sig)
    return sig.error();
  if (tokenizer->vocab_size() > sig->vocab)
    return load_error(c, "its tokenizer has " + std::to_string(tokenizer->vocab_size())
                           + " tokens but the model's logits only " + std::to_string(sig->vocab)
                           + "; the tokenizer.json does not belong to this model");

  scheduler::generation_limits limits;
  limits.max_running = static_cast<uint32_t>(*max_sequences);
  limits.max_step_tokens = static_cast<uint32_t>(
    std::max<uint64_t>(*max_step_tokens, *max_sequences));
  limits.block_tokens = static_cast<uint32_t>(*block_tokens);
  limits.max_context = static_cast<uint32_t>(*max_context);
  limits.max_waiting = static_cast<uint32_t>(*max_waiting);
  limits.ttft_target = std::chrono::milliseconds(*ttft_target_ms);
  limits.tpot_target = std::chrono::milliseconds(*tpot_target_ms);
  executor::kv_cache_layout layout{sig->layers(), sig->kv_heads,
                                   sig->head_dim, limits.block_tokens, 0};
  const uint64_t block_bytes = executor::kv_block_bytes(layout);
  uint64_t blocks_per_context = (*max_context + *block_tokens - 1) / *block_tokens;
  uint64_t default_bytes = std::min(machine_memory() / 4,
                                    blocks_per_context * *max_sequences * block_bytes);
  auto budget = parameter(c, "kv_cache_bytes",
                          cfg.kv_cache_bytes ? cfg.kv_cache_bytes : default_bytes, 1,
                          uint64_t{1} << 50);
  if (!budget)
    return budget.error();
  limits.cache_blocks = static_cast<uint32_t>(
    std::min<uint64_t>(*budget / block_bytes, UINT32_MAX));
  if (auto problem = scheduler::check_limits(limits))
    return load_error(c, *problem);
  if (limits.cache_blocks == 0)
    return load_error(c, "a KV cache of " + std::to_string(*budget) + " bytes holds no block of "
                           + std::to_string(block_bytes) + " bytes; raise kv_cache_bytes");

  loaded_generative out;
  out.config = public_config(c);
  std::ostringstream summary;
  summary << "generative: " << sig->present_keys.size() << " layers, " << sig->kv_heads
          << " KV heads of " << sig->head_dim << ", vocab " << sig->vocab << "; KV cache "
          << limits.cache_blocks << " blocks of " << limits.block_tokens << " tokens ("
          << (uint64_t{limits.cache_blocks} * block_bytes >> 20) << " MiB, "
          << uint64_t{limits.cache_blocks} * limits.block_tokens << " positions); up to "
          << limits.max_running << " sequences, " << limits.max_step_tokens
          << " tokens per step, context " << limits.max_context;
  if (*ttft_target_ms > 0 || *tpot_target_ms > 0)
    summary << "; targets: TTFT " << *ttft_target_ms << " ms, TPOT " << *tpot_target_ms
            << " ms (0: none)";
  summary << "; tokenizer "
          << tokenizer_path->filename().string() << " (" << tokenizer->vocab_size()
          << " tokens), " << (chat ? "a chat template" : "no chat template") << ", eos";
  for (int32_t id : eos_ids)
    summary << " " << id;
  if (decoder_attention.layers > 0)
    summary << "; attention of " << decoder_attention.layers
            << " layers as GroupQueryAttention";
  else if (rewrite_wanted)
    summary << "; attention as exported (" << decoder_attention.refused << ")";
  summary << "; attention "
          << (sig->paged ? "reads the cache in place (paged)"
                         : "takes the past as tensors (" + paged.refused + ")");
  if (last_logits)
    summary << "; logits of the last position only";
  out.summary = summary.str();

  executor::decoder_runner_config rc;
  rc.past_bucket = static_cast<uint32_t>(*past_bucket);
  rc.kv_pool = sig->paged ? kv_pool : 0;
  rc.max_batch = limits.max_running;
  auto make_instance = model->make_instance;
  auto name = c.name;
  out.start = [=, sig = *sig](caf::actor_system& sys) {
    auto g = std::make_shared<generative_model>();
    g->stats = std::make_shared<scheduler::generation_stats>();
    g->tokenizer = tokenizer;
    g->chat_template = chat;
    g->limits = limits;
    g->bos_token = bos_token;
    g->eos_token = eos_token;
    g->add_special_tokens = add_special_tokens;
    g->created_s = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    scheduler::generation_actor_config ac;
    ac.model_name = name;
    ac.limits = limits;
    ac.runner = rc;
    ac.signature = sig;
    ac.backend = make_instance();
    ac.tokenizer = tokenizer;
    ac.eos_ids = eos_ids;
    ac.stats = g->stats;
    g->actor = scheduler::spawn_generation_actor(sys, std::move(ac));
    return g;
  };
  return out;
}

} // namespace caf_serving::server
