#pragma once
/// One admission step for every protocol (HTTP and gRPC today; the generate
/// and OpenAI endpoints next): what happens to an inference request between
/// the protocol's parser and the model's scheduler, and the accounting of its
/// answer, written once so that every protocol binds, checks, caches, counts
/// and words its errors alike. A protocol keeps only its own parsing, its
/// response_sink and the writing of its answers. This library links neither
/// kj-http nor grpc (a CMake rule checks it).
///
/// Usage (a protocol's infer path, once it has found `model` and parsed
/// `request`; a parse failure it counts itself with record_failure):
///
///   auto outcome = admit(cfg, model, std::move(request), received_ns);
///   if (auto* e = std::get_if<serving_error>(&outcome))
///     return write_error(*e);                           // counted already
///   if (auto* hit = std::get_if<cache_hit>(&outcome)) {
///     auto view = cached_answer(*hit, *model->stats, received_ns);
///     ... encode view;  record_answer(hit->answer, *model->stats, view.outputs, received_ns);
///   }
///   auto& admitted = std::get<admitted_request>(outcome);
///   keep admitted.answer until the answer is written;
///   submit(*model, std::move(admitted.message), std::make_shared<my_sink>(...));
///   ... on the sink's answer `msg`:
///   auto view = read_answer(msg, answer, *model, received_ns);   // error: counted
///   ... encode *view; answer.shared_memory = {};
///   record_answer(answer, *model->stats, view->outputs, received_ns);

#include "core/error.hpp"
#include "core/pipeline_messages.hpp"
#include "core/stats.hpp"
#include "ingress/kserve_codec.hpp"
#include "ingress/response_cache.hpp"
#include "ingress/shared_memory.hpp"
#include "ingress/shm_tensors.hpp"
#include "server/model_directory.hpp"

#include <caf/send.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace caf_serving::ingress {

/// What admission takes from the server: the same for every request.
struct admission_config {
  /// The limits a request is validated against (--max-body-bytes and the
  /// parser's limits).
  request_limits limits;
  /// The server's one registry of client shared-memory regions.
  std::shared_ptr<const shared_memory_registry> shared_memory;
  /// The server's response cache, consulted for models that enable it; null:
  /// none.
  std::shared_ptr<response_cache> cache;
};

/// After a response-cache miss: where the answer is stored once it is known.
struct cache_miss {
  /// The cache that was asked and had no answer; null when it was not asked.
  std::shared_ptr<response_cache> cache;
  /// The key (owning its bytes) to store the answer under; none when the
  /// request is too large to be cached.
  std::optional<cache_key> key;
  /// Time the lookup took, copying the key included.
  int64_t lookup_ns = 0;
};

/// What the answer to an admitted request needs from the request; the
/// protocol keeps it until the answer is written.
struct answer_context {
  /// The request as parsed, less its inputs once the request message holds
  /// them: id, requested outputs, binary_data_output, timeout, parameters.
  infer_request request;
  /// The request parameter timing=true: stage times in the answer's
  /// parameters.
  bool timing = false;
  /// The shared-memory regions the request reads and writes, mapped until it
  /// is answered (a region unregistered meanwhile stays mapped for it).
  shared_memory_binding shared_memory;
  cache_miss miss;
};

/// The response cache had the answer: the protocol writes it at once
/// (cached_answer) and the pipeline is skipped.
struct cache_hit {
  answer_context answer;
  std::shared_ptr<const cached_response> response;
  /// Time the lookup took.
  int64_t lookup_ns = 0;
};

/// A request for the pipeline: its message, for submit(), and what its
/// answer needs.
struct admitted_request {
  request_message message;
  answer_context answer;
};

/// What admission made of a request: a refusal (counted in the model's
/// statistics already), an answer from the cache, or a request to submit.
using admission = std::variant<admitted_request, cache_hit, serving_error>;

/// Admits `request` to `model`: binds its shared-memory windows, validates it
/// against the model, asks the response cache (for a model that enables it,
/// and a request without shared memory), and builds the request message: the
/// one copy of the tensor bytes between the protocol's buffer and the
/// executor. Binary inputs may point into the protocol's buffer, which must
/// live until admit returns.
admission admit(const admission_config& cfg,
                const std::shared_ptr<const server::model_pipeline>& model,
                infer_request&& request, int64_t received_ns);

/// Hands an admitted request's message to the model's scheduler with the sink
/// its answer goes to: one message, no copy, no wait. (Inline: it is one send
/// on every request's path.)
inline void submit(const server::model_pipeline& model, request_message message,
                   std::shared_ptr<response_sink> sink) {
  caf::anon_send(model.scheduler, infer_job{std::move(message), std::move(sink)});
}

// -- answers -------------------------------------------------------------------

/// The answer to a cache hit: views of the cached outputs and, with timing,
/// the parameters cache_hit_us and until_response_us. Counts the hit in
/// cache_hit and queue (with no time), as Triton; record_answer counts the
/// success. Model name, version and id are the caller's.
response_view cached_answer(const cache_hit& hit, model_stats& stats, int64_t received_ns);

/// The pipeline's answer `msg` to an admitted request: its outputs as views
/// into `msg` (which must outlive the view), written into shared memory where
/// the request asked, with timing the stage times. Or the error to answer
/// instead, counted as a failure, the shared memory released. Model name,
/// version and id are the caller's.
result<response_view> read_answer(const response_message& msg, answer_context& answer,
                                  const server::model_pipeline& model, int64_t received_ns);

/// Counts a successful answer once it is encoded: after a cache miss stores
/// its outputs in the cache (counting the miss with the lookup and the
/// store), then counts the success (record_success, infer_message.hpp).
void record_answer(answer_context& answer, model_stats& stats,
                   const std::vector<output_view>& outputs, int64_t received_ns);

/// Counts a failed request, `received_ns` being when it arrived.
void record_failure(const server::model_pipeline& model, int64_t received_ns,
                    const serving_error& e);

/// The error a pipeline's answer carries, as a client may read it
/// (client_error_message) and with Triton's phrase first (with_triton_phrase).
serving_error pipeline_error(wire::Error::Reader error, const std::string& model_name);

/// `message` with Triton's words for the same refusal first, where Triton's
/// clients match on them: "Exceeds maximum queue size" for a full queue,
/// "Request timeout expired" for a request past its queue timeout (both 503
/// in Triton too). Other reasons: `message` as it is.
std::string with_triton_phrase(failure_reason reason, std::string message);

/// The message a client may see for an error the pipeline reports: `message`
/// itself, or, when it carries CAF or kj internals (rendered errors, source
/// locations), a general one that points to the server log. The status stays.
std::string client_error_message(std::string_view message, std::string_view model);

} // namespace caf_serving::ingress
