/// What a worker or a server receives from another node (cluster/protocol.hpp):
/// bytes from the network deserialized by CAF's binary deserializer, as the
/// middleman does, and then read the way the receiver reads them.
///
/// Input: one control byte, then the bytes of one message.
///   control % 4 == 0: run_batch (a worker's executor receives it)
///   control % 4 == 1: batch_result_message (the server's remote executor proxy)
///   control % 4 == 2: worker_info (the server, after the handshake)
///   control % 4 == 3: a whole caf::message of any registered type, as the
///                     middleman delivers it (handshake strings and atoms included)
///
/// A message that deserializes must then be readable field by field without a
/// Cap'n Proto exception: the receiving actors read it without a try block.

#include "cluster/protocol.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/message.hpp>
#include <kj/exception.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace caf_serving;

namespace {

caf::actor_system& system_for_fuzzing() {
  static caf::actor_system_config cfg = [] {
    caf::actor_system_config c;
    cluster::configure_actor_system(c, cluster::liveness_config{});
    return c;
  }();
  // Never destroyed: ~actor_system at exit, after libFuzzer's own exit handlers
  // ran, crashes in CAF; the process ends there anyway.
  static auto& sys = *new caf::actor_system{cfg};
  return sys;
}

/// Reads every field the way the executor and the post-processor do, summing
/// something from each so that nothing is optimized away.
uint64_t read_tensors(capnp::List<wire::Tensor>::Reader tensors) {
  uint64_t sum = 0;
  for (auto t : tensors) {
    sum += t.getName().size();
    sum += static_cast<uint64_t>(t.getDatatype());
    for (auto d : t.getShape())
      sum += static_cast<uint64_t>(d);
    auto data = t.getData();
    if (data.size() > 0)
      sum += data[0] + data[data.size() - 1];
  }
  return sum;
}

uint64_t read_batch(wire::Batch::Reader b) {
  uint64_t sum = b.getBatchId() + b.getRows() + static_cast<uint64_t>(b.getModelVersion());
  sum += b.getModelName().size();
  for (auto r : b.getRequestRows())
    sum += r;
  return sum + read_tensors(b.getInputs());
}

uint64_t read_result(wire::BatchResult::Reader r) {
  uint64_t sum = r.getBatchId() + static_cast<uint64_t>(r.getComputeInferNs());
  sum += read_tensors(r.getOutputs());
  auto e = r.getError();
  return sum + e.getStatus() + e.getMessage().size() + static_cast<uint64_t>(e.getReason());
}

[[noreturn]] void unreadable(const kj::Exception& e) {
  std::fprintf(stderr, "cluster_wire: a message that deserialized cannot be read: %s\n",
               e.getDescription().cStr());
  std::abort();
}

template <class T>
bool decode(caf::actor_system& sys, const std::vector<char>& bytes, T& x) {
  caf::binary_deserializer source(sys, bytes);
  return !source(x);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& sys = system_for_fuzzing();
  if (size < 1)
    return 0;
  unsigned mode = data[0] % 4;
  // An exact-size heap copy, so that ASan sees a read past the end.
  std::vector<char> bytes(reinterpret_cast<const char*>(data) + 1,
                          reinterpret_cast<const char*>(data) + size);
  static volatile uint64_t sink = 0;
  switch (mode) {
    case 0: {
      run_batch x;
      if (decode(sys, bytes, x) && x.received) {
        KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] { sink = sink + read_batch(x.reader()); }))
          unreadable(*e);
      }
      break;
    }
    case 1: {
      batch_result_message x;
      if (decode(sys, bytes, x) && x) {
        KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] { sink = sink + read_result(x.reader()); }))
          unreadable(*e);
      }
      break;
    }
    case 2: {
      cluster::worker_info x;
      if (decode(sys, bytes, x)) {
        uint64_t sum = x.name.size();
        for (auto& m : x.models)
          sum += m.name.size() + m.executors.size();
        sink = sink + sum;
      }
      break;
    }
    case 3: {
      caf::message x;
      if (decode(sys, bytes, x))
        sink = sink + x.size();
      break;
    }
  }
  return 0;
}
