#pragma once
/// Reference-counted Cap'n Proto messages: how a request, a batch and their results
/// travel between the stages of one process without copying tensor data.
///
/// A `message<S>` shares one MallocMessageBuilder, or (for a message that arrived
/// from another node) the received bytes it is read from in place. A stage that builds a message
/// referencing another message's tensor bytes (a batch of one request, a response
/// slicing a batch's outputs) keeps that message alive through `keep_alive`, so no
/// tensor bytes are copied for it.

#include <capnp/message.h>
#include <capnp/orphan.h>
#include <kj/debug.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace caf_serving {

struct message_storage {
  explicit message_storage(unsigned first_segment_words)
      : builder(first_segment_words), first_segment_words(first_segment_words) {}
  capnp::MallocMessageBuilder builder;
  /// What the first segment was sized to (Cap'n Proto zeroes all of it).
  unsigned first_segment_words;
  /// Owners of external bytes this message references (see above). The first
  /// is held inline: a batch or a response references one other message, and
  /// a vector allocated for it on every request.
  std::shared_ptr<const void> kept_first;
  std::vector<std::shared_ptr<const void>> kept_more;

  void keep_alive(std::shared_ptr<const void> owner) {
    if (!kept_first)
      kept_first = std::move(owner);
    else if (owner != kept_first)
      kept_more.push_back(std::move(owner));
  }
};

template <class Schema>
class message {
public:
  message() = default;

  /// A new message whose root is an empty `Schema`. `size_hint_bytes` sizes the
  /// first segment so that a message with tensors usually stays in one segment.
  static message create(size_t size_hint_bytes = 1024) {
    message m;
    auto words = static_cast<unsigned>(size_hint_bytes / sizeof(capnp::word) + 64);
    m.storage_ = std::make_shared<message_storage>(words);
    m.root_ = m.storage_->builder.template initRoot<Schema>();
    return m;
  }

  /// A message that arrived from another node: `root` points into bytes that
  /// `owner` keeps alive. It is read in place and never built on.
  static message received(typename Schema::Reader root, std::shared_ptr<const void> owner) {
    message m;
    m.received_root_ = root;
    m.received_owner_ = std::move(owner);
    return m;
  }

  explicit operator bool() const { return storage_ != nullptr || received_owner_ != nullptr; }

  /// Whether this message was received (see `received`) rather than built here.
  bool is_received() const { return received_owner_ != nullptr; }

  typename Schema::Reader reader() const {
    if (received_owner_)
      return received_root_;
    return root_.asReader();
  }

  typename Schema::Builder builder() {
    KJ_REQUIRE(storage_ != nullptr, "a received message is read-only");
    return root_;
  }

  capnp::Orphanage orphanage() { return storage_->builder.getOrphanage(); }

  /// Bytes allocated (and zeroed) for the first segment of a built message;
  /// what `size_hint_bytes` cost. 0 for a received message.
  size_t first_segment_bytes() const {
    return storage_ ? size_t{storage_->first_segment_words} * sizeof(capnp::word) : 0;
  }

  /// Segments a built message has grown to: 1 when its size hint sufficed.
  size_t segment_count() const {
    return storage_ ? storage_->builder.getSegmentsForOutput().size() : 0;
  }

  /// Makes `data` (owned by `owner`) part of this message. It is referenced,
  /// not copied, unless it fits in the first segment's unused room: a small
  /// tensor costs less to copy there than an external segment does (an arena
  /// segment table allocated and freed with the message, about 0.7k
  /// instructions). Sizes are not raised to make room: a first segment past
  /// 1 KiB leaves malloc's per-thread cache, which costs more than it saves.
  /// Cap'n Proto can only reference word-aligned bytes; others are copied (in
  /// practice: BYTES slices and rows of odd byte length).
  capnp::Orphan<capnp::Data> reference(capnp::Data::Reader data,
                                       std::shared_ptr<const void> owner) {
    if (reinterpret_cast<uintptr_t>(data.begin()) % sizeof(void*) != 0
        || fits_in_first_segment(data.size()))
      return orphanage().newOrphanCopy(data);
    storage_->keep_alive(std::move(owner));
    return orphanage().referenceExternalData(data);
  }

  /// The shared owner, to hand to `reference` of another message: the
  /// message_storage of a built message, or the received bytes' owner.
  std::shared_ptr<const void> owner() const {
    if (received_owner_)
      return received_owner_;
    return storage_;
  }

private:
  /// Whether `bytes` more fit in the first segment while it is the only one
  /// (asking for a single segment's size allocates nothing).
  bool fits_in_first_segment(size_t bytes) {
    auto segments = storage_->builder.getSegmentsForOutput();
    if (segments.size() != 1)
      return false;
    size_t free_words = storage_->first_segment_words - segments[0].size();
    return (bytes + sizeof(capnp::word) - 1) / sizeof(capnp::word) <= free_words;
  }

  std::shared_ptr<message_storage> storage_;
  /// The root of a built message, from create(): the root never moves (nothing
  /// sets it again), and getRoot() walked the arena to find it on every
  /// reader() and builder(), about twenty times per request.
  typename Schema::Builder root_ = nullptr;
  std::shared_ptr<const void> received_owner_;
  typename Schema::Reader received_root_;
};

} // namespace caf_serving
