#include "ingress/generate_fields.hpp"

#include <charconv>
#include <cmath>
#include <limits>

namespace caf_serving::ingress::generate_detail {

void fail(std::string message) {
  throw field_failure{bad_request(std::move(message))};
}

std::string in_quotes(std::string_view name) {
  std::string s;
  s.reserve(name.size() + 2);
  s += '\'';
  s += name;
  s += '\'';
  return s;
}

std::string shown(dom::element value) {
  std::string text = simdjson::minify(value);
  constexpr size_t most = 40;
  if (text.size() > most) {
    // Cut at a character boundary so the message stays valid UTF-8.
    size_t cut = most;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
      --cut;
    text.resize(cut);
    text += "...";
  }
  return text;
}

dom::element parse_document(dom::parser& parser, std::string_view body, std::string_view what) {
  dom::element doc;
  auto err = parser.parse(body.data(), body.size()).get(doc);
  switch (err) {
    case simdjson::SUCCESS: return doc;
    case simdjson::UTF8_ERROR:
      fail(std::string{what} + " is not valid UTF-8; JSON text must be UTF-8");
    case simdjson::EMPTY: fail(std::string{what} + " is empty; send a JSON object");
    case simdjson::DEPTH_ERROR:
      fail(std::string{what} + " nests deeper than 1024 levels");
    case simdjson::NUMBER_ERROR:
      fail(std::string{what} + " holds a number JSON cannot carry (out of range, or not "
           "finite); send finite numbers");
    default:
      fail(std::string{what} + " is not valid JSON (" + simdjson::error_message(err) + ")");
  }
}

// -- field_reader -------------------------------------------------------------

namespace {

const char* type_name(dom::element v) {
  switch (v.type()) {
    case dom::element_type::ARRAY: return "an array";
    case dom::element_type::OBJECT: return "an object";
    case dom::element_type::INT64:
    case dom::element_type::UINT64:
    case dom::element_type::DOUBLE: return "a number";
    case dom::element_type::STRING: return "a string";
    case dom::element_type::BOOL: return "a boolean";
    case dom::element_type::NULL_VALUE: return "null";
  }
  return "a value";
}

/// Shortest text of a bound in a message ("2", "0.5").
std::string bound_text(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

} // namespace

void field_reader::wrong(std::string_view key, dom::element v, std::string_view expected) const {
  fail(std::string{where} + in_quotes(key) + " must be " + std::string{expected} + ", got "
       + type_name(v) + " (" + shown(v) + ")");
}

double field_reader::number(std::string_view key, dom::element v, double lo, double hi,
                            bool lo_open) const {
  std::string expected = "a number ";
  if (hi == std::numeric_limits<double>::infinity())
    expected += lo_open ? "greater than " + bound_text(lo) : "of at least " + bound_text(lo);
  else
    expected += (lo_open ? "greater than " + bound_text(lo) + " and at most "
                         : "between " + bound_text(lo) + " and ")
                + bound_text(hi);
  double x = 0.0;
  if (v.get_double().get(x) != simdjson::SUCCESS) {
    std::string_view s;
    if (!lenient || v.get_string().get(s) != simdjson::SUCCESS)
      wrong(key, v, expected);
    s = trimmed(s);
    auto r = std::from_chars(s.data(), s.data() + s.size(), x);
    if (r.ec != std::errc{} || r.ptr != s.data() + s.size())
      wrong(key, v, expected);
  }
  if (!std::isfinite(x))
    fail(std::string{where} + in_quotes(key) + " must be a finite number, got " + shown(v));
  if (x < lo || x > hi || (lo_open && x == lo))
    fail(std::string{where} + in_quotes(key) + " must be " + expected + ", got " + shown(v));
  return x;
}

int64_t field_reader::integer(std::string_view key, dom::element v, int64_t lo,
                              int64_t hi) const {
  std::string expected = "an integer ";
  expected += hi == std::numeric_limits<int64_t>::max()
                ? "of at least " + std::to_string(lo)
                : "between " + std::to_string(lo) + " and " + std::to_string(hi);
  int64_t x = 0;
  double d = 0.0;
  std::string_view s;
  uint64_t u = 0;
  if (v.get_int64().get(x) == simdjson::SUCCESS) {
    // as is
  } else if (v.get_uint64().get(u) == simdjson::SUCCESS) {
    fail(std::string{where} + in_quotes(key) + " must be " + expected + ", got " + shown(v));
  } else if (v.is_double() && v.get_double().get(d) == simdjson::SUCCESS) {
    if (!(d == std::floor(d) && d >= -9.2e18 && d <= 9.2e18))
      wrong(key, v, expected);
    x = static_cast<int64_t>(d);
  } else if (lenient && v.get_string().get(s) == simdjson::SUCCESS) {
    s = trimmed(s);
    auto r = std::from_chars(s.data(), s.data() + s.size(), x);
    if (r.ec != std::errc{} || r.ptr != s.data() + s.size())
      wrong(key, v, expected);
  } else {
    wrong(key, v, expected);
  }
  if (x < lo || x > hi)
    fail(std::string{where} + in_quotes(key) + " must be " + expected + ", got " + shown(v));
  return x;
}

uint64_t field_reader::bits64(std::string_view key, dom::element v) const {
  int64_t x = 0;
  uint64_t u = 0;
  std::string_view s;
  if (v.get_int64().get(x) == simdjson::SUCCESS)
    return static_cast<uint64_t>(x);
  if (v.get_uint64().get(u) == simdjson::SUCCESS)
    return u;
  if (lenient && v.get_string().get(s) == simdjson::SUCCESS) {
    s = trimmed(s);
    auto end = s.data() + s.size();
    if (auto r = std::from_chars(s.data(), end, x); r.ec == std::errc{} && r.ptr == end)
      return static_cast<uint64_t>(x);
    if (auto r = std::from_chars(s.data(), end, u); r.ec == std::errc{} && r.ptr == end)
      return u;
  }
  wrong(key, v, "a 64-bit integer");
}

bool field_reader::boolean(std::string_view key, dom::element v) const {
  bool b = false;
  if (v.get_bool().get(b) == simdjson::SUCCESS)
    return b;
  std::string_view s;
  if (lenient && v.get_string().get(s) == simdjson::SUCCESS) {
    // Stricter than Python's bool("false"), which is True.
    if (s == "true" || s == "True")
      return true;
    if (s == "false" || s == "False")
      return false;
  }
  wrong(key, v, lenient ? "true or false (or the strings \"true\", \"false\")" : "true or false");
}

std::string_view field_reader::string(std::string_view key, dom::element v) const {
  std::string_view s;
  if (v.get_string().get(s) != simdjson::SUCCESS)
    wrong(key, v, "a string");
  return s;
}

// -- shared fields ------------------------------------------------------------

namespace {

void read_stop(dom::element v, const field_reader& reader, const generate_codec_limits& limits,
               stop_params& stop) {
  auto add = [&](std::string_view s) {
    if (s.empty())
      fail(std::string{reader.where} + "'stop' holds an empty string, which would stop "
           "before the first token; leave it out");
    if (s.size() > limits.max_stop_string_bytes)
      fail(std::string{reader.where} + "'stop' holds a string of " + std::to_string(s.size())
           + " bytes; at most " + std::to_string(limits.max_stop_string_bytes)
           + " bytes are allowed");
    if (stop.stop.size() >= limits.max_stop_strings)
      fail(std::string{reader.where} + "'stop' holds more than "
           + std::to_string(limits.max_stop_strings) + " strings; send at most "
           + std::to_string(limits.max_stop_strings));
    stop.stop.emplace_back(s);
  };
  std::string_view s;
  if (v.get_string().get(s) == simdjson::SUCCESS) {
    add(s);
    return;
  }
  dom::array arr;
  if (v.get_array().get(arr) != simdjson::SUCCESS)
    reader.wrong("stop", v, "a string or an array of strings");
  for (dom::element e : arr) {
    if (e.get_string().get(s) != simdjson::SUCCESS)
      reader.wrong("stop", v, "a string or an array of strings");
    add(s);
  }
}

void read_stop_token_ids(dom::element v, const field_reader& reader,
                         const generate_codec_limits& limits, stop_params& stop) {
  dom::array arr;
  if (v.get_array().get(arr) != simdjson::SUCCESS)
    reader.wrong("stop_token_ids", v, "an array of token ids");
  for (dom::element e : arr) {
    if (stop.stop_token_ids.size() >= limits.max_stop_token_ids)
      fail(std::string{reader.where} + "'stop_token_ids' holds more than "
           + std::to_string(limits.max_stop_token_ids) + " ids; send at most "
           + std::to_string(limits.max_stop_token_ids));
    stop.stop_token_ids.push_back(static_cast<int32_t>(
      reader.integer("stop_token_ids", e, 0, std::numeric_limits<int32_t>::max())));
  }
}

constexpr double inf = std::numeric_limits<double>::infinity();

} // namespace

bool is_shared_field(std::string_view key) {
  for (std::string_view k :
       {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "seed", "max_tokens", "min_tokens", "ignore_eos", "stop",
        "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output", "n",
        "ttft_target_ms"})
    if (k == key)
      return true;
  return false;
}

bool apply_shared_field(std::string_view key, dom::element v, const field_reader& reader,
                        const generate_codec_limits& limits, generate_request& req) {
  sampling_params& s = req.sampling;
  stop_params& st = req.stop;
  // Null is "not set" for every shared field (they are all optional).
  const bool null = v.is_null();
  if (key == "temperature") {
    if (!null)
      s.temperature = static_cast<float>(reader.number(key, v, 0.0, 2.0));
  } else if (key == "top_p") {
    if (!null)
      s.top_p = static_cast<float>(reader.number(key, v, 0.0, 1.0, true));
  } else if (key == "top_k") {
    // vLLM: -1 (or 0) means every token.
    if (!null) {
      int64_t k = reader.integer(key, v, -1, std::numeric_limits<int32_t>::max());
      s.top_k = k <= 0 ? 0 : static_cast<uint32_t>(k);
    }
  } else if (key == "min_p") {
    if (!null)
      s.min_p = static_cast<float>(reader.number(key, v, 0.0, 1.0));
  } else if (key == "repetition_penalty") {
    if (!null)
      s.repetition_penalty = static_cast<float>(reader.number(key, v, 0.0, inf, true));
  } else if (key == "presence_penalty") {
    if (!null)
      s.presence_penalty = static_cast<float>(reader.number(key, v, -2.0, 2.0));
  } else if (key == "frequency_penalty") {
    if (!null)
      s.frequency_penalty = static_cast<float>(reader.number(key, v, -2.0, 2.0));
  } else if (key == "seed") {
    if (!null)
      s.seed = reader.bits64(key, v);
  } else if (key == "max_tokens") {
    if (!null)
      st.max_tokens = static_cast<uint32_t>(
        reader.integer(key, v, 1, std::numeric_limits<uint32_t>::max()));
  } else if (key == "min_tokens") {
    if (!null)
      st.min_tokens = static_cast<uint32_t>(
        reader.integer(key, v, 0, std::numeric_limits<uint32_t>::max()));
  } else if (key == "ignore_eos") {
    if (!null)
      st.ignore_eos = reader.boolean(key, v);
  } else if (key == "stop") {
    if (!null)
      read_stop(v, reader, limits, st);
  } else if (key == "stop_token_ids") {
    if (!null)
      read_stop_token_ids(v, reader, limits, st);
  } else if (key == "skip_special_tokens") {
    if (!null)
      req.skip_special_tokens = reader.boolean(key, v);
  } else if (key == "include_stop_str_in_output") {
    if (!null)
      req.include_stop_str_in_output = reader.boolean(key, v);
  } else if (key == "ttft_target_ms") {
    if (!null)
      req.ttft_target_ms = static_cast<uint32_t>(reader.integer(key, v, 1, 1 << 24));
  } else if (key == "n") {
    if (!null) {
      int64_t n = reader.integer(key, v, 1, std::numeric_limits<int32_t>::max());
      if (n != 1)
        fail(std::string{reader.where} + "'n' is " + std::to_string(n)
             + ", but this server returns one choice per request; set 'n' to 1 (or leave it "
               "out) and send several requests instead");
      req.n = 1;
    }
  } else {
    return false;
  }
  return true;
}

void check_across_fields(const generate_request& req, std::string_view where) {
  if (req.stop.max_tokens && req.stop.min_tokens > *req.stop.max_tokens)
    fail(std::string{where} + "'min_tokens' (" + std::to_string(req.stop.min_tokens)
         + ") is more than 'max_tokens' (" + std::to_string(*req.stop.max_tokens)
         + "); make min_tokens at most max_tokens");
}

} // namespace caf_serving::ingress::generate_detail
