// Generative serving over KServe gRPC (issue 34): the caf-serving binary on a
// repository with the tiny GPT-2 fixture, driven with ModelStreamInfer as
// tritonclient.grpc's start_stream / async_stream_infer drive a decoupled
// model (text_input, stream, sampling_parameters, exclude_input_in_output;
// text_output per step). Greedy text matches transformers' reference
// (fixtures/tiny_gpt2_reference.json) with several requests interleaved on
// one stream; the final-response flag and Triton's empty final response;
// a bad request answers an error response and the stream goes on; unary
// ModelInfer is refused as Triton refuses it; a cancelled call frees its
// sequence's cache blocks.
#include "generation_metrics.hpp"
#include "support/http_client.hpp"
#include "support/json_document.hpp"
#include "support/server_process.hpp"

#include "grpc_service.grpc.pb.h"

#include <doctest/doctest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace caf_serving::generative_test;
using namespace caf_serving::support;
namespace pb = inference;

namespace {

const std::string fixtures = CAF_SERVING_GENERATIVE_FIXTURES;

struct reference_case {
  std::string prompt;
  uint32_t max_tokens = 0;
  std::string text;
};

/// The fixture's cases whose prompt text tokenizes back to its ids (a text
/// prompt then gives the reference's tokens).
std::vector<reference_case> load_reference() {
  std::ifstream in(fixtures + "/tiny_gpt2_reference.json");
  std::stringstream s;
  s << in.rdbuf();
  auto doc = json_document::parse(s.str());
  std::vector<reference_case> out;
  simdjson::dom::array cases = doc.at("/cases").get_array().value();
  for (simdjson::dom::element c : cases) {
    if (!c["prompt_roundtrips"].get_bool().value())
      continue;
    reference_case r;
    r.prompt = std::string(c["prompt"].get_string().value());
    r.max_tokens = static_cast<uint32_t>(c["max_tokens"].get_int64().value());
    r.text = std::string(c["generated_text"].get_string().value());
    out.push_back(std::move(r));
  }
  return out;
}

server_config config_for(const temp_repository& repo) {
  server_config c;
  c.binary = CAF_SERVING_BINARY;
  c.model_repository = repo.path().string();
  return c;
}

using stub_ptr = std::unique_ptr<pb::GRPCInferenceService::Stub>;
using stream_ptr
  = std::unique_ptr<grpc::ClientReaderWriter<pb::ModelInferRequest, pb::ModelStreamInferResponse>>;

stub_ptr connect(uint16_t port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  return pb::GRPCInferenceService::NewStub(channel);
}

/// A BYTES element as tritonclient serializes it.
std::string bytes_element(const std::string& s) {
  std::string out(4, '\0');
  uint32_t n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + s;
}

void add_raw(pb::ModelInferRequest& r, const char* name, const char* dtype, std::string raw) {
  auto* t = r.add_inputs();
  t->set_name(name);
  t->set_datatype(dtype);
  t->add_shape(1);
  r.add_raw_input_contents(std::move(raw));
}

void add_bool(pb::ModelInferRequest& r, const char* name, bool value) {
  add_raw(r, name, "BOOL", std::string(1, value ? '\1' : '\0'));
}

/// A greedy request for `c`, as vLLM's example client builds one: the
/// sampling fields in sampling_parameters (numbers as strings) or as request
/// parameters.
pb::ModelInferRequest greedy_request(const reference_case& c, const std::string& id,
                                     bool stream, bool in_sampling_parameters = true) {
  pb::ModelInferRequest r;
  r.set_model_name("tiny_gpt2");
  r.set_id(id);
  add_raw(r, "text_input", "BYTES", bytes_element(c.prompt));
  add_bool(r, "stream", stream);
  add_bool(r, "exclude_input_in_output", true);
  if (in_sampling_parameters) {
    add_raw(r, "sampling_parameters", "BYTES",
            bytes_element("{\"temperature\":\"0\",\"ignore_eos\":\"true\",\"max_tokens\":\""
                          + std::to_string(c.max_tokens) + "\"}"));
  } else {
    auto& p = *r.mutable_parameters();
    p["temperature"].set_double_param(0.0);
    p["ignore_eos"].set_bool_param(true);
    p["max_tokens"].set_int64_param(c.max_tokens);
  }
  return r;
}

/// text_output's one element, or nullopt when the response has no such output.
std::optional<std::string> text_output(const pb::ModelInferResponse& r) {
  for (int i = 0; i < r.outputs_size(); ++i) {
    if (r.outputs(i).name() != "text_output" || i >= r.raw_output_contents_size())
      continue;
    const std::string& raw = r.raw_output_contents(i);
    REQUIRE(raw.size() >= 4);
    uint32_t n = 0;
    for (int b = 0; b < 4; ++b)
      n |= uint32_t{static_cast<unsigned char>(raw[b])} << (8 * b);
    REQUIRE(raw.size() == 4 + n);
    return raw.substr(4);
  }
  return std::nullopt;
}

bool is_final(const pb::ModelInferResponse& r) {
  auto it = r.parameters().find("triton_final_response");
  return it != r.parameters().end() && it->second.bool_param();
}

/// Everything one request got on a stream.
struct collected {
  std::string text;
  size_t responses = 0;
  size_t finals = 0;
  std::string error;
  /// The last response.
  pb::ModelStreamInferResponse last;
};

/// Reads responses until `requests` requests have had their final one;
/// `order` gets the id of each response.
std::map<std::string, collected> read_until_final(grpc::ClientReaderWriter<pb::ModelInferRequest,
                                                                           pb::ModelStreamInferResponse>& s,
                                                  size_t requests,
                                                  std::vector<std::string>* order = nullptr) {
  std::map<std::string, collected> out;
  size_t done = 0;
  pb::ModelStreamInferResponse r;
  while (done < requests && s.Read(&r)) {
    auto& c = out[r.infer_response().id()];
    ++c.responses;
    if (!r.error_message().empty())
      c.error = r.error_message();
    if (auto t = text_output(r.infer_response()))
      c.text += *t;
    if (is_final(r.infer_response())) {
      ++c.finals;
      ++done;
    }
    if (order)
      order->push_back(r.infer_response().id());
    c.last = r;
  }
  return out;
}

void set_deadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
}

struct fixture_server {
  temp_repository repo;
  std::unique_ptr<server_process> server;
  fixture_server() {
    repo.add_model(fixtures + "/tiny_gpt2");
    server = std::make_unique<server_process>(config_for(repo));
    REQUIRE(server->grpc_port() != 0);
  }
};

} // namespace

TEST_CASE("requests interleaved on one stream answer transformers' greedy text") {
  auto cases = load_reference();
  REQUIRE(cases.size() >= 4);
  fixture_server fx;
  auto stub = connect(fx.server->grpc_port());
  grpc::ClientContext ctx;
  set_deadline(ctx);
  auto stream = stub->ModelStreamInfer(&ctx);
  // Four at once, the sampling fields as sampling_parameters for some and as
  // request parameters for others.
  for (size_t i = 0; i < 4; ++i)
    REQUIRE(stream->Write(greedy_request(cases[i], "r" + std::to_string(i), true, i % 2 == 0)));
  std::vector<std::string> order;
  auto got = read_until_final(*stream, 4, &order);
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    const auto& c = got["r" + std::to_string(i)];
    CHECK(c.error.empty());
    CHECK(c.finals == 1);
    CHECK(c.responses >= 2);
    CHECK(c.text == cases[i].text);
    // The last response carries the final flag and text_output (possibly
    // empty), as vLLM's backend sends its last step.
    CHECK(text_output(c.last.infer_response()).has_value());
    CHECK(c.last.infer_response().model_name() == "tiny_gpt2");
    CHECK(c.last.infer_response().model_version() == "1");
  }
  // The requests ran together: their responses interleave on the stream
  // rather than coming one request after the other.
  size_t switches = 0;
  for (size_t i = 1; i < order.size(); ++i)
    switches += order[i] != order[i - 1];
  CHECK_MESSAGE(switches > 3, "responses came request after request: " << switches
                                << " switches in " << order.size());
  stream->WritesDone();
  CHECK(stream->Finish().ok());
  CHECK(wait_metric(fx.server->http_port(), "caf_serving_generation_kv_cache_blocks_used", 0));
}

TEST_CASE("the final response: Triton's empty one when asked, the whole text without stream") {
  auto cases = load_reference();
  fixture_server fx;
  auto stub = connect(fx.server->grpc_port());
  grpc::ClientContext ctx;
  set_deadline(ctx);
  auto stream = stub->ModelStreamInfer(&ctx);
  const auto& c = cases[5];
  // triton_enable_empty_final_response: the text in responses that are not
  // final, then one without outputs flagged final.
  auto asked = greedy_request(c, "empty-final", true);
  (*asked.mutable_parameters())["triton_enable_empty_final_response"].set_bool_param(true);
  REQUIRE(stream->Write(asked));
  auto got = read_until_final(*stream, 1);
  const auto& e = got["empty-final"];
  CHECK(e.text == c.text);
  CHECK(e.finals == 1);
  CHECK(e.last.infer_response().outputs_size() == 0);
  CHECK(e.last.error_message().empty());

  // stream false: one response, the whole text, final.
  REQUIRE(stream->Write(greedy_request(c, "whole", false)));
  got = read_until_final(*stream, 1);
  CHECK(got["whole"].responses == 1);
  CHECK(got["whole"].text == c.text);

  // Without exclude_input_in_output (and not streaming) the prompt leads the
  // text, as vLLM's backend answers.
  auto echo = greedy_request(c, "echo", false);
  echo.mutable_inputs()->RemoveLast(); // drop sampling_parameters ...
  echo.mutable_raw_input_contents()->RemoveLast();
  echo.mutable_inputs()->RemoveLast(); // ... and exclude_input_in_output
  echo.mutable_raw_input_contents()->RemoveLast();
  auto& p = *echo.mutable_parameters();
  p["temperature"].set_double_param(0.0);
  p["ignore_eos"].set_bool_param(true);
  p["max_tokens"].set_int64_param(c.max_tokens);
  REQUIRE(stream->Write(echo));
  got = read_until_final(*stream, 1);
  CHECK(got["echo"].text == c.prompt + c.text);

  stream->WritesDone();
  CHECK(stream->Finish().ok());
}

TEST_CASE("a bad request answers an error response and the stream goes on") {
  auto cases = load_reference();
  fixture_server fx;
  auto stub = connect(fx.server->grpc_port());
  grpc::ClientContext ctx;
  set_deadline(ctx);
  auto stream = stub->ModelStreamInfer(&ctx);
  auto bad = greedy_request(cases[1], "bad", true, false);
  (*bad.mutable_parameters())["max_tokens"].set_int64_param(0);
  REQUIRE(stream->Write(bad));
  pb::ModelInferRequest no_prompt;
  no_prompt.set_model_name("tiny_gpt2");
  no_prompt.set_id("no-prompt");
  add_bool(no_prompt, "stream", true);
  REQUIRE(stream->Write(no_prompt));
  REQUIRE(stream->Write(greedy_request(cases[1], "good", true)));
  auto got = read_until_final(*stream, 3);
  CHECK_MESSAGE(got["bad"].error.find("max_tokens") != std::string::npos, got["bad"].error);
  CHECK_MESSAGE(got["no-prompt"].error.find("text_input") != std::string::npos,
                got["no-prompt"].error);
  CHECK(got["good"].error.empty());
  CHECK(got["good"].text == cases[1].text);
  stream->WritesDone();
  CHECK(stream->Finish().ok());

  // Unary ModelInfer is refused, in Triton's words and code.
  grpc::ClientContext unary_ctx;
  set_deadline(unary_ctx);
  pb::ModelInferResponse unary;
  auto status = stub->ModelInfer(&unary_ctx, greedy_request(cases[1], "unary", false), &unary);
  CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  CHECK_MESSAGE(status.error_message().find("ModelInfer RPC doesn't support models with "
                                            "decoupled transaction policy")
                  != std::string::npos,
                status.error_message());
}

TEST_CASE("a client that cancels its stream frees its sequences") {
  fixture_server fx;
  uint16_t http = fx.server->http_port();
  auto stub = connect(fx.server->grpc_port());
  grpc::ClientContext ctx;
  set_deadline(ctx);
  auto stream = stub->ModelStreamInfer(&ctx);
  reference_case long_one{"the", 250, ""};
  REQUIRE(stream->Write(greedy_request(long_one, "long-1", true)));
  REQUIRE(stream->Write(greedy_request(long_one, "long-2", true)));
  pb::ModelStreamInferResponse first;
  REQUIRE(stream->Read(&first));
  CHECK(first.error_message().empty());
  CHECK(metric(http, "caf_serving_generation_kv_cache_blocks_used") > 0);
  ctx.TryCancel();
  CHECK(wait_metric(http, "caf_serving_generation_cancelled_total", 2));
  CHECK(wait_metric(http, "caf_serving_generation_running", 0));
  CHECK(wait_metric(http, "caf_serving_generation_kv_cache_blocks_used", 0));
  stream->Finish();
}

TEST_CASE("SIGTERM: a generation running on a stream is answered to its end, then the stream "
          "closes and the server exits 0") {
  fixture_server fx;
  auto stub = connect(fx.server->grpc_port());
  grpc::ClientContext ctx;
  set_deadline(ctx);
  auto stream = stub->ModelStreamInfer(&ctx);
  reference_case long_one{"the", 200, ""};
  REQUIRE(stream->Write(greedy_request(long_one, "draining", true)));
  pb::ModelStreamInferResponse first;
  REQUIRE(stream->Read(&first));
  fx.server->send_signal(SIGTERM);
  auto rest = read_until_final(*stream, 1);
  CHECK(rest["draining"].error.empty());
  CHECK(rest["draining"].finals == 1);
  // The client keeps its side open: the drain closes the stream once nothing
  // is owed.
  pb::ModelStreamInferResponse none;
  CHECK_FALSE(stream->Read(&none));
  auto closed = stream->Finish();
  CHECK(closed.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(closed.error_message().find("shutting down") != std::string::npos);
  CHECK(fx.server->wait_exit(std::chrono::seconds(20)) == 0);
}
