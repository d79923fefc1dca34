#include "scheduler/gather_batch.hpp"

#include "scheduler/padded_request.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::scheduler;

namespace {

/// One INT32 input of 4 values a row, batched up to `max_batch` rows.
model_config identity_model(int max_batch) {
  model_config cfg;
  cfg.name = "id";
  cfg.max_batch_size = max_batch;
  cfg.inputs = {{"INPUT0", datatype::int32, {4}}};
  cfg.outputs = {{"OUTPUT0", datatype::int32, {4}}};
  cfg.dynamic_batching_enabled = true;
  return cfg;
}

/// A request for identity_model whose one row holds `width` int32 values from
/// `id` up. Gathering never answers it: it has no sink.
infer_job make_job(int id, unsigned width = 4) {
  auto msg = request_message::create();
  auto b = msg.builder();
  b.setId(std::to_string(id));
  b.setModelName("id");
  b.setModelVersion(1);
  b.setRows(1);
  auto in = b.initInputs(1)[0];
  in.setName("INPUT0");
  in.setDatatype(wire::DataType::INT32);
  auto shape = in.initShape(2);
  shape.set(0, 1);
  shape.set(1, width);
  std::vector<int32_t> values(width);
  for (unsigned i = 0; i < width; ++i)
    values[i] = id + static_cast<int32_t>(i);
  auto data = in.initData(4 * width);
  std::memcpy(data.begin(), values.data(), 4 * width);
  return {msg, nullptr};
}

/// A request of `rows` rows of `length` int64 ids (value = 100 * row + position + 1).
infer_job sequence_job(int id, uint32_t rows, int64_t length) {
  auto msg = request_message::create();
  auto b = msg.builder();
  b.setId(std::to_string(id));
  b.setModelName("seq");
  b.setModelVersion(1);
  b.setRows(rows);
  auto in = b.initInputs(1)[0];
  in.setName("ids");
  in.setDatatype(wire::DataType::INT64);
  auto shape = in.initShape(2);
  shape.set(0, rows);
  shape.set(1, length);
  std::vector<int64_t> values;
  for (uint32_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < length; ++p)
      values.push_back(100 * r + p + 1);
  auto data = in.initData(static_cast<unsigned>(values.size() * 8));
  std::memcpy(data.begin(), values.data(), data.size());
  return {msg, nullptr};
}

model_config sequence_model() {
  model_config m;
  m.name = "seq";
  m.max_batch_size = 8;
  m.dynamic_batching_enabled = true;
  m.inputs = {{"ids", datatype::int64, {-1}}};
  m.outputs = {{"out", datatype::int64, {-1}}};
  m.parameters["padded_batching"] = "ids:1:-7";
  return m;
}

} // namespace

TEST_CASE("gather_batch concatenates rows; a lone request's bytes are copied when small, "
          "else referenced") {
  auto model = identity_model(8);
  std::vector<batched_job> jobs{{make_job(1), 0, 0}, {make_job(5), 0, 0}};
  auto two_msg = gather_batch(model, 7, jobs);
  REQUIRE(two_msg.ok());
  auto two = two_msg->reader();
  CHECK(two.getBatchId() == 7);
  CHECK(two.getRows() == 2);
  CHECK(two.getInputs()[0].getShape()[0] == 2);
  CHECK(two.getInputs()[0].getData().size() == 32);
  int32_t values[8];
  std::memcpy(values, two.getInputs()[0].getData().begin(), 32);
  CHECK(values[0] == 1);
  CHECK(values[4] == 5);

  // 16 bytes: copied into the room left in the batch's first segment (an
  // external segment costs more).
  std::vector<batched_job> one{{make_job(9), 0, 0}};
  auto single = gather_batch(model, 8, one);
  REQUIRE(single.ok());
  auto small = single->reader().getInputs()[0].getData();
  CHECK(small.begin() != one[0].job.request.reader().getInputs()[0].getData().begin());
  REQUIRE(small.size() == 16);
  std::memcpy(values, small.begin(), 16);
  CHECK(values[0] == 9);
  CHECK(values[3] == 12);
  CHECK(single->segment_count() == 1);

  // 4 KiB: more than the batch's first segment has room for; referenced.
  const unsigned wide = 1024;
  model.inputs[0].dims = {static_cast<int64_t>(wide)};
  std::vector<batched_job> large{{make_job(3, wide), 0, 0}};
  auto referenced = gather_batch(model, 9, large);
  REQUIRE(referenced.ok());
  CHECK(referenced->reader().getInputs()[0].getData().begin()
        == large[0].job.request.reader().getInputs()[0].getData().begin());
  CHECK(referenced->segment_count() == 2);
}

TEST_CASE("gather_batch sizes the batch's first segment from what it holds") {
  // Cap'n Proto zeroes the whole first segment: a fixed 2 KiB on top of every
  // batch was a memset per request. The hint now fits the contents, and they
  // still fit in one segment.
  auto model = identity_model(8);
  std::vector<batched_job> one{{make_job(9), 0, 0}};
  auto single = gather_batch(model, 8, one);
  REQUIRE(single.ok());
  // The lone request's small bytes are copied into the first segment.
  CHECK(single->segment_count() == 1);
  CHECK(single->first_segment_bytes() < 1024);

  std::vector<batched_job> jobs;
  for (int i = 0; i < 8; ++i)
    jobs.push_back({make_job(i), 0, 0});
  auto eight = gather_batch(model, 9, jobs);
  REQUIRE(eight.ok());
  CHECK(eight->segment_count() == 1);
  size_t data = eight->reader().getInputs()[0].getData().size();
  CHECK(eight->first_segment_bytes() < data + 1024);
}

TEST_CASE("gather_batch refuses requests of different shapes instead of mixing them") {
  auto model = identity_model(8);
  model.inputs[0].dims = {-1};
  auto narrow = make_job(1);
  auto wide = make_job(5);
  // Rebuild the second request with shape [1,2]: same bytes would not fit.
  auto msg = request_message::create();
  msg.builder().setId("5");
  msg.builder().setRows(1);
  auto in = msg.builder().initInputs(1)[0];
  in.setName("INPUT0");
  in.setDatatype(wire::DataType::INT32);
  auto shape = in.initShape(2);
  shape.set(0, 1);
  shape.set(1, 2);
  in.initData(8);
  wide.request = msg;
  std::vector<batched_job> jobs{{narrow, 0, 0}, {wide, 0, 0}};
  auto batch = gather_batch(model, 9, jobs);
  REQUIRE_FALSE(batch.ok());
  CHECK(batch.error().status == status_code::internal);
  CHECK(batch.error().message.find("[1,4] and [1,2]") != std::string::npos);
  // And the shape key tells them apart, while equal shapes share one.
  CHECK(shape_class_of(model, narrow.request.reader())
        != shape_class_of(model, wide.request.reader()));
  CHECK(shape_class_of(model, narrow.request.reader())
        == shape_class_of(model, make_job(7).request.reader()));
  // A model whose shapes cannot vary keys every request 0.
  CHECK(shape_class_of(identity_model(8), narrow.request.reader()) == 0);
}

TEST_CASE("gather_batch pads shorter sequences to the longest with the pad value") {
  auto model = sequence_model();
  auto padding = read_padded_batching(model);
  REQUIRE(padding.ok());
  std::vector<batched_job> jobs{{sequence_job(1, 1, 3), 0, 0},
                                {sequence_job(2, 2, 5), 0, 0},
                                {sequence_job(3, 1, 2), 0, 0}};
  // Without padding these shapes may not share a batch.
  CHECK_FALSE(gather_batch(model, 1, jobs).ok());
  auto msg = gather_batch(model, 1, jobs, *padding);
  REQUIRE(msg.ok());
  auto in = msg->reader().getInputs()[0];
  REQUIRE(in.getShape().size() == 2);
  CHECK(in.getShape()[0] == 4);
  CHECK(in.getShape()[1] == 5);
  REQUIRE(in.getData().size() == 4 * 5 * 8);
  std::vector<int64_t> got(20);
  std::memcpy(got.data(), in.getData().begin(), 160);
  std::vector<int64_t> want{1, 2, 3, -7, -7,        // request 1, padded 3 -> 5
                            1, 2, 3, 4, 5,           // request 2, row 0
                            101, 102, 103, 104, 105, // request 2, row 1
                            1, 2, -7, -7, -7};       // request 3, padded 2 -> 5
  CHECK(got == want);
  // Equal lengths are not padded, and the key leaves the padded dim out.
  CHECK(shape_class_of(model, jobs[0].job.request.reader(), *padding)
        == shape_class_of(model, jobs[2].job.request.reader(), *padding));
  CHECK(shape_class_of(model, jobs[0].job.request.reader())
        != shape_class_of(model, jobs[2].job.request.reader()));
  CHECK(padded_length(*padding, jobs[1].job.request.reader()) == 5);
}
