#include "scheduler/padded_request.hpp"

#include "core/pipeline_messages.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;
using namespace caf_serving::scheduler;

TEST_CASE("padding: a request whose padded inputs differ in length is refused") {
  model_config m;
  m.name = "bert";
  m.max_batch_size = 8;
  m.dynamic_batching_enabled = true;
  m.inputs = {{"input_ids", datatype::int64, {-1}}, {"attention_mask", datatype::int64, {-1}}};
  m.parameters["padded_batching"] = "input_ids:1:0;attention_mask:1:0";
  auto pad = read_padded_batching(m);
  REQUIRE(pad.ok());
  auto request = [](int64_t ids, int64_t mask) {
    auto msg = request_message::create();
    auto ins = msg.builder().initInputs(2);
    const char* names[] = {"input_ids", "attention_mask"};
    int64_t lengths[] = {ids, mask};
    for (unsigned i = 0; i < 2; ++i) {
      ins[i].setName(names[i]);
      auto s = ins[i].initShape(2);
      s.set(0, 1);
      s.set(1, lengths[i]);
    }
    return msg;
  };
  auto same = request(5, 5);
  CHECK_FALSE(check_padded_lengths(*pad, same.reader()));
  CHECK(padded_length(*pad, same.reader()) == 5);
  auto differ = request(5, 3);
  auto err = check_padded_lengths(*pad, differ.reader());
  REQUIRE(err);
  CHECK(err->status == status_code::bad_request);
  CHECK(err->message.find("lengths 5 and 3") != std::string::npos);
}
