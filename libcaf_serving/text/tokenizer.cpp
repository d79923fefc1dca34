/// Running the pipeline: encode, decode and the detokenizer. What fills it
/// in from tokenizer.json is tokenizer_json.cpp.
#include "text/tokenizer.hpp"

#include "text/tokenizer_impl.hpp"
#include "text/unicode.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <variant>

namespace caf_serving::text {

using namespace detail;

namespace {

// -- small helpers -----------------------------------------------------------

// C++17's strings have neither.
bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

/// The character that ends `s` (not empty), read as next_utf8 would read it.
utf8_char last_char(std::string_view s) {
  for (size_t back = 2; back <= 4 && back <= s.size(); ++back) {
    auto u = next_utf8(s, s.size() - back);
    if (u.size == back)
      return u;
  }
  return next_utf8(s, s.size() - 1);
}

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
