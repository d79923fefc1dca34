#include "text/tokenizer.hpp"

#include "text/bpe.hpp"
#include "text/pre_tokenizer.hpp"
#include "text/unicode.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>
#include <variant>

namespace caf_serving::text {

namespace {

// C++17's strings have neither.
bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

const std::string metaspace_default = "\xE2\x96\x81"; // ▁

// -- the pipeline's steps, as plain data ---------------------------------------

struct prepend_step {
  std::string text;
};
struct replace_step {
  std::string pattern;
  std::string content;
};
struct nfc_step {};
using normalizer_step = std::variant<prepend_step, replace_step, nfc_step>;

enum class prepend_scheme { first, always, never };

struct split_step {
  split_pattern pattern;
};
struct byte_level_step {
  bool add_prefix_space;
  bool use_regex;
};
struct metaspace_step {
  std::string replacement;
  prepend_scheme scheme;
  bool split;
};
using pre_tokenizer_step = std::variant<split_step, byte_level_step, metaspace_step>;

struct byte_level_decoder {};
struct replace_decoder {
  std::string pattern;
  std::string content;
};
struct byte_fallback_decoder {};
struct fuse_decoder {};
struct strip_decoder {
  char32_t content;
  size_t start;
  size_t stop;
};
struct metaspace_decoder {
  std::string replacement;
  bool strip_first;
};
using decoder_step = std::variant<byte_level_decoder, replace_decoder, byte_fallback_decoder,
                                  fuse_decoder, strip_decoder, metaspace_decoder>;

/// TemplateProcessing's "single": special ids, or where the text's ids go.
struct template_item {
  std::vector<int32_t> special_ids; ///< empty: the sequence itself
};

// -- added tokens --------------------------------------------------------------

/// The added tokens of one kind (raw or normalized), found leftmost-longest as
/// HF's Aho-Corasick matcher (MatchKind::LeftmostLongest) finds them.
class added_matcher {
public:
  void add(std::string pattern, size_t token) {
    if (pattern.empty())
      return;
    first_bytes_[static_cast<uint8_t>(pattern[0])] = true;
    by_first_[static_cast<uint8_t>(pattern[0])].push_back({std::move(pattern), token});
  }
  void finish() {
    for (auto& bucket : by_first_)
      std::sort(bucket.begin(), bucket.end(),
                [](const entry& a, const entry& b) { return a.text.size() > b.text.size(); });
  }
  bool empty() const { return std::none_of(first_bytes_.begin(), first_bytes_.end(),
                                           [](bool b) { return b; }); }

  struct match {
    size_t begin;
    size_t end;
    size_t token;
  };
  /// The next match at or after `from`.
  std::optional<match> find(std::string_view text, size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      auto b = static_cast<uint8_t>(text[i]);
      if (!first_bytes_[b])
        continue;
      for (const auto& e : by_first_[b]) // longest first
        if (text.compare(i, e.text.size(), e.text) == 0)
          return match{i, i + e.text.size(), e.token};
    }
    return std::nullopt;
  }

private:
  struct entry {
    std::string text;
    size_t token;
  };
  std::array<bool, 256> first_bytes_{};
  std::array<std::vector<entry>, 256> by_first_;
};

/// A piece of the text: an added token's id, or text still to tokenize.
struct added_split {
  size_t begin;
  size_t end;
  std::optional<int32_t> id;
};

/// The character that ends `s` (not empty), read as next_utf8 would read it.
utf8_char last_char(std::string_view s) {
  for (size_t back = 2; back <= 4 && back <= s.size(); ++back) {
    auto u = next_utf8(s, s.size() - back);
    if (u.size == back)
      return u;
  }
  return next_utf8(s, s.size() - 1);
}

// -- small helpers -----------------------------------------------------------

void replace_all(std::string& s, std::string_view pattern, std::string_view content) {
  if (pattern.empty() || s.find(pattern) == std::string::npos)
    return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(pattern, pos)) != std::string::npos; pos = hit + pattern.size())
    out.append(s, pos, hit - pos).append(content);
  out.append(s, pos);
  s = std::move(out);
}

} // namespace

// -- the loaded tokenizer ----------------------------------------------------

struct tokenizer::impl {
  std::unique_ptr<bpe_model> model;
  std::vector<normalizer_step> normalizers;
  std::vector<pre_tokenizer_step> pre_tokenizers;
  bool byte_level = false; ///< words are mapped to ByteLevel characters last
  std::optional<std::vector<template_item>> post_template;
  std::optional<std::vector<decoder_step>> decoders; ///< none: tokens joined by spaces

  std::vector<added_token> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  added_matcher raw_tokens;
  added_matcher normalized_tokens;
  std::vector<std::string> id_to_token; ///< the model's, then the added tokens'
  std::vector<bool> special;
  special_token_ids specials;

  std::string normalize(std::string_view text) const;
  std::vector<added_split> split_added(std::string_view text, const added_matcher& m) const;
  void tokenize_piece(std::string_view piece, bool at_start, std::vector<int32_t>& ids) const;
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const;
  std::string decode(const int32_t* first, const int32_t* last, decode_options options) const;
};

std::string tokenizer::impl::normalize(std::string_view text) const {
  std::string s{text};
  for (const auto& step : normalizers) {
    if (auto* p = std::get_if<prepend_step>(&step)) {
      if (!s.empty())
        s.insert(0, p->text);
    } else if (std::holds_alternative<nfc_step>(step)) {
      s = nfc(s);
    } else {
      const auto& r = std::get<replace_step>(step);
      replace_all(s, r.pattern, r.content);
    }
  }
  return s;
}

std::vector<added_split> tokenizer::impl::split_added(std::string_view text,
                                                       const added_matcher& m) const {
  std::vector<added_split> out;
  size_t done = 0; // text before this is in `out`
  for (size_t from = 0; auto hit = m.find(text, from);) {
    // As HF's Aho-Corasick iterator: the next match starts after this one, even
    // when single_word rejects this one.
    from = hit->end;
    const auto& tok = added[hit->token];
    size_t begin = hit->begin;
    size_t end = hit->end;
    if (tok.single_word) {
      bool word_before = begin > 0 && is_word_char(last_char(text.substr(0, begin)).c);
      bool word_after = end < text.size() && is_word_char(next_utf8(text, end).c);
      if (word_before || word_after)
        continue;
    }
    if (tok.lstrip) {
      size_t b = begin;
      for (utf8_char u; b > 0 && classify((u = last_char(text.substr(0, b))).c)
                                   == char_class::whitespace;)
        b -= u.size;
      begin = std::max(b, done); // not into what an earlier token took
    }
    if (tok.rstrip)
      while (end < text.size()) {
        auto u = next_utf8(text, end);
        if (classify(u.c) != char_class::whitespace)
          break;
        end += u.size;
      }
    if (done < begin)
      out.push_back({done, begin, std::nullopt});
    out.push_back({begin, end, tok.id});
    done = end;
  }
  if (done < text.size() || text.empty())
    out.push_back({done, text.size(), std::nullopt});
  return out;
}

void tokenizer::impl::tokenize_piece(std::string_view piece, bool at_start,
                                     std::vector<int32_t>& ids) const {
  if (piece.empty()) // HF drops empty pieces before its pre-tokenizers see them
    return;
  struct word {
    std::string text;
    bool at_start;
  };
  std::vector<word> words{{std::string{piece}, at_start}};
  for (const auto& step : pre_tokenizers) {
    std::vector<word> next;
    next.reserve(words.size());
    for (auto& w : words) {
      if (auto* s = std::get_if<split_step>(&step)) {
        bool first = w.at_start;
        for (auto part : split_isolated(w.text, s->pattern)) {
          next.push_back({std::string{part}, first});
          first = false;
        }
      } else if (auto* b = std::get_if<byte_level_step>(&step)) {
        if (b->add_prefix_space && (w.text.empty() || w.text[0] != ' '))
          w.text.insert(0, " ");
        if (!b->use_regex) {
          next.push_back(std::move(w));
          continue;
        }
        bool first = w.at_start;
        for (auto part : split_isolated(w.text, split_pattern::gpt2)) {
          next.push_back({std::string{part}, first});
          first = false;
        }
      } else {
        const auto& m = std::get<metaspace_step>(step);
        replace_all(w.text, " ", m.replacement);
        bool prepend = m.scheme == prepend_scheme::always
                       || (m.scheme == prepend_scheme::first && w.at_start);
        if (prepend && w.text.compare(0, m.replacement.size(), m.replacement) != 0)
          w.text.insert(0, m.replacement);
        if (!m.split) {
          next.push_back(std::move(w));
          continue;
        }
        // Split before every replacement character (it leads the next word).
        bool first = w.at_start;
        size_t begin = 0;
        for (size_t hit = w.text.find(m.replacement, 1); hit != std::string::npos;
             hit = w.text.find(m.replacement, hit + m.replacement.size())) {
          next.push_back({w.text.substr(begin, hit - begin), first});
          first = false;
          begin = hit;
        }
        next.push_back({w.text.substr(begin), first});
      }
    }
    words = std::move(next);
  }
  for (const auto& w : words) {
    if (w.text.empty())
      continue;
    auto word_ids = model->tokenize(byte_level ? byte_level_encode(w.text) : w.text);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  }
}

std::vector<std::string> tokenizer::impl::decode_chain(std::vector<std::string> tokens) const {
  for (const auto& step : *decoders) {
    if (std::holds_alternative<byte_level_decoder>(step)) {
      // A token whose characters all stand for bytes gives those bytes, any
      // other token its own text; then the whole is repaired as UTF-8.
      std::string bytes;
      for (const auto& t : tokens) {
        size_t mark = bytes.size();
        bool all = true;
        for (size_t pos = 0; pos < t.size() && all;) {
          auto u = next_utf8(t, pos);
          auto b = byte_level_decode(u.c);
          all = b.has_value();
          if (all)
            bytes += static_cast<char>(*b);
          pos += u.size;
        }
        if (!all)
          bytes.replace(mark, std::string::npos, t);
      }
      tokens.assign(1, utf8_lossy(bytes));
    } else if (auto* r = std::get_if<replace_decoder>(&step)) {
      for (auto& t : tokens)
        replace_all(t, r->pattern, r->content);
    } else if (std::holds_alternative<byte_fallback_decoder>(step)) {
      // Runs of <0xXX> tokens become their bytes if those are valid UTF-8, or
      // one U+FFFD per byte token if not.
      std::vector<std::string> out;
      std::string run;
      size_t run_tokens = 0;
      auto end_run = [&] {
        if (run_tokens == 0)
          return;
        if (utf8_lossy(run) == run)
          out.push_back(run);
        else
          for (size_t k = 0; k < run_tokens; ++k)
            out.emplace_back("\xEF\xBF\xBD");
        run.clear();
        run_tokens = 0;
      };
      for (auto& t : tokens) {
        auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
        if (t.size() == 6 && starts_with(t, "<0x") && t[5] == '>' && hex(t[3]) && hex(t[4])) {
          run += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
          ++run_tokens;
        } else {
          end_run();
          out.push_back(std::move(t));
        }
      }
      end_run();
      tokens = std::move(out);
    } else if (std::holds_alternative<fuse_decoder>(step)) {
      std::string all;
      for (const auto& t : tokens)
        all += t;
      tokens.assign(1, std::move(all));
    } else if (auto* s = std::get_if<strip_decoder>(&step)) {
      for (auto& t : tokens) {
        std::vector<std::pair<size_t, size_t>> chars; // offset, size
        for (size_t pos = 0; pos < t.size();) {
          auto u = next_utf8(t, pos);
          chars.emplace_back(pos, u.size);
          pos += u.size;
        }
        auto is_content = [&](size_t k) { return next_utf8(t, chars[k].first).c == s->content; };
        size_t cut_front = 0;
        while (cut_front < s->start && cut_front < chars.size() && is_content(cut_front))
          ++cut_front;
        size_t cut_back = 0;
        while (cut_back < s->stop && cut_back < chars.size() - cut_front
               && is_content(chars.size() - 1 - cut_back))
          ++cut_back;
        size_t b = cut_front < chars.size() ? chars[cut_front].first : t.size();
        size_t e = cut_back > 0 ? chars[chars.size() - cut_back].first : t.size();
        t = t.substr(b, e > b ? e - b : 0);
      }
    } else {
      const auto& m = std::get<metaspace_decoder>(step);
      for (size_t i = 0; i < tokens.size(); ++i)
        replace_all(tokens[i], m.replacement, i == 0 && m.strip_first ? "" : " ");
    }
  }
  return tokens;
}

// -- loading -----------------------------------------------------------------

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

std::vector<int32_t> tokenizer::encode(std::string_view text, encode_options options) const {
  const impl& m = *impl_;
  std::vector<int32_t> ids;
  for (const auto& raw : m.split_added(text, m.raw_tokens)) {
    if (raw.id) {
      ids.push_back(*raw.id);
      continue;
    }
    auto normalized = m.normalize(text.substr(raw.begin, raw.end - raw.begin));
    for (const auto& piece : m.split_added(normalized, m.normalized_tokens)) {
      if (piece.id)
        ids.push_back(*piece.id);
      else
        m.tokenize_piece(
          std::string_view{normalized}.substr(piece.begin, piece.end - piece.begin),
          raw.begin == 0 && piece.begin == 0, ids);
    }
  }
  if (options.add_special_tokens && m.post_template) {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& item : *m.post_template) {
      if (item.special_ids.empty())
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), item.special_ids.begin(), item.special_ids.end());
    }
    return out;
  }
  return ids;
}

std::string tokenizer::decode(const std::vector<int32_t>& ids, decode_options options) const {
  return impl_->decode(ids.data(), ids.data() + ids.size(), options);
}

std::string tokenizer::impl::decode(const int32_t* first, const int32_t* last,
                                    decode_options options) const {
  const impl& m = *this;
  std::vector<std::string> tokens;
  tokens.reserve(static_cast<size_t>(last - first));
  for (const int32_t* it = first; it != last; ++it) {
    int32_t id = *it;
    if (id < 0 || static_cast<size_t>(id) >= m.id_to_token.size())
      continue;
    if (options.skip_special_tokens && m.special[id])
      continue;
    tokens.push_back(m.id_to_token[id]);
  }
  std::string text;
  if (!m.decoders) {
    for (size_t i = 0; i < tokens.size(); ++i)
      text.append(i ? " " : "").append(tokens[i]);
    return text;
  }
  for (const auto& t : m.decode_chain(std::move(tokens)))
    text += t;
  return text;
}

std::optional<int32_t> tokenizer::token_to_id(std::string_view token) const {
  const auto& added = impl_->added_by_content;
  if (auto it = added.find(std::string{token}); it != added.end())
    return it->second;
  const auto& vocab = impl_->model->vocab();
  if (auto it = vocab.find(token); it != vocab.end())
    return it->second;
  return std::nullopt;
}

std::optional<std::string_view> tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size())
    return std::nullopt;
  const auto& t = impl_->id_to_token[id];
  if (t.empty())
    return std::nullopt;
  return t;
}

size_t tokenizer::vocab_size() const {
  return impl_->id_to_token.size();
}

const special_token_ids& tokenizer::special_ids() const {
  return impl_->specials;
}

bool tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}

const std::vector<added_token>& tokenizer::added_tokens() const {
  return impl_->added;
}

// -- detokenizer -------------------------------------------------------------

namespace {
/// How many prompt tokens the first window reaches back: enough that a word's
/// leading space or a character split across tokens is decoded in context.
constexpr size_t context_tokens = 5;
} // namespace

detokenizer::detokenizer(tokenizer tok, const std::vector<int32_t>& prompt,
                         decode_options options)
  : tok_(std::move(tok)), options_(options) {
  // ByteFallback turns a whole run of byte tokens into U+FFFDs when any of it
  // is invalid, so the window must not start inside a character's bytes.
  auto continues_char = [&](int32_t id) {
    auto t = tok_.id_to_token(id);
    return t && t->size() == 6 && starts_with(*t, "<0x") && std::strchr("89AB", (*t)[3])
           && (*t)[3] != '\0';
  };
  size_t start = prompt.size() - std::min(prompt.size(), context_tokens);
  while (start > 0 && continues_char(prompt[start]))
    --start;
  window_.assign(prompt.begin() + static_cast<std::ptrdiff_t>(start), prompt.end());
  prefix_ = 0;
  read_ = window_.size();
}

std::string detokenizer::push(int32_t id) {
  window_.push_back(id);
  return emit(false);
}

std::string detokenizer::flush() {
  return emit(true);
}

std::string detokenizer::emit(bool final) {
  if (read_ == window_.size())
    return {};
  const int32_t* ids = window_.data();
  auto before = tok_.impl_->decode(ids + prefix_, ids + read_, options_);
  auto now = tok_.impl_->decode(ids + prefix_, ids + window_.size(), options_);
  if (now.size() <= before.size() || (!final && ends_with(now, "\xEF\xBF\xBD")))
    return {}; // nothing new yet, or a character still incomplete
  std::string text = now.substr(before.size());
  prefix_ = read_;
  read_ = window_.size();
  // Forget what no later window reaches.
  if (prefix_ > 64) {
    window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(prefix_));
    read_ -= prefix_;
    prefix_ = 0;
  }
  return text;
}

} // namespace caf_serving::text
