#pragma once
/// Inside the tokenizer (not for its users): the pipeline a tokenizer.json
/// describes, as plain data that tokenizer_json.cpp fills in and
/// tokenizer.cpp runs.

#include "text/bpe.hpp"
#include "text/pre_tokenizer.hpp"
#include "text/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace caf_serving::text {

namespace detail {

inline const std::string metaspace_default = "\xE2\x96\x81"; // ▁

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

} // namespace detail

/// Immutable once loaded; every tokenizer copy shares one.
struct tokenizer::impl {
  std::unique_ptr<bpe_model> model;
  std::vector<detail::normalizer_step> normalizers;
  std::vector<detail::pre_tokenizer_step> pre_tokenizers;
  bool byte_level = false; ///< words are mapped to ByteLevel characters last
  std::optional<std::vector<detail::template_item>> post_template;
  std::optional<std::vector<detail::decoder_step>> decoders; ///< none: tokens joined by spaces

  std::vector<added_token> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  detail::added_matcher raw_tokens;
  detail::added_matcher normalized_tokens;
  std::vector<std::string> id_to_token; ///< the model's, then the added tokens'
  std::vector<bool> special;
  special_token_ids specials;

  std::string normalize(std::string_view text) const;
  std::vector<detail::added_split> split_added(std::string_view text,
                                               const detail::added_matcher& m) const;
  void tokenize_piece(std::string_view piece, bool at_start, std::vector<int32_t>& ids) const;
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const;
  std::string decode(const int32_t* first, const int32_t* last, decode_options options) const;
};

} // namespace caf_serving::text
