#include "ingress/answer_inbox.hpp"

#include <utility>

namespace caf_serving::ingress {

std::pair<std::shared_ptr<answer_cell>, kj::Promise<kj::Maybe<response_message>>>
answer_inbox::make_cell() {
  auto paf = kj::newPromiseAndFulfiller<kj::Maybe<response_message>>();
  auto cell = std::make_shared<answer_cell>();
  cell->fulfiller = kj::mv(paf.fulfiller);
  return {std::move(cell), kj::mv(paf.promise)};
}

kj::Promise<void> answer_inbox::run() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bell_ = kj::mv(paf.fulfiller);
    // What came while the loop was taking the last lot rings at once.
    rung_ = !items_.empty();
    if (rung_)
      bell_->fulfill();
  }
  return paf.promise.then([this]() {
    ++wakes_;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::swap(items_, taken_);
    }
    for (auto& it : taken_)
      it.cell->fulfiller->fulfill(kj::Maybe<response_message>(std::move(it.answer)));
    taken_.clear();
    return run();
  });
}

void answer_inbox::post(std::shared_ptr<answer_cell> cell, response_message answer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_)
    return;
  items_.push_back(item{std::move(cell), std::move(answer)});
  if (!rung_ && bell_) {
    rung_ = true;
    bell_->fulfill();
  }
}

void answer_inbox::close() {
  std::vector<item> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  bell_ = nullptr;
  std::swap(items_, dropped);
}

} // namespace caf_serving::ingress
