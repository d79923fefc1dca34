/// Inference through the whole server: JSON on the three example models,
/// nested JSON data, the binary tensor extension in both directions (BYTES
/// included), FP16 as binary data, compressed request and response bodies,
/// and classification with labels. Every check reads the returned values.

#include "server_test.hpp"

#include <doctest/doctest.h>

#include <cstdio>

using namespace caf_serving::server_test;

namespace {

test_server& server() {
  static test_server s({example_model("simple"), example_model("identity_fp32"),
                        test_model("identity_bytes"), test_model("fp16_identity"),
                        test_model("classifier")});
  return s;
}

std::vector<int32_t> iota32(int32_t from, size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = from + static_cast<int32_t>(i);
  return v;
}

std::string simple_body(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                        int64_t rows, const std::string& rest = "") {
  int64_t cols = static_cast<int64_t>(a.size()) / rows;
  return infer_body({input_json("INPUT0", "INT32", {rows, cols}, json_list(a)),
                     input_json("INPUT1", "INT32", {rows, cols}, json_list(b))},
                    rest);
}

/// Checks a JSON response of model simple for inputs a and b.
void check_simple_response(const json_document& doc, const std::vector<int32_t>& a,
                           const std::vector<int32_t>& b, int64_t rows) {
  CHECK(doc.string_at("/model_name") == "simple");
  CHECK(doc.string_at("/model_version") == "1");
  REQUIRE(doc.at("/outputs").get_array().size() == 2);
  for (int o = 0; o < 2; ++o) {
    std::string at = "/outputs/" + std::to_string(o);
    auto name = doc.string_at(at + "/name");
    CHECK(doc.string_at(at + "/datatype") == "INT32");
    CHECK(json_ints(doc.at(at + "/shape")) == std::vector<int64_t>{rows, 16});
    auto data = json_ints(doc.at(at + "/data"));
    REQUIRE(data.size() == a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      int64_t want = name == "OUTPUT0" ? a[i] + b[i] : a[i] - b[i];
      CHECK_MESSAGE(data[i] == want, name << "[" << i << "]");
    }
  }
}

} // namespace

TEST_CASE("simple adds and subtracts INT32 tensors sent as JSON, one and several rows") {
  auto http = server().client();
  auto a = iota32(-8, 16);
  std::vector<int32_t> b(16, 3);
  auto r = http.post("/v2/models/simple/infer",
                     simple_body(a, b, 1, ",\"id\":\"req-42\""), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(r.header("content-type") == "application/json");
  auto doc = json_document::parse(r.body);
  CHECK(doc.string_at("/id") == "req-42");
  check_simple_response(doc, a, b, 1);

  auto a2 = iota32(1000, 32);
  auto b2 = iota32(-2000, 32);
  r = http.post("/v2/models/simple/infer", simple_body(a2, b2, 2), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  check_simple_response(json_document::parse(r.body), a2, b2, 2);

  SUBCASE("an explicit version path answers the same") {
    r = http.post("/v2/models/simple/versions/1/infer", simple_body(a, b, 1), json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    check_simple_response(json_document::parse(r.body), a, b, 1);
    r = http.post("/v2/models/simple/versions/7/infer", simple_body(a, b, 1), json_content);
    CHECK(r.status == 404);
    CHECK(error_message(r.body).find("Request for unknown model: 'simple' version 7 is not found")
          != std::string::npos);
  }
}

TEST_CASE("identity_fp32 returns FP32 values bit for bit, flat and nested JSON") {
  auto http = server().client();
  std::vector<float> v;
  for (int i = 0; i < 32; ++i)
    v.push_back(0.1f * static_cast<float>(i) - 1.7f + (i % 3 == 0 ? 1e-7f : 0.f));
  auto r = http.post("/v2/models/identity_fp32/infer", fp32_identity_body(v, 2), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  CHECK(doc.string_at("/outputs/0/name") == "OUTPUT0");
  CHECK(doc.string_at("/outputs/0/datatype") == "FP32");
  CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{2, 16});
  CHECK(fp32_output(doc) == v);

  // The same values as nested arrays [[16 values], [16 values]].
  std::vector<float> row0(v.begin(), v.begin() + 16), row1(v.begin() + 16, v.end());
  auto nested = "[" + json_list(row0) + "," + json_list(row1) + "]";
  r = http.post("/v2/models/identity_fp32/infer",
                infer_body({input_json("INPUT0", "FP32", {2, 16}, nested)},
                           ",\"outputs\":[{\"name\":\"OUTPUT0\"}]"),
                json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(fp32_output(json_document::parse(r.body)) == v);

  // Nested INT32 data on simple too.
  auto a = iota32(5, 16);
  std::vector<int32_t> b(16, -5);
  r = http.post("/v2/models/simple/infer",
                infer_body({input_json("INPUT0", "INT32", {1, 16}, "[" + json_list(a) + "]"),
                            input_json("INPUT1", "INT32", {1, 16}, "[" + json_list(b) + "]")}),
                json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  check_simple_response(json_document::parse(r.body), a, b, 1);
}

TEST_CASE("a chunked body that outgrows the first 64 KiB buffer arrives whole") {
  // Without a Content-Length the body buffer starts at 64 KiB and grows while
  // the chunks arrive (body_bytes in http_server.cpp, which leaves new room
  // uninitialised): every byte read before a growth must survive it.
  std::vector<float> v;
  for (int i = 0; i < 16; ++i)
    v.push_back(0.5f * static_cast<float>(i) - 3.25f);
  std::string id(150000, ' ');
  for (size_t i = 0; i < id.size(); ++i)
    id[i] = static_cast<char>('a' + i % 26);
  auto body = fp32_identity_body(v, 1, ",\"id\":\"" + id + "\"");
  std::string request = "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
                        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (size_t at = 0; at < body.size(); at += 10000) {
    auto piece = body.substr(at, 10000);
    char size_line[32];
    std::snprintf(size_line, sizeof(size_line), "%zx\r\n", piece.size());
    request += size_line + piece + "\r\n";
  }
  request += "0\r\n\r\n";
  auto http = server().client();
  auto r = http.raw_request(request);
  REQUIRE_MESSAGE(r.status == 200, r.body.substr(0, 500));
  auto doc = json_document::parse(r.body);
  CHECK(doc.string_at("/id") == id);
  CHECK(fp32_output(doc) == v);
}

TEST_CASE("identity_bytes returns strings, escapes and non-ASCII included") {
  auto http = server().client();
  std::vector<std::string> words{"hello", "", "quote \" and backslash \\", "gr\xC3\xBC\xC3\x9F" "e"};
  std::string data = "[\"hello\",\"\",\"quote \\\" and backslash \\\\\",\"gr\xC3\xBC\xC3\x9F" "e\"]";
  auto r = http.post("/v2/models/identity_bytes/infer",
                     infer_body({input_json("INPUT0", "BYTES", {4, 1}, data)}), json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  CHECK(doc.string_at("/outputs/0/datatype") == "BYTES");
  CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{4, 1});
  CHECK(json_strings(doc.at("/outputs/0/data")) == words);
}

TEST_CASE("binary tensor data in both directions on identity_fp32") {
  auto http = server().client();
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>(i * i) / 7.0f;
  auto raw = to_bytes(v);
  auto json = infer_body({binary_input_json("INPUT0", "FP32", {1, 16}, raw.size())},
                         ",\"parameters\":{\"binary_data_output\":true}");
  auto r = http.post("/v2/models/identity_fp32/infer", json + raw,
                     {{"Content-Type", "application/octet-stream"},
                      {"Inference-Header-Content-Length", std::to_string(json.size())}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(r.header("content-type") == "application/octet-stream");
  REQUIRE(!r.header("inference-header-content-length").empty());
  auto body = split_binary(r);
  auto doc = json_document::parse(body.json);
  CHECK(doc.uint_at("/outputs/0/parameters/binary_data_size") == 64);
  CHECK_FALSE(doc.has("/outputs/0/data"));
  CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{1, 16});
  CHECK(from_bytes<float>(body.binary) == v);

  SUBCASE("binary input, JSON output") {
    auto plain = infer_body({binary_input_json("INPUT0", "FP32", {1, 16}, raw.size())});
    r = http.post("/v2/models/identity_fp32/infer", plain + raw,
                  {{"Inference-Header-Content-Length", std::to_string(plain.size())}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(r.header("inference-header-content-length").empty());
    CHECK(fp32_output(json_document::parse(r.body)) == v);
  }
  SUBCASE("a raw binary body is the single input's data") {
    r = http.post("/v2/models/identity_fp32/infer", raw,
                  {{"Content-Type", "application/octet-stream"}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    auto d = json_document::parse(r.body);
    CHECK(json_ints(d.at("/outputs/0/shape")) == std::vector<int64_t>{1, 16});
    CHECK(fp32_output(d) == v);
  }
}

TEST_CASE("per-output binary_data: one output binary, the other JSON") {
  auto http = server().client();
  auto a = iota32(100, 16);
  auto b = iota32(-50, 16);
  auto raw_a = to_bytes(a);
  auto json = infer_body(
    {binary_input_json("INPUT0", "INT32", {1, 16}, raw_a.size()),
     input_json("INPUT1", "INT32", {1, 16}, json_list(b))},
    ",\"outputs\":[{\"name\":\"OUTPUT1\",\"parameters\":{\"binary_data\":true}},"
    "{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":false}}]");
  auto r = http.post("/v2/models/simple/infer", json + raw_a,
                     {{"Inference-Header-Content-Length", std::to_string(json.size())}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto body = split_binary(r);
  auto doc = json_document::parse(body.json);
  REQUIRE(doc.at("/outputs").get_array().size() == 2);
  for (int o = 0; o < 2; ++o) {
    std::string at = "/outputs/" + std::to_string(o);
    if (doc.string_at(at + "/name") == "OUTPUT0") {
      auto sums = json_ints(doc.at(at + "/data"));
      REQUIRE(sums.size() == 16);
      for (size_t i = 0; i < 16; ++i)
        CHECK(sums[i] == a[i] + b[i]);
    } else {
      CHECK(doc.string_at(at + "/name") == "OUTPUT1");
      CHECK(doc.uint_at(at + "/parameters/binary_data_size") == 64);
      CHECK_FALSE(doc.has(at + "/data"));
      auto diffs = from_bytes<int32_t>(body.binary);
      REQUIRE(diffs.size() == 16);
      for (size_t i = 0; i < 16; ++i)
        CHECK(diffs[i] == a[i] - b[i]);
    }
  }

  SUBCASE("only the requested output comes back") {
    r = http.post("/v2/models/simple/infer",
                  simple_body(a, b, 1, ",\"outputs\":[{\"name\":\"OUTPUT1\"}]"), json_content);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    auto d = json_document::parse(r.body);
    REQUIRE(d.at("/outputs").get_array().size() == 1);
    CHECK(d.string_at("/outputs/0/name") == "OUTPUT1");
    CHECK(json_ints(d.at("/outputs/0/data")).front() == a[0] - b[0]);
  }
}

TEST_CASE("BYTES elements as binary data in both directions, raw bytes kept") {
  auto http = server().client();
  std::vector<std::string> items{"alpha", "", std::string("\x00\xff\xfe not utf-8", 13), "z"};
  auto raw = bytes_elements(items);
  auto json = infer_body({binary_input_json("INPUT0", "BYTES", {4, 1}, raw.size())},
                         ",\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":true}}]");
  auto r = http.post("/v2/models/identity_bytes/infer", json + raw,
                     {{"Inference-Header-Content-Length", std::to_string(json.size())}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto body = split_binary(r);
  auto doc = json_document::parse(body.json);
  CHECK(doc.string_at("/outputs/0/datatype") == "BYTES");
  CHECK(doc.uint_at("/outputs/0/parameters/binary_data_size") == raw.size());
  CHECK(parse_bytes_elements(body.binary) == items);
}

TEST_CASE("FP16 input as binary data, returned as binary FP16 and as JSON FP32 values") {
  auto http = server().client();
  std::vector<float> values{1.5f, -2.25f, 65504.f, 6.103515625e-05f, 0.f, -0.f, 3.140625f, 1e-7f};
  std::vector<uint16_t> halves;
  for (float f : values)
    halves.push_back(float_to_half(f));
  auto raw = to_bytes(halves);
  auto json = infer_body({binary_input_json("INPUT0", "FP16", {2, 4}, raw.size())},
                         ",\"parameters\":{\"binary_data_output\":true}");
  auto r = http.post("/v2/models/fp16_identity/infer", json + raw,
                     {{"Inference-Header-Content-Length", std::to_string(json.size())}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto body = split_binary(r);
  auto doc = json_document::parse(body.json);
  CHECK(doc.string_at("/outputs/0/datatype") == "FP16");
  CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{2, 4});
  CHECK(from_bytes<uint16_t>(body.binary) == halves);

  auto json_out = infer_body({binary_input_json("INPUT0", "FP16", {2, 4}, raw.size())});
  r = http.post("/v2/models/fp16_identity/infer", json_out + raw,
                {{"Inference-Header-Content-Length", std::to_string(json_out.size())}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto d = json_document::parse(r.body);
  auto got = json_numbers(d.at("/outputs/0/data"));
  REQUIRE(got.size() == halves.size());
  for (size_t i = 0; i < halves.size(); ++i)
    // Written as the shortest text that reads back to the same FP32 value.
    CHECK_MESSAGE(static_cast<float>(got[i]) == half_to_float(halves[i]), "element " << i);
}

TEST_CASE("gzip and deflate request bodies, gzip and deflate responses") {
  auto http = server().client();
  auto a = iota32(7, 16);
  auto b = iota32(3, 16);
  auto body = simple_body(a, b, 1);
  for (std::string encoding : {"gzip", "deflate"}) {
    CAPTURE(encoding);
    auto compressed = encoding == "gzip" ? gzip(body) : deflate(body);
    REQUIRE(compressed != body);
    auto r = http.post("/v2/models/simple/infer", compressed,
                       {{"Content-Type", "application/json"}, {"Content-Encoding", encoding}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(r.header("content-encoding").empty());
    check_simple_response(json_document::parse(r.body), a, b, 1);

    r = http.post("/v2/models/simple/infer", body,
                  {{"Content-Type", "application/json"}, {"Accept-Encoding", encoding}});
    REQUIRE(r.status == 200);
    CHECK(r.header("content-encoding") == encoding);
    auto plain = inflate(r.body);
    check_simple_response(json_document::parse(plain), a, b, 1);
  }
  SUBCASE("a corrupt gzip body is a 400") {
    auto bad = gzip(body);
    bad.resize(bad.size() / 2);
    auto r = http.post("/v2/models/simple/infer", bad,
                       {{"Content-Type", "application/json"}, {"Content-Encoding", "gzip"}});
    CHECK(r.status == 400);
    CHECK_FALSE(error_message(r.body).empty());
  }
}

TEST_CASE("classification returns the top classes with their labels") {
  auto http = server().client();
  std::vector<float> scores{0.1f, 0.7f, 0.05f, 0.9f, 0.3f,  // row 0: fish, dog
                            0.6f, 0.2f, 0.8f, 0.0f, 0.5f}; // row 1: bird, cat
  auto r = http.post(
    "/v2/models/classifier/infer",
    infer_body({input_json("INPUT0", "FP32", {2, 5}, json_list(scores))},
               ",\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"classification\":2}}]"),
    json_content);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto doc = json_document::parse(r.body);
  CHECK(doc.string_at("/outputs/0/datatype") == "BYTES");
  CHECK(json_ints(doc.at("/outputs/0/shape")) == std::vector<int64_t>{2, 2});
  CHECK(json_strings(doc.at("/outputs/0/data"))
        == std::vector<std::string>{"0.9:3:fish", "0.7:1:dog", "0.8:2:bird", "0.6:0:cat"});

  SUBCASE("without classification the scores come back") {
    r = http.post("/v2/models/classifier/infer",
                  infer_body({input_json("INPUT0", "FP32", {2, 5}, json_list(scores))}),
                  json_content);
    REQUIRE(r.status == 200);
    CHECK(fp32_output(json_document::parse(r.body)) == scores);
  }
}
