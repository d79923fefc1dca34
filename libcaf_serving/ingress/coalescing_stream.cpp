#include "ingress/coalescing_stream.hpp"

#include <utility>

namespace caf_serving::ingress {

coalescing_stream::coalescing_stream(kj::Own<kj::AsyncIoStream> inner, size_t hold_limit)
    : inner_(kj::mv(inner)), hold_limit_(hold_limit) {
  held_.reserve(hold_limit_);
  sending_bytes_.reserve(hold_limit_);
}

kj::Promise<void> coalescing_stream::after_send() {
  KJ_IF_MAYBE (s, sending_)
    return s->addBranch();
  return kj::READY_NOW;
}

kj::Promise<void> coalescing_stream::send_held() {
  if (held_.empty())
    return kj::READY_NOW;
  std::swap(held_, sending_bytes_);
  held_.clear();
  ++socket_writes_;
  return inner_->write(sending_bytes_.data(), sending_bytes_.size()).then([this]() {
    // What was held while these bytes went out follows them.
    return send_held();
  });
}

kj::Promise<void> coalescing_stream::write(const void* buffer, size_t size) {
  kj::ArrayPtr<const kj::byte> piece(static_cast<const kj::byte*>(buffer), size);
  return write(kj::arrayPtr(&piece, 1));
}

kj::Promise<void> coalescing_stream::write(
  kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  KJ_IF_MAYBE (e, failed_)
    return kj::cp(*e);
  size_t total = 0;
  for (auto p : pieces)
    total += p.size();
  if (held_.size() + total <= hold_limit_) {
    for (auto p : pieces)
      held_.insert(held_.end(), p.begin(), p.end());
    if (state_ == state::idle) {
      state_ = state::scheduled;
      sending_ = kj::evalLast([this]() {
                   state_ = state::sending;
                   return send_held();
                 })
                   .then(
                     [this]() {
                       state_ = state::idle;
                       if (shutdown_after_send_)
                         inner_->shutdownWrite();
                     },
                     [this](kj::Exception&& e) {
                       state_ = state::idle;
                       failed_ = kj::mv(e);
                     })
                   .fork();
    }
    return kj::READY_NOW;
  }
  // Too large to hold. Writes come one at a time (the caller waits for each),
  // so the only send that can be in flight is that of held bytes: this one
  // follows it.
  auto owned = kj::heapArrayBuilder<kj::ArrayPtr<const kj::byte>>(pieces.size() + 1);
  if (state_ == state::sending) {
    // The send in flight takes everything held before it ends.
    for (auto p : pieces)
      owned.add(p);
    return after_send().then([this, iov = owned.finish()]() mutable -> kj::Promise<void> {
      KJ_IF_MAYBE (e, failed_)
        return kj::cp(*e);
      ++socket_writes_;
      return inner_->write(iov).attach(kj::mv(iov));
    });
  }
  // Held bytes (a response's headers, most often) go first, in the same call;
  // a flush scheduled for them finds nothing left to send.
  auto held = kj::heapArray<kj::byte>(held_.data(), held_.size());
  held_.clear();
  if (held.size() > 0)
    owned.add(held.asPtr());
  for (auto p : pieces)
    owned.add(p);
  auto iov = owned.finish();
  ++socket_writes_;
  auto sent = inner_->write(iov);
  return sent.attach(kj::mv(iov), kj::mv(held));
}

kj::Promise<void> coalescing_stream::flush() {
  KJ_IF_MAYBE (e, failed_)
    return kj::cp(*e);
  if (state_ == state::idle)
    return kj::READY_NOW;
  return after_send().then([this]() { return flush(); });
}

void coalescing_stream::shutdownWrite() {
  if (state_ == state::idle)
    inner_->shutdownWrite();
  else
    shutdown_after_send_ = true;
}

kj::Promise<void> coalescing_stream::whenWriteDisconnected() {
  return inner_->whenWriteDisconnected();
}

kj::Promise<size_t> coalescing_stream::tryRead(void* buffer, size_t min_bytes,
                                               size_t max_bytes) {
  return inner_->tryRead(buffer, min_bytes, max_bytes);
}

kj::Maybe<uint64_t> coalescing_stream::tryGetLength() {
  return inner_->tryGetLength();
}

kj::Promise<uint64_t> coalescing_stream::pumpTo(kj::AsyncOutputStream& output, uint64_t amount) {
  return inner_->pumpTo(output, amount);
}

void coalescing_stream::abortRead() {
  inner_->abortRead();
}

void coalescing_stream::getsockopt(int level, int option, void* value, kj::uint* length) {
  inner_->getsockopt(level, option, value, length);
}

void coalescing_stream::setsockopt(int level, int option, const void* value, kj::uint length) {
  inner_->setsockopt(level, option, value, length);
}

void coalescing_stream::getsockname(struct sockaddr* addr, kj::uint* length) {
  inner_->getsockname(addr, length);
}

void coalescing_stream::getpeername(struct sockaddr* addr, kj::uint* length) {
  inner_->getpeername(addr, length);
}

kj::Maybe<int> coalescing_stream::getFd() const {
  return inner_->getFd();
}

} // namespace caf_serving::ingress
