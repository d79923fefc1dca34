#pragma once
/// How the HTTP ingress writes its answers (part of http_server; internal to
/// the ingress): KServe error bodies, JSON and text, compressed where the
/// client asks, inference answers whose large binary outputs are written in
/// place, and what kj-http does with failures outside the service's answers.
///
/// Usage (an endpoint of http_service.hpp):
///
///   return writer.send_json(response, 200, body);
///   return writer.send_error(response, 404, "Not Found: ...");
///   return writer.send(response, 200, std::move(text), {"text/plain; version=0.0.4"});

#include "core/error.hpp"
#include "ingress/compression.hpp"

#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/debug.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::ingress {

using http_response = kj::HttpService::Response;

/// The headers the ingress reads or writes beside kj's built-in ones.
struct header_ids {
  explicit header_ids(kj::HttpHeaderTable::Builder& b)
      : content_encoding(b.add("Content-Encoding")),
        accept_encoding(b.add("Accept-Encoding")),
        inference_header_length(b.add("Inference-Header-Content-Length")),
        retry_after(b.add("Retry-After")) {}
  kj::HttpHeaderId content_encoding;
  kj::HttpHeaderId accept_encoding;
  kj::HttpHeaderId inference_header_length;
  kj::HttpHeaderId retry_after;
};

/// A header's value, or "" when it is absent.
std::string header_or_empty(const kj::HttpHeaders& h, kj::HttpHeaderId id);

/// The reason phrase of a status the ingress answers with.
inline const char* status_text(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
}

/// Sets `Connection: close` on the one response being started while
/// `close_next` is set: kj asks shouldClose() inside Response::send(), on the
/// event loop's thread, so the writer sets it around that call.
struct close_after_response final : kj::HttpServerCallbacks {
  bool close_next = false;
  bool shouldClose() override { return close_next; }
};

/// What HttpServer does with failures outside the service's own answers: a
/// request kj could not parse, an exception out of the service (thrown or from
/// a promise), a request left without a response. Clients get a KServe error
/// body, never kj's or CAF's text; the detail goes to stderr.
class kserve_error_handler final : public kj::HttpServerErrorHandler {
public:
  kj::Promise<void> handleClientProtocolError(kj::HttpHeaders::ProtocolError error,
                                              http_response& response) override;
  kj::Promise<void> handleApplicationError(kj::Exception exception,
                                           kj::Maybe<http_response&> response) override;
  kj::Promise<void> handleNoResponse(http_response& response) override;
};

/// Whether a response ends its connection: after a request whose framing
/// cannot be trusted, or whose body was left unread on purpose.
enum class close_connection { no, yes };

/// How a response is sent, beside its status and body.
struct response_head {
  const char* content_type = "application/json";
  /// Inference-Header-Content-Length: binary data follows this many bytes of
  /// JSON.
  std::optional<size_t> header_length = std::nullopt;
  /// The body is compressed so (the client's Accept-Encoding).
  content_encoding encoding = content_encoding::identity;
  close_connection close = close_connection::no;
  /// Retry-After in seconds; 0: none.
  uint32_t retry_after_s = 0;
};

/// Writes one event loop's responses; its header table and the loop's
/// close_after_response outlive it.
class response_writer {
public:
  response_writer(const kj::HttpHeaderTable& table, const header_ids& ids,
                  close_after_response& closer)
      : table_(table), ids_(ids), closer_(closer) {}

  const header_ids& ids() const { return ids_; }

  /// A whole response; with close_connection::yes the connection ends after
  /// it.
  kj::Promise<void> send(http_response& response, int status, std::string body,
                         const response_head& head = {});

  kj::Promise<void> send_json(http_response& response, int status, std::string body) {
    return send(response, status, std::move(body));
  }

  /// A KServe error body ({"error": message}).
  kj::Promise<void> send_error(http_response& response, int status, const std::string& message,
                               close_connection close = close_connection::no);

  /// The same for `e`, with its Retry-After.
  kj::Promise<void> send_error(http_response& response, const serving_error& e,
                               close_connection close = close_connection::no);

  /// Sends the status line and headers of a response whose body is `body`
  /// (compressed in place when `head` asks), and returns the stream to write
  /// the body to.
  kj::Own<kj::AsyncOutputStream> start(http_response& response, int status, std::string& body,
                                       const response_head& head);

  /// A 200 whose body is `json` followed by `tail` (binary output data, alive
  /// through `keep`), written as pieces in one vectored write.
  kj::Promise<void> send_vectored(http_response& response, std::string json,
                                  const std::vector<std::string_view>& tail,
                                  std::shared_ptr<const void> keep, const response_head& head);

private:
  const kj::HttpHeaderTable& table_;
  const header_ids& ids_;
  close_after_response& closer_;
};

} // namespace caf_serving::ingress
