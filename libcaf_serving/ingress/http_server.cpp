#include "ingress/http_server.hpp"

#include "core/clock.hpp"
#include "core/pipeline_messages.hpp"
#include "ingress/answer_inbox.hpp"
#include "ingress/compression.hpp"
#include "ingress/infer_message.hpp"
#include "ingress/http_listen.hpp"
#include "ingress/repository_index.hpp"
#include "ingress/repository_api.hpp"
#include "ingress/shm_api.hpp"
#include "ingress/shm_tensors.hpp"
#include "ingress/response_cache.hpp"
#include "ingress/restricted_api.hpp"
#include "ingress/validate.hpp"
#include "repository/config_json.hpp"

#include <caf/send.hpp>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/compat/http.h>
#include <kj/list.h>
#include <kj/mutex.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fcntl.h>

#include <sys/syscall.h>
#include <unistd.h>

namespace caf_serving::ingress {

namespace {

/// The Triton release whose HTTP protocol and client behaviour this server
/// matches (tritonclient 2.51 and its examples are the tests of it).
constexpr const char* triton_protocol_version = "2.51.0";

constexpr const char* server_extensions
  = "[\"classification\",\"binary_tensor_data\",\"model_repository\",\"statistics\","
    "\"schedule_policy\",\"model_configuration\",\"system_shared_memory\"]";

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

std::string_view view(kj::StringPtr s) {
  return {s.cStr(), s.size()};
}

std::string header_or_empty(const kj::HttpHeaders& h, kj::HttpHeaderId id) {
  KJ_IF_MAYBE (v, h.get(id))
    return std::string(v->cStr(), v->size());
  return {};
}

/// The value of header `name` (any case), which need not be one the header
/// table registered.
std::optional<std::string> find_header(const kj::HttpHeaders& h, std::string_view name) {
  std::optional<std::string> found;
  h.forEach([&](kj::StringPtr key, kj::StringPtr value) {
    if (found || key.size() != name.size())
      return;
    for (size_t i = 0; i < name.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(key[i]))
          != std::tolower(static_cast<unsigned char>(name[i])))
        return;
    found = std::string(value.cStr(), value.size());
  });
  return found;
}

/// The path split at '/', without the query string.
std::vector<std::string> split_path(kj::StringPtr url) {
  std::string_view path = view(url);
  if (auto q = path.find('?'); q != std::string_view::npos)
    path = path.substr(0, q);
  std::vector<std::string> parts;
  // At most one part per '/' and one more: reserved, not grown 1, 2, 4.
  parts.reserve(static_cast<size_t>(std::count(path.begin(), path.end(), '/')) + 1);
  size_t at = 0;
  while (at < path.size()) {
    auto next = path.find('/', at);
    if (next == std::string_view::npos)
      next = path.size();
    if (next > at)
      parts.emplace_back(path.substr(at, next - at));
    at = next + 1;
  }
  return parts;
}

const char* status_text(int status) {
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
/// event loop's thread, so the service sets it around that call.
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
                                              kj::HttpService::Response& response) override {
    return send(response, static_cast<int>(error.statusCode),
                "the request is not valid HTTP/1.1: "
                  + std::string(error.description.cStr(), error.description.size()));
  }

  kj::Promise<void> handleApplicationError(kj::Exception exception,
                                           kj::Maybe<kj::HttpService::Response&> response) override {
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
      return send(*r, 500, "internal error while serving this request; see the server log");
    return kj::READY_NOW;
  }

  kj::Promise<void> handleNoResponse(kj::HttpService::Response& response) override {
    std::cerr << "caf-serving: internal error: a request got no response" << std::endl;
    return send(response, 500, "internal error: the server did not answer this request; "
                               "see the server log");
  }

private:
  static kj::Promise<void> send(kj::HttpService::Response& response, int status,
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
};

/// A request body's bytes. Unlike a std::string, whose resize zero-fills what
/// the socket then overwrites (a memset of the whole body per request), growing
/// leaves the new bytes uninitialised. A NUL follows the bytes, as in a
/// std::string, and the room past it is readable (padding()).
class body_bytes {
public:
  const char* data() const { return data_.get(); }
  char* data() { return data_.get(); }
  size_t size() const { return size_; }
  /// Allocated bytes readable after the end, which the JSON parser may use
  /// as its padding.
  size_t padding() const { return capacity_ - size_; }

  /// Makes room for `n` bytes and `spare` more after them, keeping the bytes
  /// there are; the new ones are uninitialised until written.
  void grow(size_t n, size_t spare) {
    if (n + spare + 1 > capacity_) {
      std::unique_ptr<char[]> bigger(new char[n + spare + 1]); // not zeroed
      if (size_ != 0)
        std::memcpy(bigger.get(), data_.get(), std::min(size_, n));
      data_ = std::move(bigger);
      capacity_ = n + spare + 1;
    }
    size_ = n;
  }

  /// Ends the bytes at `n` (at most size()), with a NUL after them.
  void truncate(size_t n) {
    size_ = std::min(n, size_);
    if (data_)
      data_[size_] = '\0';
  }

  std::string_view view() const { return {data_.get(), size_}; }

private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

/// A request body as read from the connection, or why there is none.
struct body_read {
  enum class outcome { complete, too_large, disconnected, malformed, stalled };
  outcome result = outcome::complete;
  body_bytes bytes;
  size_t used = 0;
};

/// Binary outputs of at least this many bytes (all outputs of a response
/// together) are written from the pipeline's message instead of copied into
/// the response body.
constexpr size_t vectored_write_min_bytes = 16 << 10;

/// Bytes simdjson may read past the end of a JSON text (SIMDJSON_PADDING);
/// parse_infer_request copies a JSON that has less readable room after it.
constexpr size_t json_parser_padding = 64;

/// Allocated bytes readable after the end of `s` (its capacity), which the
/// JSON parser may use as its padding.
size_t read_padding(const std::string& s) {
  return s.capacity() - s.size();
}

size_t read_padding(const body_bytes& b) {
  return b.padding();
}

/// Reads a request body into memory, at most `limit` bytes: one more means
/// too_large. Each read waits at most `stall` for the client's next bytes.
/// Unlike readAllBytes, every way of failing is told apart: kj reports a body
/// that ends early (the client closed or shut down its side) as DISCONNECTED,
/// and broken chunked framing as FAILED.
class body_reader {
public:
  body_reader(kj::AsyncInputStream& in, kj::Timer& timer, kj::Duration stall, size_t limit,
              std::optional<uint64_t> expected)
      : in_(in), timer_(timer), stall_(stall), limit_(limit), expected_(expected) {
    // A declared length (plus one byte, to see the end) is allocated at once;
    // a chunked body grows from 64 KiB.
    size_t first = expected ? static_cast<size_t>(std::min<uint64_t>(*expected, limit_)) + 1
                            : std::min<size_t>(size_t{64} << 10, limit_ + 1);
    // Room past the body for the JSON parser's padding, so that it parses
    // the body where it lies instead of a padded copy (read_padding()).
    body_.bytes.grow(first, json_parser_padding);
  }

  /// The whole body, or why there is none.
  kj::Promise<body_read> read() {
    return loop().then([this]() { return kj::mv(body_); },
                       [this](kj::Exception&& e) {
                         failed(e);
                         return kj::mv(body_);
                       });
  }

  /// One read: resolves to whether the body is done (read whole, or failed:
  /// see body()). A failure of the stream is an exception, for failed().
  /// A caller that goes on anyway chains this instead of read(), and loop()
  /// only when it is not done: a body that came with its headers (the usual
  /// case) costs one read and no promise nodes for the loop.
  kj::Promise<bool> step() {
    if (body_.used > limit_) {
      body_.result = body_read::outcome::too_large;
      return true;
    }
    if (body_.used == body_.bytes.size())
      body_.bytes.grow(std::min(body_.bytes.size() * 2, limit_ + 1), json_parser_padding);
    auto got = in_.tryRead(body_.bytes.data() + body_.used, 1, body_.bytes.size() - body_.used)
                 .exclusiveJoin(timer_.afterDelay(stall_).then([]() { return stalled; }));
    return got.then([this](size_t n) { return consume(n); });
  }

  /// The rest of the body, after a step() that was not done.
  kj::Promise<void> loop() {
    return step().then([this](bool done) -> kj::Promise<void> {
      if (done)
        return kj::READY_NOW;
      return loop();
    });
  }

  /// Records the failure of the stream that step() or loop() threw.
  void failed(const kj::Exception& e) {
    body_.result = e.getType() == kj::Exception::Type::DISCONNECTED
                     ? body_read::outcome::disconnected
                     : body_read::outcome::malformed;
  }

  body_read& body() { return body_; }

private:
  static constexpr size_t stalled = ~size_t{0};

  /// Takes the `n` bytes one read gave; returns whether the body is done.
  bool consume(size_t n) {
    if (n == stalled) {
      body_.result = body_read::outcome::stalled;
      return true;
    }
    if (n == 0) {
      body_.bytes.truncate(body_.used);
      return true;
    }
    body_.used += n;
    // A declared length read whole is the end: kj's stream would only
    // answer the next read with 0 (a timer and three promise nodes more).
    if (expected_ && body_.used == *expected_) {
      body_.bytes.truncate(body_.used);
      return true;
    }
    return false;
  }

  kj::AsyncInputStream& in_;
  kj::Timer& timer_;
  kj::Duration stall_;
  size_t limit_;
  std::optional<uint64_t> expected_;
  body_read body_;
};

/// Delivers a response from whichever thread the post-processor runs on to the
/// connection's event loop, through the loop's inbox (answer_inbox.hpp).
///
/// Every request gets exactly one answer: a sink dropped without an answer (a
/// pipeline stage stopped while holding the request) answers 500 naming the
/// model, instead of letting kj turn the broken promise into its own 500.
/// The request's promise carries a Maybe: nothing when the ingress gives up on
/// the answer (at the exit timeout).
class http_sink final : public response_sink {
public:
  http_sink(std::shared_ptr<answer_inbox> inbox, std::shared_ptr<answer_cell> cell,
            std::string model)
      : inbox_(std::move(inbox)), cell_(std::move(cell)), model_(std::move(model)) {}
  ~http_sink() noexcept override {
    if (!cell_)
      return;
    auto msg = response_message::create(512);
    auto err = msg.builder().initError();
    err.setStatus(static_cast<uint16_t>(status_code::internal));
    err.setMessage("model '" + model_ + "': the request was lost inside the server (a "
                   "pipeline stage stopped while holding it); retry it");
    err.setReason(wire::FailureReason::INTERNAL);
    inbox_->post(std::move(cell_), std::move(msg));
  }
  void deliver(response_message r) override { inbox_->post(std::move(cell_), std::move(r)); }

private:
  std::shared_ptr<answer_inbox> inbox_;
  /// Handed to the inbox with the answer; empty once delivered.
  std::shared_ptr<answer_cell> cell_;
  std::string model_;
};

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
  infer_request request;
  bool timing = false;
  /// The shared-memory regions the request reads and writes, mapped until
  /// it is answered.
  shared_memory_binding shared_memory;
  /// Whether the response cache was asked and had no answer.
  bool cache_missed = false;
  /// After such a miss: the key to store the answer under (none when the
  /// request is too large to be cached).
  std::optional<cache_key> cache_miss_key;
  /// Time the response cache lookup took (and copying the key, on a miss).
  int64_t cache_lookup_ns = 0;
  /// A successful answer's bytes and stream, alive until the write is done.
  std::string response_body;
  kj::Own<kj::AsyncOutputStream> response_stream;
  /// While the request waits for the pipeline: its place in the service's
  /// list of such requests, and its end of the answer, to abandon at the
  /// exit timeout.
  kj::ListLink<infer_context> waiting_link;
  kj::List<infer_context, &infer_context::waiting_link>* waiting_in = nullptr;
  std::shared_ptr<answer_cell> cell;
};

/// What every event loop shares: read-only after start, or thread-safe.
struct shared_state {
  const http_server_config& cfg;
  server::model_directory& models;
  shared_memory_registry& shm;
  const kj::HttpHeaderTable& table;
  const header_ids& ids;
  connection_count& http_connections;
  connection_count& metrics_connections;
  /// Connections each event loop has accepted on the HTTP port, by loop
  /// (written only by that loop; rendered on /metrics).
  std::vector<std::atomic<uint64_t>>& accepted_by_loop;
};

class kserve_service final : public kj::HttpService {
public:
  kserve_service(const shared_state& shared, bool metrics_only, kj::Timer& timer,
                 close_after_response& closer)
      : cfg_(shared.cfg),
        models_(shared.models),
        shm_(shared.shm),
        table_(shared.table),
        ids_(shared.ids),
        accepted_by_loop_(shared.accepted_by_loop),
        http_connections_(shared.http_connections),
        metrics_only_(metrics_only),
        timer_(timer),
        closer_(closer) {}

  ~kserve_service() noexcept(false) {
    // Every request of this loop is gone by now: answers still on their way
    // have nobody to go to.
    inbox_task_ = nullptr;
    inbox_->close();
  }

  bool draining = false;

  /// Answers 503 to every inference request still waiting for the pipeline,
  /// now and from now on (the exit timeout has passed); returns how many were
  /// waiting.
  size_t abandon_in_flight() {
    abandoned_ = true;
    // A request whose answer has come already takes that; the fulfiller
    // takes one call.
    for (auto& ctx : waiting_)
      ctx.cell->fulfiller->fulfill(kj::Maybe<response_message>(nullptr));
    return waiting_.size();
  }

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override {
    int64_t received = now_ns();
    // The request line and headers as they came, give or take the spacing.
    size_t header_bytes = url.size() + 32;
    headers.forEach([&](kj::StringPtr name, kj::StringPtr value) {
      header_bytes += name.size() + value.size() + 4;
    });
    if (header_bytes > cfg_.max_header_bytes)
      return send_error(response, 431,
                        "the request line and headers take about " + std::to_string(header_bytes)
                          + " bytes, over the limit of " + std::to_string(cfg_.max_header_bytes)
                          + " bytes (--max-header-bytes)",
                        close_connection::yes);
    auto parts = split_path(url);
    if (metrics_only_) {
      if (parts.size() == 1 && parts[0] == "metrics")
        return metrics(method, response);
      return send_error(response, 404, "Not Found: the metrics port serves only GET /metrics");
    }
    if (parts.size() == 1 && parts[0] == "metrics")
      return metrics(method, response);
    // --http-restricted-api, checked before anything else about the request
    // (its method included), as Triton does.
    if (auto group = api_group_of(parts))
      if (!cfg_.restricted.allows(*group, [&](const std::string& header) {
            return find_header(headers, header);
          }))
        return send_error(response, 403, cfg_.restricted.refusal(*group));
    if (parts.empty() || parts[0] != "v2")
      return send_error(response, 404, "Not Found: unknown path '" + std::string(view(url))
                                         + "'; KServe v2 endpoints start with /v2");
    if (parts.size() == 1)
      return expect(method, kj::HttpMethod::GET, response, [&] {
        auto cluster = models_.cluster_json();
        return send_json(response, 200,
                         // Triton's clients and examples check that the
                         // server calls itself "triton" (tritonclient's
                         // simple_http_health_metadata.py fails otherwise), so
                         // name and version are those of the Triton release
                         // whose protocol this server speaks; the engine names
                         // itself under "engine".
                         std::string("{\"name\":\"triton\",\"version\":\"")
                           + triton_protocol_version
                           + "\",\"engine\":{\"name\":\"caf-serving\",\"version\":\""
                           CAF_SERVING_VERSION "\""
                           + (cfg_.engine_cpu_json.empty() ? std::string()
                                                           : ",\"cpu\":" + cfg_.engine_cpu_json)
                           + "},\"extensions\":"
                           + std::string(server_extensions)
                           + (cluster.empty() ? std::string() : ",\"cluster\":" + cluster)
                           + "}");
      });
    if (parts[1] == "health" && parts.size() == 3) {
      return expect(method, kj::HttpMethod::GET, response, [&] {
        bool ok = parts[2] == "live" ? true
                  : parts[2] == "ready"
                    ? !draining && (!cfg_.strict_readiness || models_.all_ready())
                    : false;
        if (parts[2] != "live" && parts[2] != "ready")
          return send_error(response, 404, "Not Found: health endpoints are /v2/health/live and /ready");
        // Triton answers a server that is not ready (or not live) 400, with
        // no body.
        return send_json(response, ok ? 200 : 400, "");
      });
    }
    if (parts[1] == "repository")
      return repository(method, body, parts, response);
    if (is_shared_memory_path(parts))
      return shared_memory(method, std::move(parts), body, response);
    if (parts[1] == "models")
      return models(method, url, headers, body, response, parts, received);
    return send_error(response, 404, "Not Found: unknown path '" + std::string(view(url)) + "'");
  }

private:
  template <class F>
  kj::Promise<void> expect(kj::HttpMethod method, kj::HttpMethod wanted, Response& response,
                           F&& f) {
    if (method != wanted)
      return send_error(response, 405,
                        std::string("Method Not Allowed: this endpoint takes ")
                          + (wanted == kj::HttpMethod::GET
                                                                 ? "GET"
                                                                 : "POST"));
    return f();
  }

  /// Whether a response ends its connection: after a request whose framing
  /// cannot be trusted, or whose body was left unread on purpose.
  enum class close_connection { no, yes };

  kj::Promise<void> send_body(Response& response, int status, std::string body,
                              const char* content_type,
                              std::optional<size_t> header_length = std::nullopt,
                              content_encoding encoding = content_encoding::identity,
                              close_connection close = close_connection::no,
                              uint32_t retry_after_s = 0) {
    auto owned = kj::heap<std::string>(std::move(body));
    auto stream = start_body(response, status, *owned, content_type, header_length, encoding,
                             close, retry_after_s);
    auto promise =
      stream->write(owned->data(), owned->size()).attach(kj::mv(stream), kj::mv(owned));
    if (close == close_connection::no)
      return promise;
    // kj 0.9 sends `Connection: close` but would still wait for the next
    // request; failing as DISCONNECTED after the response ends the connection
    // (kserve_error_handler answers nothing more to that).
    return promise.then([]() -> kj::Promise<void> {
      return KJ_EXCEPTION(DISCONNECTED, "closing the connection after this response");
    });
  }

  /// A successful inference answer, written from `ctx`, which holds the bytes
  /// and the stream until the write is done: no allocation and no promise
  /// node to keep them, as send_body needs.
  kj::Promise<void> send_kept(infer_context& ctx, Response& response, std::string body,
                              const char* content_type, std::optional<size_t> header_length,
                              content_encoding encoding) {
    ctx.response_body = std::move(body);
    ctx.response_stream = start_body(response, 200, ctx.response_body, content_type,
                                     header_length, encoding, close_connection::no, 0);
    return ctx.response_stream->write(ctx.response_body.data(), ctx.response_body.size());
  }

  /// Sends the status line and headers of a response whose body is `body`
  /// (compressed in place when `encoding` asks), and returns the stream to
  /// write the body to.
  kj::Own<kj::AsyncOutputStream> start_body(Response& response, int status, std::string& body,
                                            const char* content_type,
                                            std::optional<size_t> header_length,
                                            content_encoding encoding, close_connection close,
                                            uint32_t retry_after_s) {
    kj::HttpHeaders headers(table_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, content_type);
    if (retry_after_s > 0)
      headers.set(ids_.retry_after, kj::str(retry_after_s));
    if (header_length)
      headers.set(ids_.inference_header_length, kj::str(*header_length));
    if (encoding != content_encoding::identity) {
      body = compress(body, encoding);
      headers.set(ids_.content_encoding, kj::str(to_string(encoding).data()));
    }
    closer_.close_next = close == close_connection::yes;
    auto stream = response.send(static_cast<uint>(status), status_text(status), headers,
                                uint64_t{body.size()});
    closer_.close_next = false;
    return stream;
  }

  kj::Promise<void> send_json(Response& response, int status, std::string body) {
    return send_body(response, status, std::move(body), "application/json");
  }

  kj::Promise<void> send_error(Response& response, int status, const std::string& message,
                               close_connection close = close_connection::no) {
    return send_body(response, status, serialize_error(message), "application/json",
                     std::nullopt, content_encoding::identity, close);
  }

  kj::Promise<void> send_error(Response& response, const serving_error& e,
                               close_connection close = close_connection::no) {
    return send_body(response, static_cast<int>(e.status), serialize_error(e.message),
                     "application/json", std::nullopt, content_encoding::identity, close,
                     e.retry_after_s);
  }

  /// /v2/systemsharedmemory/... and /v2/cudasharedmemory/...: the body (a
  /// register request, at most max_shm_request_bytes) is read, then
  /// shm_api.hpp answers.
  kj::Promise<void> shared_memory(kj::HttpMethod method, std::vector<std::string> parts,
                                  kj::AsyncInputStream& body, Response& response) {
    shm_method m = method == kj::HttpMethod::GET    ? shm_method::get
                   : method == kj::HttpMethod::POST ? shm_method::post
                                                    : shm_method::other;
    control_body_limit limit{max_shm_request_bytes, 413,
                             "a shared-memory request body may have at most "
                               + std::to_string(max_shm_request_bytes) + " bytes"};
    return read_control_body(body, limit.max_bytes)
      .then([this, &response, m, parts = std::move(parts),
             limit = std::move(limit)](body_read read) -> kj::Promise<void> {
        if (read.result != body_read::outcome::complete)
          return send_body_read_error(response, read, limit);
        auto r = handle_shared_memory_request(
          shm_, {m, parts, std::string_view(read.bytes.data(), read.bytes.size())});
        return send_body(response, r.status, std::move(r.body), "application/json");
      });
  }

  /// Connections open on the HTTP port now, over every loop, and those
  /// accepted per event loop: how evenly the loops share them.
  std::string loop_prometheus() const {
    std::string out = "# HELP caf_serving_http_connections_open Connections open on the HTTP "
                      "port, over every event loop (the count --max-connections limits)\n"
                      "# TYPE caf_serving_http_connections_open gauge\n"
                      "caf_serving_http_connections_open "
                      + std::to_string(http_connections_.open.load(std::memory_order_relaxed))
                      + "\n";
    out += "# HELP caf_serving_http_connections_accepted_total Connections "
           "accepted on the HTTP port, per event loop (--http-threads)\n"
           "# TYPE caf_serving_http_connections_accepted_total counter\n";
    for (size_t i = 0; i < accepted_by_loop_.size(); ++i)
      out += "caf_serving_http_connections_accepted_total{loop=\"" + std::to_string(i)
             + "\"} " + std::to_string(accepted_by_loop_[i].load(std::memory_order_relaxed))
             + "\n";
    return out;
  }

  /// An info gauge (always 1) whose labels say what the CPU backend runs at.
  std::string cpu_prometheus() const {
    if (cfg_.engine_cpu_labels.empty())
      return {};
    return "# HELP caf_serving_cpu_info What the CPU backend runs at: oneDNN's ISA, the "
           "engine's kernels' ISA, the channel block of its layouts, and whether int8 runs on "
           "VNNI or the exact path\n# TYPE caf_serving_cpu_info gauge\ncaf_serving_cpu_info{"
           + cfg_.engine_cpu_labels + "} 1\n";
  }

  kj::Promise<void> metrics(kj::HttpMethod method, Response& response) {
    return expect(method, kj::HttpMethod::GET, response, [&] {
      return send_body(response, 200,
                       prometheus_text(models_.all_stats()) + models_.cluster_prometheus()
                         + (cfg_.cache ? cfg_.cache->prometheus() : std::string())
                         + loop_prometheus() + cpu_prometheus(),
                       "text/plain; version=0.0.4");
    });
  }

  kj::Promise<void> repository(kj::HttpMethod method, kj::AsyncInputStream& body,
                               const std::vector<std::string>& parts, Response& response) {
    if (parts.size() == 3 && parts[2] == "index")
      return expect(method, kj::HttpMethod::POST, response, [&] {
        auto limit = input_size_limit();
        return read_control_body(body, limit.max_bytes)
          .then([this, &response, limit = std::move(limit)](body_read read) {
          if (read.result != body_read::outcome::complete)
            return send_body_read_error(response, read, limit);
          auto request = parse_index_request(read.bytes.view());
          if (!request)
            return send_error(response, request.error());
          std::vector<index_entry> rows;
          for (auto& row : models_.index())
            rows.push_back({std::move(row.name), std::move(row.version), std::move(row.state),
                            std::move(row.reason)});
          return send_json(response, 200, serialize_index(rows, *request));
        });
      });
    if (parts.size() == 5 && parts[2] == "models" && (parts[4] == "load" || parts[4] == "unload"))
      return expect(method, kj::HttpMethod::POST, response, [&]() -> kj::Promise<void> {
        // The body (parameters; model files for a load) is read whole, within
        // --max-body-bytes, then parsed by repository_api. Triton's phrase
        // first (its tests match on it).
        auto too_large = [this](const std::string& size) {
          return "request JSON size of " + size + " bytes exceeds the maximum allowed input "
                 "size of " + std::to_string(cfg_.limits.max_body_bytes)
                 + " bytes; raise --max-body-bytes to send larger model files";
        };
        control_body_limit limit{
          cfg_.limits.max_body_bytes, 413,
          too_large("more than " + std::to_string(cfg_.limits.max_body_bytes))};
        KJ_IF_MAYBE (n, body.tryGetLength())
          if (*n > limit.max_bytes)
            return send_error(response, 413, too_large(std::to_string(*n)),
                              close_connection::yes);
        return read_control_body(body, limit.max_bytes)
          .then([this, &response, name = parts[3], unload = parts[4] == "unload",
                 limit = std::move(limit)](body_read read) -> kj::Promise<void> {
            if (read.result != body_read::outcome::complete)
              return send_body_read_error(response, read, limit);
            return control(response, name, unload, std::string(read.bytes.view()));
          });
      });
    return send_error(response, 404,
                      "Not Found: repository endpoints are POST /v2/repository/index and "
                      "/v2/repository/models/{model}/load or /unload");
  }

  /// How much a control request's body (not an inference's) may hold, and
  /// the answer to one that holds more.
  struct control_body_limit {
    uint64_t max_bytes = 0;
    int too_large_status = 400;
    std::string too_large_message;
  };

  /// The repository index's limit: --max-body-bytes,
  /// answered as Triton answers an oversized body.
  control_body_limit input_size_limit() const {
    auto max = std::to_string(cfg_.limits.max_body_bytes);
    return {cfg_.limits.max_body_bytes, 400,
            "request JSON size of more than " + max
              + " bytes exceeds the maximum allowed input size of " + max
              + " bytes. Use --http-max-input-size to increase the limit (this server's "
                "--max-body-bytes)"};
  }

  /// Reads the body of a control request, at most `max_bytes`, each read
  /// waiting at most --idle-timeout-ms.
  kj::Promise<body_read> read_control_body(kj::AsyncInputStream& body, uint64_t max_bytes) {
    std::optional<uint64_t> expected;
    KJ_IF_MAYBE (n, body.tryGetLength())
      expected = *n;
    auto reader = kj::heap<body_reader>(body, timer_, cfg_.idle_timeout_ms * kj::MILLISECONDS,
                                        max_bytes, expected);
    auto reading = reader->read();
    return reading.attach(kj::mv(reader));
  }

  /// The answer to a control request whose body could not be read whole.
  kj::Promise<void> send_body_read_error(Response& response, const body_read& read,
                                         const control_body_limit& limit) {
    switch (read.result) {
      case body_read::outcome::disconnected:
        return KJ_EXCEPTION(DISCONNECTED, "the client left inside the request body");
      case body_read::outcome::too_large:
        return send_error(response, limit.too_large_status, limit.too_large_message,
                          close_connection::yes);
      case body_read::outcome::stalled:
        return send_error(response, 408,
                          "no byte of the request body arrived for "
                            + std::to_string(cfg_.idle_timeout_ms) + " ms (--idle-timeout-ms)",
                          close_connection::yes);
      case body_read::outcome::malformed:
      case body_read::outcome::complete:
        break;
    }
    return send_error(response, 400, "the request body could not be read",
                      close_connection::yes);
  }

  /// A load or unload with its body (repository_api).
  kj::Promise<void> control(Response& response, const std::string& name, bool unload,
                            std::string body) {
    if (unload) {
      auto params = parse_unload_request(body);
      if (!params)
        return send_error(response, params.error());
      auto r = models_.request_unload(name, *params);
      if (auto* e = std::get_if<serving_error>(&r))
        return send_error(response, *e);
      return send_json(response, 200, "");
    }
    // A load (its body parsed, files written, ONNX import, compile, warm-up)
    // runs on the model manager's loader thread; this loop keeps serving.
    using load_result = std::variant<std::monostate, serving_error>;
    auto paf = kj::newPromiseAndCrossThreadFulfiller<load_result>();
    // std::function copies its callable: the fulfiller goes behind a shared_ptr.
    auto fulfiller = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<load_result>>>(
      kj::mv(paf.fulfiller));
    auto shared_body = std::make_shared<std::string>(std::move(body));
    models_.request_load(
      name, [shared_body] { return parse_load_request(*shared_body); },
      [fulfiller](load_result r) { (*fulfiller)->fulfill(kj::mv(r)); });
    return paf.promise.then([this, &response](load_result r) {
      if (auto* e = std::get_if<serving_error>(&r))
        return send_error(response, *e);
      return send_json(response, 200, "");
    });
  }

  kj::Promise<void> models(kj::HttpMethod method, kj::StringPtr url,
                           const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                           Response& response, const std::vector<std::string>& parts,
                           int64_t received) {
    if (parts.size() == 3 && parts[2] == "stats")
      return expect(method, kj::HttpMethod::GET, response, [&] {
        return send_json(response, 200, stats_json(models_.all_stats()));
      });
    if (parts.size() < 3)
      return send_error(response, 404, "Not Found: name a model: /v2/models/{model}");
    const std::string& name = parts[2];
    size_t next = 3;
    int64_t version = 0;
    if (parts.size() >= 5 && parts[3] == "versions") {
      char* end = nullptr;
      version = std::strtoll(parts[4].c_str(), &end, 10);
      // Triton's routes take only digits there, so anything else is its 404.
      if (*end != '\0' || version <= 0)
        return send_error(response, 404, "Not Found: version '" + parts[4] + "' of model '"
                                           + name + "' is not a positive integer");
      next = 5;
    }
    std::string action = parts.size() > next ? parts[next] : "";
    if (parts.size() > next + 1)
      return send_error(response, 404, "Not Found: unknown path '" + std::string(view(url)) + "'");
    if (action == "ready")
      return expect(method, kj::HttpMethod::GET, response, [&] {
        // Triton 2.51 (the release /v2 names) answers every model or version
        // that is not ready, known or not, 400 "Model version not ready";
        // find() says which case it is, in later Triton's words.
        auto m = models_.find(name, version);
        if (!m)
          return send_error(response, 400, "Model version not ready: " + m.error().message);
        return send_json(response, 200, "");
      });
    if (action == "stats")
      return expect(method, kj::HttpMethod::GET, response, [&] {
        std::vector<std::shared_ptr<model_stats>> stats;
        for (const auto& p : models_.versions(name))
          if (version == 0 || p->version == version)
            stats.push_back(p->stats);
        if (stats.empty()) {
          // Triton's statistics answer 400 for a model or version it does
          // not serve, with its own wording; find() says why.
          auto m = models_.find(name, version);
          std::string why = m ? std::string("it is not served") : m.error().message;
          bool model_served = version != 0 && !models_.versions(name).empty();
          return send_error(response, 400,
                            (model_served ? "requested model version is not available for model '"
                                              + name + "'"
                                          : "requested model '" + name + "' is not available")
                              + ": " + why);
        }
        return send_json(response, 200, stats_json(stats));
      });
    if (action.empty() || action == "config")
      return expect(method, kj::HttpMethod::GET, response, [&] {
        auto m = models_.find(name, version);
        if (!m)
          return send_error(response, m.error());
        return send_json(response, 200, action.empty() ? (*m)->metadata_json : (*m)->config_json);
      });
    if (action == "infer") {
      if (method != kj::HttpMethod::POST)
        return send_error(response, 405, "Method Not Allowed: inference takes POST");
      auto m = models_.find(name, version);
      if (!m) {
        return send_error(response, m.error());
      }
      return infer(*m, headers, body, response, received);
    }
    return send_error(response, 404, "Not Found: unknown path '" + std::string(view(url)) + "'");
  }

  kj::Promise<void> infer(std::shared_ptr<const server::model_pipeline> model,
                          const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                          Response& response, int64_t received) {
    auto length_text = header_or_empty(headers, kj::HttpHeaderId::CONTENT_LENGTH);
    auto header_length_text = header_or_empty(headers, ids_.inference_header_length);
    const auto& limits = cfg_.limits;
    // Triton's 400 for a body over the input size limit; the body stays
    // unread, so the connection cannot go on.
    bool raw_body = header_length_text == "0";
    if (!length_text.empty() && std::strtoull(length_text.c_str(), nullptr, 10) > limits.max_body_bytes)
      return send_error(response,
                        body_too_large(std::strtoull(length_text.c_str(), nullptr, 10),
                                       limits.max_body_bytes, raw_body),
                        close_connection::yes);
    std::optional<uint64_t> expected;
    if (!length_text.empty())
      expected = std::strtoull(length_text.c_str(), nullptr, 10);
    auto owned = kj::heap<infer_context>(
      std::move(model), received,
      body_reader(body, timer_, cfg_.idle_timeout_ms * kj::MILLISECONDS, limits.max_body_bytes,
                  expected));
    infer_context& ctx = *owned;
    // Headers are invalid once the body is read: take what is needed now.
    ctx.content_type = header_or_empty(headers, kj::HttpHeaderId::CONTENT_TYPE);
    ctx.encoding_header = header_or_empty(headers, ids_.content_encoding);
    ctx.accept_encoding = header_or_empty(headers, ids_.accept_encoding);
    ctx.header_length_text = std::move(header_length_text);
    ctx.raw_body = raw_body;
    ctx.chunked = !header_or_empty(headers, kj::HttpHeaderId::TRANSFER_ENCODING).empty();
    // The body's first read, and the rest only when that was not all of it;
    // a failed read is answered as the body's outcome. (kj::cp: then() would
    // keep a reference to an lvalue handler.)
    auto read_failed = [this, &ctx, &response](kj::Exception&& e) {
      ctx.reader.failed(e);
      return after_body(ctx, response);
    };
    return ctx.reader.step()
      .then(
        [this, &ctx, &response, read_failed](bool done) -> kj::Promise<void> {
          if (done)
            return after_body(ctx, response);
          return ctx.reader.loop().then(
            [this, &ctx, &response]() { return after_body(ctx, response); }, kj::cp(read_failed));
        },
        kj::cp(read_failed))
      .attach(kj::mv(owned));
  }

  /// The rest of an inference request once its body is read (or failed):
  /// parse, check, hand to the pipeline, and answer what comes back.
  kj::Promise<void> after_body(infer_context& ctx, Response& response) {
    const auto& model = ctx.model;
    int64_t received = ctx.received_ns;
    auto fail = [&](const serving_error& e, close_connection close = close_connection::no) {
      finish_failure(*model, received, e);
      return send_error(response, static_cast<int>(e.status), e.message, close);
    };
    body_read& read = ctx.reader.body();
    switch (read.result) {
      case body_read::outcome::complete:
        break;
      case body_read::outcome::disconnected:
        // Nobody is left to answer, and a client that went away is no
        // failure of the server's: it is not counted as one.
        return KJ_EXCEPTION(DISCONNECTED, "the client left inside the request body");
      case body_read::outcome::malformed:
        return fail(bad_request(ctx.chunked ? "the request body is not valid chunked "
                                              "transfer encoding (Transfer-Encoding: chunked)"
                                            : "the request body could not be read"),
                    close_connection::yes);
      case body_read::outcome::stalled:
        return fail({static_cast<status_code>(408),
                     "no byte of the request body arrived for "
                       + std::to_string(cfg_.idle_timeout_ms) + " ms (--idle-timeout-ms)",
                     failure_reason::bad_request},
                    close_connection::yes);
      case body_read::outcome::too_large:
        // The rest of the body stays unread: the connection cannot go on.
        return fail(body_too_large(std::nullopt, cfg_.limits.max_body_bytes, ctx.raw_body),
                    close_connection::yes);
    }
    // Binary inputs point into the body (or its inflated copy) until
    // to_message has copied them into the request message.
    std::string inflated_body;
    std::string_view body_view(read.bytes.data(), read.bytes.size());
    size_t body_padding = read_padding(read.bytes);
    if (!ctx.encoding_header.empty()) {
      auto enc = parse_content_encoding(ctx.encoding_header);
      if (!enc)
        return fail(enc.error());
      if (*enc != content_encoding::identity) {
        auto inflated = decompress(body_view, *enc, cfg_.limits.max_body_bytes);
        if (!inflated)
          return fail(inflated.error());
        inflated_body = std::move(*inflated);
        body_view = inflated_body;
        body_padding = read_padding(inflated_body);
      }
    }
    parse_input in;
    in.body = body_view;
    in.readable_padding = body_padding;
    in.content_type = ctx.content_type;
    in.limits = cfg_.limits;
    in.model = &model->config;
    if (!ctx.header_length_text.empty()) {
      char* end = nullptr;
      auto n = std::strtoull(ctx.header_length_text.c_str(), &end, 10);
      if (*end != '\0')
        return fail(bad_request("Unable to parse Inference-Header-Content-Length, got: "
                                + ctx.header_length_text + "; its value '"
                                + ctx.header_length_text
                                + "' is not a number (the byte length of the JSON "
                                  "header that starts the body)"));
      in.header_length = n;
    }
    auto parsed = parse_infer_request(in);
    if (!parsed)
      return fail(parsed.error());
    auto bound = bind_shared_memory(*parsed, shm_, model->config);
    if (!bound)
      return fail(bound.error());
    ctx.shared_memory = std::move(*bound);
    auto checked = validate(*parsed, model->config, cfg_.limits);
    if (!checked)
      return fail(checked.error());
    ctx.request = std::move(*parsed);
    auto timing = ctx.request.parameters.find("timing");
    ctx.timing = timing != ctx.request.parameters.end() && timing->second == "true";
    // Not for requests that use shared memory: their inputs may live in a
    // client's region, which only copy_input_data reads safely.
    if (cfg_.cache && model->config.response_cache_enabled && ctx.shared_memory.empty())
      if (auto hit = probe_cache(ctx))
        return answer_cached(ctx, std::move(hit), response);
    auto msg = to_message(ctx, checked->batch_size, received);
    if (!msg)
      return fail(msg.error());
    // The inputs now live in `msg`: their views into the body would dangle
    // once the body goes, which need not wait for the answer, nor need
    // JSON-converted bytes wait in the queue twice.
    ctx.request.inputs.clear();
    read.bytes = body_bytes();
    if (inbox_task_ == nullptr)
      inbox_task_ = inbox_->run().eagerlyEvaluate([](kj::Exception&& e) {
        std::cerr << "caf-serving: the HTTP loop stopped taking answers from the pipeline: "
                  << e.getDescription().cStr() << std::endl;
      });
    auto [cell, answered] = answer_inbox::make_cell();
    ctx.cell = cell;
    auto sink = std::make_shared<http_sink>(inbox_, std::move(cell), model->config.name);
    caf::anon_send(model->scheduler, infer_job{std::move(*msg), std::move(sink)});
    return wait_for_pipeline(ctx, kj::mv(answered))
      .then([this, &ctx, &response](kj::Maybe<response_message> r) {
        if (ctx.waiting_link.isLinked())
          waiting_.remove(ctx);
        KJ_IF_MAYBE (answered, r)
          return answer(ctx, kj::mv(*answered), response);
        serving_error e{status_code::unavailable,
                        "the server is shutting down and did not finish this request "
                        "within --exit-timeout-secs ("
                          + std::to_string(cfg_.exit_timeout_secs) + " s)"};
        finish_failure(*ctx.model, ctx.received_ns, e);
        return send_error(response, e);
      });
  }

  /// The pipeline's answer (`p`), or nothing when the exit timeout has
  /// passed or passes first: until the answer is taken (or the request
  /// dropped) ctx is on the list abandon_in_flight() walks. A list instead of
  /// joining each request with one forked promise: that took three nodes and
  /// three allocations per request.
  kj::Promise<kj::Maybe<response_message>> wait_for_pipeline(
    infer_context& ctx, kj::Promise<kj::Maybe<response_message>> p) {
    if (abandoned_)
      return kj::Maybe<response_message>(nullptr);
    waiting_.add(ctx);
    ctx.waiting_in = &waiting_;
    return p;
  }

  /// The one copy of tensor bytes between the socket and the executor
  /// (infer_message.hpp, shared with the gRPC ingress).
  result<request_message> to_message(const infer_context& ctx, uint32_t rows, int64_t received) {
    return make_request_message(ctx.request, *ctx.model, rows, received);
  }

  void finish_failure(const server::model_pipeline& model, int64_t received,
                      const serving_error& e) {
    auto& stats = *model.stats;
    stats.record_failure(reason_of(e), static_cast<uint64_t>(now_ns() - received));
  }

  kj::Promise<void> answer(infer_context& ctx, response_message msg, Response& response) {
    auto r = msg.reader();
    if (r.getError().getStatus() != 0) {
      ctx.shared_memory = {};
      auto reason = static_cast<failure_reason>(r.getError().getReason());
      serving_error e{static_cast<status_code>(r.getError().getStatus()),
                      with_triton_phrase(reason,
                                         client_error_message(view(r.getError().getMessage()),
                                                              ctx.model->config.name)),
                      reason, r.getError().getRetryAfterS()};
      finish_failure(*ctx.model, ctx.received_ns, e);
      return send_error(response, e);
    }
    response_view view = make_response_view(r, ctx.timing);
    return send_answer(ctx, std::move(view), response, {&msg, nullptr});
  }

  // -- response cache (ingress/response_cache.hpp) ---------------------------

  /// The cached answer to ctx's request, or null; on a miss ctx keeps the key
  /// (owning its bytes: the body goes before the answer comes) for
  /// send_answer to store the answer under.
  std::shared_ptr<const cached_response> probe_cache(infer_context& ctx) {
    int64_t start = now_ns();
    auto key = cache_key::of(ctx.request, ctx.model);
    auto hit = cfg_.cache->find(key);
    ctx.cache_missed = !hit;
    if (!hit && cfg_.cache->admits(key)) {
      key.own();
      ctx.cache_miss_key = std::move(key);
    }
    ctx.cache_lookup_ns = now_ns() - start;
    return hit;
  }

  /// Answers from the cache: the pipeline is skipped, and the hit counts in
  /// success, queue (with no time) and cache_hit, as in Triton.
  kj::Promise<void> answer_cached(infer_context& ctx, std::shared_ptr<const cached_response> hit,
                                  Response& response) {
    auto& stats = *ctx.model->stats;
    stats.cache_hit.add(static_cast<uint64_t>(ctx.cache_lookup_ns));
    stats.queue.add(0);
    response_view view;
    view.outputs = hit->views();
    if (ctx.timing)
      view.parameters = {
        {"cache_hit_us", static_cast<uint64_t>(ctx.cache_lookup_ns) / 1000},
        {"until_response_us", static_cast<uint64_t>(now_ns() - ctx.received_ns) / 1000},
      };
    return send_answer(ctx, std::move(view), response, {nullptr, std::move(hit)});
  }

  /// What holds a response's output bytes: the pipeline's message (alive
  /// while send_answer runs) or the cache's entry. A vectored write that sends
  /// the bytes in place keeps it alive until the write is done.
  struct output_owner {
    const response_message* message = nullptr;
    std::shared_ptr<const cached_response> cached;

    std::shared_ptr<const void> keep() const {
      if (cached)
        return cached;
      return std::make_shared<response_message>(*message); // shares its segments
    }
  };

  /// Writes a successful answer (from the pipeline or the cache) out as the
  /// request asked, counts it, and after a cache miss stores it.
  kj::Promise<void> send_answer(infer_context& ctx, response_view view, Response& response,
                                output_owner outputs) {
    auto& stats = *ctx.model->stats;
    view.model_name = ctx.model->config.name;
    auto version = std::to_string(ctx.model->version);
    view.model_version = version;
    view.id = ctx.request.id;
    auto written = ctx.shared_memory.write_outputs(view);
    if (!written) {
      ctx.shared_memory = {};
      finish_failure(*ctx.model, ctx.received_ns, written.error());
      return send_error(response, written.error());
    }
    serialize_options opts;
    // Not needed after this: moved, not copied (names, shared-memory slices).
    opts.requested = std::move(ctx.request.outputs);
    opts.binary_data_output = ctx.request.binary_data_output;
    auto encoding = ctx.accept_encoding.empty() ? content_encoding::identity
                                                : choose_encoding(ctx.accept_encoding);
    // Large binary outputs go out from where they are, in a vectored write;
    // small ones are cheaper to copy than to keep alive and write in pieces
    // (callgrind: +1,300 instructions per request for 64 bytes), and a
    // compressed body is one string anyway.
    size_t output_bytes = 0;
    for (const auto& o : view.outputs)
      output_bytes += o.data.size();
    if (encoding == content_encoding::identity && output_bytes >= vectored_write_min_bytes)
      opts.binary = serialize_options::binary_output::by_reference;
    auto out = serialize_infer_response(view, opts);
    if (!out) {
      finish_failure(*ctx.model, ctx.received_ns, out.error());
      return send_error(response, out.error());
    }
    if (ctx.cache_missed) {
      int64_t start = now_ns();
      if (ctx.cache_miss_key)
        cfg_.cache->insert(*ctx.cache_miss_key, cached_response::copy_of(view.outputs));
      stats.cache_miss.add(static_cast<uint64_t>(ctx.cache_lookup_ns + (now_ns() - start)));
    }
    // Done with the regions: a region unregistered meanwhile goes now, before
    // the client can see the answer and ask for the status.
    ctx.shared_memory = {};
    uint64_t elapsed = static_cast<uint64_t>(now_ns() - ctx.received_ns);
    record_success(stats, elapsed, ctx.request.timeout_us);
    if (!out->binary_data.empty())
      return send_vectored(response, std::move(out->body), out->binary_data, outputs.keep(),
                           out->content_type.c_str(), *out->header_length);
    return send_kept(ctx, response, std::move(out->body), out->content_type.c_str(),
                     out->header_length, encoding);
  }

  /// A 200 whose body is `head` (the JSON) followed by `tail` (binary output
  /// data, alive through `keep`), written as pieces in one vectored write.
  kj::Promise<void> send_vectored(Response& response, std::string head,
                                  const std::vector<std::string_view>& tail,
                                  std::shared_ptr<const void> keep, const char* content_type,
                                  size_t header_length) {
    kj::HttpHeaders headers(table_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, content_type);
    headers.set(ids_.inference_header_length, kj::str(header_length));
    auto owned = kj::heap<std::string>(std::move(head));
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

  const http_server_config& cfg_;
  server::model_directory& models_;
  shared_memory_registry& shm_;
  const kj::HttpHeaderTable& table_;
  const header_ids& ids_;
  const std::vector<std::atomic<uint64_t>>& accepted_by_loop_;
  const connection_count& http_connections_;
  bool metrics_only_;
  kj::Timer& timer_;
  close_after_response& closer_;
  /// Set when the exit timeout passes: waiting requests answer 503.
  bool abandoned_ = false;
  /// Inference requests handed to the pipeline and not answered yet.
  kj::List<infer_context, &infer_context::waiting_link> waiting_;
  /// Their answers, on their way from the pipeline's threads; taken while
  /// inbox_task_ runs (from the first inference request on).
  std::shared_ptr<answer_inbox> inbox_ = std::make_shared<answer_inbox>();
  kj::Maybe<kj::Promise<void>> inbox_task_;
};

/// The thread that waits for SIGINT and SIGTERM (blocked there and read by kj).
std::atomic<pid_t> stop_signal_thread{0};

extern "C" void forward_stop_signal(int signal) {
  int saved = errno;
  pid_t target = stop_signal_thread.load();
  if (target != 0 && static_cast<pid_t>(syscall(SYS_gettid)) != target)
    syscall(SYS_tgkill, getpid(), target, signal);
  errno = saved;
}

/// kj::UnixEventPort::captureSignal blocks a signal only in the threads started
/// after it; a thread started earlier (OpenBLAS starts its thread pool when the
/// library loads, before main) would take a process-wide SIGTERM with the
/// default action and kill the server without a drain. Such threads forward the
/// signal to this thread instead.
void forward_stop_signals_to_this_thread() {
  stop_signal_thread.store(static_cast<pid_t>(syscall(SYS_gettid)));
  struct sigaction action {};
  action.sa_handler = forward_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

} // namespace

std::string with_triton_phrase(failure_reason reason, std::string message) {
  const char* phrase = reason == failure_reason::queue_full ? "Exceeds maximum queue size"
                       : reason == failure_reason::timeout  ? "Request timeout expired"
                                                            : nullptr;
  if (phrase == nullptr || message.rfind(phrase, 0) == 0)
    return message;
  return std::string(phrase) + ": " + message;
}

std::string client_error_message(std::string_view message, std::string_view model) {
  // What CAF's render() and kj's exception text look like: "error(3, caf::sec
  // ...)", "system_error(...)", "exit_reason", and source locations.
  static constexpr std::string_view internal_marks[]
    = {"caf::", "sec::", "error(", "exit_reason", "kj::", ".c++:", ".cpp:", ".hpp:"};
  bool internal = false;
  for (auto mark : internal_marks)
    internal = internal || message.find(mark) != std::string_view::npos;
  if (!internal)
    return std::string(message);
  std::cerr << "caf-serving: model '" << model << "' failed a request: " << message << std::endl;
  return "internal error while running model '" + std::string(model) + "'; see the server log";
}

namespace {


/// One event loop: its own kj loop, HttpServer and service over a duplicate of
/// the HTTP listening socket (and, on loop 0, the metrics socket). It serves
/// until `stop` resolves, then drains its own connections as
/// run_http_server's contract says, and tells how that ended.
class event_loop {
public:
  event_loop(kj::AsyncIoContext& io, const shared_state& s, unsigned index, int http_fd,
             int metrics_fd)
      : io_(io),
        timer_(io.provider->getTimer()),
        cfg_(s.cfg),
        service_(s, false, timer_, closer_),
        metrics_service_(s, true, timer_, closer_),
        server_(timer_, s.table, service_, settings()),
        metrics_server_(timer_, s.table, metrics_service_, settings()),
        gate_(server_, *io.lowLevelProvider, timer_, s.cfg.max_connections, s.http_connections,
              &s.accepted_by_loop[index]),
        metrics_gate_(metrics_server_, *io.lowLevelProvider, timer_, s.cfg.max_connections,
                      s.metrics_connections) {
    if (http_fd >= 0)
      listener_ = wrap(http_fd);
    if (metrics_fd >= 0)
      metrics_listener_ = wrap(metrics_fd);
  }

  /// The HTTP port's gate: loop 0 hands connections to the others' gates.
  connection_gate& gate() { return gate_; }

  stop_report serve(kj::Promise<void> stop) {
    auto& ws = io_.waitScope;
    // Loops other than loop 0 only serve what it hands them.
    kj::Promise<void> serving = kj::NEVER_DONE;
    if (listener_)
      serving = gate_.listen(*listener_);
    if (metrics_listener_)
      serving = serving.exclusiveJoin(metrics_gate_.listen(*metrics_listener_));
    // Serve until stopped; dropping the listen loops stops accepting connections.
    serving.exclusiveJoin(kj::mv(stop)).wait(ws);
    service_.draining = true;
    listener_ = nullptr;
    metrics_listener_ = nullptr;
    // Answer every request already accepted, then close the connections.
    // Both drains must finish: exclusiveJoin would stop at the first one (the
    // metrics server's, at once) and drop the inference requests still running.
    auto metrics_drained = metrics_server_.drain();
    auto drained = server_.drain()
                     .then([m = kj::mv(metrics_drained)]() mutable { return kj::mv(m); })
                     .then([this]() { return gate_.connections_closed(); })
                     .then([this]() { return metrics_gate_.connections_closed(); })
                     .fork();
    auto within = [&](kj::Duration limit) {
      return drained.addBranch()
        .then([]() { return true; })
        .exclusiveJoin(timer_.afterDelay(limit).then([]() { return false; }))
        .wait(ws);
    };
    stop_report report;
    if (within(cfg_.exit_timeout_secs * kj::SECONDS))
      return report;
    // Past --exit-timeout-secs: what still waits for the pipeline is answered
    // 503; a second is left for those answers to be written.
    report.abandoned = service_.abandon_in_flight() + metrics_service_.abandon_in_flight();
    report.drained = within(1 * kj::SECONDS);
    return report;
  }

private:
  kj::HttpServerSettings settings() {
    kj::HttpServerSettings s;
    s.headerTimeout = cfg_.header_timeout_ms * kj::MILLISECONDS;
    s.pipelineTimeout = cfg_.idle_timeout_ms * kj::MILLISECONDS;
    s.errorHandler = errors_;
    s.callbacks = closer_;
    return s;
  }

  /// This loop's own descriptor of a shared listening socket.
  kj::Own<kj::ConnectionReceiver> wrap(int fd) {
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0)
      throw std::runtime_error(std::string("cannot duplicate a listening socket: ")
                               + std::strerror(errno));
    using flags = kj::LowLevelAsyncIoProvider;
    return io_.lowLevelProvider->wrapListenSocketFd(
      own, flags::TAKE_OWNERSHIP | flags::ALREADY_CLOEXEC | flags::ALREADY_NONBLOCK);
  }

  kj::AsyncIoContext& io_;
  kj::Timer& timer_;
  const http_server_config& cfg_;
  close_after_response closer_;
  kserve_error_handler errors_;
  kserve_service service_;
  kserve_service metrics_service_;
  kj::HttpServer server_;
  kj::HttpServer metrics_server_;
  // After the servers: their connections are cancelled before the servers go.
  connection_gate gate_;
  connection_gate metrics_gate_;
  kj::Own<kj::ConnectionReceiver> listener_;
  kj::Own<kj::ConnectionReceiver> metrics_listener_;
};

/// A loop on a thread of its own (loops 1..N-1): started, told to stop from
/// loop 0 (a cross-thread fulfiller), joined for its stop_report.
class loop_thread {
public:
  loop_thread(const shared_state& s, unsigned index) {
    thread_ = std::thread([this, &s, index] { run(s, index); });
    std::string failure;
    {
      auto ready = state_.lockExclusive();
      ready.wait([](const slot& st) { return st.stop != nullptr || !st.failure.empty(); });
      failure = ready->failure;
      if (failure.empty())
        peer_ = {ready->executor->addRef(), ready->gate};
    }
    if (!failure.empty()) {
      thread_.join();
      throw std::runtime_error(failure);
    }
  }
  ~loop_thread() {
    stop();
    if (thread_.joinable())
      thread_.join();
  }

  /// Where loop 0 hands this loop its connections.
  connection_gate::peer peer() const { return {peer_.executor->addRef(), peer_.gate}; }

  /// Safe from any thread, and more than once.
  void stop() {
    auto st = state_.lockExclusive();
    if (st->stop && !st->stopped)
      st->stop->fulfill();
    st->stopped = true;
  }

  /// Waits for the loop to end; a failure of the loop is thrown.
  stop_report join() {
    thread_.join();
    auto st = state_.lockExclusive();
    if (!st->failure.empty())
      throw std::runtime_error(st->failure);
    return st->report;
  }

private:
  struct slot {
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop;
    kj::Own<const kj::Executor> executor;
    connection_gate* gate = nullptr;
    bool stopped = false;
    stop_report report;
    std::string failure;
  };

  void run(const shared_state& s, unsigned index) {
    std::string failure;
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                   auto io = kj::setupAsyncIo();
                   event_loop loop(io, s, index, -1, -1);
                   auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
                   {
                     auto st = state_.lockExclusive();
                     st->executor = kj::getCurrentThreadExecutor().addRef();
                     st->gate = &loop.gate();
                     st->stop = kj::mv(paf.fulfiller);
                   }
                   auto report = loop.serve(kj::mv(paf.promise));
                   auto st = state_.lockExclusive();
                   st->report = report;
                   // The fulfiller belongs to this loop's promise: gone with it.
                   st->stop = nullptr;
                   st->gate = nullptr;
                 })) {
      failure = "an HTTP event loop failed: " + std::string(e->getDescription().cStr());
    }
    if (!failure.empty()) {
      auto st = state_.lockExclusive();
      st->failure = failure;
      st->stop = nullptr;
    }
  }

  kj::MutexGuarded<slot> state_;
  connection_gate::peer peer_;
  std::thread thread_;
};

} // namespace

stop_report run_http_server(const http_server_config& cfg, server::model_directory& models,
                            const std::function<void(listening_ports)>& on_listening) {
  // Bound once, before any loop starts: a port in use fails the start here.
  auto http_fd = bind_listen_socket(cfg.address, cfg.http_port, {"HTTP", "--http-port"});
  kj::AutoCloseFd metrics_fd;
  if (cfg.metrics_enabled)
    metrics_fd = bind_listen_socket(cfg.address, cfg.metrics_port, {"metrics", "--metrics-port"});

  kj::HttpHeaderTable::Builder builder;
  header_ids ids(builder);
  auto table = builder.build();
  auto regions = cfg.shared_memory_regions
                   ? cfg.shared_memory_regions
                   : std::make_shared<shared_memory_registry>(cfg.shared_memory);
  shared_memory_registry& shm = *regions;
  connection_count http_connections, metrics_connections;
  unsigned loops = std::max(cfg.event_loops, 1u);
  std::vector<std::atomic<uint64_t>> accepted_by_loop(loops);
  shared_state shared{cfg,  models,           shm,
                      *table, ids,            http_connections,
                      metrics_connections,    accepted_by_loop};

  // Loop 0 runs on this thread (it also serves the metrics port and waits for
  // the stop signals); the others each on a thread of their own. Those
  // threads inherit this thread's signal mask, so the signals stay here.
  auto io = kj::setupAsyncIo();
  event_loop first(io, shared, 0, http_fd.get(), metrics_fd.get());
  std::vector<std::unique_ptr<loop_thread>> others;
  kj::Vector<connection_gate::peer> peers;
  for (unsigned i = 1; i < loops; ++i) {
    others.push_back(std::make_unique<loop_thread>(shared, i));
    peers.add(others.back()->peer());
  }
  first.gate().set_peers(kj::mv(peers));
  // Loop 0 holds its own descriptors now; the sockets close with them.
  listening_ports ports;
  ports.http = bound_port(http_fd.get());
  ports.metrics = cfg.metrics_enabled ? bound_port(metrics_fd.get()) : 0;
  http_fd = nullptr;
  metrics_fd = nullptr;
  on_listening(ports);

  forward_stop_signals_to_this_thread();
  auto stop = io.unixEventPort.onSignal(SIGINT)
                .ignoreResult()
                .exclusiveJoin(io.unixEventPort.onSignal(SIGTERM).ignoreResult())
                .then([&others, &cfg]() {
                  // gRPC (main.cpp) starts its drain with HTTP's.
                  if (cfg.on_stop)
                    cfg.on_stop();
                  for (auto& loop : others)
                    loop->stop();
                });
  auto report = first.serve(kj::mv(stop));
  for (auto& loop : others) {
    loop->stop(); // when loop 0 ended without a signal
    auto r = loop->join();
    report.abandoned += r.abandoned;
    report.drained = report.drained && r.drained;
  }
  return report;
}

} // namespace caf_serving::ingress
