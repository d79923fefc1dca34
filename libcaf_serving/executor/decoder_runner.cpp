#include "executor/decoder_runner.hpp"

#include "core/external_memory.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

namespace caf_serving::executor {
namespace {

const tensor_config* find_tensor(const std::vector<tensor_config>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name)
      return &t;
  return nullptr;
}

serving_error not_a_decoder(const model_config& c, const std::string& what) {
  return bad_request("model '" + c.name + "' is not a decoder with its KV cache as tensors: "
                     + what + "; export it with past_key_values.N.key/value inputs and "
                     "present.N.key/value outputs (torch.onnx.export with use_cache, or "
                     "optimum's decoder_with_past)");
}

uint32_t round_up(uint32_t n, uint32_t to) { return (n + to - 1) / to * to; }

uint32_t batch_bucket(uint32_t rows, uint32_t max_batch) {
  uint32_t b = 1;
  while (b < rows)
    b *= 2;
  return std::max(rows, std::min(b, max_batch));
}

} // namespace

uint8_t* decoder_runner::output_buffers::allocate(std::string_view name, datatype,
                                                  const std::vector<int64_t>& shape,
                                                  size_t bytes) {
  auto i = outputs.find(name);
  if (i == outputs.end())
    i = outputs.emplace(std::string(name), tensor{}).first;
  i->second.shape = shape;
  i->second.bytes.resize(bytes);
  return i->second.bytes.data();
}

model_config with_cache_dims(model_config c, const cache_dims& d) {
  const std::vector<int64_t> cache{static_cast<int64_t>(d.kv_heads), -1,
                                   static_cast<int64_t>(d.head_dim)};
  auto add = [&](std::vector<tensor_config>& list, const std::string& name, datatype dt,
                 std::vector<int64_t> dims) {
    if (find_tensor(list, name))
      return;
    tensor_config t;
    t.name = name;
    t.dtype = dt;
    t.dims = std::move(dims);
    list.push_back(std::move(t));
  };
  add(c.inputs, "input_ids", datatype::int64, {-1});
  add(c.inputs, "attention_mask", datatype::int64, {-1});
  add(c.outputs, "logits", datatype::fp32, {-1, static_cast<int64_t>(d.vocab)});
  for (uint32_t l = 0; l < d.layers; ++l)
    for (const char* kv : {".key", ".value"}) {
      if (!d.paged)
        add(c.inputs, "past_key_values." + std::to_string(l) + kv, datatype::fp32, cache);
      add(c.outputs, "present." + std::to_string(l) + kv, datatype::fp32, cache);
    }
  if (d.paged) {
    add(c.inputs, "kv_block_table", datatype::int32, {-1});
    add(c.inputs, "kv_context_lens", datatype::int32, {1});
  }
  return c;
}

std::optional<past_layout> past_layout_from_name(std::string_view name) {
  if (name == "masked")
    return past_layout::masked;
  if (name == "left_aligned")
    return past_layout::left_aligned;
  return std::nullopt;
}

result<decoder_signature> find_decoder_signature(const model_config& c,
                                                 const decoder_hints& hints) {
  decoder_signature s;
  s.layout = hints.layout;
  auto input = [&](const std::string& n) { return find_tensor(c.inputs, n); };
  auto output = [&](const std::string& n) { return find_tensor(c.outputs, n); };
  const tensor_config* ids = input("input_ids");
  const tensor_config* mask = input("attention_mask");
  const tensor_config* logits = output("logits");
  if (!ids)
    return not_a_decoder(c, "it has no input 'input_ids'");
  if (!mask)
    return not_a_decoder(c, "it has no input 'attention_mask'");
  if (!logits)
    return not_a_decoder(c, "it has no output 'logits'");
  for (const auto* t : {ids, mask})
    if (t->dtype != datatype::int64 && t->dtype != datatype::int32)
      return not_a_decoder(c, "input '" + t->name + "' is " + std::string(to_string(t->dtype))
                                + ", not INT64 or INT32");
  s.input_ids = ids->name;
  s.attention_mask = mask->name;
  s.ids_dtype = ids->dtype;
  s.mask_dtype = mask->dtype;
  if (const auto* pos = input("position_ids")) {
    if (pos->dtype != ids->dtype)
      return not_a_decoder(c, "'position_ids' and 'input_ids' have different datatypes");
    s.position_ids = pos->name;
  }
  s.logits = logits->name;
  if (logits->dtype != datatype::fp32 || logits->model_dims().empty()
      || logits->model_dims().back() <= 0)
    return not_a_decoder(c, "output 'logits' is not FP32 [batch, sequence, vocab] with a "
                            "fixed vocab");
  s.vocab = static_cast<uint32_t>(logits->model_dims().back());
  const auto* table = input("kv_block_table");
  const auto* context = input("kv_context_lens");
  if (table || context) {
    if (!table || !context || table->dtype != datatype::int32 || context->dtype != datatype::int32)
      return not_a_decoder(c, "a paged decoder needs both INT32 inputs kv_block_table and "
                              "kv_context_lens");
    s.paged = true;
    s.block_table = table->name;
    s.context_lens = context->name;
  }
  for (uint32_t layer = 0;; ++layer) {
    std::string p = "past_key_values." + std::to_string(layer);
    std::string q = "present." + std::to_string(layer);
    const auto* pk = input(p + ".key");
    const auto* pv = input(p + ".value");
    const auto* qk = output(q + ".key");
    const auto* qv = output(q + ".value");
    if (s.paged ? !qk : !pk)
      break;
    if (s.paged && (pk || pv))
      return not_a_decoder(c, "a paged decoder takes no past tensors, but it has " + p);
    if ((!s.paged && !pv) || !qk || !qv)
      return not_a_decoder(c, "layer " + std::to_string(layer) + " lacks one of " + p
                                + ".value, " + q + ".key, " + q + ".value");
    std::vector<const tensor_config*> cache{qk, qv};
    if (!s.paged)
      cache = {pk, pv, qk, qv};
    for (const auto* t : cache) {
      const auto& d = t->model_dims();
      // onnxruntime-genai leaves the head size symbolic ("kv_cache_dim"):
      // genai_config.json's head_size gives it.
      bool dim_known = !d.empty() && (d.back() > 0 || hints.head_dim > 0);
      if (t->dtype != datatype::fp32 || d.size() < 3 || d[d.size() - 3] <= 0 || !dim_known)
        return not_a_decoder(c, "'" + t->name + "' is not FP32 [batch, kv_heads, positions, "
                                "head_dim] with fixed kv_heads and head_dim (or head_size "
                                "in genai_config.json)");
      uint32_t heads = static_cast<uint32_t>(d[d.size() - 3]);
      uint32_t dim = d.back() > 0 ? static_cast<uint32_t>(d.back()) : hints.head_dim;
      if (hints.head_dim > 0 && dim != hints.head_dim)
        return not_a_decoder(c, "'" + t->name + "' has head_dim " + std::to_string(dim)
                                + " but genai_config.json says head_size "
                                + std::to_string(hints.head_dim));
      if (s.kv_heads == 0) {
        s.kv_heads = heads;
        s.head_dim = dim;
      } else if (s.kv_heads != heads || s.head_dim != dim) {
        return not_a_decoder(c, "'" + t->name + "' has other kv_heads or head_dim than layer 0");
      }
    }
    if (!s.paged) {
      s.past_keys.push_back(pk->name);
      s.past_values.push_back(pv->name);
    }
    s.present_keys.push_back(qk->name);
    s.present_values.push_back(qv->name);
  }
  if (s.present_keys.empty())
    return not_a_decoder(c, s.paged ? "it has no output 'present.0.key'"
                                    : "it has no input 'past_key_values.0.key'");
  for (const auto& t : c.inputs) {
    bool known = t.name == s.input_ids || t.name == s.attention_mask
                 || t.name == s.position_ids
                 || (s.paged && (t.name == s.block_table || t.name == s.context_lens))
                 || std::find(s.past_keys.begin(), s.past_keys.end(), t.name) != s.past_keys.end()
                 || std::find(s.past_values.begin(), s.past_values.end(), t.name)
                      != s.past_values.end();
    if (!known && !t.optional)
      return not_a_decoder(c, "it takes input '" + t.name + "', which a decoding step cannot "
                              "fill");
    if (known)
      s.input_order.push_back(t.name);
  }
  return s;
}

decoder_runner::decoder_runner(decoder_signature signature, std::shared_ptr<backend> model,
                               kv_cache_layout cache, decoder_runner_config config)
  : sig_(std::move(signature)), model_(std::move(model)), cache_(cache), config_(config) {
  if (config_.past_bucket == 0 || config_.max_batch == 0)
    throw std::invalid_argument("decoder_runner: past_bucket and max_batch must be positive");
  past_.resize(2 * sig_.past_keys.size());
  if (sig_.paged != (config_.kv_pool != 0))
    throw std::invalid_argument("decoder_runner: a paged decoder needs its kv_pool handle, "
                                "and only a paged decoder takes one");
  if (sig_.paged)
    bind_external_memory(config_.kv_pool, {cache_.data(), cache_.floats()});
}

decoder_runner::~decoder_runner() {
  if (sig_.paged)
    unbind_external_memory(config_.kv_pool);
}

void decoder_runner::paged_inputs(const std::vector<const decoder_step_item*>& items,
                                  uint32_t rows) {
  const uint32_t block_tokens = cache_.layout().block_tokens;
  uint32_t width = 1;
  for (const auto* it : items)
    width = std::max(width, (it->first_position + block_tokens - 1) / block_tokens);
  table_width_ = round_up(width, std::max(1u, config_.past_bucket / block_tokens));
  table_.assign(size_t{rows} * table_width_, 0);
  context_.assign(rows, 0);
  for (uint32_t r = 0; r < items.size(); ++r) {
    const auto& blocks = cache_.blocks(items[r]->seq);
    uint32_t used = (items[r]->first_position + block_tokens - 1) / block_tokens;
    std::copy(blocks.begin(), blocks.begin() + used, table_.begin() + size_t{r} * table_width_);
    context_[r] = static_cast<int32_t>(items[r]->first_position);
  }
}

result<std::vector<float>> decoder_runner::run(const std::vector<decoder_step_item>& items) {
  std::vector<size_t> slot(items.size(), SIZE_MAX);
  size_t emitting = 0;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].emits)
      slot[i] = emitting++;
  std::vector<float> logits(emitting * size_t{sig_.vocab});
  std::vector<const decoder_step_item*> group;
  std::vector<size_t> group_slots;
  auto flush = [&]() -> std::variant<std::monostate, serving_error> {
    for (size_t begin = 0; begin < group.size(); begin += config_.max_batch) {
      size_t end = std::min(group.size(), begin + config_.max_batch);
      std::vector<const decoder_step_item*> part(group.begin() + begin, group.begin() + end);
      std::vector<size_t> part_slots(group_slots.begin() + begin, group_slots.begin() + end);
      auto r = run_group(part, logits, part_slots);
      if (!std::holds_alternative<std::monostate>(r))
        return r;
    }
    group.clear();
    group_slots.clear();
    return std::monostate{};
  };
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].count == 0)
      continue;
    if (items[i].count == 1) {
      group.push_back(&items[i]);
      group_slots.push_back(slot[i]);
      continue;
    }
    auto r = run_group({&items[i]}, logits, {slot[i]});
    if (auto* e = std::get_if<serving_error>(&r))
      return *e;
  }
  auto r = flush();
  if (auto* e = std::get_if<serving_error>(&r))
    return *e;
  return logits;
}

std::variant<std::monostate, serving_error>
decoder_runner::run_group(const std::vector<const decoder_step_item*>& items,
                          std::vector<float>& logits, const std::vector<size_t>& logits_slot) {
  const uint32_t layers = sig_.layers();
  const uint32_t heads = sig_.kv_heads, dim = sig_.head_dim;
  uint32_t tokens = 0, longest_past = 0;
  for (const auto* it : items) {
    tokens = std::max<uint32_t>(tokens, static_cast<uint32_t>(it->count));
    longest_past = std::max(longest_past, it->first_position);
    if (!cache_.reserve(it->seq, it->first_position + static_cast<uint32_t>(it->count)))
      throw std::logic_error("decoder_runner: the KV cache has no block left for sequence "
                             + std::to_string(it->seq)
                             + " (the scheduler's block count disagrees with the cache's)");
  }
  const uint32_t rows = items.size() == 1 ? 1 : batch_bucket(static_cast<uint32_t>(items.size()),
                                                              config_.max_batch);
  // masked: slot 0 is a masked placeholder, slots 1..first_position the cache.
  // left_aligned: slots 0..first_position - 1 the cache (at least one slot).
  // paged: no past tensors; the mask covers the new tokens only.
  const bool paged = sig_.paged;
  const bool left = !paged && sig_.layout == past_layout::left_aligned;
  const uint32_t front = left ? 0 : 1;
  const uint32_t past =
    paged ? 0 : round_up(std::max(longest_past + front, 1u), config_.past_bucket);
  const uint32_t total = past + tokens;
  if (left)
    for (const auto* it : items)
      if (it->count != tokens)
        throw std::logic_error("decoder_runner: a left-aligned step's rows must all compute "
                               "the same number of tokens (seqlens_k counts them)");

  ids_.assign(size_t{rows} * tokens, 0);
  positions_.assign(size_t{rows} * tokens, 0);
  mask_.assign(size_t{rows} * total, 0);
  for (uint32_t r = 0; r < rows; ++r) {
    const decoder_step_item* it = r < items.size() ? items[r] : nullptr;
    uint32_t n = it ? static_cast<uint32_t>(it->count) : tokens;
    for (uint32_t j = 0; j < tokens; ++j) {
      if (it && j < n)
        ids_[size_t{r} * tokens + j] = it->tokens[j];
      positions_[size_t{r} * tokens + j] = (it ? it->first_position : 0) + j;
    }
    int64_t* m = &mask_[size_t{r} * total];
    if (paged) {
      std::fill(m, m + tokens, 1);
    } else if (left) {
      // seqlens_k = first_position + n - 1; a padding row has no past.
      std::fill(m, m + (it ? it->first_position : 0) + n, 1);
    } else {
      if (it)
        std::fill(m + 1, m + 1 + it->first_position, 1);
      std::fill(m + past, m + past + n, 1);
    }
  }
  const size_t past_floats = size_t{rows} * heads * past * dim;
  if (paged)
    paged_inputs(items, rows);
  for (uint32_t l = 0; l < layers && !paged; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      auto& buf = past_[2 * l + kv];
      buf.assign(past_floats, 0.0f);
      for (uint32_t r = 0; r < items.size(); ++r)
        for (uint32_t h = 0; h < heads; ++h)
          for (uint32_t p = 0; p < items[r]->first_position; ++p)
            std::memcpy(&buf[((size_t{r} * heads + h) * past + front + p) * dim],
                        cache_.row(items[r]->seq, l, kv == 1, h, p), dim * sizeof(float));
    }
  }

  auto view_of = [](std::string_view name, datatype dt, std::vector<int64_t> shape,
                    const void* data, size_t bytes) {
    tensor_view v;
    v.name = name;
    v.dtype = dt;
    v.shape = std::move(shape);
    v.data = static_cast<const uint8_t*>(data);
    v.size = bytes;
    return v;
  };
  auto int_view = [&](const std::string& name, datatype dt, const std::vector<int64_t>& values,
                      std::vector<int32_t>& narrow, std::vector<int64_t> shape) {
    if (dt == datatype::int64)
      return view_of(name, dt, std::move(shape), values.data(), values.size() * 8);
    narrow.assign(values.begin(), values.end());
    return view_of(name, dt, std::move(shape), narrow.data(), narrow.size() * 4);
  };
  batch_view batch;
  batch.rows = rows;
  for (const auto& name : sig_.input_order) {
    if (name == sig_.input_ids) {
      batch.inputs.push_back(int_view(name, sig_.ids_dtype, ids_, ids32_, {rows, tokens}));
    } else if (name == sig_.attention_mask) {
      batch.inputs.push_back(int_view(name, sig_.mask_dtype, mask_, mask32_, {rows, total}));
    } else if (name == sig_.position_ids) {
      batch.inputs.push_back(int_view(name, sig_.ids_dtype, positions_, positions32_,
                                      {rows, tokens}));
    } else if (paged && name == sig_.block_table) {
      batch.inputs.push_back(view_of(name, datatype::int32, {rows, table_width_}, table_.data(),
                                     table_.size() * 4));
    } else if (paged && name == sig_.context_lens) {
      batch.inputs.push_back(view_of(name, datatype::int32, {rows, 1}, context_.data(),
                                     context_.size() * 4));
    } else {
      for (uint32_t l = 0; l < layers; ++l)
        for (int kv = 0; kv < 2; ++kv)
          if (name == (kv ? sig_.past_values : sig_.past_keys)[l])
            batch.inputs.push_back(view_of(name, datatype::fp32, {rows, heads, past, dim},
                                           past_[2 * l + kv].data(), past_floats * 4));
    }
  }
  auto& out = outputs_;
  auto status = model_->execute(batch, out);
  if (!std::holds_alternative<std::monostate>(status))
    return status;

  auto tensor = [&](const std::string& name, size_t want) -> const float* {
    auto i = out.outputs.find(name);
    if (i == out.outputs.end() || i->second.bytes.size() != want * sizeof(float))
      return nullptr;
    return reinterpret_cast<const float*>(i->second.bytes.data());
  };
  // [rows, tokens, vocab], or the last position's alone (onnx/passes_decoder.hpp's
  // last_position_logits): every row of a group computes `tokens` tokens.
  const float* out_logits = tensor(sig_.logits, size_t{rows} * tokens * sig_.vocab);
  const bool last_only = !out_logits && tokens > 1;
  if (last_only)
    out_logits = tensor(sig_.logits, size_t{rows} * sig_.vocab);
  if (!out_logits)
    return serving_error{status_code::internal,
                         "the decoder's output '" + sig_.logits + "' is not [" +
                           std::to_string(rows) + ", " + std::to_string(tokens) + ", " +
                           std::to_string(sig_.vocab) + "]"};
  // A paged decoder's present holds the new positions alone.
  const uint32_t present_positions = paged ? tokens : total;
  const size_t present_floats = size_t{rows} * heads * present_positions * dim;
  for (uint32_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::string& name = (kv ? sig_.present_values : sig_.present_keys)[l];
      const float* present = tensor(name, present_floats);
      if (!present)
        return serving_error{status_code::internal,
                             "the decoder's output '" + name + "' is not [batch, kv_heads, "
                             "past + sequence, head_dim] = [" + std::to_string(rows) + ", " +
                               std::to_string(heads) + ", "
                               + std::to_string(present_positions) + ", " +
                               std::to_string(dim) + "]"};
      for (uint32_t r = 0; r < items.size(); ++r) {
        const uint32_t at = paged ? 0 : left ? items[r]->first_position : past;
        for (uint32_t h = 0; h < heads; ++h)
          for (uint32_t j = 0; j < items[r]->count; ++j)
            std::memcpy(cache_.row(items[r]->seq, l, kv == 1, h, items[r]->first_position + j),
                        &present[((size_t{r} * heads + h) * present_positions + at + j) * dim],
                        dim * sizeof(float));
      }
    }
  }
  for (uint32_t r = 0; r < items.size(); ++r) {
    if (logits_slot[r] == SIZE_MAX)
      continue;
    size_t at = last_only ? r : size_t{r} * tokens + items[r]->count - 1;
    std::memcpy(&logits[logits_slot[r] * sig_.vocab], &out_logits[at * sig_.vocab],
                sig_.vocab * sizeof(float));
  }
  return std::monostate{};
}

} // namespace caf_serving::executor
