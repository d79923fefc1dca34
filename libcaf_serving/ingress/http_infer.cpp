#include "ingress/http_infer.hpp"

#include "core/clock.hpp"
#include "ingress/compression.hpp"

#include <cstdlib>
#include <iostream>
#include <optional>

namespace caf_serving::ingress {

namespace {

/// Binary outputs of at least this many bytes (all outputs of a response
/// together) are written from the pipeline's message instead of copied into
/// the response body.
constexpr size_t vectored_write_min_bytes = 16 << 10;

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

} // namespace

http_infer::~http_infer() noexcept(false) {
  // Every request of this loop is gone by now: answers still on their way
  // have nobody to go to.
  inbox_task_ = nullptr;
  inbox_->close();
}

size_t http_infer::abandon_in_flight() {
  abandoned_ = true;
  // A request whose answer has come already takes that; the fulfiller takes
  // one call.
  for (auto& ctx : waiting_)
    ctx.cell->fulfiller->fulfill(kj::Maybe<response_message>(nullptr));
  return waiting_.size();
}

kj::Promise<void> http_infer::infer(std::shared_ptr<const server::model_pipeline> model,
                                    const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                                    http_response& response, int64_t received) {
  const auto& cfg = shared_.cfg;
  const auto& ids = shared_.ids;
  auto header_length_text = header_or_empty(headers, ids.inference_header_length);
  const auto& limits = cfg.limits;
  bool raw_body = header_length_text == "0";
  std::optional<uint64_t> expected;
  KJ_IF_MAYBE (length, headers.get(kj::HttpHeaderId::CONTENT_LENGTH))
    if (length->size() != 0)
      expected = std::strtoull(length->cStr(), nullptr, 10);
  // Triton's 400 for a body over the input size limit; the body stays
  // unread, so the connection cannot go on.
  if (expected && *expected > limits.max_body_bytes)
    return writer_.send_error(response,
                              body_too_large(*expected, limits.max_body_bytes, raw_body),
                              close_connection::yes);
  auto owned = kj::heap<infer_context>(
    std::move(model), received,
    body_reader(body, timer_, cfg.idle_timeout_ms * kj::MILLISECONDS, limits.max_body_bytes,
                expected));
  infer_context& ctx = *owned;
  // Headers are invalid once the body is read: take what is needed now.
  ctx.content_type = header_or_empty(headers, kj::HttpHeaderId::CONTENT_TYPE);
  ctx.encoding_header = header_or_empty(headers, ids.content_encoding);
  ctx.accept_encoding = header_or_empty(headers, ids.accept_encoding);
  ctx.header_length_text = std::move(header_length_text);
  ctx.raw_body = raw_body;
  KJ_IF_MAYBE (encoding, headers.get(kj::HttpHeaderId::TRANSFER_ENCODING))
    ctx.chunked = encoding->size() != 0;
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

kj::Promise<void> http_infer::after_body(infer_context& ctx, http_response& response) {
  const auto& cfg = shared_.cfg;
  const auto& model = ctx.model;
  int64_t received = ctx.received_ns;
  auto fail = [&](const serving_error& e, close_connection close = close_connection::no) {
    record_failure(*model, received, e);
    return writer_.send_error(response, static_cast<int>(e.status), e.message, close);
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
                     + std::to_string(cfg.idle_timeout_ms) + " ms (--idle-timeout-ms)",
                   failure_reason::bad_request},
                  close_connection::yes);
    case body_read::outcome::too_large:
      // The rest of the body stays unread: the connection cannot go on.
      return fail(body_too_large(std::nullopt, cfg.limits.max_body_bytes, ctx.raw_body),
                  close_connection::yes);
  }
  // Binary inputs point into the body (or its inflated copy) until admit has
  // copied them into the request message.
  std::string inflated_body;
  std::string_view body_view(read.bytes.data(), read.bytes.size());
  size_t body_padding = read_padding(read.bytes);
  if (!ctx.encoding_header.empty()) {
    auto enc = parse_content_encoding(ctx.encoding_header);
    if (!enc)
      return fail(enc.error());
    if (*enc != content_encoding::identity) {
      auto inflated = decompress(body_view, *enc, cfg.limits.max_body_bytes);
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
  in.limits = cfg.limits;
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
  auto admitted = admit(shared_.admission, model, std::move(*parsed), received);
  if (auto* e = std::get_if<serving_error>(&admitted)) // counted by admit
    return writer_.send_error(response, static_cast<int>(e->status), e->message);
  if (auto* hit = std::get_if<cache_hit>(&admitted))
    return answer_cached(ctx, *hit, response);
  auto& request = std::get<admitted_request>(admitted);
  ctx.answer = std::move(request.answer);
  // The request message holds the inputs now: the body need not wait for the
  // answer.
  read.bytes = body_bytes();
  if (inbox_task_ == nullptr)
    inbox_task_ = inbox_->run().eagerlyEvaluate([](kj::Exception&& e) {
      std::cerr << "caf-serving: the HTTP loop stopped taking answers from the pipeline: "
                << e.getDescription().cStr() << std::endl;
    });
  auto [cell, answered] = answer_inbox::make_cell();
  ctx.cell = cell;
  submit(*model, std::move(request.message),
         std::make_shared<http_sink>(inbox_, std::move(cell), model->config.name));
  return wait_for_pipeline(ctx, kj::mv(answered))
    .then([this, &ctx, &response](kj::Maybe<response_message> r) {
      if (ctx.waiting_link.isLinked())
        waiting_.remove(ctx);
      KJ_IF_MAYBE (answered, r)
        return answer(ctx, kj::mv(*answered), response);
      serving_error e{status_code::unavailable,
                      "the server is shutting down and did not finish this request "
                      "within --exit-timeout-secs ("
                        + std::to_string(shared_.cfg.exit_timeout_secs) + " s)"};
      record_failure(*ctx.model, ctx.received_ns, e);
      return writer_.send_error(response, e);
    });
}

/// The pipeline's answer (`p`), or nothing when the exit timeout has passed or
/// passes first: until the answer is taken (or the request dropped) ctx is on
/// the list abandon_in_flight() walks. A list instead of joining each request
/// with one forked promise: that took three nodes and three allocations per
/// request.
kj::Promise<kj::Maybe<response_message>> http_infer::wait_for_pipeline(
  infer_context& ctx, kj::Promise<kj::Maybe<response_message>> p) {
  if (abandoned_)
    return kj::Maybe<response_message>(nullptr);
  waiting_.add(ctx);
  ctx.waiting_in = &waiting_;
  return p;
}

kj::Promise<void> http_infer::answer(infer_context& ctx, response_message msg,
                                     http_response& response) {
  auto view = read_answer(msg, ctx.answer, *ctx.model, ctx.received_ns);
  if (!view) // counted by read_answer
    return writer_.send_error(response, view.error());
  return send_answer(ctx, std::move(*view), response, {&msg, nullptr});
}

/// Answers from the cache: the pipeline is skipped, and the hit counts in
/// success, queue (with no time) and cache_hit, as in Triton.
kj::Promise<void> http_infer::answer_cached(infer_context& ctx, cache_hit& hit,
                                            http_response& response) {
  auto view = cached_answer(hit, *ctx.model->stats, ctx.received_ns);
  ctx.answer = std::move(hit.answer);
  return send_answer(ctx, std::move(view), response, {nullptr, hit.response});
}

/// Writes a successful answer (from the pipeline or the cache) out as the
/// request asked, counts it, and after a cache miss stores it.
kj::Promise<void> http_infer::send_answer(infer_context& ctx, response_view view,
                                          http_response& response, output_owner outputs) {
  auto& answer = ctx.answer;
  view.model_name = ctx.model->config.name;
  auto version = std::to_string(ctx.model->version);
  view.model_version = version;
  view.id = answer.request.id;
  serialize_options opts;
  // Not needed after this: moved, not copied (names, shared-memory slices).
  opts.requested = std::move(answer.request.outputs);
  opts.binary_data_output = answer.request.binary_data_output;
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
    record_failure(*ctx.model, ctx.received_ns, out.error());
    return writer_.send_error(response, out.error());
  }
  // Done with the regions: a region unregistered meanwhile goes now, before
  // the client can see the answer and ask for the status.
  answer.shared_memory = {};
  record_answer(answer, *ctx.model->stats, view.outputs, ctx.received_ns);
  response_head head;
  head.content_type = out->content_type.c_str();
  head.header_length = out->header_length;
  if (!out->binary_data.empty())
    return writer_.send_vectored(response, std::move(out->body), out->binary_data,
                                 outputs.keep(), head);
  head.encoding = encoding;
  return send_kept(ctx, response, std::move(out->body), head);
}

/// A successful inference answer, written from `ctx`, which holds the bytes
/// and the stream until the write is done: no allocation and no promise node
/// to keep them, as response_writer::send needs.
kj::Promise<void> http_infer::send_kept(infer_context& ctx, http_response& response,
                                        std::string body, const response_head& head) {
  ctx.response_body = std::move(body);
  ctx.response_stream = writer_.start(response, 200, ctx.response_body, head);
  return ctx.response_stream->write(ctx.response_body.data(), ctx.response_body.size());
}

} // namespace caf_serving::ingress
