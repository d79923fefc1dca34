#include "postprocess/response_builder.hpp"

#include <doctest/doctest.h>

#include <cstring>

using namespace caf_serving;
using namespace caf_serving::postprocess;

namespace {

struct null_sink : response_sink {
  void deliver(response_message) override {}
};

infer_job make_job(uint32_t rows, std::vector<std::string> outputs = {}, uint32_t k = 0) {
  auto req = request_message::create();
  auto b = req.builder();
  b.setId("req" + std::to_string(rows));
  b.setModelName("m");
  b.setModelVersion(1);
  b.setRows(rows);
  auto outs = b.initOutputs(static_cast<unsigned>(outputs.size()));
  for (unsigned i = 0; i < outputs.size(); ++i) {
    outs[i].setName(outputs[i]);
    outs[i].setClassification(k);
  }
  return {req, std::make_shared<null_sink>()};
}

void set_tensor(wire::Tensor::Builder t, const char* name, wire::DataType dt,
                std::vector<int64_t> shape, const std::string& bytes) {
  t.setName(name);
  t.setDatatype(dt);
  auto s = t.initShape(static_cast<unsigned>(shape.size()));
  for (unsigned i = 0; i < shape.size(); ++i)
    s.set(i, shape[i]);
  auto d = t.initData(static_cast<unsigned>(bytes.size()));
  std::memcpy(d.begin(), bytes.data(), bytes.size());
}

std::string bytes_element(const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  std::string out(4, '\0');
  std::memcpy(out.data(), &n, 4);
  return out + s;
}

std::string as_string(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

} // namespace

TEST_CASE("a batch's rows go back to the requests they came from") {
  finished_batch fb;
  fb.result = batch_result_message::create();
  auto outs = fb.result.builder().initOutputs(2);
  std::vector<float> values{1, 2, 3, 4, 5, 6}; // 3 rows of 2
  set_tensor(outs[0], "F", wire::DataType::FP32, {3, 2},
             std::string(reinterpret_cast<char*>(values.data()), 24));
  set_tensor(outs[1], "S", wire::DataType::BYTES, {3, 1},
             bytes_element("a") + bytes_element("") + bytes_element("xyz"));
  fb.jobs.push_back({make_job(1), 10, 20});
  fb.jobs.push_back({make_job(2, {"S"}), 11, 20});
  fb.compute_start_ns = 30;
  fb.compute_end_ns = 40;

  auto responses = split_batch(fb, {});
  REQUIRE(responses.size() == 2);
  auto r0 = responses[0].reader();
  CHECK(r0.getError().getStatus() == 0);
  REQUIRE(r0.getOutputs().size() == 2);
  CHECK(as_string(r0.getOutputs()[0].getData())
        == std::string(reinterpret_cast<char*>(values.data()), 8));
  CHECK(r0.getOutputs()[0].getShape()[0] == 1);
  CHECK(as_string(r0.getOutputs()[1].getData()) == bytes_element("a"));
  CHECK(r0.getTimes().getEnqueuedNs() == 10);
  CHECK(r0.getTimes().getComputeEndNs() == 40);
  CHECK(r0.getTimes().getPostprocessEndNs() > 0);

  auto r1 = responses[1].reader();
  REQUIRE(r1.getOutputs().size() == 1); // only the requested output
  CHECK(std::string(r1.getOutputs()[0].getName().cStr()) == "S");
  CHECK(r1.getOutputs()[0].getShape()[0] == 2);
  CHECK(as_string(r1.getOutputs()[0].getData()) == bytes_element("") + bytes_element("xyz"));
  CHECK(std::string(r1.getId().cStr()) == "req2");
}

TEST_CASE("a response copies its rows of a small output and references those of a large one") {
  finished_batch fb;
  fb.result = batch_result_message::create();
  auto outs = fb.result.builder().initOutputs(2);
  // Per request: 8 bytes of "SMALL", which fit in the response's first
  // segment, and 4 KiB of "LARGE", which do not.
  const int64_t wide = 1024;
  std::vector<float> small{1, 2, 3, 4};
  std::vector<float> large(static_cast<size_t>(2 * wide));
  for (size_t i = 0; i < large.size(); ++i)
    large[i] = static_cast<float>(i);
  set_tensor(outs[0], "SMALL", wire::DataType::FP32, {2, 2},
             std::string(reinterpret_cast<char*>(small.data()), 16));
  set_tensor(outs[1], "LARGE", wire::DataType::FP32, {2, wide},
             std::string(reinterpret_cast<char*>(large.data()), large.size() * 4));
  fb.jobs.push_back({make_job(1), 1, 2});
  fb.jobs.push_back({make_job(1), 1, 2});

  auto responses = split_batch(fb, {});
  REQUIRE(responses.size() == 2);
  auto result = fb.result.reader().getOutputs();
  for (unsigned r = 0; r < 2; ++r) {
    auto got = responses[r].reader().getOutputs();
    REQUIRE(got.size() == 2);
    CHECK(as_string(got[0].getData())
          == std::string(reinterpret_cast<char*>(small.data() + 2 * r), 8));
    CHECK(got[0].getData().begin() != result[0].getData().begin() + 8 * r);
    CHECK(got[1].getData().begin() == result[1].getData().begin() + wide * 4 * r);
    // The small rows sit in the first segment; the large ones are one external segment.
    CHECK(responses[r].segment_count() == 2);
  }
}

TEST_CASE("classification replaces the tensor with top-k strings") {
  finished_batch fb;
  fb.result = batch_result_message::create();
  auto outs = fb.result.builder().initOutputs(1);
  std::vector<float> values{0.1f, 0.7f, 0.2f};
  set_tensor(outs[0], "P", wire::DataType::FP32, {1, 3},
             std::string(reinterpret_cast<char*>(values.data()), 12));
  fb.jobs.push_back({make_job(1, {"P"}, 2), 1, 2});
  response_config cfg;
  cfg.labels["P"] = {"cat", "dog", "eel"};
  auto responses = split_batch(fb, cfg);
  auto out = responses[0].reader().getOutputs()[0];
  CHECK(out.getDatatype() == wire::DataType::BYTES);
  auto data = as_string(out.getData());
  CHECK(data.find("1:dog") != std::string::npos);
  CHECK(data.find("2:eel") != std::string::npos);
  CHECK(data.find("cat") == std::string::npos);
}

TEST_CASE("an executor's error reaches every request of the batch") {
  finished_batch fb;
  fb.result = batch_result_message::create();
  auto err = fb.result.builder().initError();
  err.setStatus(500);
  err.setMessage("device lost");
  fb.jobs.push_back({make_job(1), 1, 2});
  fb.jobs.push_back({make_job(1), 1, 2});
  auto responses = split_batch(fb, {});
  REQUIRE(responses.size() == 2);
  for (auto& r : responses) {
    CHECK(r.reader().getError().getStatus() == 500);
    CHECK(std::string(r.reader().getError().getMessage().cStr()) == "device lost");
  }
}

TEST_CASE("row ranges reject BYTES data that ends inside an element") {
  auto m = batch_result_message::create();
  auto outs = m.builder().initOutputs(1);
  set_tensor(outs[0], "S", wire::DataType::BYTES, {2, 1}, bytes_element("ab").substr(0, 5));
  auto r = row_range(m.reader().getOutputs()[0], 0, 2);
  CHECK_FALSE(r.ok());
}

TEST_CASE("padded batching: listed outputs are sliced back to each request's length") {
  model_config m;
  m.name = "m";
  m.max_batch_size = 8;
  m.dynamic_batching_enabled = true;
  m.inputs = {{"ids", datatype::int64, {-1}}};
  m.outputs = {{"H", datatype::fp32, {-1, 2}}, {"P", datatype::fp32, {2}}};
  m.parameters["padded_batching"] = "ids:1:0";
  m.parameters["padded_outputs"] = "H:1";
  auto padding = scheduler::read_padded_batching(m);
  REQUIRE(padding.ok());
  response_config cfg;
  cfg.padding = *padding;

  // Two requests of lengths 1 and 3, batched at length 3; H is [2, 3, 2], P [2, 2].
  auto request = [](const char* id, int64_t length) {
    auto req = request_message::create();
    auto b = req.builder();
    b.setId(id);
    b.setRows(1);
    auto in = b.initInputs(1)[0];
    in.setName("ids");
    in.setDatatype(wire::DataType::INT64);
    auto s = in.initShape(2);
    s.set(0, 1);
    s.set(1, length);
    in.initData(static_cast<unsigned>(8 * length));
    return infer_job{req, std::make_shared<null_sink>()};
  };
  finished_batch fb;
  fb.result = batch_result_message::create();
  auto outs = fb.result.builder().initOutputs(2);
  std::vector<float> h{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  set_tensor(outs[0], "H", wire::DataType::FP32, {2, 3, 2},
             std::string(reinterpret_cast<char*>(h.data()), 48));
  std::vector<float> p{20, 21, 22, 23};
  set_tensor(outs[1], "P", wire::DataType::FP32, {2, 2},
             std::string(reinterpret_cast<char*>(p.data()), 16));
  fb.jobs.push_back({request("short", 1), 0, 0});
  fb.jobs.push_back({request("long", 3), 0, 0});

  auto responses = split_batch(fb, cfg);
  REQUIRE(responses.size() == 2);
  auto shorter = responses[0].reader();
  REQUIRE(shorter.getError().getStatus() == 0);
  auto sh = shorter.getOutputs()[0];
  CHECK(sh.getShape()[0] == 1);
  CHECK(sh.getShape()[1] == 1);
  CHECK(sh.getShape()[2] == 2);
  CHECK(as_string(sh.getData()) == std::string(reinterpret_cast<char*>(h.data()), 8));
  // An output not listed comes back whole.
  CHECK(as_string(shorter.getOutputs()[1].getData())
        == std::string(reinterpret_cast<char*>(p.data()), 8));
  auto lh = responses[1].reader().getOutputs()[0];
  CHECK(lh.getShape()[1] == 3);
  CHECK(as_string(lh.getData()) == std::string(reinterpret_cast<char*>(h.data() + 6), 24));
  // Without the padding config the short request gets the padded rows.
  auto unsliced = split_batch(fb, {});
  CHECK(unsliced[0].reader().getOutputs()[0].getShape()[1] == 3);
}
