#pragma once
/// The bulk channel: large batches and their results between a server and a
/// worker over a TCP connection of their own, beside CAF's (docs/cluster.md,
/// "The bulk channel"). CAF's middleman makes six passes over every byte of a
/// message; here the sender `writev`s the Cap'n Proto segments from where they
/// are, and the receiver reads them straight into a word-aligned array, the
/// one the CAF path would deserialize into. What arrives is the same run_batch
/// or batch_result_message the CAF path produces, handed to the same actors.
///
/// ```
/// worker: bulk_listener on --bulk-port       server: bulk_client per worker link
///   hello answer: port + 16-byte token  --->   connect, send the token
///   reader: batch frame -> session actor <---  writer thread (bounded queue)
///     -> the executor's gate -> result
///   writer thread: result frame         --->   reader: -> the remote_executor proxy
/// ```
///
/// A frame is a 40-byte header (little-endian; the machines we run on all are),
/// then for batches and results the segment table (one u64 word count per
/// segment) and the segments, for errors a CAF-serialized caf::error. The
/// channel is authenticated by the token, which only a server that proved the
/// cluster secret over CAF receives; it is not encrypted, so TLS clusters keep
/// every batch on CAF's link.

#include "core/error.hpp"
#include "core/pipeline_messages.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::cluster {

/// bulk_client reader -> proxy: (id, batch_result_message), the answer to batch `id`.
using bulk_answer_atom = caf::atom_constant<caf::atom("bulkans")>;
/// bulk_client reader -> proxy: (id, caf::error), the worker's error for batch `id`.
using bulk_error_atom = caf::atom_constant<caf::atom("bulkerr")>;
/// -> proxy: (why), the bulk channel broke; the worker counts as lost.
using bulk_lost_atom = caf::atom_constant<caf::atom("bulklost")>;
/// bulk_listener reader -> session actor: (request, target, run_batch).
using bulk_in_atom = caf::atom_constant<caf::atom("bulkin")>;

namespace bulk {

inline constexpr size_t token_bytes = 16;
inline constexpr size_t header_bytes = 40;
/// "CSB1" as a little-endian u32.
inline constexpr uint32_t frame_magic = 0x31425343;
/// Largest error frame (a serialized caf::error with its text).
inline constexpr uint64_t max_error_bytes = 64 * 1024;

enum class frame_kind : uint8_t { batch = 1, result = 2, error = 3 };

struct frame_header {
  frame_kind kind = frame_kind::batch;
  /// Segments of the Cap'n Proto message (0 for an error).
  uint32_t segments = 0;
  /// The sender's id of the batch; a result or error carries its batch's.
  uint64_t request = 0;
  /// batch: the actor id of the worker's executor gate. error: 1 when the
  /// executor is gone (the batch may run elsewhere), else 0.
  uint64_t target = 0;
  /// Bytes after the header: segment table and segments, or the error.
  uint64_t payload_bytes = 0;
};

/// Writes `h` into the header_bytes at `out`.
void encode_header(const frame_header& h, uint8_t* out);

struct parsed_header {
  frame_header header;
  /// What is wrong with it; empty: valid.
  std::string error;
};

/// Reads the header_bytes at `in` that arrived. A frame whose payload is larger
/// than `max_frame_bytes` is refused before anything is allocated for it.
parsed_header parse_header(const uint8_t* in, uint64_t max_frame_bytes);

struct segment_table {
  /// The sum of the segments' words.
  uint64_t total_words = 0;
  /// What is wrong with it; empty: valid.
  std::string error;
};

/// Checks a received segment table against its header: the words must fill
/// the payload exactly.
segment_table check_segment_table(const frame_header& h, const std::vector<uint64_t>& sizes);

/// The message's segments as they would be written (the CAF path writes the same).
kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments_of(const run_batch& b);
kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments_of(const batch_result_message& m);

/// Bytes of the message as CAF's serializer writes it (segment count, table,
/// segments): what --bulk-threshold-bytes is compared with.
uint64_t wire_bytes(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments);

} // namespace bulk

struct bulk_config {
  /// Largest frame accepted; a larger one breaks the connection unallocated.
  uint64_t max_frame_bytes = uint64_t{1} << 32;
  /// Bytes a server may have queued, not yet written, on one connection; a batch
  /// that does not fit goes over CAF's link instead (one always fits an empty queue).
  uint64_t max_queued_bytes = uint64_t{64} << 20;
  /// How long the server waits for the TCP connect.
  std::chrono::milliseconds connect_timeout{3000};
};

struct bulk_core;

/// Where the server's end of a bulk channel connects, and what it tells.
struct bulk_client_config {
  std::string host;
  uint16_t port = 0;
  /// The 16 bytes the worker handed out in its greeting.
  std::string token;
  /// The worker's name, for log lines.
  std::string worker;
  bulk_config limits;
  /// Called once, from a channel thread, when a connected channel breaks (not
  /// when it cannot connect, nor when its owner closes it).
  std::function<void(const std::string& why)> on_lost;
};

/// The server's end of one worker's bulk channel. Made when the worker greets
/// the server; connects on its own thread (nothing waits for it): until it is
/// connected, and for good if it cannot connect, send_batch says no and the
/// batches take CAF's link.
class bulk_client {
public:
  static std::shared_ptr<bulk_client> connect(caf::actor_system& sys,
                                              bulk_client_config cfg);
  ~bulk_client();
  bulk_client(const bulk_client&) = delete;
  bulk_client& operator=(const bulk_client&) = delete;

  /// Queues `batch` for the worker's executor gate `target`. Its answer comes to
  /// `proxy` as (bulk_answer_atom, id, batch_result_message) or (bulk_error_atom,
  /// id, caf::error); should the channel break first, as (bulk_lost_atom, why).
  /// False (nothing queued): not connected, broken, or the queue is full.
  bool send_batch(const run_batch& batch, uint64_t target, caf::actor proxy, uint64_t id);

  bool connected() const;
  /// Closed: it could not connect, broke, or was closed; batches take CAF's link.
  bool closed() const;

private:
  explicit bulk_client(std::shared_ptr<bulk_core> core) : core_(std::move(core)) {}
  std::shared_ptr<bulk_core> core_;
};

struct bulk_listener_state;

/// The worker's end: listens on the bulk port, hands out tokens, checks each
/// connection's token, and runs the batches that arrive through the executors'
/// gates (registered with add_target), answering on the same connection.
class bulk_listener {
public:
  /// Listens on `address` (empty or 0.0.0.0: all) and `port` (0: any free one).
  static result<std::shared_ptr<bulk_listener>> listen(caf::actor_system& sys,
                                                       const std::string& address,
                                                       uint16_t port, bulk_config cfg);
  ~bulk_listener();
  bulk_listener(const bulk_listener&) = delete;
  bulk_listener& operator=(const bulk_listener&) = delete;

  uint16_t port() const;
  /// A new random token for one server connection (`who`, for the log); it
  /// admits one bulk connection.
  std::string issue_token(const std::string& who);
  /// An executor gate that batches may name as their target (by actor id).
  void add_target(const caf::actor& gate);

private:
  explicit bulk_listener(std::shared_ptr<bulk_listener_state> st) : st_(std::move(st)) {}
  std::shared_ptr<bulk_listener_state> st_;
};

} // namespace caf_serving::cluster
