/// A closed-loop KServe gRPC load generator for bench/grpc/run: `concurrency`
/// ModelInfer calls always in flight, spread over `channels` connections and
/// driven from one thread through one completion queue (as caf-serving-perf
/// drives HTTP from one epoll thread). Each answer is checked against its
/// request. Prints one line: calls/s, P50 and P99 latency in microseconds,
/// the count of failed or mismatched calls, and every good answer (warm-up
/// and drain included, for CPU per request).
///
///   grpc-load HOST:PORT MODEL CONCURRENCY SECONDS [CHANNELS]
///
/// The model takes one FP32 input INPUT0 [1,16] and answers it unchanged as
/// OUTPUT0 (bench/pipeline/models/identity_fp32).

#include "grpc_service.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace pb = inference;

namespace {

using clock_type = std::chrono::steady_clock;

struct call {
  size_t slot = 0;
  grpc::ClientContext ctx;
  pb::ModelInferResponse reply;
  grpc::Status status;
  clock_type::time_point start;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::ModelInferResponse>> reader;
};

} // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: grpc-load HOST:PORT MODEL CONCURRENCY SECONDS [CHANNELS]\n");
    return 2;
  }
  std::string target = argv[1];
  std::string model = argv[2];
  size_t concurrency = std::strtoul(argv[3], nullptr, 10);
  double seconds = std::strtod(argv[4], nullptr);
  size_t n_channels = argc > 5 ? std::strtoul(argv[5], nullptr, 10)
                               : std::min<size_t>(concurrency, 8);
  std::vector<std::unique_ptr<pb::GRPCInferenceService::Stub>> stubs;
  for (size_t i = 0; i < n_channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stubs.push_back(pb::GRPCInferenceService::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
  }
  // One request per slot, each with its own values, so that an answer that
  // belongs to another request is seen.
  std::vector<pb::ModelInferRequest> requests(concurrency);
  std::vector<std::string> expected(concurrency);
  for (size_t s = 0; s < concurrency; ++s) {
    auto& r = requests[s];
    r.set_model_name(model);
    auto* in = r.add_inputs();
    in->set_name("INPUT0");
    in->set_datatype("FP32");
    in->add_shape(1);
    in->add_shape(16);
    std::vector<float> v(16);
    for (int k = 0; k < 16; ++k)
      v[k] = static_cast<float>(s * 16 + k);
    expected[s].assign(reinterpret_cast<const char*>(v.data()), 64);
    r.add_raw_input_contents(expected[s]);
  }
  grpc::CompletionQueue cq;
  auto start_call = [&](size_t slot) {
    auto* c = new call;
    c->slot = slot;
    c->start = clock_type::now();
    c->reader = stubs[slot % stubs.size()]->PrepareAsyncModelInfer(&c->ctx, requests[slot], &cq);
    c->reader->StartCall();
    c->reader->Finish(&c->reply, &c->status, c);
  };
  auto warmup_end = clock_type::now() + std::chrono::milliseconds(500);
  auto end = warmup_end + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  for (size_t s = 0; s < concurrency; ++s)
    start_call(s);
  std::vector<double> latencies_us;
  latencies_us.reserve(1 << 20);
  size_t failed = 0;
  /// Every good answer, warm-up and drain included (for CPU per request).
  size_t completed = 0;
  size_t in_flight = concurrency;
  bool stopping = false;
  void* tag = nullptr;
  bool ok = false;
  while (in_flight > 0 && cq.Next(&tag, &ok)) {
    std::unique_ptr<call> c(static_cast<call*>(tag));
    --in_flight;
    auto now = clock_type::now();
    bool good = ok && c->status.ok() && c->reply.raw_output_contents_size() == 1
                && c->reply.raw_output_contents(0) == expected[c->slot];
    completed += good ? 1 : 0;
    if (c->start >= warmup_end && now <= end) {
      if (good)
        latencies_us.push_back(
          std::chrono::duration<double, std::micro>(now - c->start).count());
      else
        ++failed;
    }
    if (!good && failed < 3 && !c->status.ok())
      std::fprintf(stderr, "call failed: %s\n", c->status.error_message().c_str());
    if (now > end)
      stopping = true;
    if (!stopping) {
      start_call(c->slot);
      ++in_flight;
    }
  }
  std::sort(latencies_us.begin(), latencies_us.end());
  auto pct = [&](double p) {
    if (latencies_us.empty())
      return 0.0;
    return latencies_us[std::min(latencies_us.size() - 1,
                                 static_cast<size_t>(p * latencies_us.size()))];
  };
  std::printf("{\"concurrency\":%zu,\"channels\":%zu,\"throughput\":%.1f,\"p50_us\":%.1f,"
              "\"p99_us\":%.1f,\"failed\":%zu,\"completed\":%zu}\n",
              concurrency, stubs.size(), latencies_us.size() / seconds, pct(0.5), pct(0.99),
              failed, completed);
  return failed == 0 ? 0 : 1;
}
