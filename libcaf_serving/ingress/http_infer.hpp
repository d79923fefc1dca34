#pragma once
/// The HTTP ingress's inference endpoint, POST /v2/models/{m}[/versions/{v}]/infer
/// (part of http_server; internal to the ingress): reads the body, parses it
/// (JSON or the binary tensor extension, compressed or not), admits the
/// request (admission.hpp: shared memory, validation, the response cache, the
/// request message), hands it to the model's scheduler, and writes the answer
/// that comes back through the loop's inbox (answer_inbox.hpp). One per
/// event loop and port; everything here runs on that loop's thread.

#include "ingress/admission.hpp"
#include "ingress/answer_inbox.hpp"
#include "ingress/http_body.hpp"
#include "ingress/http_response.hpp"
#include "ingress/http_shared.hpp"

#include <kj/compat/http.h>
#include <kj/list.h>
#include <kj/timer.h>

#include <cstdint>
#include <memory>
#include <string>

namespace caf_serving::ingress {

/// Everything an inference request keeps from its headers until its answer
/// is written: one allocation per request, attached once to the request's
/// promise, which its continuations reach by reference. While it exists the
/// request counts as pending in the model's statistics, whichever way it
/// ends: answered, failed, or dropped by kj when the client goes away.
struct infer_context {
  infer_context(std::shared_ptr<const server::model_pipeline> m, int64_t received,
                body_reader r)
      : model(std::move(m)), received_ns(received), reader(std::move(r)) {
    model->stats->pending.fetch_add(1, std::memory_order_relaxed);
  }
  ~infer_context() {
    if (waiting_link.isLinked())
      waiting_in->remove(*this);
    model->stats->pending.fetch_sub(1, std::memory_order_relaxed);
  }
  infer_context(const infer_context&) = delete;
  infer_context& operator=(const infer_context&) = delete;

  std::shared_ptr<const server::model_pipeline> model;
  int64_t received_ns = 0;
  body_reader reader;
  // Headers the body needs, copied: kj's are invalid once the body is read.
  std::string content_type;
  std::string encoding_header;
  std::string header_length_text;
  std::string accept_encoding;
  bool chunked = false;
  /// Inference-Header-Content-Length: 0, a body that is all tensor bytes.
  bool raw_body = false;
  /// What the answer needs, once the request is admitted.
  answer_context answer;
  /// A successful answer's bytes and stream, alive until the write is done.
  std::string response_body;
  kj::Own<kj::AsyncOutputStream> response_stream;
  /// While the request waits for the pipeline: its place in the endpoint's
  /// list of such requests, and its end of the answer, to abandon at the
  /// exit timeout.
  kj::ListLink<infer_context> waiting_link;
  kj::List<infer_context, &infer_context::waiting_link>* waiting_in = nullptr;
  std::shared_ptr<answer_cell> cell;
};

class http_infer {
public:
  http_infer(const http_shared& shared, response_writer& writer, kj::Timer& timer)
      : shared_(shared), writer_(writer), timer_(timer) {}
  ~http_infer() noexcept(false);
  http_infer(const http_infer&) = delete;
  http_infer& operator=(const http_infer&) = delete;

  /// An inference request to `model` (found already), received at `received`.
  kj::Promise<void> infer(std::shared_ptr<const server::model_pipeline> model,
                          const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                          http_response& response, int64_t received);

  /// Answers 503 to every inference request still waiting for the pipeline,
  /// now and from now on (the exit timeout has passed); returns how many were
  /// waiting.
  size_t abandon_in_flight();

private:
  /// What holds a response's output bytes: the pipeline's message (alive
  /// while send_answer runs) or the cache's entry. A vectored write that
  /// sends the bytes in place keeps it alive until the write is done.
  struct output_owner {
    const response_message* message = nullptr;
    std::shared_ptr<const cached_response> cached;

    std::shared_ptr<const void> keep() const {
      if (cached)
        return cached;
      return std::make_shared<response_message>(*message); // shares its segments
    }
  };

  kj::Promise<void> after_body(infer_context& ctx, http_response& response);
  kj::Promise<kj::Maybe<response_message>> wait_for_pipeline(
    infer_context& ctx, kj::Promise<kj::Maybe<response_message>> p);
  kj::Promise<void> answer(infer_context& ctx, response_message msg, http_response& response);
  kj::Promise<void> answer_cached(infer_context& ctx, cache_hit& hit,
                                  http_response& response);
  kj::Promise<void> send_answer(infer_context& ctx, response_view view, http_response& response,
                                output_owner outputs);
  kj::Promise<void> send_kept(infer_context& ctx, http_response& response, std::string body,
                              const response_head& head);

  const http_shared& shared_;
  response_writer& writer_;
  kj::Timer& timer_;
  /// Set when the exit timeout passes: waiting requests answer 503.
  bool abandoned_ = false;
  /// Inference requests handed to the pipeline and not answered yet.
  kj::List<infer_context, &infer_context::waiting_link> waiting_;
  /// Their answers, on their way from the pipeline's threads; taken while
  /// inbox_task_ runs (from the first inference request on).
  std::shared_ptr<answer_inbox> inbox_ = std::make_shared<answer_inbox>();
  kj::Maybe<kj::Promise<void>> inbox_task_;
};

} // namespace caf_serving::ingress
