#include "ingress/kserve_codec.hpp"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

result<infer_request> parse_json(const std::string& body) {
  parse_input in;
  in.body = body;
  in.content_type = "application/json";
  return parse_infer_request(in);
}

/// A request body with a JSON header and binary data after it.
struct binary_body {
  std::string body;
  size_t header_length;
};

binary_body with_binary(const std::string& json, const std::string& binary) {
  return {json + binary, json.size()};
}

result<infer_request> parse_binary(const binary_body& b) {
  parse_input in;
  in.body = b.body;
  in.header_length = b.header_length;
  in.content_type = "application/octet-stream";
  return parse_infer_request(in);
}

template <class T>
std::vector<T> values_of(std::string_view data) {
  REQUIRE(data.size() % sizeof(T) == 0);
  std::vector<T> v(data.size() / sizeof(T));
  std::memcpy(v.data(), data.data(), data.size());
  return v;
}

template <class T>
std::string raw_bytes(std::initializer_list<T> values) {
  std::string s(values.size() * sizeof(T), '\0');
  std::memcpy(s.data(), values.begin(), s.size());
  return s;
}

std::string bytes_elements(std::initializer_list<std::string_view> elements) {
  std::string s;
  for (auto e : elements) {
    auto len = static_cast<uint32_t>(e.size());
    char buf[4];
    std::memcpy(buf, &len, 4);
    s.append(buf, 4);
    s += e;
  }
  return s;
}

std::vector<std::string> split_bytes(std::string_view data) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos + 4 <= data.size()) {
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);
    out.emplace_back(data.substr(pos + 4, len));
    pos += 4 + len;
  }
  CHECK(pos == data.size());
  return out;
}

void check_error(const result<infer_request>& r, status_code status, std::string_view substring) {
  REQUIRE_FALSE(r.ok());
  INFO(r.error().message);
  CHECK(r.error().status == status);
  CHECK(r.error().message.find(substring) != std::string::npos);
}

std::string input_json(std::string_view name, std::string_view dtype, std::string_view shape,
                       std::string_view data) {
  return std::string{"{\"inputs\":[{\"name\":\""} + std::string{name} + "\",\"datatype\":\""
         + std::string{dtype} + "\",\"shape\":" + std::string{shape} + ",\"data\":"
         + std::string{data} + "}]}";
}

} // namespace

// -- JSON requests ------------------------------------------------------------

TEST_CASE("JSON data: flat and nested, for the common datatypes") {
  SUBCASE("INT32 flat") {
    std::string body = input_json("a", "INT32", "[2,2]", "[1,-2,3,2147483647]");
    auto r = parse_json(body);
    REQUIRE(r.ok());
    REQUIRE(r->inputs.size() == 1);
    CHECK(r->inputs[0].name == "a");
    CHECK(r->inputs[0].dtype == datatype::int32);
    CHECK(r->inputs[0].shape == std::vector<int64_t>{2, 2});
    CHECK(values_of<int32_t>(r->inputs[0].data) == std::vector<int32_t>{1, -2, 3, 2147483647});
    CHECK(r->inputs[0].owns_data());
  }
  SUBCASE("INT32 nested") {
    std::string body = input_json("a", "INT32", "[2,3]", "[[1,2,3],[4,5,6]]");
    auto r = parse_json(body);
    REQUIRE(r.ok());
    CHECK(values_of<int32_t>(r->inputs[0].data) == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  }
  SUBCASE("FP32, exactly as float would read it") {
    std::string body = input_json("f", "FP32", "[1,4]", "[[0.1, -2.5e-3, 3, 1e38]]");
    auto r = parse_json(body);
    REQUIRE(r.ok());
    CHECK(values_of<float>(r->inputs[0].data)
          == std::vector<float>{0.1f, -2.5e-3f, 3.0f, 1e38f});
  }
  SUBCASE("BOOL") {
    std::string body = input_json("b", "BOOL", "[3]", "[true,false,true]");
    auto r = parse_json(body);
    REQUIRE(r.ok());
    CHECK(r->inputs[0].data == std::string_view{"\x01\x00\x01", 3});
  }
  SUBCASE("BYTES, escapes unescaped") {
    std::string body = input_json("s", "BYTES", "[2,1]", "[[\"hi\"],[\"a\\\"b\\u00e9\"]]");
    auto r = parse_json(body);
    REQUIRE(r.ok());
    CHECK(split_bytes(r->inputs[0].data) == std::vector<std::string>{"hi", "a\"b\xC3\xA9"});
  }
  SUBCASE("INT64 extremes") {
    std::string body =
      input_json("i", "INT64", "[2]", "[-9223372036854775808, 9223372036854775807]");
    auto r = parse_json(body);
    REQUIRE(r.ok());
    CHECK(values_of<int64_t>(r->inputs[0].data)
          == std::vector<int64_t>{std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max()});
  }
  SUBCASE("UINT8") {
    std::string body = input_json("u", "UINT8", "[1,1,3]", "[[[0,128,255]]]");
    auto r = parse_json(body);
    REQUIRE(r.ok());
    CHECK(values_of<uint8_t>(r->inputs[0].data) == std::vector<uint8_t>{0, 128, 255});
  }
  SUBCASE("UINT64 and FP64") {
    std::string body = "{\"inputs\":[{\"name\":\"u\",\"datatype\":\"UINT64\",\"shape\":[1],"
                       "\"data\":[18446744073709551615]},{\"name\":\"d\",\"datatype\":\"FP64\","
                       "\"shape\":[2],\"data\":[0.1,1e300]}]}";
    auto r = parse_json(body);
    REQUIRE(r.ok());
    CHECK(values_of<uint64_t>(r->inputs[0].data)
          == std::vector<uint64_t>{std::numeric_limits<uint64_t>::max()});
    CHECK(values_of<double>(r->inputs[1].data) == std::vector<double>{0.1, 1e300});
  }
  SUBCASE("empty tensor") {
    std::string body = input_json("e", "FP32", "[0,3]", "[]");
    auto r = parse_json(body);
    REQUIRE(r.ok());
    CHECK(r->inputs[0].data.empty());
  }
}

TEST_CASE("fields may come in any order, and unknown fields are skipped") {
  std::string body = "{\"outputs\":[{\"parameters\":{\"binary_data\":true},\"name\":\"o\"}],"
                     "\"model_name\":\"m\",\"inputs\":[{\"data\":[[1,2]],\"extra\":{\"x\":[1]},"
                     "\"shape\":[1,2],\"datatype\":\"INT16\",\"name\":\"a\"}],\"id\":\"req-7\"}";
  auto r = parse_json(body);
  REQUIRE(r.ok());
  CHECK(r->id == "req-7");
  CHECK(values_of<int16_t>(r->inputs[0].data) == std::vector<int16_t>{1, 2});
  REQUIRE(r->outputs.size() == 1);
  CHECK(r->outputs[0].name == "o");
  CHECK(r->outputs[0].binary);
}

TEST_CASE("request parameters and requested outputs") {
  std::string body =
    "{\"id\":\"42\",\"parameters\":{\"priority\":2,\"timeout\":1500,\"binary_data_output\":true,"
    "\"note\":\"hi\",\"flag\":false,\"n\":7,\"nested\":{\"a\":1}},"
    "\"inputs\":[{\"name\":\"a\",\"datatype\":\"UINT32\",\"shape\":[1],\"data\":[1]}],"
    "\"outputs\":[{\"name\":\"p\",\"parameters\":{\"classification\":3}},"
    "{\"name\":\"q\",\"parameters\":{\"binary_data\":false}}]}";
  auto r = parse_json(body);
  REQUIRE(r.ok());
  CHECK(r->priority == 2);
  CHECK(r->timeout_us == 1500);
  CHECK(r->binary_data_output);
  CHECK(r->parameters.at("note") == "hi");
  CHECK(r->parameters.at("flag") == "false");
  CHECK(r->parameters.at("n") == "7");
  CHECK(r->parameters.count("nested") == 0);
  REQUIRE(r->outputs.size() == 2);
  CHECK(r->outputs[0].name == "p");
  CHECK(r->outputs[0].classification == 3);
  // Triton's rule: a listed output without its own binary_data parameter is
  // JSON, whatever binary_data_output says (that is the default only for
  // outputs sent because none were listed).
  CHECK_FALSE(r->outputs[0].binary);
  CHECK(r->outputs[1].name == "q");
  CHECK_FALSE(r->outputs[1].binary);
}

TEST_CASE("binary_data_output and listed outputs follow Triton's rule") {
  std::string in = "\"inputs\":[{\"name\":\"a\",\"datatype\":\"UINT32\",\"shape\":[1],"
                   "\"data\":[1]}]";
  auto r = parse_json("{" + in + ",\"parameters\":{\"binary_data_output\":true},"
                      "\"outputs\":[{\"name\":\"p\"},{\"name\":\"q\",\"parameters\":"
                      "{\"binary_data\":true}},{\"name\":\"r\",\"parameters\":{}}]}");
  REQUIRE(r.ok());
  REQUIRE(r->outputs.size() == 3);
  CHECK_FALSE(r->outputs[0].binary);
  CHECK(r->outputs[1].binary);
  CHECK_FALSE(r->outputs[2].binary);
  CHECK(r->binary_data_output);
  // No outputs listed: every output follows the request's default.
  r = parse_json("{" + in + ",\"parameters\":{\"binary_data_output\":true}}");
  REQUIRE(r.ok());
  CHECK(r->outputs.empty());
  CHECK(r->binary_data_output);
}

TEST_CASE("a JSON body with readable padding is parsed in place") {
  std::string body = input_json("a", "INT32", "[2]", "[5,6]");
  std::string buffer = body + std::string(64, '\0');
  parse_input in;
  in.body = std::string_view{buffer.data(), body.size()};
  in.readable_padding = 64;
  auto r = parse_infer_request(in);
  REQUIRE(r.ok());
  CHECK(values_of<int32_t>(r->inputs[0].data) == std::vector<int32_t>{5, 6});
}

TEST_CASE("a JSON header followed by 64 or more binary bytes is parsed in place, padded by them") {
  // The binary data (16 floats) is the parser's padding: no room after the
  // body is needed.
  std::string json = "{\"inputs\":[{\"name\":\"a\",\"shape\":[16],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":64}}]}";
  std::vector<float> values(16);
  for (int i = 0; i < 16; ++i)
    values[static_cast<size_t>(i)] = static_cast<float>(i) * 1.5f;
  std::string body = json + std::string(reinterpret_cast<const char*>(values.data()), 64);
  parse_input in;
  in.body = body;
  in.header_length = json.size();
  in.readable_padding = 0;
  auto r = parse_infer_request(in);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.error().message));
  REQUIRE(r->inputs.size() == 1);
  CHECK(r->inputs[0].data.data() == body.data() + json.size());
  CHECK(values_of<float>(r->inputs[0].data) == values);
}

TEST_CASE("moving and copying a request keeps owned data valid") {
  std::string body = input_json("a", "INT8", "[3]", "[1,2,3]"); // 3 bytes: in the SSO buffer
  auto r = parse_json(body);
  REQUIRE(r.ok());
  infer_request moved = std::move(*r);
  std::vector<infer_request> many;
  for (int i = 0; i < 20; ++i)
    many.push_back(moved); // copies, then reallocations move them
  for (const auto& m : many) {
    REQUIRE(m.inputs.size() == 1);
    CHECK(m.inputs[0].owns_data());
    CHECK(m.inputs[0].data == std::string_view{"\x01\x02\x03", 3});
  }
}

// -- binary requests ----------------------------------------------------------

TEST_CASE("binary tensor data: inputs point into the body, in order") {
  // Triton's example: a [2,2] UINT32 and a [3] BOOL.
  std::string json =
    "{\"inputs\":[{\"name\":\"input0\",\"shape\":[2,2],\"datatype\":\"UINT32\","
    "\"parameters\":{\"binary_data_size\":16}},{\"name\":\"input1\",\"shape\":[3],"
    "\"datatype\":\"BOOL\",\"parameters\":{\"binary_data_size\":3}}],"
    "\"outputs\":[{\"name\":\"output0\",\"parameters\":{\"binary_data\":true}}]}";
  auto b = with_binary(json, raw_bytes<uint32_t>({1, 2, 3, 4}) + std::string{"\x01\x00\x01", 3});
  auto r = parse_binary(b);
  REQUIRE(r.ok());
  REQUIRE(r->inputs.size() == 2);
  CHECK(values_of<uint32_t>(r->inputs[0].data) == std::vector<uint32_t>{1, 2, 3, 4});
  CHECK(r->inputs[0].data.data() == b.body.data() + b.header_length); // no copy
  CHECK_FALSE(r->inputs[0].owns_data());
  CHECK(r->inputs[1].data == std::string_view{"\x01\x00\x01", 3});
  CHECK(r->inputs[1].data.data() == b.body.data() + b.header_length + 16);
  REQUIRE(r->outputs.size() == 1);
  CHECK(r->outputs[0].binary);
}

TEST_CASE("binary BYTES and FP16 inputs, mixed with JSON data") {
  std::string json =
    "{\"inputs\":[{\"name\":\"s\",\"shape\":[2],\"datatype\":\"BYTES\","
    "\"parameters\":{\"binary_data_size\":15}},{\"name\":\"j\",\"shape\":[1],"
    "\"datatype\":\"INT32\",\"data\":[9]},{\"name\":\"h\",\"shape\":[2],\"datatype\":\"FP16\","
    "\"parameters\":{\"binary_data_size\":4}}]}";
  std::string strings = bytes_elements({"abcd", std::string_view{"\x00\xffz", 3}});
  REQUIRE(strings.size() == 15);
  auto b = with_binary(json, strings + raw_bytes<uint16_t>({0x3C00, 0xC000}));
  auto r = parse_binary(b);
  REQUIRE(r.ok());
  CHECK(split_bytes(r->inputs[0].data) == std::vector<std::string>{"abcd", std::string{"\x00\xffz", 3}});
  CHECK(values_of<int32_t>(r->inputs[1].data) == std::vector<int32_t>{9});
  CHECK(values_of<uint16_t>(r->inputs[2].data) == std::vector<uint16_t>{0x3C00, 0xC000});
}

TEST_CASE("binary data errors") {
  std::string json_16 = "{\"inputs\":[{\"name\":\"a\",\"shape\":[4],\"datatype\":\"FP32\","
                        "\"parameters\":{\"binary_data_size\":16}}]}";
  check_error(parse_binary(with_binary(json_16, std::string(12, 'x'))), status_code::bad_request,
              "input 'a' has binary_data_size 16 but only 12 bytes of binary data remain");
  check_error(parse_binary(with_binary(json_16, std::string(20, 'x'))), status_code::bad_request,
              "4 bytes of binary data after the JSON header that no input's binary_data_size");

  std::string no_header_body = json_16 + std::string(16, 'x');
  parse_input in;
  in.body = no_header_body;
  in.content_type = "application/json";
  check_error(parse_infer_request(in), status_code::bad_request,
              "set Inference-Header-Content-Length to the JSON's length");
  check_error(parse_json(json_16), status_code::bad_request,
              "input 'a' has binary_data_size but the request has no "
              "Inference-Header-Content-Length");

  binary_body too_long{json_16, json_16.size() + 1};
  check_error(parse_binary(too_long), status_code::bad_request,
              "Inference-Header-Content-Length is");

  std::string both = "{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"FP32\","
                     "\"data\":[1],\"parameters\":{\"binary_data_size\":4}}]}";
  check_error(parse_binary(with_binary(both, "abcd")), status_code::bad_request,
              "has both \"data\" and the binary_data_size parameter");
}

// -- raw binary requests ------------------------------------------------------

TEST_CASE("raw binary body: the bytes of the model's single input") {
  model_config m;
  m.name = "raw";
  m.max_batch_size = 8;
  m.inputs = {{"x", datatype::fp32, {4}}};
  std::string body = raw_bytes<float>({1, 2, 3, 4, 5, 6, 7, 8});
  parse_input in;
  in.body = body;
  in.content_type = "application/octet-stream";
  in.model = &m;

  SUBCASE("batched model: batch dimension inferred") {
    auto r = parse_infer_request(in);
    REQUIRE(r.ok());
    REQUIRE(r->inputs.size() == 1);
    CHECK(r->inputs[0].name == "x");
    CHECK(r->inputs[0].shape == std::vector<int64_t>{2, 4});
    CHECK(r->inputs[0].data.data() == body.data());
  }
  SUBCASE("Inference-Header-Content-Length: 0 also means raw, answered in binary") {
    in.content_type = "";
    in.header_length = 0;
    auto r = parse_infer_request(in);
    REQUIRE(r.ok());
    CHECK(r->inputs[0].shape == std::vector<int64_t>{2, 4});
    // Triton answers a raw request with binary outputs.
    CHECK(r->binary_data_output);
    CHECK(r->outputs.empty());
  }
  SUBCASE("application/octet-stream alone (this server's extension) keeps JSON outputs") {
    auto r = parse_infer_request(in);
    REQUIRE(r.ok());
    CHECK_FALSE(r->binary_data_output);
  }
  SUBCASE("one variable dimension is inferred") {
    m.max_batch_size = 0;
    m.inputs[0].dims = {2, -1};
    auto r = parse_infer_request(in);
    REQUIRE(r.ok());
    CHECK(r->inputs[0].shape == std::vector<int64_t>{2, 4});
  }
  SUBCASE("two variable dimensions: Triton's message") {
    m.max_batch_size = 0;
    m.inputs[0].dims = {-1, -1};
    check_error(parse_infer_request(in), status_code::bad_request,
                "The shape of the raw input 'x' can not be deduced because there are more than "
                "one variable-sized dimension");
  }
  SUBCASE("fixed dims must hold exactly the body") {
    m.max_batch_size = 0;
    m.inputs[0].dims = {4};
    check_error(parse_infer_request(in), status_code::bad_request,
                "has 8 elements but the model's dims [4] hold 4");
  }
  SUBCASE("body not a whole number of elements") {
    std::string odd = body.substr(0, 7);
    in.body = odd;
    check_error(parse_infer_request(in), status_code::bad_request,
                "has 7 bytes, not a multiple of the 4-byte FP32 element");
  }
  SUBCASE("BYTES input: the body is one element") {
    m.inputs[0] = {"text", datatype::bytes, {1}};
    std::string text = "raw text \xff";
    in.body = text;
    auto r = parse_infer_request(in);
    REQUIRE(r.ok());
    CHECK(r->inputs[0].shape == std::vector<int64_t>{1, 1});
    CHECK(split_bytes(r->inputs[0].data) == std::vector<std::string>{text});
  }
  SUBCASE("BYTES input whose dims hold more than one element: Triton refuses") {
    std::string text = "427";
    in.body = text;
    in.header_length = 0;
    for (std::vector<int64_t> dims : {std::vector<int64_t>{-1}, {2}, {1, -1}}) {
      m.inputs[0] = {"INPUT0", datatype::bytes, dims};
      check_error(parse_infer_request(in), status_code::bad_request,
                  "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]");
    }
    m.inputs[0] = {"INPUT0", datatype::bytes, {1, 1}};
    CHECK(parse_infer_request(in).ok());
  }
  SUBCASE("a model with two inputs cannot take a raw body") {
    m.inputs.push_back({"y", datatype::fp32, {4}});
    check_error(parse_infer_request(in), status_code::bad_request,
                "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
                "'raw' model configuration");
  }
  SUBCASE("without a model a raw body is refused") {
    in.model = nullptr;
    check_error(parse_infer_request(in), status_code::bad_request,
                "needs a model with a single input");
  }
}

// -- bad requests -------------------------------------------------------------

TEST_CASE("malformed JSON and encoding errors are 400 with a clear message") {
  check_error(parse_json(""), status_code::bad_request, "the request body is empty");
  check_error(parse_json("{\"inputs\":[{\"name\":\"a\" \"datatype\":\"INT8\"}]}"),
              status_code::bad_request, "not valid JSON");
  check_error(parse_json("{\"inputs\":[{\"name\":\"a\",\"datatype\":\"INT8\",\"shape\":[1],"
                         "\"data\":[1,]}]}"),
              status_code::bad_request, "not valid JSON");
  check_error(parse_json("[1,2]"), status_code::bad_request, "must be a JSON object");
  check_error(parse_json("{\"inputs\":[{\"name\":\"a\xff\",\"datatype\":\"FP32\",\"shape\":[1],"
                         "\"data\":[1]}]}"),
              status_code::bad_request, "not valid UTF-8");
  check_error(parse_json("{\"id\":\"x\"}"), status_code::bad_request, "has no \"inputs\"");
  check_error(parse_json("{\"id\":5,\"inputs\":[]}"), status_code::bad_request,
              "\"id\" must be a string");
  check_error(parse_json("{\"inputs\":[]} x"), status_code::bad_request,
              "set Inference-Header-Content-Length to the JSON's length");
  check_error(parse_json("{\"inputs\":[1]}"), status_code::bad_request,
              "inputs[0] must be an object");
}

TEST_CASE("a malformed document is refused before On Demand looks fields up (fuzz: kserve_request)") {
  // An unbalanced "parameters" object: the unordered lookups of "data" after it
  // reached a state simdjson assumes impossible (undefined behaviour).
  check_error(parse_json("{\"inputs\":[{\"name\":\"\",\"shape\":[],\"datatype\":\"BYTES\","
                         "\"parameters\":{\"\":]}}"),
              status_code::bad_request, "not valid JSON");
  binary_body b{"{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"BYTES\","
                "\"parameters\":{\"binary_data_size\":]}}abcd", 90};
  check_error(parse_binary(b), status_code::bad_request, "not valid JSON");
}

TEST_CASE("bad input fields") {
  check_error(parse_json("{\"inputs\":[{\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}"),
              status_code::bad_request, "inputs[0] has no \"name\" field");
  check_error(parse_json(input_json("a", "FLOAT", "[1]", "[1]")), status_code::bad_request,
              "input 'a' has unknown datatype 'FLOAT'; use one of BOOL, UINT8");
  check_error(parse_json("{\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"data\":[1]}]}"),
              status_code::bad_request, "input 'a' has no \"shape\" field");
  check_error(parse_json(input_json("a", "FP32", "[1.5]", "[1]")), status_code::bad_request,
              "input 'a' shape must be an array of integers");
  check_error(parse_json(input_json("a", "FP32", "[2,-1]", "[1]")), status_code::bad_request,
              "input 'a' has shape [2,-1] with a negative dimension");
  check_error(parse_json(input_json("a", "FP32", "[4294967296,4294967296]", "[1]")),
              status_code::bad_request,
              "causes total element count to exceed maximum size of 9223372036854775807");
  check_error(parse_json(input_json("a", "FP32", "[65536,65536]", "[1]")),
              status_code::bad_request, "more than the limit of");
  // Triton's two overflow messages (qa/L0_http/http_test.py matches them).
  check_error(parse_json(input_json("a", "FP32", "[16,1152921504606846978]", "[1.0]")),
              status_code::bad_request,
              "invalid shape for input 'a': shape [16,1152921504606846978] causes total element "
              "count to exceed maximum size of 9223372036854775807");
  check_error(parse_json(input_json("a", "FP32", "[4,1152921504606846978]", "[1.0]")),
              status_code::bad_request,
              "byte size overflow for input 'a': element count (4611686018427387912) * data "
              "type size (4) exceeds maximum allowed size (9223372036854775807)");
  check_error(parse_json(input_json("a", "FP32", "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", "[1]")),
              status_code::bad_request, "more than 16 dimensions");
  check_error(parse_json("{\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[1]}]}"),
              status_code::bad_request, "input 'a' has no \"data\"");
}

TEST_CASE("data that does not fit the shape or datatype") {
  check_error(parse_json(input_json("a", "INT32", "[2,2]", "[1,2,3]")), status_code::bad_request,
              "Unable to parse 'data': Shape does not match true shape of 'data' field: input "
              "'a' has 3 data elements but its shape [2,2] needs 4");
  check_error(parse_json(input_json("a", "INT32", "[2,2]", "[1,2,3,4,5]")),
              status_code::bad_request,
              "Unable to parse 'data': Shape does not match true shape of 'data' field: input "
              "'a' has more data elements than its shape [2,2] holds (4)");
  check_error(parse_json(input_json("a", "INT32", "[2]", "[1,\"2\"]")), status_code::bad_request,
              "input 'a' has datatype INT32 but data element 1 is not an integer");
  check_error(parse_json(input_json("a", "INT32", "[2]", "[1,2.5]")), status_code::bad_request,
              "data element 1 is not an integer");
  check_error(parse_json(input_json("a", "INT8", "[1]", "[300]")), status_code::bad_request,
              "data element 0 (300) is out of range for INT8");
  check_error(parse_json(input_json("a", "UINT8", "[1]", "[-1]")), status_code::bad_request,
              "data element 0 (-1) is out of range for UINT8");
  check_error(parse_json(input_json("a", "UINT16", "[1]", "[\"x\"]")), status_code::bad_request,
              "data element 0 is not a non-negative integer");
  // A huge shape with little data fails before anything is allocated for it.
  check_error(parse_json(input_json("a", "FP64", "[100000000]", "[1]")), status_code::bad_request,
              "input 'a' has shape [100000000] of 100000000 elements, more than its \"data\" can "
              "hold");
  check_error(parse_json(input_json("a", "FP32", "[1]", "[1e39]")), status_code::bad_request,
              "out of range for FP32");
  check_error(parse_json(input_json("a", "BOOL", "[1]", "[1]")), status_code::bad_request,
              "is not true or false");
  check_error(parse_json(input_json("a", "BYTES", "[1]", "[1]")), status_code::bad_request,
              "is not a string");
  check_error(parse_json(input_json("a", "FP16", "[1]", "[1.0]")), status_code::bad_request,
              "receiving FP16 data via JSON is not supported. Please use the binary data format "
              "for input a: input 'a' has datatype FP16, which JSON cannot carry; send it as "
              "binary data");
}

TEST_CASE("nested data: any nesting up to Triton's depth limit of 100") {
  auto nested = [](size_t depth, const std::string& scalar) {
    return std::string(depth, '[') + scalar + std::string(depth, ']');
  };
  // Nesting that follows the shape, and nesting that does not (Triton only
  // counts the elements).
  for (auto data : {std::string("[[1,2],[3,4]]"), std::string("[1,2,3,4]"),
                    std::string("[[[1]],[[2]],[3,4]]"), std::string("[[[[1,2,3,4]]]]")}) {
    auto r = parse_json(input_json("a", "INT32", "[2,2]", data));
    REQUIRE_MESSAGE(r.ok(), data);
    CHECK(values_of<int32_t>(r->inputs[0].data) == std::vector<int32_t>{1, 2, 3, 4});
  }
  // Triton's test: 50 arrays around one element pass, 120 fail; the element
  // may sit at depth 99, not 100.
  for (size_t depth : {size_t{1}, size_t{50}, size_t{99}}) {
    auto r = parse_json(input_json("a", "INT64", "[1,1]", nested(depth, "123")));
    REQUIRE_MESSAGE(r.ok(), depth);
    CHECK(values_of<int64_t>(r->inputs[0].data) == std::vector<int64_t>{123});
    r = parse_json(input_json("s", "BYTES", "[1,1]", nested(depth, "\"hello\"")));
    REQUIRE_MESSAGE(r.ok(), depth);
    CHECK(split_bytes(r->inputs[0].data) == std::vector<std::string>{"hello"});
  }
  for (size_t depth : {size_t{100}, size_t{120}}) {
    check_error(parse_json(input_json("a", "INT64", "[1,1]", nested(depth, "123"))),
                status_code::bad_request,
                "JSON nesting depth exceeds maximum allowed limit (100): input 'a' has \"data\" "
                "nested in 100 or more arrays");
    check_error(parse_json(input_json("s", "BYTES", "[1,1]", nested(depth, "\"hello\""))),
                status_code::bad_request, "JSON nesting depth exceeds maximum allowed limit (100)");
  }
  // Deeper than simdjson's whole-document limit: still a clear 400.
  check_error(parse_json(input_json("a", "INT64", "[1]", nested(2000, "1"))),
              status_code::bad_request, "JSON nesting depth exceeds maximum allowed limit");
  // The limit is a request limit like the others.
  parse_input in;
  std::string body = input_json("a", "INT64", "[1]", nested(5, "1"));
  in.body = body;
  in.limits.max_data_depth = 5;
  check_error(parse_infer_request(in), status_code::bad_request,
              "JSON nesting depth exceeds maximum allowed limit (5)");
  in.limits.max_data_depth = 6;
  CHECK(parse_infer_request(in).ok());
}

TEST_CASE("bad parameters and outputs") {
  std::string in = "\"inputs\":[{\"name\":\"a\",\"datatype\":\"UINT8\",\"shape\":[1],\"data\":[1]}]";
  check_error(parse_json("{" + in + ",\"parameters\":{\"priority\":-1}}"), status_code::bad_request,
              "parameter priority must be a non-negative integer");
  check_error(parse_json("{" + in + ",\"parameters\":{\"timeout\":\"5\"}}"),
              status_code::bad_request, "parameter timeout must be a non-negative integer");
  check_error(parse_json("{" + in + ",\"parameters\":{\"binary_data_output\":1}}"),
              status_code::bad_request, "binary_data_output must be true or false");
  check_error(parse_json("{" + in + ",\"outputs\":[{\"parameters\":{}}]}"),
              status_code::bad_request, "outputs[0] has no \"name\" field");
  check_error(parse_json("{" + in + ",\"outputs\":[{\"name\":\"o\",\"parameters\":"
                                    "{\"classification\":-2}}]}"),
              status_code::bad_request, "classification must be a non-negative integer");
}

TEST_CASE("limits: body size and element count are 400s, body size in Triton's words") {
  std::string body = input_json("a", "INT32", "[4]", "[1,2,3,4]");
  parse_input in;
  in.body = body;
  in.limits.max_body_bytes = body.size() - 1;
  check_error(parse_infer_request(in), status_code::bad_request,
              "request JSON size of " + std::to_string(body.size())
                + " bytes exceeds the maximum allowed input size of "
                + std::to_string(body.size() - 1)
                + " bytes. Use --http-max-input-size to increase the limit");
  in.header_length = 0; // raw
  check_error(parse_infer_request(in), status_code::bad_request,
              "Raw input has a byte_size (" + std::to_string(body.size())
                + " bytes) that exceeds the maximum allowed value of "
                + std::to_string(body.size() - 1) + " bytes.");
  in.header_length.reset();
  in.limits.max_body_bytes = body.size();
  in.limits.max_elements = 3;
  check_error(parse_infer_request(in), status_code::bad_request,
              "input 'a' has shape [4], more than the limit of 3 elements per tensor");
  in.limits.max_elements = 4;
  CHECK(parse_infer_request(in).ok());
}

// -- responses ----------------------------------------------------------------

namespace {

/// The JSON part of a serialized response, parsed back into a DOM.
struct parsed_response {
  simdjson::padded_string json;
  simdjson::dom::parser parser;
  simdjson::dom::element root;

  explicit parsed_response(const serialized_response& r)
    : json(r.body.substr(0, r.header_length.value_or(r.body.size()))) {
    auto err = parser.parse(json).get(root);
    REQUIRE_MESSAGE(err == simdjson::SUCCESS, r.body);
  }
};

simdjson::dom::array array_of(simdjson::simdjson_result<simdjson::dom::element> e) {
  simdjson::dom::array a;
  REQUIRE(e.get(a) == simdjson::SUCCESS);
  return a;
}

} // namespace

TEST_CASE("JSON response: numbers round-trip exactly") {
  std::string f32 = raw_bytes<float>({0.1f, -1.0f / 3.0f, 3.4028235e38f, 1e-45f, 0.0f, -0.0f});
  std::string i64 = raw_bytes<int64_t>({std::numeric_limits<int64_t>::min(), 0, 42});
  std::string u64 = raw_bytes<uint64_t>({std::numeric_limits<uint64_t>::max()});
  std::string f64 = raw_bytes<double>({0.1, 1.0 / 3.0});
  std::string b = std::string{"\x01\x00", 2};
  response_view v;
  v.model_name = "m";
  v.model_version = "3";
  v.id = "req\"1";
  v.outputs = {{"f32", datatype::fp32, {2, 3}, f32},
               {"i64", datatype::int64, {3}, i64},
               {"u64", datatype::uint64, {1}, u64},
               {"f64", datatype::fp64, {2}, f64},
               {"b", datatype::bool_, {2}, b}};
  v.parameters = {{"queue_us", 12}, {"compute_us", 345}};
  auto r = serialize_infer_response(v, {});
  REQUIRE(r.ok());
  CHECK(r->content_type == "application/json");
  CHECK_FALSE(r->header_length.has_value());

  parsed_response p{*r};
  CHECK(std::string_view{p.root["model_name"].get_string().value()} == "m");
  CHECK(std::string_view{p.root["model_version"].get_string().value()} == "3");
  CHECK(std::string_view{p.root["id"].get_string().value()} == "req\"1");
  CHECK(uint64_t{p.root["parameters"]["compute_us"].get_uint64().value()} == 345);
  auto outputs = array_of(p.root["outputs"]);
  REQUIRE(outputs.size() == 5);

  auto o0 = outputs.at(0).value();
  CHECK(std::string_view{o0["datatype"].get_string().value()} == "FP32");
  std::vector<int64_t> shape;
  for (auto d : array_of(o0["shape"]))
    shape.push_back(d.get_int64().value());
  CHECK(shape == std::vector<int64_t>{2, 3});
  std::vector<float> floats;
  for (auto x : array_of(o0["data"]))
    floats.push_back(static_cast<float>(x.get_double().value()));
  CHECK(floats == values_of<float>(f32));

  std::vector<int64_t> ints;
  for (auto x : array_of(outputs.at(1).value()["data"]))
    ints.push_back(x.get_int64().value());
  CHECK(ints == values_of<int64_t>(i64));
  CHECK(uint64_t{outputs.at(2).value()["data"].at(0).get_uint64().value()}
        == std::numeric_limits<uint64_t>::max());
  std::vector<double> doubles;
  for (auto x : array_of(outputs.at(3).value()["data"]))
    doubles.push_back(x.get_double().value());
  CHECK(doubles == values_of<double>(f64));
  CHECK(bool{outputs.at(4).value()["data"].at(0).get_bool().value()});
  CHECK_FALSE(bool{outputs.at(4).value()["data"].at(1).get_bool().value()});
}

TEST_CASE("JSON response: NaN and infinity become null, FP16/BF16 become numbers") {
  std::string f32 = raw_bytes<float>({std::nanf(""), std::numeric_limits<float>::infinity(), 1.5f});
  // FP16 1.0, -2.0, 0.099975586 (0x2E66); BF16 1.0, 3.140625 (0x4049).
  std::string f16 = raw_bytes<uint16_t>({0x3C00, 0xC000, 0x2E66});
  std::string bf16 = raw_bytes<uint16_t>({0x3F80, 0x4049});
  response_view v;
  v.model_name = "m";
  v.model_version = "1";
  v.outputs = {{"a", datatype::fp32, {3}, f32},
               {"h", datatype::fp16, {3}, f16},
               {"bf", datatype::bf16, {2}, bf16}};
  auto r = serialize_infer_response(v, {});
  REQUIRE(r.ok());
  CHECK(r->body.find("\"data\":[null,null,1.5]") != std::string::npos);
  CHECK(r->body.find("\"data\":[1,-2,0.099975586]") != std::string::npos);
  CHECK(r->body.find("\"data\":[1,3.140625]") != std::string::npos);
  CHECK(r->body.find("\"datatype\":\"FP16\"") != std::string::npos);
  CHECK(r->body.find("\"id\"") == std::string::npos); // empty id omitted
  parsed_response p{*r}; // and it is valid JSON
}

TEST_CASE("JSON response: BYTES as escaped strings") {
  std::string data = bytes_elements({"plain", "q\"b\\n\nt\x01", "bad\xff" "utf8", "\xC3\xA9"});
  response_view v;
  v.model_name = "m";
  v.model_version = "1";
  v.outputs = {{"s", datatype::bytes, {4}, data}};
  auto r = serialize_infer_response(v, {});
  REQUIRE(r.ok());
  parsed_response p{*r};
  std::vector<std::string> strings;
  for (auto x : array_of(p.root["outputs"].at(0)["data"]))
    strings.emplace_back(std::string_view{x.get_string().value()});
  CHECK(strings == std::vector<std::string>{"plain", "q\"b\\n\nt\x01", "bad\xEF\xBF\xBDutf8",
                                            "\xC3\xA9"});
}

TEST_CASE("binary outputs: per output or for all, with the header length") {
  std::string a = raw_bytes<float>({1, 2, 3, 4, 5, 6});
  std::string b = raw_bytes<int32_t>({7, 8});
  std::string h = raw_bytes<uint16_t>({0x3C00});
  response_view v;
  v.model_name = "m";
  v.model_version = "1";
  v.outputs = {{"a", datatype::fp32, {3, 2}, a},
               {"b", datatype::int32, {2}, b},
               {"h", datatype::fp16, {1}, h}};

  SUBCASE("one output binary") {
    serialize_options o;
    o.requested = {{"a", true, 0}, {"b", false, 0}};
    auto r = serialize_infer_response(v, o);
    REQUIRE(r.ok());
    CHECK(r->content_type == "application/octet-stream");
    REQUIRE(r->header_length.has_value());
    CHECK(r->body.size() == *r->header_length + 24);
    CHECK(r->body.substr(*r->header_length) == a);
    parsed_response p{*r};
    auto out_a = p.root["outputs"].at(0);
    CHECK(uint64_t{out_a["parameters"]["binary_data_size"].get_uint64().value()} == 24);
    CHECK(out_a["data"].error() == simdjson::NO_SUCH_FIELD);
    CHECK(p.root["outputs"].at(1)["data"].at(1).get_int64().value() == 8);
  }
  SUBCASE("binary_data_output for all, one output overriding") {
    serialize_options o;
    o.binary_data_output = true;
    o.requested = {{"b", false, 0}};
    auto r = serialize_infer_response(v, o);
    REQUIRE(r.ok());
    REQUIRE(r->header_length.has_value());
    CHECK(r->body.substr(*r->header_length) == a + h); // in output order
    parsed_response p{*r};
    CHECK(uint64_t{p.root["outputs"].at(2)["parameters"]["binary_data_size"].get_uint64().value()}
          == 2);
  }
  SUBCASE("by reference: the pieces point into the outputs, nothing is copied") {
    serialize_options o;
    o.binary_data_output = true;
    o.requested = {{"b", false, 0}};
    o.binary = serialize_options::binary_output::by_reference;
    auto r = serialize_infer_response(v, o);
    REQUIRE(r.ok());
    REQUIRE(r->header_length.has_value());
    CHECK(r->body.size() == *r->header_length); // the JSON only
    REQUIRE(r->binary_data.size() == 2);
    CHECK(r->binary_data[0].data() == v.outputs[0].data.data());
    CHECK(r->binary_data[0].size() == 24);
    CHECK(r->binary_data[1].data() == v.outputs[2].data.data());
  }
}

TEST_CASE("serializing data that does not fit its shape is an internal error") {
  std::string a = raw_bytes<float>({1, 2, 3});
  response_view v;
  v.model_name = "m";
  v.model_version = "1";
  v.outputs = {{"a", datatype::fp32, {2, 2}, a}};
  auto r = serialize_infer_response(v, {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().status == status_code::internal);
  CHECK(r.error().message.find("output 'a' has 12 bytes but shape [2,2] of FP32 needs 16")
        != std::string::npos);
  std::string s = bytes_elements({"x"}).substr(0, 3);
  v.outputs = {{"s", datatype::bytes, {1}, s}};
  CHECK_FALSE(serialize_infer_response(v, {}).ok());
}

// -- classification results ---------------------------------------------------

TEST_CASE("a classification result (the post-processor's BYTES output) is written as it is") {
  // Classification is computed by the post-processor (postprocess/classification.hpp);
  // the serializer writes the BYTES tensor it made, and the request's count changes nothing.
  std::string classes = bytes_elements({"0.7:1:dog", "0.6:0:cat"});
  response_view v;
  v.model_name = "m";
  v.model_version = "1";
  v.outputs = {{"probs", datatype::bytes, {2, 1}, classes}};
  serialize_options o;
  o.requested = {{"probs", false, 1}};
  auto r = serialize_infer_response(v, o);
  REQUIRE(r.ok());
  CHECK(r->body.find("{\"name\":\"probs\",\"datatype\":\"BYTES\",\"shape\":[2,1],"
                     "\"data\":[\"0.7:1:dog\",\"0.6:0:cat\"]}")
        != std::string::npos);
  o.requested = {{"probs", true, 2}};
  r = serialize_infer_response(v, o);
  REQUIRE(r.ok());
  REQUIRE(r->header_length.has_value());
  CHECK(split_bytes(std::string_view{r->body}.substr(*r->header_length))
        == std::vector<std::string>{"0.7:1:dog", "0.6:0:cat"});
}

// -- error bodies -------------------------------------------------------------

TEST_CASE("serialize_error escapes and repairs its message") {
  CHECK(serialize_error("plain") == "{\"error\":\"plain\"}");
  CHECK(serialize_error("a \"q\" \\ b\n\t\x01") == "{\"error\":\"a \\\"q\\\" \\\\ b\\n\\t\\u0001\"}");
  CHECK(serialize_error("caf\xC3\xA9") == "{\"error\":\"caf\xC3\xA9\"}");
  CHECK(serialize_error("bad \xff\xC3") == "{\"error\":\"bad \xEF\xBF\xBD\xEF\xBF\xBD\"}");
  // Overlong encodings and surrogates are invalid UTF-8 too.
  CHECK(serialize_error("\xC0\xAF") == "{\"error\":\"\xEF\xBF\xBD\xEF\xBF\xBD\"}");
  CHECK(serialize_error("\xED\xA0\x80").find("\xED") == std::string::npos);
  std::string all_bytes;
  for (int c = 0; c < 256; ++c)
    all_bytes += static_cast<char>(c);
  simdjson::dom::parser p;
  simdjson::padded_string json{serialize_error(all_bytes)};
  simdjson::dom::element root;
  REQUIRE(p.parse(json).get(root) == simdjson::SUCCESS);
  std::string_view back = root["error"].get_string().value();
  CHECK(back.substr(0, 128) == std::string_view{all_bytes}.substr(0, 128));
}
