#include "ingress/http_response.hpp"

#include "ingress/kserve_codec.hpp"

#include <cstring>
#include <iostream>

namespace caf_serving::ingress {

std::string header_or_empty(const kj::HttpHeaders& h, kj::HttpHeaderId id) {
  KJ_IF_MAYBE (v, h.get(id))
    return std::string(v->cStr(), v->size());
  return {};
}

// -- kserve_error_handler -------------------------------------------------------

namespace {

kj::Promise<void> send_plain_error(http_response& response, int status,
                                   const std::string& message) {
  kj::HttpHeaderTable table;
  kj::HttpHeaders headers(table);
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
  auto body = kj::heap<std::string>(serialize_error(message));
  auto stream = response.send(static_cast<uint>(status), status_text(status), headers,
                              uint64_t{body->size()});
  auto promise = stream->write(body->data(), body->size());
  return promise.attach(kj::mv(stream), kj::mv(body));
}

} // namespace

kj::Promise<void> kserve_error_handler::handleClientProtocolError(
  kj::HttpHeaders::ProtocolError error, http_response& response) {
  return send_plain_error(response, static_cast<int>(error.statusCode),
                          "the request is not valid HTTP/1.1: "
                            + std::string(error.description.cStr(), error.description.size()));
}

kj::Promise<void> kserve_error_handler::handleApplicationError(
  kj::Exception exception, kj::Maybe<http_response&> response) {
  // A client that went away: nobody to answer, nothing worth a log line.
  if (exception.getType() == kj::Exception::Type::DISCONNECTED)
    return kj::READY_NOW;
  // Headers past kj's 128 KiB buffer fail before a request exists, so there
  // is no Response to answer with; the connection is closed.
  if (response == nullptr
      && std::strstr(exception.getDescription().cStr(), "request headers too large"))
    return kj::READY_NOW;
  std::cerr << "caf-serving: internal error while serving a request: "
            << kj::str(exception).cStr() << std::endl;
  KJ_IF_MAYBE (r, response)
    return send_plain_error(*r, 500, "internal error while serving this request; see the "
                                     "server log");
  return kj::READY_NOW;
}

kj::Promise<void> kserve_error_handler::handleNoResponse(http_response& response) {
  std::cerr << "caf-serving: internal error: a request got no response" << std::endl;
  return send_plain_error(response, 500, "internal error: the server did not answer this "
                                         "request; see the server log");
}

// -- response_writer ------------------------------------------------------------

kj::Promise<void> response_writer::send(http_response& response, int status, std::string body,
                                        const response_head& head) {
  auto owned = kj::heap<std::string>(std::move(body));
  auto stream = start(response, status, *owned, head);
  auto promise =
    stream->write(owned->data(), owned->size()).attach(kj::mv(stream), kj::mv(owned));
  if (head.close == close_connection::no)
    return promise;
  // kj 0.9 sends `Connection: close` but would still wait for the next
  // request; failing as DISCONNECTED after the response ends the connection
  // (kserve_error_handler answers nothing more to that).
  return promise.then([]() -> kj::Promise<void> {
    return KJ_EXCEPTION(DISCONNECTED, "closing the connection after this response");
  });
}

kj::Promise<void> response_writer::send_error(http_response& response, int status,
                                              const std::string& message,
                                              close_connection close) {
  response_head head;
  head.close = close;
  return send(response, status, serialize_error(message), head);
}

kj::Promise<void> response_writer::send_error(http_response& response, const serving_error& e,
                                              close_connection close) {
  response_head head;
  head.close = close;
  head.retry_after_s = e.retry_after_s;
  return send(response, static_cast<int>(e.status), serialize_error(e.message), head);
}

kj::Own<kj::AsyncOutputStream> response_writer::start(http_response& response, int status,
                                                      std::string& body,
                                                      const response_head& head) {
  kj::HttpHeaders headers(table_);
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, head.content_type);
  if (head.retry_after_s > 0)
    headers.set(ids_.retry_after, kj::str(head.retry_after_s));
  if (head.header_length)
    headers.set(ids_.inference_header_length, kj::str(*head.header_length));
  if (head.encoding != content_encoding::identity) {
    body = compress(body, head.encoding);
    headers.set(ids_.content_encoding, kj::str(to_string(head.encoding).data()));
  }
  closer_.close_next = head.close == close_connection::yes;
  auto stream = response.send(static_cast<uint>(status), status_text(status), headers,
                              uint64_t{body.size()});
  closer_.close_next = false;
  return stream;
}

kj::Promise<void> response_writer::send_vectored(http_response& response, std::string json,
                                                 const std::vector<std::string_view>& tail,
                                                 std::shared_ptr<const void> keep,
                                                 const response_head& head) {
  kj::HttpHeaders headers(table_);
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, head.content_type);
  headers.set(ids_.inference_header_length, kj::str(*head.header_length));
  auto owned = kj::heap<std::string>(std::move(json));
  auto pieces = kj::heapArray<kj::ArrayPtr<const kj::byte>>(tail.size() + 1);
  auto bytes = [](std::string_view v) {
    return kj::arrayPtr(reinterpret_cast<const kj::byte*>(v.data()), v.size());
  };
  pieces[0] = bytes(*owned);
  uint64_t total = owned->size();
  for (size_t i = 0; i < tail.size(); ++i) {
    pieces[i + 1] = bytes(tail[i]);
    total += tail[i].size();
  }
  auto stream = response.send(200, status_text(200), headers, total);
  auto promise = stream->write(pieces.asPtr());
  return promise.attach(kj::mv(stream), kj::mv(owned), kj::mv(pieces), kj::mv(keep));
}

} // namespace caf_serving::ingress
