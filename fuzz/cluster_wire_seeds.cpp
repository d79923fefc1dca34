/// Writes the seed corpus of the cluster_wire fuzzer (fuzz/corpus/cluster_wire/):
/// each message kind a worker or server receives, serialized as the middleman
/// serializes it, behind the fuzzer's control byte.
///
///   fuzz_cluster_wire_seeds fuzz/corpus/cluster_wire

#include "cluster/protocol.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/message.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using namespace caf_serving;

namespace {

batch_message make_batch(unsigned floats) {
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
  shape.set(1, floats / 3);
  auto data = t.initData(floats * 4);
  for (unsigned i = 0; i < data.size(); ++i)
    data[i] = static_cast<uint8_t>(i);
  return m;
}

batch_result_message make_result(bool error) {
  auto res = batch_result_message::create();
  auto b = res.builder();
  b.setBatchId(7);
  b.setComputeInferNs(1234);
  auto o = b.initOutputs(1)[0];
  o.setName("OUTPUT0");
  o.setDatatype(wire::DataType::FP32);
  o.initShape(1).set(0, 4);
  auto data = o.initData(16);
  for (unsigned i = 0; i < 16; ++i)
    data[i] = static_cast<uint8_t>(i * 3);
  if (error) {
    b.initError().setStatus(503);
    b.getError().setMessage("model 'x' is unavailable");
  }
  return res;
}

template <class T>
void write(caf::actor_system& sys, const std::string& path, uint8_t control, T& x) {
  std::vector<char> buf;
  caf::binary_serializer sink(sys, buf);
  if (auto err = sink(x)) {
    std::fprintf(stderr, "cannot serialize %s\n", path.c_str());
    std::exit(1);
  }
  std::ofstream out(path, std::ios::binary);
  out.put(static_cast<char>(control));
  out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  caf::actor_system_config cfg;
  cluster::configure_actor_system(cfg, cluster::liveness_config{});
  caf::actor_system sys{cfg};

  run_batch small{make_batch(3 * 4), nullptr};
  write(sys, dir + "/run_batch", 0, small);
  run_batch empty{batch_message::create(), nullptr};
  write(sys, dir + "/run_batch_empty", 0, empty);
  auto ok = make_result(false);
  write(sys, dir + "/batch_result", 1, ok);
  auto failed = make_result(true);
  write(sys, dir + "/batch_result_error", 1, failed);
  cluster::worker_info info{"worker-1:9000", {{"identity_fp32", 1, {}}, {"simple", 2, {}}}};
  write(sys, dir + "/worker_info", 2, info);
  // Type-erased, as the middleman delivers them to the handshake handlers.
  auto challenge = caf::make_message(cluster::challenge_atom::value);
  write(sys, dir + "/message_challenge", 3, challenge);
  auto hello = caf::make_message(cluster::hello_atom::value, std::string(64, 'a'));
  write(sys, dir + "/message_hello", 3, hello);
  auto nonce = caf::make_message(std::string("0123456789abcdef"));
  write(sys, dir + "/message_nonce", 3, nonce);
  auto info_msg = caf::make_message(info);
  write(sys, dir + "/message_worker_info", 3, info_msg);
  auto batch_msg = caf::make_message(small);
  write(sys, dir + "/message_run_batch", 3, batch_msg);
  auto result_msg = caf::make_message(ok);
  write(sys, dir + "/message_batch_result", 3, result_msg);
  return 0;
}
