/// The CAF serialization of the messages that cross nodes (core/pipeline_messages.hpp):
/// a Batch and a BatchResult survive a round trip through CAF's binary
/// serializer byte for byte, including a batch that references a request's bytes.

#include "cluster/protocol.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>

using namespace caf_serving;

namespace {

batch_message make_batch(size_t floats) {
  auto m = batch_message::create(floats * 4 + 1024);
  auto b = m.builder();
  b.setBatchId(42);
  b.setModelName("identity_fp32");
  b.setModelVersion(1);
  b.setRows(3);
  auto rows = b.initRequestRows(2);
  rows.set(0, 1);
  rows.set(1, 2);
  auto t = b.initInputs(1)[0];
  t.setName("INPUT0");
  t.setDatatype(wire::DataType::FP32);
  auto shape = t.initShape(2);
  shape.set(0, 3);
  shape.set(1, static_cast<int64_t>(floats / 3));
  auto data = t.initData(static_cast<unsigned>(floats * 4));
  std::vector<float> v(floats);
  std::iota(v.begin(), v.end(), 0.5f);
  std::memcpy(data.begin(), v.data(), data.size());
  return m;
}

template <class T>
std::vector<char> save(caf::actor_system& sys, T& x) {
  std::vector<char> buf;
  caf::binary_serializer sink(sys, buf);
  auto err = sink(x);
  REQUIRE_FALSE(err);
  return buf;
}

template <class T>
T load(caf::actor_system& sys, const std::vector<char>& buf) {
  T x;
  caf::binary_deserializer source(sys, buf);
  auto err = source(x);
  REQUIRE_FALSE(err);
  CHECK(source.remaining() == 0);
  return x;
}

} // namespace

TEST_CASE("run_batch: the batch arrives with every field and tensor byte") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  run_batch out{make_batch(3 * 1000), nullptr};
  auto bytes = save(sys, out);
  // One copy of the tensor data plus a small segment table and header.
  CHECK(bytes.size() >= 12000);
  CHECK(bytes.size() < 12000 + 512);
  auto in = load<run_batch>(sys, bytes);
  REQUIRE(in.received);
  auto r = in.reader();
  CHECK(r.getBatchId() == 42);
  CHECK(std::string(r.getModelName().cStr()) == "identity_fp32");
  CHECK(r.getRows() == 3);
  CHECK(r.getRequestRows()[1] == 2);
  auto d = r.getInputs()[0].getData();
  auto orig = out.reader().getInputs()[0].getData();
  REQUIRE(d.size() == orig.size());
  CHECK(std::memcmp(d.begin(), orig.begin(), d.size()) == 0);
  // Forwarding a received batch writes the same bytes again.
  CHECK(save(sys, in) == bytes);
}

TEST_CASE("run_batch: a batch referencing a request's bytes travels as well") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto request = make_batch(30);
  auto m = batch_message::create();
  auto t = m.builder().initInputs(1)[0];
  t.setName("INPUT0");
  t.adoptData(m.reference(request.reader().getInputs()[0].getData(), request.owner()));
  run_batch out{m, nullptr};
  auto in = load<run_batch>(sys, save(sys, out));
  auto d = in.reader().getInputs()[0].getData();
  REQUIRE(d.size() == 120);
  CHECK(std::memcmp(d.begin(), request.reader().getInputs()[0].getData().begin(), 120) == 0);
}

TEST_CASE("batch_result_message: result and error survive; a truncated one is refused") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto res = batch_result_message::create();
  auto b = res.builder();
  b.setBatchId(7);
  b.setComputeInferNs(1234);
  auto o = b.initOutputs(1)[0];
  o.setName("OUTPUT0");
  auto data = o.initData(64);
  for (unsigned i = 0; i < 64; ++i)
    data[i] = static_cast<uint8_t>(i * 3);
  b.initError().setMessage("none");
  auto bytes = save(sys, res);
  auto in = load<batch_result_message>(sys, bytes);
  REQUIRE(in);
  // Read in place from the received bytes, not copied into a new message.
  CHECK(in.is_received());
  CHECK(save(sys, in) == bytes);
  auto r = in.reader();
  CHECK(r.getBatchId() == 7);
  CHECK(r.getComputeInferNs() == 1234);
  CHECK(r.getOutputs()[0].getData()[63] == static_cast<uint8_t>(63 * 3));
  CHECK(std::string(r.getError().getMessage().cStr()) == "none");

  bytes.resize(bytes.size() - 8);
  batch_result_message broken;
  caf::binary_deserializer source(sys, bytes);
  CHECK(source(broken));
}

TEST_CASE("a malformed batch is refused when it arrives, not when it is read (fuzz: cluster_wire)") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  // One segment of two words: the root Batch with one pointer, modelName, which
  // points 1000 words past the end of the segment.
  std::vector<char> bytes;
  caf::binary_serializer sink(sys, bytes);
  uint32_t segments = 1;
  uint64_t words = 2;
  uint8_t message[16] = {0, 0, 0, 0, 0, 0, 1, 0,           // struct: 0 data, 1 pointer
                         0xA1, 0x0F, 0, 0, 0x2A, 0, 0, 0}; // text at +1000, 5 bytes
  REQUIRE_FALSE(sink(segments, words));
  REQUIRE_FALSE(sink.apply_raw(sizeof message, message));
  run_batch batch;
  caf::binary_deserializer source(sys, bytes);
  auto err = source(batch);
  REQUIRE(err);
  CHECK(sys.render(err).find("not a valid Batch") != std::string::npos);
  CHECK_FALSE(batch.received);

  batch_result_message result;
  caf::binary_deserializer again(sys, bytes);
  CHECK(again(result));
}

TEST_CASE("a batch claiming a million empty inputs is refused (fuzz: cluster_wire)") {
  // Four words: the root Batch with 3 pointers, `inputs` a list of 2^20 VOID
  // elements that take no bytes. Reading it costs 2^20 words of the traversal
  // limit; it was accepted, and the limit ran out when the executor read it again.
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<char> bytes;
  caf::binary_serializer sink(sys, bytes);
  uint32_t segments = 1;
  uint64_t words = 4;
  uint8_t message[32] = {0, 0, 0, 0, 0, 0, 3, 0,       // struct: 0 data, 3 pointers
                         0, 0, 0, 0, 0, 0, 0, 0,       // modelName: null
                         0, 0, 0, 0, 0, 0, 0, 0,       // requestRows: null
                         1, 0, 0, 0, 0, 0, 0x80, 0};   // inputs: 2^20 x VOID
  REQUIRE_FALSE(sink(segments, words));
  REQUIRE_FALSE(sink.apply_raw(sizeof message, message));
  run_batch batch;
  caf::binary_deserializer source(sys, bytes);
  auto err = source(batch);
  REQUIRE(err);
  CHECK(sys.render(err).find("traversal limit") != std::string::npos);
}

TEST_CASE("a message announcing more words than arrived is refused before allocating them") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<char> bytes;
  caf::binary_serializer sink(sys, bytes);
  uint32_t segments = 1;
  uint64_t words = uint64_t{1} << 29; // 4 GiB, within max_words
  REQUIRE_FALSE(sink(segments, words));
  bytes.resize(bytes.size() + 64);
  run_batch batch;
  caf::binary_deserializer source(sys, bytes);
  auto err = source(batch);
  REQUIRE(err);
  CHECK(sys.render(err).find("only 64 bytes arrived") != std::string::npos);
}

TEST_CASE("segment sizes whose sum wraps around are refused (fuzz: cluster_wire)") {
  // 10 + (2^64 - 5) wrapped to 5 words: 5 were allocated and the first segment's
  // 10 written into them, a heap overflow from the network.
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<char> bytes;
  caf::binary_serializer sink(sys, bytes);
  uint32_t segments = 2;
  uint64_t first = 10;
  uint64_t second = ~uint64_t{0} - 4;
  REQUIRE_FALSE(sink(segments, first, second));
  bytes.resize(bytes.size() + 256);
  run_batch batch;
  caf::binary_deserializer source(sys, bytes);
  auto err = source(batch);
  REQUIRE(err);
  CHECK(sys.render(err).find("larger than 8 GiB") != std::string::npos);
}

TEST_CASE("executor_was_lost: only a lost node or a dead executor means send again") {
  CHECK(executor_was_lost(make_cluster_error(cluster_errc::executor_lost, "x")));
  CHECK_FALSE(executor_was_lost(make_cluster_error(cluster_errc::refused, "x")));
  CHECK(executor_was_lost(caf::make_error(caf::sec::request_receiver_down)));
  CHECK_FALSE(executor_was_lost(caf::make_error(caf::sec::unexpected_message)));
}
