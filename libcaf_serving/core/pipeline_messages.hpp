#pragma once
/// Every message type exchanged between the pipeline's actors, in one place
/// (STYLE.md). Payloads are Cap'n Proto messages (schemas/serving.capnp) shared by
/// reference inside a process; plain C++ rides alongside only for what never
/// leaves the process (where to deliver a response).
///
/// `run_batch` and `batch_result_message` also cross nodes (a remote executor,
/// libcaf_serving/cluster/). Their CAF serialization is the message's Cap'n Proto
/// segments as they are: a segment table, then each segment's bytes written with one
/// `apply_raw` (one copy into CAF's buffer). On the receiving side the bytes are read
/// with one `apply_raw` into a word-aligned array that a SegmentArrayMessageReader
/// reads in place, and a received BatchResult becomes a `message<>` over those same
/// bytes (`message<>::received`): tensor data is copied once on each side.

#include "core/message.hpp"
#include "core/wire_check.hpp"
#include "schemas/serving.capnp.h"

#include <capnp/serialize.h>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace caf_serving {

using request_message = message<wire::InferRequest>;
using response_message = message<wire::InferResponse>;
using batch_message = message<wire::Batch>;
using batch_result_message = message<wire::BatchResult>;

/// Where a request's one response goes. The ingress implements it for each
/// connection's pending request; `deliver` may be called from any thread, once.
class response_sink {
public:
  virtual ~response_sink() = default;
  virtual void deliver(response_message response) = 0;
};

/// A request on its way through the pipeline (ingress -> scheduler).
struct infer_job {
  request_message request;
  std::shared_ptr<response_sink> sink;
};

/// A request the scheduler put into a batch, as the post-processor needs it.
struct batched_job {
  infer_job job;
  int64_t enqueued_ns = 0;
  int64_t batch_formed_ns = 0;
};

/// Cap'n Proto bytes that arrived from another node, read in place.
struct received_message {
  kj::Array<capnp::word> words;
  kj::Array<kj::ArrayPtr<const capnp::word>> segments;
  std::unique_ptr<capnp::SegmentArrayMessageReader> reader;
};

/// scheduler -> executor: one batch to run. The reply is a `batch_result_message`.
/// In a process the batch is `batch`; on a worker node that received it over the
/// network it is `received`. Executors read it through `reader()`.
struct run_batch {
  batch_message batch;
  std::shared_ptr<const received_message> received;

  wire::Batch::Reader reader() const {
    return received ? received->reader->getRoot<wire::Batch>() : batch.reader();
  }
};

/// scheduler -> post-processor: a finished batch and the requests it answers, in
/// the order of the batch's rows.
struct finished_batch {
  batch_result_message result;
  std::vector<batched_job> jobs;
  int64_t compute_start_ns = 0;
  int64_t compute_end_ns = 0;
};

/// Timer tick for the scheduler's batching delay and queue timeouts.
using tick_atom = caf::atom_constant<caf::atom("tick")>;
/// Finish what is queued and in flight, then stop (model unload, shutdown).
using drain_atom = caf::atom_constant<caf::atom("drain")>;

// -- executor lost: the one error after which a batch is sent elsewhere ----------

/// Error category of the cluster's errors (`caf::error::category()`).
inline constexpr caf::atom_value cluster_error_category = caf::atom("cluster");

enum class cluster_errc : uint8_t {
  /// The executor's node died, became unreachable or did not answer in time; the
  /// batch was not answered and may be sent to another executor.
  executor_lost = 1,
  /// The worker refused this server (wrong cluster secret).
  refused = 2,
  /// A worker could not load a model the server asked it to (cluster/model_sync.hpp).
  model_load_failed = 3,
};

inline caf::error make_cluster_error(cluster_errc code, std::string why) {
  return caf::error(static_cast<uint8_t>(code), cluster_error_category,
                    caf::make_message(std::move(why)));
}

/// True when a request to an executor failed without an answer, so that the batch
/// may run elsewhere: the executor's node was lost, or the executor died first.
inline bool executor_was_lost(const caf::error& e) {
  if (e.category() == cluster_error_category)
    return e.code() == static_cast<uint8_t>(cluster_errc::executor_lost);
  if (e.category() == caf::atom("system"))
    return e.code() == static_cast<uint8_t>(caf::sec::request_receiver_down)
           || e.code() == static_cast<uint8_t>(caf::sec::request_timeout);
  return false;
}

// -- serialization of Cap'n Proto messages between nodes --------------------------

namespace wire_format {

/// Bounds that a received message must respect before anything is allocated.
inline constexpr uint32_t max_segments = 512;
inline constexpr uint64_t max_words = uint64_t{1} << 30; // 8 GiB

inline caf::error save_segments(caf::serializer& f,
                                kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segs) {
  auto count = static_cast<uint32_t>(segs.size());
  if (auto err = f(count))
    return err;
  for (auto s : segs) {
    auto words = static_cast<uint64_t>(s.size());
    if (auto err = f(words))
      return err;
  }
  for (auto s : segs)
    if (s.size() > 0)
      if (auto err = f.apply_raw(s.size() * sizeof(capnp::word),
                                 const_cast<capnp::word*>(s.begin())))
        return err;
  return caf::none;
}

inline caf::error save(caf::serializer& f, const std::shared_ptr<const void>& owner) {
  // message<S>::owner() is its message_storage; writing reads the builder's
  // segments only (getSegmentsForOutput is not const, but does not modify).
  auto storage = std::static_pointer_cast<const message_storage>(owner);
  if (!storage)
    return save_segments(f, {});
  auto& builder = const_cast<capnp::MallocMessageBuilder&>(storage->builder);
  return save_segments(f, builder.getSegmentsForOutput());
}

/// Reads what save_segments wrote and checks it as a `schema` root (wire_check.hpp):
/// a message that loads can be read by every receiver without an exception.
inline caf::error load(caf::deserializer& f, std::shared_ptr<const received_message>& out,
                       capnp::StructSchema schema) {
  uint32_t count = 0;
  if (auto err = f(count))
    return err;
  if (count > max_segments)
    return caf::make_error(caf::sec::invalid_argument,
                           "a Cap'n Proto message with " + std::to_string(count)
                             + " segments arrived; at most 512 are accepted");
  std::vector<uint64_t> sizes(count);
  uint64_t total = 0;
  for (auto& s : sizes) {
    if (auto err = f(s))
      return err;
    // Compared before adding: a size near 2^64 would wrap the sum to a small
    // total, and its segment would be written past the end of `words`.
    if (s > max_words - total)
      return caf::make_error(caf::sec::invalid_argument,
                             "a Cap'n Proto message larger than 8 GiB arrived");
    total += s;
  }
  if (count == 0) {
    out.reset();
    return caf::none;
  }
  // The sizes come from the peer: allocate only what the received bytes can fill
  // (the middleman always reads from a binary_deserializer over the whole message).
  if (auto* bytes = dynamic_cast<caf::binary_deserializer*>(&f);
      bytes && total > bytes->remaining() / sizeof(capnp::word))
    return caf::make_error(caf::sec::invalid_argument,
                           "a Cap'n Proto message announced " + std::to_string(total)
                             + " words but only " + std::to_string(bytes->remaining())
                             + " bytes arrived");
  auto msg = std::make_shared<received_message>();
  msg->words = kj::heapArray<capnp::word>(total);
  auto segs = kj::heapArrayBuilder<kj::ArrayPtr<const capnp::word>>(count);
  size_t at = 0;
  for (auto s : sizes) {
    if (s > 0)
      if (auto err = f.apply_raw(s * sizeof(capnp::word), msg->words.begin() + at))
        return err;
    segs.add(msg->words.begin() + at, s);
    at += s;
  }
  msg->segments = segs.finish();
  capnp::ReaderOptions options;
  // The reader is read more than once (executor, post-processor): allow that.
  options.traversalLimitInWords = total * 8 + (uint64_t{1} << 20);
  msg->reader = std::make_unique<capnp::SegmentArrayMessageReader>(msg->segments, options);
  auto problem = unreadable_reason(msg->segments, schema);
  if (!problem.empty())
    return caf::make_error(caf::sec::invalid_argument,
                           "a Cap'n Proto message that is not a valid "
                             + std::string{schema.getShortDisplayName().cStr()} + " arrived: "
                             + problem);
  out = std::move(msg);
  return caf::none;
}

} // namespace wire_format

inline caf::error inspect(caf::serializer& f, run_batch& x) {
  if (x.received) {
    return wire_format::save_segments(f, x.received->segments);
  }
  return wire_format::save(f, x.batch.owner());
}

inline caf::error inspect(caf::deserializer& f, run_batch& x) {
  x.batch = {};
  return wire_format::load(f, x.received, capnp::Schema::from<wire::Batch>());
}

template <class Inspector>
std::enable_if_t<!std::is_base_of<caf::serializer, Inspector>::value
                   && !std::is_base_of<caf::deserializer, Inspector>::value,
                 typename Inspector::result_type>
inspect(Inspector& f, run_batch&) {
  return f(caf::meta::type_name("run_batch"));
}

inline caf::error inspect(caf::serializer& f, batch_result_message& x) {
  if (x.is_received())
    return wire_format::save_segments(
      f, std::static_pointer_cast<const received_message>(x.owner())->segments);
  return wire_format::save(f, x.owner());
}

inline caf::error inspect(caf::deserializer& f, batch_result_message& x) {
  std::shared_ptr<const received_message> received;
  if (auto err = wire_format::load(f, received, capnp::Schema::from<wire::BatchResult>()))
    return err;
  if (!received) {
    x = {};
    return caf::none;
  }
  // Read in place: the post-processor slices the outputs by reference, keeping
  // `received` alive through the message's owner.
  auto root = received->reader->getRoot<wire::BatchResult>();
  x = batch_result_message::received(root, std::move(received));
  return caf::none;
}

template <class Inspector>
std::enable_if_t<!std::is_base_of<caf::serializer, Inspector>::value
                   && !std::is_base_of<caf::deserializer, Inspector>::value,
                 typename Inspector::result_type>
inspect(Inspector& f, batch_result_message&) {
  return f(caf::meta::type_name("batch_result_message"));
}

} // namespace caf_serving

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::infer_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(caf_serving::finished_batch)
