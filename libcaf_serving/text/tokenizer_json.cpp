/// Reading tokenizer.json into the pipeline (tokenizer_impl.hpp): every
/// component this library cannot run exactly as HF does is refused here.
#include "text/tokenizer.hpp"

#include "text/tokenizer_impl.hpp"
#include "text/unicode.hpp"

#include <simdjson.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace caf_serving::text {

using namespace detail;

namespace {

using simdjson::dom::element;

serving_error load_error(std::string what) {
  return bad_request("tokenizer.json: " + std::move(what));
}

// By value: a range-for over value_unsafe() of a temporary result would
// iterate a dangling reference.
simdjson::dom::array array_of(element e) {
  simdjson::dom::array a = e.get_array().value_unsafe();
  return a;
}
simdjson::dom::object object_of(element e) {
  simdjson::dom::object o = e.get_object().value_unsafe();
  return o;
}

/// The member `key` of `e` if present and not null.
std::optional<element> member(element e, std::string_view key) {
  auto r = e[key];
  if (r.error() || r.value_unsafe().is_null())
    return std::nullopt;
  return r.value_unsafe();
}

std::optional<std::string> string_member(element e, std::string_view key) {
  auto m = member(e, key);
  if (!m || !m->is_string())
    return std::nullopt;
  return std::string{m->get_string().value_unsafe()};
}

bool bool_member(element e, std::string_view key, bool fallback) {
  auto m = member(e, key);
  return m && m->is_bool() ? m->get_bool().value_unsafe() : fallback;
}

std::string type_of(element e) {
  return string_member(e, "type").value_or("(no type)");
}

/// A string Replace pattern ({"String": "..."}); a Regex one is refused.
result<std::string> string_pattern(element e, std::string_view where) {
  auto p = member(e, "pattern");
  if (p)
    if (auto s = string_member(*p, "String"))
      return *s;
  return load_error(std::string{where} + " has a pattern that is not {\"String\": ...}; only "
                    "literal string patterns are supported here");
}

result<std::vector<normalizer_step>> parse_normalizer(std::optional<element> e) {
  std::vector<normalizer_step> steps;
  if (!e)
    return steps;
  auto type = type_of(*e);
  if (type == "Sequence") {
    auto list = member(*e, "normalizers");
    if (!list || !list->is_array())
      return load_error("normalizer Sequence has no \"normalizers\" list");
    for (element child : array_of(*list)) {
      auto sub = parse_normalizer(child);
      if (!sub)
        return sub.error();
      steps.insert(steps.end(), sub->begin(), sub->end());
    }
  } else if (type == "Prepend") {
    steps.push_back(prepend_step{string_member(*e, "prepend").value_or("")});
  } else if (type == "NFC") {
    steps.push_back(nfc_step{});
  } else if (type == "Replace") {
    auto pattern = string_pattern(*e, "normalizer Replace");
    if (!pattern)
      return pattern.error();
    steps.push_back(replace_step{*pattern, string_member(*e, "content").value_or("")});
  } else {
    return load_error("normalizer \"" + type + "\" is not supported (supported: Sequence, NFC, "
                      "Prepend, Replace with a string pattern); its ids would differ from "
                      "Hugging Face's");
  }
  return steps;
}

result<prepend_scheme> parse_prepend_scheme(element e) {
  auto scheme = string_member(e, "prepend_scheme");
  if (!scheme) // older files: add_prefix_space
    return bool_member(e, "add_prefix_space", true) ? prepend_scheme::always
                                                    : prepend_scheme::never;
  if (*scheme == "first")
    return prepend_scheme::first;
  if (*scheme == "always")
    return prepend_scheme::always;
  if (*scheme == "never")
    return prepend_scheme::never;
  return load_error("Metaspace prepend_scheme \"" + *scheme
                    + "\" is unknown (expected first, always or never)");
}

result<std::vector<pre_tokenizer_step>> parse_pre_tokenizer(std::optional<element> e) {
  std::vector<pre_tokenizer_step> steps;
  if (!e)
    return steps;
  auto type = type_of(*e);
  if (type == "Sequence") {
    auto list = member(*e, "pretokenizers");
    if (!list || !list->is_array())
      return load_error("pre_tokenizer Sequence has no \"pretokenizers\" list");
    for (element child : array_of(*list)) {
      auto sub = parse_pre_tokenizer(child);
      if (!sub)
        return sub.error();
      steps.insert(steps.end(), sub->begin(), sub->end());
    }
  } else if (type == "ByteLevel") {
    steps.push_back(byte_level_step{bool_member(*e, "add_prefix_space", true),
                                    bool_member(*e, "use_regex", true)});
  } else if (type == "Split") {
    auto pattern = member(*e, "pattern");
    auto regex = pattern ? string_member(*pattern, "Regex") : std::nullopt;
    if (!regex)
      return load_error("pre_tokenizer Split has no {\"Regex\": ...} pattern; only the regex "
                        "patterns of GPT-2, Llama-3 and Qwen2 are supported");
    auto known = known_split_pattern(*regex);
    if (!known)
      return load_error("pre_tokenizer Split pattern " + *regex + " is not one this tokenizer "
                        "has a matcher for (GPT-2's, Llama-3's, Qwen2's)");
    auto behavior = string_member(*e, "behavior").value_or("");
    if (behavior != "Isolated" || bool_member(*e, "invert", false))
      return load_error("pre_tokenizer Split with behavior \"" + behavior
                        + "\" (invert " + (bool_member(*e, "invert", false) ? "true" : "false")
                        + ") is not supported; only Isolated without invert is");
    steps.push_back(split_step{*known});
  } else if (type == "Metaspace") {
    auto scheme = parse_prepend_scheme(*e);
    if (!scheme)
      return scheme.error();
    steps.push_back(metaspace_step{string_member(*e, "replacement").value_or(metaspace_default),
                                   *scheme, bool_member(*e, "split", true)});
  } else {
    return load_error("pre_tokenizer \"" + type + "\" is not supported (supported: ByteLevel, "
                      "Split with the GPT-2, Llama-3 or Qwen2 regex, Metaspace, Sequence); its "
                      "ids would differ from Hugging Face's");
  }
  return steps;
}

result<std::vector<decoder_step>> parse_decoder(element e) {
  std::vector<decoder_step> steps;
  auto type = type_of(e);
  if (type == "Sequence") {
    auto list = member(e, "decoders");
    if (!list || !list->is_array())
      return load_error("decoder Sequence has no \"decoders\" list");
    for (element child : array_of(*list)) {
      auto sub = parse_decoder(child);
      if (!sub)
        return sub.error();
      steps.insert(steps.end(), sub->begin(), sub->end());
    }
  } else if (type == "ByteLevel") {
    steps.push_back(byte_level_decoder{});
  } else if (type == "Replace") {
    auto pattern = string_pattern(e, "decoder Replace");
    if (!pattern)
      return pattern.error();
    steps.push_back(replace_decoder{*pattern, string_member(e, "content").value_or("")});
  } else if (type == "ByteFallback") {
    steps.push_back(byte_fallback_decoder{});
  } else if (type == "Fuse") {
    steps.push_back(fuse_decoder{});
  } else if (type == "Strip") {
    auto content = string_member(e, "content").value_or(" ");
    auto c = next_utf8(content, 0);
    if (content.empty() || c.size != content.size())
      return load_error("decoder Strip content \"" + content + "\" is not one character");
    auto count = [&](std::string_view key) -> size_t {
      auto m = member(e, key);
      return m && m->is_uint64() ? m->get_uint64().value_unsafe() : 0;
    };
    steps.push_back(strip_decoder{c.c, count("start"), count("stop")});
  } else if (type == "Metaspace") {
    auto scheme = parse_prepend_scheme(e);
    if (!scheme)
      return scheme.error();
    steps.push_back(metaspace_decoder{string_member(e, "replacement").value_or(metaspace_default),
                                      *scheme != prepend_scheme::never});
  } else {
    return load_error("decoder \"" + type + "\" is not supported (supported: ByteLevel, "
                      "Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)");
  }
  return steps;
}

/// TemplateProcessing's "single", or nothing to add (ByteLevel, none).
result<std::optional<std::vector<template_item>>> parse_post_processor(std::optional<element> e) {
  std::optional<std::vector<template_item>> out;
  if (!e)
    return out;
  auto type = type_of(*e);
  if (type == "Sequence") {
    auto list = member(*e, "processors");
    if (!list || !list->is_array())
      return load_error("post_processor Sequence has no \"processors\" list");
    for (element child : array_of(*list)) {
      auto sub = parse_post_processor(child);
      if (!sub)
        return sub.error();
      if (*sub) {
        if (out)
          return load_error("post_processor Sequence holds two TemplateProcessing steps");
        out = std::move(*sub);
      }
    }
    return out;
  }
  if (type == "ByteLevel") // offsets only; the ids stay as they are
    return out;
  if (type != "TemplateProcessing")
    return load_error("post_processor \"" + type + "\" is not supported (supported: "
                      "TemplateProcessing, ByteLevel, Sequence)");
  auto single = member(*e, "single");
  auto specials = member(*e, "special_tokens");
  if (!single || !single->is_array())
    return load_error("post_processor TemplateProcessing has no \"single\" template");
  std::vector<template_item> items;
  for (element item : array_of(*single)) {
    if (auto seq = member(item, "Sequence")) {
      if (string_member(*seq, "id").value_or("A") != "A")
        return load_error("post_processor TemplateProcessing single template names sequence "
                          "B; a single text has only A");
      items.push_back({});
    } else if (auto sp = member(item, "SpecialToken")) {
      auto name = string_member(*sp, "id").value_or("");
      auto entry = specials ? member(*specials, name) : std::nullopt;
      auto ids = entry ? member(*entry, "ids") : std::nullopt;
      if (!ids || !ids->is_array())
        return load_error("post_processor TemplateProcessing uses special token \"" + name
                          + "\" that its special_tokens does not list");
      template_item t;
      for (element id : array_of(*ids))
        t.special_ids.push_back(static_cast<int32_t>(id.get_int64().value_unsafe()));
      items.push_back(std::move(t));
    } else {
      return load_error("post_processor TemplateProcessing has an item that is neither "
                        "Sequence nor SpecialToken");
    }
  }
  out = std::move(items);
  return out;
}

result<bpe_config> parse_model(element e) {
  auto type = type_of(e);
  if (type != "BPE" && !(type == "(no type)" && member(e, "merges")))
    return load_error("model type \"" + type + "\" is not supported (supported: BPE)");
  if (auto d = member(e, "dropout"); d && d->is_number() && d->get_double().value_unsafe() > 0)
    return load_error("model BPE has dropout, which makes tokenization random; serve a file "
                      "with \"dropout\": null");
  for (auto key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto s = string_member(e, key); s && !s->empty())
      return load_error(std::string{"model BPE "} + key + " \"" + *s + "\" is not supported");
  bpe_config config;
  auto vocab = member(e, "vocab");
  if (!vocab || !vocab->is_object())
    return load_error("model has no \"vocab\" object");
  for (auto [key, value] : object_of(*vocab)) {
    if (!value.is_int64())
      return load_error("model.vocab entry \"" + std::string{key} + "\" is not an integer id");
    config.vocab.emplace_back(std::string{key},
                              static_cast<int32_t>(value.get_int64().value_unsafe()));
  }
  auto merges = member(e, "merges");
  if (merges && merges->is_array()) {
    for (element m : array_of(*merges)) {
      if (m.is_string()) { // "a b"
        std::string_view s = m.get_string().value_unsafe();
        auto space = s.find(' ');
        if (space == std::string_view::npos)
          return load_error("model.merges entry \"" + std::string{s} + "\" is not \"a b\"");
        config.merges.emplace_back(std::string{s.substr(0, space)},
                                   std::string{s.substr(space + 1)});
      } else if (m.is_array() && array_of(m).size() == 2) { // ["a", "b"]
        auto pair = array_of(m);
        auto a = pair.at(0).get_string();
        auto b = pair.at(1).get_string();
        if (a.error() || b.error())
          return load_error("model.merges has a pair that is not two strings");
        config.merges.emplace_back(std::string{a.value_unsafe()}, std::string{b.value_unsafe()});
      } else {
        return load_error("model.merges has an entry that is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
  }
  config.unk_token = string_member(e, "unk_token");
  config.byte_fallback = bool_member(e, "byte_fallback", false);
  config.fuse_unk = bool_member(e, "fuse_unk", false);
  config.ignore_merges = bool_member(e, "ignore_merges", false);
  return config;
}

} // namespace

result<tokenizer> tokenizer::load(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded{json};
  auto doc = parser.parse(padded);
  if (doc.error())
    return load_error(std::string{"not valid JSON: "} + simdjson::error_message(doc.error()));
  element root = doc.value_unsafe();

  auto p = std::make_shared<impl>();
  auto model = member(root, "model");
  if (!model)
    return load_error("has no \"model\"");
  auto config = parse_model(*model);
  if (!config)
    return config.error();
  auto bpe = bpe_model::create(std::move(*config));
  if (!bpe)
    return bpe.error();
  p->model = std::move(*bpe);

  auto normalizers = parse_normalizer(member(root, "normalizer"));
  if (!normalizers)
    return normalizers.error();
  p->normalizers = std::move(*normalizers);
  auto pre = parse_pre_tokenizer(member(root, "pre_tokenizer"));
  if (!pre)
    return pre.error();
  p->pre_tokenizers = std::move(*pre);
  for (size_t i = 0; i < p->pre_tokenizers.size(); ++i)
    if (std::holds_alternative<byte_level_step>(p->pre_tokenizers[i])) {
      if (i + 1 != p->pre_tokenizers.size())
        return load_error("pre_tokenizer ByteLevel is followed by another pre-tokenizer; only "
                          "a ByteLevel last in the Sequence is supported");
      p->byte_level = true;
    }
  auto post = parse_post_processor(member(root, "post_processor"));
  if (!post)
    return post.error();
  p->post_template = std::move(*post);
  if (auto d = member(root, "decoder")) {
    auto steps = parse_decoder(*d);
    if (!steps)
      return steps.error();
    p->decoders = std::move(*steps);
  }

  // Ids to tokens: the model's, then the added tokens' (which win, as in HF).
  int32_t max_id = -1;
  for (const auto& [token, id] : p->model->vocab())
    max_id = std::max(max_id, id);
  if (auto list = member(root, "added_tokens"); list && list->is_array()) {
    for (element t : array_of(*list)) {
      added_token a;
      auto id = member(t, "id");
      auto content = string_member(t, "content");
      if (!id || !id->is_int64() || !content)
        return load_error("an added_tokens entry lacks an integer \"id\" or a \"content\"");
      a.id = static_cast<int32_t>(id->get_int64().value_unsafe());
      a.content = *content;
      a.single_word = bool_member(t, "single_word", false);
      a.lstrip = bool_member(t, "lstrip", false);
      a.rstrip = bool_member(t, "rstrip", false);
      a.normalized = bool_member(t, "normalized", true);
      a.special = bool_member(t, "special", false);
      if (a.id < 0)
        return load_error("added token \"" + a.content + "\" has a negative id");
      max_id = std::max(max_id, a.id);
      p->added.push_back(std::move(a));
    }
  }
  p->id_to_token.resize(static_cast<size_t>(max_id + 1));
  p->special.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : p->model->vocab())
    if (id >= 0)
      p->id_to_token[id] = token;
  for (size_t i = 0; i < p->added.size(); ++i) {
    const auto& a = p->added[i];
    // HF names a normalized token by its normalized text (what decode shows).
    p->id_to_token[a.id] = a.normalized ? p->normalize(a.content) : a.content;
    p->special[a.id] = a.special;
    p->added_by_content[a.content] = a.id;
    if (a.normalized)
      p->normalized_tokens.add(p->normalize(a.content), i);
    else
      p->raw_tokens.add(a.content, i);
  }
  p->raw_tokens.finish();
  p->normalized_tokens.finish();

  p->specials.unk = p->model->unk_id();
  if (p->post_template && !p->post_template->empty()
      && !p->post_template->front().special_ids.empty())
    p->specials.bos = p->post_template->front().special_ids.front();
  for (std::string_view name :
       {"</s>", "<|endoftext|>", "<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<eos>"}) {
    auto it = p->added_by_content.find(std::string{name});
    if (it != p->added_by_content.end() && p->special[it->second]) {
      p->specials.eos = it->second;
      break;
    }
  }
  return tokenizer{std::move(p)};
}

result<tokenizer> tokenizer::load_file(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in)
    return bad_request("cannot read tokenizer file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  auto tok = load(text.str());
  if (!tok)
    return bad_request(path + ": " + tok.error().message);
  return tok;
}

} // namespace caf_serving::text
