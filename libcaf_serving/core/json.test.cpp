#include "core/json.hpp"
#include "core/stats.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;

TEST_CASE("JSON strings escape what JSON cannot hold and repair broken UTF-8") {
  CHECK(json_string("plain") == "\"plain\"");
  CHECK(json_string("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(json_string("line\nnext\ttab") == "\"line\\nnext\\ttab\"");
  CHECK(json_string(std::string_view("\x01", 1)) == "\"\\u0001\"");
  CHECK(json_string("caf\xC3\xA9") == "\"caf\xC3\xA9\""); // valid UTF-8 stays
  CHECK(json_string("bad\xC3") == "\"bad\xEF\xBF\xBD\"");  // truncated sequence
  CHECK(json_string("\xED\xA0\x80") == "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""); // surrogate
}

TEST_CASE("repair_utf8 keeps valid UTF-8 and replaces each invalid byte") {
  CHECK(repair_utf8("caf\xC3\xA9 \"q\"") == "caf\xC3\xA9 \"q\"");
  CHECK(repair_utf8("a\xFF\xC0\x80" "b") == "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b");
  CHECK(repair_utf8("end\xF0\x9F") == "end\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_CASE("Prometheus label values escape backslash, quote and newline") {
  CHECK(prometheus_label_value("m\"x\\y\nz") == "m\\\"x\\\\y\\nz");
}
