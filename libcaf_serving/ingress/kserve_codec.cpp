#include "ingress/kserve_codec.hpp"

#include "core/half.hpp"
#include "ingress/float_text.hpp"
#include "ingress/validate.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <type_traits>

// Tensor bytes are little-endian on the wire and are copied as host values.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the KServe codec assumes a little-endian host");

namespace caf_serving::ingress {

// -- infer_input --------------------------------------------------------------

bool infer_input::owns_data() const {
  if (data.empty() || owned.empty())
    return false;
  std::less_equal<const char*> le;
  return le(owned.data(), data.data())
         && le(data.data() + data.size(), owned.data() + owned.size());
}

namespace {

/// Re-points `to.data` after `to.owned` was copied or moved from `from`.
void repoint(infer_input& to, std::string_view from_data, const char* from_owned,
             bool owned) {
  if (owned)
    to.data = std::string_view{to.owned.data() + (from_data.data() - from_owned),
                               from_data.size()};
  else
    to.data = from_data;
}

} // namespace

infer_input::infer_input(const infer_input& other)
  : name(other.name), dtype(other.dtype), shape(other.shape), owned(other.owned),
    shared_memory(other.shared_memory) {
  repoint(*this, other.data, other.owned.data(), other.owns_data());
}

infer_input::infer_input(infer_input&& other) noexcept
  : name(std::move(other.name)), dtype(other.dtype), shape(std::move(other.shape)),
    shared_memory(std::move(other.shared_memory)) {
  bool owned_data = other.owns_data();
  auto old_data = other.data;
  const char* old_owned = other.owned.data();
  owned = std::move(other.owned);
  repoint(*this, old_data, old_owned, owned_data);
  other.data = {};
}

infer_input& infer_input::operator=(const infer_input& other) {
  if (this != &other) {
    infer_input copy{other};
    *this = std::move(copy);
  }
  return *this;
}

infer_input& infer_input::operator=(infer_input&& other) noexcept {
  if (this != &other) {
    name = std::move(other.name);
    dtype = other.dtype;
    shape = std::move(other.shape);
    shared_memory = std::move(other.shared_memory);
    bool owned_data = other.owns_data();
    auto old_data = other.data;
    const char* old_owned = other.owned.data();
    owned = std::move(other.owned);
    repoint(*this, old_data, old_owned, owned_data);
    other.data = {};
  }
  return *this;
}

// -- JSON output helpers ------------------------------------------------------

namespace {

template <class T>
void append_integer(std::string& out, T value) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, res.ptr);
}

/// Shortest text that reads back to the same value; `null_text` for NaN and
/// infinities.
template <class T>
void append_floating(std::string& out, T value, std::string_view non_finite) {
  if (!std::isfinite(value)) {
    if (!non_finite.empty()) {
      out += non_finite;
      return;
    }
    out += std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, res.ptr);
}

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void append_shape(std::string& out, const std::vector<int64_t>& shape) {
  out += '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      out += ',';
    append_integer(out, shape[i]);
  }
  out += ']';
}

} // namespace

std::string serialize_error(std::string_view message) {
  std::string out;
  out.reserve(message.size() + 16);
  out += "{\"error\":";
  append_json_string(out, message);
  out += '}';
  return out;
}

// -- request parsing ----------------------------------------------------------

namespace {

namespace od = simdjson::ondemand;

/// A semantic failure found while walking the JSON; caught at the top of
/// parse_infer_request. Exceptions keep the walk readable; they are thrown
/// only for requests that are rejected anyway.
struct parse_failure {
  serving_error error;
};

[[noreturn]] void fail(std::string message) {
  throw parse_failure{bad_request(std::move(message))};
}

[[noreturn]] void fail(serving_error err) {
  throw parse_failure{std::move(err)};
}

std::string single_quoted(std::string_view name) {
  std::string s;
  s.reserve(name.size() + 2);
  s += '\'';
  s += name;
  s += '\'';
  return s;
}

bool iequals_prefix(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size())
    return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(text[i])) != prefix[i])
      return false;
  return true;
}

/// application/octet-stream, with or without parameters.
bool is_octet_stream(std::string_view content_type) {
  while (!content_type.empty() && content_type.front() == ' ')
    content_type.remove_prefix(1);
  constexpr std::string_view mime = "application/octet-stream";
  if (!iequals_prefix(content_type, mime))
    return false;
  auto rest = content_type.substr(mime.size());
  return rest.empty() || rest.front() == ';' || rest.front() == ' ';
}

std::string all_datatype_names() {
  std::string s;
  for (int i = 0; i <= static_cast<int>(datatype::bytes); ++i) {
    if (i > 0)
      s += ", ";
    s += to_string(static_cast<datatype>(i));
  }
  return s;
}

/// Whether a failed simdjson read means "the value has another type" (the
/// caller explains what was expected). Errors in the JSON text itself are
/// thrown, to be reported as invalid JSON.
bool type_mismatch(simdjson::error_code err) {
  switch (err) {
    case simdjson::SUCCESS: return false;
    case simdjson::INCORRECT_TYPE:
    case simdjson::NUMBER_OUT_OF_RANGE: return true;
    default: throw simdjson::simdjson_error(err);
  }
}

/// Where the parser is, for the message of a simdjson error: a place and a
/// detail of it ("input 'x'", " shape"), joined only when an error is reported.
/// They change several times per input; joining them each time allocated on
/// every request.
struct parse_context {
  std::string place = "the request";
  const char* detail = "";

  /// Assigned, not constructed: the place's buffer is reused.
  void at(std::string_view new_place, const char* new_detail = "") {
    place.assign(new_place);
    detail = new_detail;
  }
  std::string where() const { return place + detail; }
};

/// How one JSON element converted.
enum class element_status { ok, wrong_type, out_of_range };

/// Writes the elements of a JSON "data" value (flat or nested arrays) as raw
/// little-endian bytes. The datatype is dispatched once per tensor, and each
/// element is read directly as the expected type; only when that fails is it
/// checked for being a nested array, so flat data costs one read per element.
struct data_writer {
  const infer_input& input;
  uint64_t expected = 0;
  size_t max_depth = 0;
  std::string& out;
  uint64_t count = 0;

  std::string what() const { return "input " + single_quoted(input.name); }

  /// Where fixed-size elements go: `out`, sized for `expected` elements.
  char* base = nullptr;

  /// Stores element number `count` (the caller counts it on success).
  template <class T>
  void store(T v) {
    if (count >= expected)
      too_many();
    std::memcpy(base + count * sizeof(T), &v, sizeof(T));
  }

  [[noreturn, gnu::cold, gnu::noinline]] void element_error(od::value& v,
                                                           element_status status) {
    std::string index = std::to_string(count - 1);
    if (status == element_status::out_of_range) {
      std::string_view token = v.raw_json_token();
      while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())))
        token.remove_suffix(1);
      fail(what() + " data element " + index + " (" + std::string{token}
           + ") is out of range for " + std::string{to_string(input.dtype)});
    }
    std::string_view expectation;
    switch (input.dtype) {
      case datatype::bool_: expectation = "true or false"; break;
      case datatype::bytes: expectation = "a string"; break;
      case datatype::fp32:
      case datatype::fp64: expectation = "a number"; break;
      case datatype::uint8:
      case datatype::uint16:
      case datatype::uint32:
      case datatype::uint64: expectation = "a non-negative integer"; break;
      default: expectation = "an integer"; break;
    }
    fail(what() + " has datatype " + std::string{to_string(input.dtype)} + " but data element "
         + index + " is not " + std::string{expectation});
  }

  /// Reads one element with `read`, which returns an element_status; recurses
  /// into nested arrays. The loop over an array stays small and inlined; nested
  /// arrays and errors take the out-of-line path.
  template <class Read>
  void write_value(od::value v, Read& read) {
    element_status status = read(v);
    if (status == element_status::ok) {
      ++count;
      return;
    }
    write_other(v, 0, status, read);
  }

  template <class Read>
  void write_array(od::array elements, size_t depth, Read& read) {
    for (auto element : elements) {
      od::value e = element.value();
      element_status status = read(e);
      if (status == element_status::ok) {
        ++count;
        continue;
      }
      write_other(e, depth + 1, status, read);
    }
  }

  template <class Read>
  [[gnu::noinline]] void write_other(od::value v, size_t depth, element_status status,
                                     Read& read) {
    if (status == element_status::wrong_type && v.type().value() == od::json_type::array) {
      // Triton counts the "data" value as depth 0 and refuses an element at
      // depth max_depth; the nesting need not follow the shape.
      if (depth + 1 >= max_depth)
        fail("JSON nesting depth exceeds maximum allowed limit (" + std::to_string(max_depth)
             + "): " + what() + " has \"data\" nested in " + std::to_string(depth + 1)
             + " or more arrays; send its elements flat, or nested at most "
             + std::to_string(max_depth - 1) + " arrays deep");
      write_array(v.get_array().value(), depth, read);
      return;
    }
    ++count;
    element_error(v, status);
  }

  [[noreturn, gnu::cold, gnu::noinline]] void too_many() const {
    fail("Unable to parse 'data': Shape does not match true shape of 'data' field: " + what()
         + " has more data elements than its shape " + format_shape(input.shape) + " holds ("
         + std::to_string(expected) + ")");
  }

  static element_status status_of(simdjson::error_code err) {
    if (err == simdjson::SUCCESS)
      return element_status::ok;
    if (type_mismatch(err)) // throws for errors in the JSON text
      return err == simdjson::NUMBER_OUT_OF_RANGE ? element_status::out_of_range
                                                  : element_status::wrong_type;
    return element_status::wrong_type;
  }

  template <class T>
  void write_signed(od::value v) {
    auto read = [this](od::value& e) {
      int64_t x = 0;
      auto status = status_of(e.get_int64().get(x));
      if (status != element_status::ok)
        return status;
      if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max())
        return element_status::out_of_range;
      store(static_cast<T>(x));
      return element_status::ok;
    };
    write_value(v, read);
  }

  template <class T>
  void write_unsigned(od::value v) {
    auto read = [this](od::value& e) {
      uint64_t x = 0;
      auto err = e.get_uint64().get(x);
      if (err == simdjson::INCORRECT_TYPE && e.is_negative())
        return element_status::out_of_range;
      auto status = status_of(err);
      if (status != element_status::ok)
        return status;
      if (x > std::numeric_limits<T>::max())
        return element_status::out_of_range;
      store(static_cast<T>(x));
      return element_status::ok;
    };
    write_value(v, read);
  }

  void write(od::value v) {
    switch (input.dtype) {
      case datatype::bool_: {
        auto read = [this](od::value& e) {
          bool b = false;
          auto status = status_of(e.get_bool().get(b));
          if (status == element_status::ok)
            store(static_cast<char>(b ? 1 : 0));
          return status;
        };
        write_value(v, read);
        return;
      }
      case datatype::int8: write_signed<int8_t>(v); return;
      case datatype::int16: write_signed<int16_t>(v); return;
      case datatype::int32: write_signed<int32_t>(v); return;
      case datatype::int64: write_signed<int64_t>(v); return;
      case datatype::uint8: write_unsigned<uint8_t>(v); return;
      case datatype::uint16: write_unsigned<uint16_t>(v); return;
      case datatype::uint32: write_unsigned<uint32_t>(v); return;
      case datatype::uint64: write_unsigned<uint64_t>(v); return;
      case datatype::fp32: {
        auto read = [this](od::value& e) {
          double d = 0;
          auto status = status_of(e.get_double().get(d));
          if (status != element_status::ok)
            return status;
          if (std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max()))
            return element_status::out_of_range;
          store(static_cast<float>(d));
          return element_status::ok;
        };
        write_value(v, read);
        return;
      }
      case datatype::fp64: {
        auto read = [this](od::value& e) {
          double d = 0;
          auto status = status_of(e.get_double().get(d));
          if (status == element_status::ok)
            store(d);
          return status;
        };
        write_value(v, read);
        return;
      }
      case datatype::bytes: {
        auto read = [this](od::value& e) {
          std::string_view str;
          auto status = status_of(e.get_string().get(str));
          if (status == element_status::ok) {
            if (count >= expected)
              too_many();
            append_bytes_element(out, str);
          }
          return status;
        };
        write_value(v, read);
        return;
      }
      case datatype::fp16:
      case datatype::bf16:
        break; // rejected before the walk
    }
  }
};

std::vector<int64_t> parse_shape(od::value v, const parse_context& ctx, size_t max_rank) {
  std::vector<int64_t> shape;
  od::array arr;
  if (type_mismatch(v.get_array().get(arr)))
    fail(ctx.where() + " must be an array of integers, e.g. [1,3]");
  for (auto element : arr) {
    int64_t dim = {};
    if (type_mismatch(element.get_int64().get(dim)))
      fail(ctx.where() + " must be an array of integers, e.g. [1,3]");
    if (shape.size() >= max_rank)
      fail(ctx.where() + " has more than " + std::to_string(max_rank) + " dimensions");
    shape.push_back(dim);
  }
  return shape;
}

/// The shared-memory parameters of one input or output, as they are read.
struct shared_memory_params {
  std::optional<std::string> region;
  std::optional<uint64_t> offset;
  std::optional<uint64_t> byte_size;

  /// Reads `key` when it is one of the three parameters; false when it is not.
  bool read(std::string_view key, od::value value, const std::string& prefix) {
    if (key == "shared_memory_region") {
      std::string_view name;
      if (type_mismatch(value.get_string().get(name)))
        fail("Unable to parse 'shared_memory_region' of " + prefix
             + "; it must be a string, the name of a registered region");
      region = std::string{name};
    } else if (key == "shared_memory_offset" || key == "shared_memory_byte_size") {
      uint64_t n = {};
      if (type_mismatch(value.get_uint64().get(n)))
        fail("Unable to parse '" + std::string{key} + "' of " + prefix
             + "; it must be a non-negative integer number of bytes");
      (key == "shared_memory_offset" ? offset : byte_size) = n;
    } else {
      return false;
    }
    return true;
  }

  /// The window named, if any. The region and its byte size come together
  /// (the offset defaults to 0), as the shared-memory extension says.
  std::optional<shared_memory_ref> finish(const std::string& prefix) const {
    if (!region && !offset && !byte_size)
      return std::nullopt;
    if (!region)
      fail(prefix + " has shared_memory_offset or shared_memory_byte_size but no "
                    "shared_memory_region; name the registered region that holds the tensor");
    if (!byte_size)
      fail(prefix + " has shared_memory_region but no shared_memory_byte_size; give the "
                    "tensor's size in bytes");
    return shared_memory_ref{*region, offset.value_or(0), *byte_size};
  }
};

struct pending_input {
  infer_input input;
  std::optional<uint64_t> binary_size;
};

struct pending_output {
  requested_output output;
  std::optional<bool> binary;
};

pending_input parse_input_object(od::value v, size_t index, const parse_input& in,
                                 parse_context& ctx) {
  pending_input p;
  infer_input& input = p.input;
  std::string prefix = "inputs[" + std::to_string(index) + "]";
  ctx.at(prefix);
  od::object obj;
  if (type_mismatch(v.get_object().get(obj)))
    fail(prefix + " must be an object with \"name\", \"datatype\", \"shape\" and \"data\"");

  auto required = [&](const char* key) {
    od::value value;
    auto err = obj.find_field_unordered(key).get(value);
    if (err == simdjson::NO_SUCH_FIELD)
      fail(prefix + " has no \"" + key + "\" field");
    if (err)
      throw simdjson::simdjson_error(err);
    return value;
  };

  ctx.detail = ".name";
  std::string_view name;
  if (type_mismatch(required("name").get_string().get(name)))
    fail(prefix + ".name must be a string");
  input.name = std::string{name};
  prefix = "input " + single_quoted(input.name);

  ctx.at(prefix, " datatype");
  std::string_view dtype_name;
  if (type_mismatch(required("datatype").get_string().get(dtype_name)))
    fail(prefix + " datatype must be a string such as \"FP32\"");
  auto dtype = datatype_from_kserve(dtype_name);
  if (!dtype)
    fail(prefix + " has unknown datatype '" + std::string{dtype_name} + "'; use one of "
         + all_datatype_names());
  input.dtype = *dtype;

  ctx.detail = " shape";
  input.shape = parse_shape(required("shape"), ctx, in.limits.max_rank);
  // Triton's overflow checks (element count, then byte size, past INT64_MAX)
  // come before this server's own element limit, so that a client matching
  // Triton's messages finds them.
  auto unlimited = checked_element_count(input.shape, std::numeric_limits<uint64_t>::max(), prefix);
  if (!unlimited)
    fail(unlimited.error());
  if (uint64_t esize = element_size(input.dtype);
      esize > 1 && *unlimited > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / esize)
    fail(byte_size_overflow(prefix, *unlimited, esize));
  auto count = checked_element_count(input.shape, in.limits.max_elements, prefix);
  if (!count)
    fail(count.error());

  ctx.detail = " parameters";
  shared_memory_params shm;
  od::value params_value;
  auto err = obj.find_field_unordered("parameters").get(params_value);
  if (err && err != simdjson::NO_SUCH_FIELD)
    throw simdjson::simdjson_error(err);
  if (!err) {
    od::object params;
    if (type_mismatch(params_value.get_object().get(params)))
      fail(prefix + " parameters must be an object");
    for (auto field : params) {
      std::string_view key = field.unescaped_key().value();
      if (shm.read(key, field.value(), prefix))
        continue;
      if (key == "binary_data_size") {
        uint64_t size = {};
        if (type_mismatch(field.value().get_uint64().get(size)))
          fail(prefix + " parameter binary_data_size must be a non-negative integer");
        p.binary_size = size;
      }
    }
  }

  ctx.detail = " data";
  od::value data_value;
  err = obj.find_field_unordered("data").get(data_value);
  if (err && err != simdjson::NO_SUCH_FIELD)
    throw simdjson::simdjson_error(err);
  bool has_data = !err;
  if (auto ref = shm.finish(prefix)) {
    if (has_data || p.binary_size)
      fail(std::string{"Input must set only one of the following fields: 'data', "
                       "'binary_data_size' in 'parameters', 'shared_memory_region' in "
                       "'parameters'. But set"}
           + (has_data ? " 'data'" : "") + (p.binary_size ? " 'binary_data_size'" : "")
           + " 'shared_memory_region'; " + prefix + " is read from shared memory, so send "
           + "no data for it");
    input.shared_memory = std::move(ref);
    return p;
  }
  if (p.binary_size && has_data)
    fail(prefix + " has both \"data\" and the binary_data_size parameter; send one of them");
  if (!p.binary_size && !has_data)
    fail(prefix + " has no \"data\"; give its elements in \"data\" or send them as binary "
         "data with the binary_data_size parameter");
  if (has_data) {
    if (input.dtype == datatype::fp16 || input.dtype == datatype::bf16)
      fail("receiving " + std::string{to_string(input.dtype)}
           + " data via JSON is not supported. Please use the binary data format for input "
           + input.name + ": " + prefix + " has datatype " + std::string{to_string(input.dtype)}
           + ", which JSON cannot carry; send it as binary data (binary_data_size "
             "parameter and Inference-Header-Content-Length)");
    // Never allocate from the shape alone: every JSON element but the last
    // takes at least two characters, so the JSON's length bounds the count.
    uint64_t most = in.body.size() / 2 + 1;
    if (*count > most)
      fail(prefix + " has shape " + format_shape(input.shape) + " of " + std::to_string(*count)
           + " elements, more than its \"data\" can hold; send as many elements as the shape "
             "says");
    size_t esize = element_size(input.dtype);
    data_writer writer{input, *count, in.limits.max_data_depth, input.owned};
    if (esize == 0) {
      input.owned.reserve(static_cast<size_t>(*count) * 5);
    } else {
      input.owned.resize(static_cast<size_t>(*count) * esize);
      writer.base = input.owned.data();
    }
    writer.write(data_value);
    if (writer.count != *count)
      fail("Unable to parse 'data': Shape does not match true shape of 'data' field: " + prefix
           + " has " + std::to_string(writer.count) + " data elements but its shape "
           + format_shape(input.shape) + " needs " + std::to_string(*count));
    input.data = input.owned;
  }
  return p;
}

pending_output parse_output_object(od::value v, size_t index, parse_context& ctx) {
  pending_output p;
  std::string prefix = "outputs[" + std::to_string(index) + "]";
  ctx.at(prefix);
  od::object obj;
  if (type_mismatch(v.get_object().get(obj)))
    fail(prefix + " must be an object with a \"name\"");
  bool has_name = false;
  shared_memory_params shm;
  for (auto field : obj) {
    std::string_view key = field.unescaped_key().value();
    od::value value = field.value();
    if (key == "name") {
      std::string_view name;
      if (type_mismatch(value.get_string().get(name)))
        fail(prefix + ".name must be a string");
      p.output.name = std::string{name};
      has_name = true;
    } else if (key == "parameters") {
      od::object params;
      if (type_mismatch(value.get_object().get(params)))
        fail(prefix + ".parameters must be an object");
      for (auto param : params) {
        std::string_view pkey = param.unescaped_key().value();
        od::value pvalue = param.value();
        if (shm.read(pkey, pvalue, prefix))
          continue;
        if (pkey == "binary_data") {
          bool b = {};
          if (type_mismatch(pvalue.get_bool().get(b)))
            fail(prefix + " parameter binary_data must be true or false");
          p.binary = b;
        } else if (pkey == "classification") {
          uint64_t k = {};
          if (type_mismatch(pvalue.get_uint64().get(k))
              || k > std::numeric_limits<uint32_t>::max())
            fail(prefix + " parameter classification must be a non-negative integer "
                          "(the number of classes to return)");
          p.output.classification = static_cast<uint32_t>(k);
        }
      }
    }
  }
  if (!has_name)
    fail(prefix + " has no \"name\" field");
  std::string what = "requested output " + single_quoted(p.output.name);
  p.output.shared_memory = shm.finish(what);
  if (p.output.shared_memory && p.output.classification > 0)
    fail("Output can't set both 'shared_memory_region' and 'classification'; " + what
         + ": ask for the classes in the response, or for the tensor in shared memory");
  if (p.output.shared_memory && p.binary.value_or(false))
    fail("Output can't set both 'shared_memory_region' and 'binary_data'; " + what
         + ": an output written to shared memory has no data in the response");
  return p;
}

void parse_request_parameters(od::value v, infer_request& req, parse_context& ctx) {
  ctx.at("parameters");
  od::object params;
  if (type_mismatch(v.get_object().get(params)))
    fail("the request's \"parameters\" must be an object");
  for (auto field : params) {
    std::string key{field.unescaped_key().value()};
    od::value value = field.value();
    ctx.at("parameter " + key);
    if (key == "priority") {
      uint64_t p = {};
      if (type_mismatch(value.get_uint64().get(p)) || p > std::numeric_limits<uint32_t>::max())
        fail("parameter priority must be a non-negative integer (a priority level, 1 is the highest)");
      req.priority = static_cast<uint32_t>(p);
    } else if (key == "timeout") {
      uint64_t t = {};
      if (type_mismatch(value.get_uint64().get(t)))
        fail("parameter timeout must be a non-negative integer number of microseconds");
      req.timeout_us = t;
    } else if (key == "binary_data_output") {
      bool b = {};
      if (type_mismatch(value.get_bool().get(b)))
        fail("parameter binary_data_output must be true or false");
      req.binary_data_output = b;
    } else {
      od::json_type type = value.type().value();
      if (type == od::json_type::string) {
        req.parameters[key] = std::string{value.get_string().value()};
      } else if (type == od::json_type::number || type == od::json_type::boolean
                 || type == od::json_type::null) {
        std::string_view token = value.raw_json_token();
        while (!token.empty() && (token.back() == ' ' || token.back() == '\n'
                                  || token.back() == '\r' || token.back() == '\t'))
          token.remove_suffix(1);
        req.parameters[key] = std::string{token};
      } // objects and arrays are not parameters KServe defines; skipped
    }
  }
}

/// Whether `text` holds a complete JSON object or array followed by more than
/// white space: the likeliest reason for a structure error, named as such.
bool has_trailing_content(std::string_view text) {
  size_t i = text.find_first_not_of(" \t\r\n");
  if (i == std::string_view::npos || (text[i] != '{' && text[i] != '['))
    return false;
  int depth = 0;
  bool in_string = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[')
      ++depth;
    else if ((c == '}' || c == ']') && --depth == 0)
      return text.find_first_not_of(" \t\r\n", i + 1) != std::string_view::npos;
  }
  return false;
}

std::string simdjson_message(simdjson::error_code code) {
  switch (code) {
    case simdjson::UTF8_ERROR:
      return "the request body is not valid UTF-8; JSON text must be UTF-8 (send raw bytes "
             "as BYTES binary data instead)";
    case simdjson::EMPTY:
      return "the request body is empty; send a JSON inference request";
    case simdjson::DEPTH_ERROR:
      return "JSON nesting depth exceeds maximum allowed limit (1024 for the whole request "
             "body; 100 for a tensor's \"data\"); send tensor data flat";
    case simdjson::INCOMPLETE_ARRAY_OR_OBJECT:
      return "the request body is not valid JSON: an object or array is not closed, or "
             "something follows the JSON object (if binary data follows, set "
             "Inference-Header-Content-Length to the JSON's length)";
    default:
      return std::string{"the request body is not valid JSON ("} + simdjson::error_message(code)
             + ")";
  }
}

/// Parses the JSON header `json` (already padded) into `req`, leaving binary
/// sizes in `pending`.
void parse_json_header(simdjson::padded_string_view json, const parse_input& in,
                       infer_request& req, std::vector<pending_input>& pending) {
  thread_local od::parser cached_parser;
  // A huge document would leave its buffers in the cached parser forever.
  constexpr size_t cache_limit = size_t{8} << 20;
  od::parser one_off;
  od::parser& parser = json.size() <= cache_limit ? cached_parser : one_off;
  // On Demand trusts the structure of what it has skipped once: on a malformed
  // document, find_field_unordered's second pass can reach a state that it
  // assumes impossible (undefined behaviour; found by the kserve_request
  // fuzzer). The DOM parser validates the whole document first, at about the
  // cost of the On Demand pass itself.
  {
    thread_local simdjson::dom::parser cached_validator;
    simdjson::dom::parser one_off_validator;
    auto& validator = json.size() <= cache_limit ? cached_validator : one_off_validator;
    auto err = validator.parse(reinterpret_cast<const uint8_t*>(json.data()), json.size(), false)
                 .error();
    if (err == simdjson::TAPE_ERROR && has_trailing_content({json.data(), json.size()}))
      fail("the request body has content after its JSON object; if binary data follows, "
           "set Inference-Header-Content-Length to the JSON's length");
    if (err == simdjson::TAPE_ERROR)
      fail(simdjson_message(err) + "; if binary data follows the JSON, set "
           "Inference-Header-Content-Length to the JSON's length");
    if (err)
      fail(simdjson_message(err));
  }
  parse_context ctx;
  try {
    od::document doc;
    auto err = parser.iterate(json).get(doc);
    if (err)
      fail(simdjson_message(err));
    od::object top;
    err = doc.get_object().get(top);
    if (err)
      fail(err == simdjson::INCORRECT_TYPE
             ? std::string{"the request body must be a JSON object with \"inputs\""}
             : simdjson_message(err));
    std::vector<pending_output> outputs;
    bool has_inputs = false;
    for (auto field : top) {
      ctx.at("the request");
      std::string_view key = field.unescaped_key().value();
      od::value value = field.value();
      if (key == "id") {
        ctx.at("id");
        std::string_view id;
        if (type_mismatch(value.get_string().get(id)))
          fail("the request's \"id\" must be a string");
        req.id = std::string{id};
      } else if (key == "parameters") {
        parse_request_parameters(value, req, ctx);
      } else if (key == "inputs") {
        ctx.at("inputs");
        has_inputs = true;
        od::array arr;
        if (type_mismatch(value.get_array().get(arr)))
          fail("the request's \"inputs\" must be an array of input objects");
        for (auto element : arr) {
          if (pending.size() >= in.limits.max_tensors)
            fail("the request has more than " + std::to_string(in.limits.max_tensors) + " inputs");
          pending.push_back(parse_input_object(element.value(), pending.size(), in, ctx));
        }
      } else if (key == "outputs") {
        ctx.at("outputs");
        od::array arr;
        if (type_mismatch(value.get_array().get(arr)))
          fail("the request's \"outputs\" must be an array of output objects");
        for (auto element : arr) {
          if (outputs.size() >= in.limits.max_tensors)
            fail("the request has more than " + std::to_string(in.limits.max_tensors)
                 + " outputs");
          outputs.push_back(parse_output_object(element.value(), outputs.size(), ctx));
        }
      }
    }
    ctx.at("the end of the request");
    const char* trailing = nullptr;
    if (doc.current_location().get(trailing) == simdjson::SUCCESS)
      fail("the request body has content after its JSON object; if binary data follows, "
           "set Inference-Header-Content-Length to the JSON's length");
    if (!has_inputs)
      fail("the request has no \"inputs\"");
    // Triton's rule: a listed output is binary only when its own
    // "binary_data" says so; the request's "binary_data_output" is the
    // default only for the outputs sent because none were listed.
    for (auto& p : outputs) {
      p.output.binary = p.binary.value_or(false);
      req.outputs.push_back(std::move(p.output));
    }
  } catch (const simdjson::simdjson_error& e) {
    std::string msg = simdjson_message(e.error());
    if (e.error() != simdjson::UTF8_ERROR)
      msg += " at " + ctx.where();
    fail(msg);
  }
}

/// " for model 'm'" when the model is known, as Triton's messages say it.
std::string for_model(const parse_input& in) {
  return in.model ? " for model " + single_quoted(in.model->name) : std::string();
}

/// A body that is the raw bytes of the model's single input.
infer_request parse_raw_binary(const parse_input& in) {
  if (!in.model)
    fail("the request body is raw binary (application/octet-stream without "
         "Inference-Header-Content-Length), which needs a model with a single input; send a "
         "JSON inference request instead");
  const model_config& model = *in.model;
  if (model.inputs.size() != 1)
    fail("Raw request must only have 1 input (found 1) to be deduced but got "
         + std::to_string(model.inputs.size()) + " inputs in '" + model.name
         + "' model configuration: a raw binary request body is the data of a model's "
           "single input; send a JSON inference request with Inference-Header-Content-Length");
  const tensor_config& cfg = model.inputs.front();
  bool batched = model.max_batch_size > 0;
  infer_request req;
  infer_input input;
  input.name = cfg.name;
  input.dtype = cfg.dtype;
  std::string what = "raw binary input " + single_quoted(cfg.name);
  if (cfg.dtype == datatype::bytes) {
    // The body is one BYTES element, so the model's dims must hold exactly
    // one: Triton refuses variable dimensions here too.
    for (auto d : cfg.dims)
      if (d != 1)
        fail("For BYTE datatype raw input " + single_quoted(cfg.name)
             + ", the model must have input shape [1]: its dims are " + format_shape(cfg.dims)
             + " and a raw binary body holds exactly one BYTES element; send a JSON "
               "inference request for more elements");
    if (batched)
      input.shape.push_back(1);
    input.shape.insert(input.shape.end(), cfg.dims.size(), 1);
    if (in.body.size() > std::numeric_limits<uint32_t>::max())
      fail(what + " is longer than a BYTES element can be (4 GiB)");
    input.owned.reserve(in.body.size() + 4);
    append_bytes_element(input.owned, in.body);
    input.data = input.owned;
  } else {
    size_t esize = element_size(cfg.dtype);
    if (in.body.size() % esize != 0)
      fail(what + " has " + std::to_string(in.body.size()) + " bytes, not a multiple of the "
           + std::to_string(esize) + "-byte " + std::string{to_string(cfg.dtype)} + " element");
    uint64_t elements = in.body.size() / esize;
    uint64_t known = 1;
    int variable = -1;
    for (size_t i = 0; i < cfg.dims.size(); ++i) {
      if (cfg.dims[i] < 0) {
        if (variable >= 0)
          fail("The shape of the raw input " + single_quoted(cfg.name)
               + " can not be deduced because there are more than one variable-sized "
                 "dimension (the model's dims are " + format_shape(cfg.dims)
               + "); send a JSON inference request that gives the shape");
        variable = static_cast<int>(i);
      } else if (cfg.dims[i] == 0) {
        known = 0;
      } else if (known > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(cfg.dims[i])) {
        fail(what + ": the model's dims " + format_shape(cfg.dims) + " overflow");
      } else {
        known *= static_cast<uint64_t>(cfg.dims[i]);
      }
    }
    std::vector<int64_t> dims = cfg.dims;
    int64_t batch = 1;
    if (known == 0 || elements % known != 0)
      fail(what + " has " + std::to_string(elements) + " elements, which do not fill the model's "
           "dims " + format_shape(cfg.dims));
    if (variable >= 0) {
      dims[static_cast<size_t>(variable)] = static_cast<int64_t>(elements / known);
    } else if (batched) {
      batch = static_cast<int64_t>(elements / known);
    } else if (elements != known) {
      fail(what + " has " + std::to_string(elements) + " elements but the model's dims "
           + format_shape(cfg.dims) + " hold " + std::to_string(known));
    }
    if (batched)
      input.shape.push_back(batch);
    input.shape.insert(input.shape.end(), dims.begin(), dims.end());
    input.data = in.body;
  }
  req.inputs.push_back(std::move(input));
  return req;
}

infer_request parse(const parse_input& in) {
  bool raw = (in.header_length && *in.header_length == 0)
             || (!in.header_length && is_octet_stream(in.content_type));
  if (in.body.size() > in.limits.max_body_bytes)
    fail(body_too_large(in.body.size(), in.limits.max_body_bytes, raw));
  if (raw) {
    auto req = parse_raw_binary(in);
    // Triton answers a raw request (Inference-Header-Content-Length: 0) with
    // binary outputs; a body sent only as application/octet-stream (this
    // server's extension) keeps the JSON answer.
    req.binary_data_output = in.header_length.has_value();
    return req;
  }
  size_t json_size = in.body.size();
  if (in.header_length) {
    if (*in.header_length > in.body.size())
      fail("inference header size should be in range (0, " + std::to_string(in.body.size())
           + "), got: " + std::to_string(*in.header_length)
           + ": Inference-Header-Content-Length is " + std::to_string(*in.header_length)
           + " but the body has only " + std::to_string(in.body.size()) + " bytes");
    json_size = static_cast<size_t>(*in.header_length);
  }
  std::string_view json = in.body.substr(0, json_size);
  std::string_view binary = in.body.substr(json_size);

  infer_request req;
  std::vector<pending_input> pending;
  // The parser may read (not use) SIMDJSON_PADDING bytes past the JSON: the
  // binary data after it and the buffer's room after the body both count.
  if (in.body.size() - json_size + in.readable_padding >= simdjson::SIMDJSON_PADDING) {
    parse_json_header(simdjson::padded_string_view{json.data(), json.size(),
                                                   in.body.size() + in.readable_padding},
                      in, req, pending);
  } else {
    simdjson::padded_string copy{json.data(), json.size()};
    parse_json_header(copy, in, req, pending);
  }

  size_t offset = 0;
  req.inputs.reserve(pending.size());
  for (auto& p : pending) {
    if (p.binary_size) {
      std::string what = "input " + single_quoted(p.input.name);
      if (!in.header_length)
        fail(what + " has binary_data_size but the request has no "
                    "Inference-Header-Content-Length header giving the JSON's length");
      if (*p.binary_size > binary.size() - offset)
        fail("unexpected size for " + what + ", expecting "
             + std::to_string(*p.binary_size - (binary.size() - offset))
             + " additional bytes" + for_model(in) + ": " + what + " has binary_data_size " + std::to_string(*p.binary_size) + " but only "
             + std::to_string(binary.size() - offset)
             + " bytes of binary data remain after the JSON header");
      p.input.data = binary.substr(offset, static_cast<size_t>(*p.binary_size));
      offset += static_cast<size_t>(*p.binary_size);
    }
    req.inputs.push_back(std::move(p.input));
  }
  if (offset != binary.size())
    fail("unexpected additional input data" + for_model(in) + ": the request has " + std::to_string(binary.size() - offset)
         + " bytes of binary data after the JSON header that no input's binary_data_size "
           "accounts for");
  return req;
}

} // namespace

serving_error body_too_large(std::optional<uint64_t> size, uint64_t limit, bool raw) {
  std::string n = size ? std::to_string(*size) : "more than " + std::to_string(limit);
  std::string m = std::to_string(limit);
  std::string triton
    = raw ? "Raw input has a byte_size (" + n + " bytes) that exceeds the maximum allowed value of "
              + m + " bytes."
          : "request JSON size of " + n + " bytes exceeds the maximum allowed input size of " + m
              + " bytes.";
  return bad_request(triton
                     + " Use --http-max-input-size to increase the limit (this server's "
                       "--max-body-bytes; the limit holds for the whole body, also after "
                       "decompression)");
}

result<infer_request> parse_infer_request(const parse_input& in) {
  try {
    return parse(in);
  } catch (parse_failure& f) {
    return std::move(f.error);
  } catch (const simdjson::simdjson_error& e) {
    return bad_request(simdjson_message(e.error()));
  } catch (const std::bad_alloc&) {
    return serving_error{status_code::payload_too_large,
                         "the request needs more memory than the server can give it"};
  }
}

// -- response serialization ---------------------------------------------------

namespace {

/// Checks that `data` fits `shape` and `dtype`; the element count on success.
result<uint64_t> check_output_data(std::string_view name, datatype dtype,
                                   const std::vector<int64_t>& shape, std::string_view data) {
  const tensor_label what{"output", name};
  auto count = checked_element_count(shape, std::numeric_limits<uint64_t>::max(), what);
  if (!count)
    return serving_error{status_code::internal, count.error().message};
  if (dtype == datatype::bytes) {
    auto n = count_bytes_elements(data, what);
    if (!n)
      return serving_error{status_code::internal, n.error().message};
    if (*n != *count)
      return serving_error{status_code::internal,
                           what.text() + " has " + std::to_string(*n) + " BYTES elements but shape "
                             + format_shape(shape) + " needs " + std::to_string(*count)};
    return count;
  }
  size_t esize = element_size(dtype);
  if (data.size() % esize != 0 || data.size() / esize != *count)
    return serving_error{status_code::internal,
                         what.text() + " has " + std::to_string(data.size()) + " bytes but shape "
                           + format_shape(shape) + " of " + std::string{to_string(dtype)}
                           + " needs " + std::to_string(*count * esize)};
  return count;
}

/// Writes `count` elements of one type straight into `out`, which grows once
/// by the longest text each element can take and shrinks to what was used.
template <class T, size_t MaxChars, class Convert>
void append_typed(std::string& out, const char* base, size_t count, Convert convert) {
  size_t start = out.size();
  out.resize(start + count * (MaxChars + 1));
  char* p = out.data() + start;
  char* end = out.data() + out.size();
  for (size_t i = 0; i < count; ++i) {
    if (i > 0)
      *p++ = ',';
    p = convert(p, end, load<T>(base + i * sizeof(T)));
  }
  out.resize(static_cast<size_t>(p - out.data()));
}

template <class T>
char* write_integer(char* p, char* end, T v) {
  return std::to_chars(p, end, v).ptr;
}

template <class F>
char* write_floating(char* p, char* end, F v) {
  if (!std::isfinite(v)) {
    std::memcpy(p, "null", 4);
    return p + 4;
  }
  if constexpr (std::is_same_v<F, float>)
    return write_float(p, v); // to_chars' text, faster for integers and short fractions
  else
    return std::to_chars(p, end, v).ptr;
}

/// JSON numbers (or true/false) for fixed-size tensor data; NaN and
/// infinities as null.
void append_json_numbers(std::string& out, datatype dtype, const char* base, size_t count) {
  auto integer = [](char* p, char* end, auto v) { return write_integer(p, end, v); };
  auto floating = [](char* p, char* end, auto v) { return write_floating(p, end, v); };
  switch (dtype) {
    case datatype::bool_:
      append_typed<uint8_t, 5>(out, base, count, [](char* p, char*, uint8_t v) {
        if (v != 0) {
          std::memcpy(p, "true", 4);
          return p + 4;
        }
        std::memcpy(p, "false", 5);
        return p + 5;
      });
      return;
    case datatype::uint8: append_typed<uint8_t, 3>(out, base, count, integer); return;
    case datatype::uint16: append_typed<uint16_t, 5>(out, base, count, integer); return;
    case datatype::uint32: append_typed<uint32_t, 10>(out, base, count, integer); return;
    case datatype::uint64: append_typed<uint64_t, 20>(out, base, count, integer); return;
    case datatype::int8: append_typed<int8_t, 4>(out, base, count, integer); return;
    case datatype::int16: append_typed<int16_t, 6>(out, base, count, integer); return;
    case datatype::int32: append_typed<int32_t, 11>(out, base, count, integer); return;
    case datatype::int64: append_typed<int64_t, 20>(out, base, count, integer); return;
    case datatype::fp16:
      append_typed<uint16_t, 16>(out, base, count, [](char* p, char* end, uint16_t v) {
        return write_floating(p, end, fp16_to_float(v));
      });
      return;
    case datatype::bf16:
      append_typed<uint16_t, 16>(out, base, count, [](char* p, char* end, uint16_t v) {
        return write_floating(p, end, bf16_to_float(v));
      });
      return;
    case datatype::fp32: append_typed<float, 16>(out, base, count, floating); return;
    case datatype::fp64: append_typed<double, 24>(out, base, count, floating); return;
    case datatype::bytes: return;
  }
}

void append_json_data(std::string& out, datatype dtype, std::string_view data, uint64_t count) {
  out += '[';
  if (dtype == datatype::bytes) {
    size_t pos = 0;
    for (uint64_t i = 0; i < count; ++i) {
      if (i > 0)
        out += ',';
      auto len = load<uint32_t>(data.data() + pos);
      append_json_string(out, data.substr(pos + 4, len));
      pos += 4 + len;
    }
  } else {
    append_json_numbers(out, dtype, data.data(), static_cast<size_t>(count));
  }
  out += ']';
}

} // namespace

result<serialized_response> serialize_infer_response(const response_view& response,
                                                     const serialize_options& options) {
  serialized_response result_body;
  std::string& out = result_body.body;
  std::vector<std::string_view> binary_parts;

  out.reserve(256 + response.outputs.size() * 64);
  out += "{\"model_name\":";
  append_json_string(out, response.model_name);
  out += ",\"model_version\":";
  append_json_string(out, response.model_version);
  if (!response.id.empty()) {
    out += ",\"id\":";
    append_json_string(out, response.id);
  }
  if (!response.parameters.empty()) {
    out += ",\"parameters\":{";
    for (size_t i = 0; i < response.parameters.size(); ++i) {
      if (i > 0)
        out += ',';
      append_json_string(out, response.parameters[i].first);
      out += ':';
      append_integer(out, response.parameters[i].second);
    }
    out += '}';
  }
  out += ",\"outputs\":[";
  for (size_t i = 0; i < response.outputs.size(); ++i) {
    const output_view& output = response.outputs[i];
    auto count = check_output_data(output.name, output.dtype, output.shape, output.data);
    if (!count)
      return count.error();
    bool binary = options.binary_data_output;
    bool in_shared_memory = false;
    for (const auto& r : options.requested) {
      if (r.name == output.name) {
        binary = r.binary;
        in_shared_memory = r.shared_memory.has_value();
        break;
      }
    }
    std::string_view data = output.data;
    if (i > 0)
      out += ',';
    out += "{\"name\":";
    append_json_string(out, output.name);
    out += ",\"datatype\":\"";
    out += to_string(output.dtype);
    out += "\",\"shape\":";
    append_shape(out, output.shape);
    if (in_shared_memory) {
      out += '}'; // the data went to the client's region
    } else if (binary) {
      out += ",\"parameters\":{\"binary_data_size\":";
      append_integer(out, data.size());
      out += "}}";
      binary_parts.push_back(data);
    } else {
      out += ",\"data\":";
      append_json_data(out, output.dtype, data, *count);
      out += '}';
    }
  }
  out += "]}";
  if (binary_parts.empty()) {
    result_body.content_type = "application/json";
  } else {
    result_body.header_length = out.size();
    result_body.content_type = "application/octet-stream";
    if (options.binary == serialize_options::binary_output::by_reference) {
      result_body.binary_data = std::move(binary_parts);
      return result_body;
    }
    size_t total = out.size();
    for (const auto& part : binary_parts)
      total += part.size();
    out.reserve(total);
    for (const auto& part : binary_parts)
      out += part;
  }
  return result_body;
}

} // namespace caf_serving::ingress
