#pragma once
/// The HTTP ingress's generative endpoints (issue 34; part of http_server,
/// internal to the ingress): Triton's generate extension,
/// POST /v2/models/{m}[/versions/{v}]/generate (one JSON answer) and
/// /generate_stream (server-sent events), and the OpenAI-compatible
/// POST /v1/completions, /v1/chat/completions (streamed or not) and
/// GET /v1/models. The codec (generate_codec.hpp) parses and writes the
/// bodies; the prompt is tokenized here, the generation actor of the model
/// decodes, and its updates come back to this loop through a channel per
/// request. A client that goes away cancels its sequence: its cache blocks are
/// free before the next step. One per event loop; everything here runs on that
/// loop's thread.

#include "ingress/generate_codec.hpp"
#include "ingress/http_response.hpp"
#include "ingress/http_shared.hpp"

#include <kj/compat/http.h>

#include <memory>
#include <string>

namespace caf_serving::ingress {

class http_generate {
public:
  http_generate(const http_shared& shared, response_writer& writer)
      : shared_(shared), writer_(writer) {}

  /// Triton's /generate (`stream` false) and /generate_stream.
  kj::Promise<void> triton(std::shared_ptr<const server::model_pipeline> model, bool stream,
                           kj::AsyncInputStream& body, http_response& response, int64_t received);

  /// /v1/completions (`api` openai_completion) and /v1/chat/completions.
  kj::Promise<void> openai(generate_api api, kj::AsyncInputStream& body, http_response& response,
                           int64_t received);

  /// GET /v1/models and /v1/models/{id}: the generative models served.
  kj::Promise<void> openai_models(const std::string& id, http_response& response);

  /// The generative models' /metrics lines (scheduler/generation_actor.hpp).
  std::string prometheus() const;

  struct call;

private:
  kj::Promise<void> start(call& c, http_response& response);
  kj::Promise<void> send_whole(call& c, http_response& response);
  kj::Promise<void> send_stream(call& c, http_response& response);
  kj::Promise<void> send_error(const call& c, http_response& response, const serving_error& e);
  /// Counts a generation that ended well in the model's statistics.
  void record_generation(const call& c);

  const http_shared& shared_;
  response_writer& writer_;
};

} // namespace caf_serving::ingress
