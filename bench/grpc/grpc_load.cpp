/// A closed-loop KServe gRPC load generator for bench/grpc/run: `concurrency`
/// ModelInfer calls always in flight, spread over `channels` connections and
/// driven from one thread through one completion queue (as caf-serving-perf
/// drives HTTP from one epoll thread). Each answer is checked against its
/// request. Prints one line: calls/s, P50 and P99 latency in microseconds,
/// the count of failed or mismatched calls, and every good answer (warm-up
/// and drain included, for CPU per request).
///
///   grpc-load HOST:PORT MODEL CONCURRENCY SECONDS [CHANNELS] [--stream]
///
/// --stream: ModelStreamInfer instead, CONCURRENCY streams each with one
/// request in flight (the next is written when the last is answered), as a
/// streaming client that waits for each answer sends them; "calls" are then
/// the requests answered.
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

/// One ModelStreamInfer stream of --stream. Its operations' tags are the
/// stream's address plus the operation (the address is 8-aligned).
struct stream {
  enum op : uintptr_t { started = 0, written = 1, read = 2, done = 3 };
  size_t slot = 0;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<pb::ModelInferRequest,
                                                pb::ModelStreamInferResponse>>
    rw;
  pb::ModelStreamInferResponse reply;
  grpc::Status status;
  clock_type::time_point start;
  /// The current request's write and read: the next request goes once both
  /// are back (one write and one read outstanding at a time).
  bool write_back = false;
  bool read_back = false;
  /// Finish is asked for (once: later failed operations only end).
  bool finishing = false;
  void finish() {
    if (!finishing)
      rw->Finish(&status, tag(done));
    finishing = true;
  }
  void* tag(op o) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(this) | o); }
};

/// Prints the result line; the exit status: 0 when no call failed.
int report(size_t concurrency, size_t channels, double seconds, std::vector<double>& latencies_us,
           size_t failed, size_t completed);

} // namespace

int main(int argc, char** argv) {
  const char* usage =
    "usage: grpc-load HOST:PORT MODEL CONCURRENCY SECONDS [CHANNELS] [--stream]\n"
    "  CONCURRENCY ModelInfer calls (--stream: ModelStreamInfer streams with one request\n"
    "  in flight each) always in flight over CHANNELS connections (default: up to 8), for\n"
    "  SECONDS after a 0.5 s warm-up; MODEL takes INPUT0 FP32 [1,16] and answers it\n"
    "  unchanged as OUTPUT0. Prints one JSON line; exits 1 when an answer was wrong.\n";
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(usage, stdout);
    return 0;
  }
  bool streaming = argc > 1 && std::strcmp(argv[argc - 1], "--stream") == 0;
  if (streaming)
    --argc;
  if (argc < 5) {
    std::fputs(usage, stderr);
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
  std::vector<double> latencies_us;
  latencies_us.reserve(1 << 20);
  size_t failed = 0;
  /// Every good answer, warm-up and drain included (for CPU per request).
  size_t completed = 0;
  bool stopping = false;
  void* tag = nullptr;
  bool ok = false;
  auto record = [&](bool good, clock_type::time_point start, clock_type::time_point now) {
    completed += good ? 1 : 0;
    if (start >= warmup_end && now <= end) {
      if (good)
        latencies_us.push_back(std::chrono::duration<double, std::micro>(now - start).count());
      else
        ++failed;
    }
    if (now > end)
      stopping = true;
  };
  if (streaming) {
    std::vector<std::unique_ptr<stream>> streams;
    auto send = [&](stream& st) {
      st.write_back = st.read_back = false;
      st.start = clock_type::now();
      st.rw->Write(requests[st.slot], st.tag(stream::written));
      st.rw->Read(&st.reply, st.tag(stream::read));
    };
    for (size_t s = 0; s < concurrency; ++s) {
      auto& st = *streams.emplace_back(std::make_unique<stream>());
      st.slot = s;
      st.rw = stubs[s % stubs.size()]->PrepareAsyncModelStreamInfer(&st.ctx, &cq);
      st.rw->StartCall(st.tag(stream::started));
    }
    size_t open = concurrency;
    while (open > 0 && cq.Next(&tag, &ok)) {
      auto bits = reinterpret_cast<uintptr_t>(tag);
      auto& st = *reinterpret_cast<stream*>(bits & ~uintptr_t{7});
      auto o = static_cast<stream::op>(bits & 7);
      if (o == stream::done) {
        if (!st.status.ok() && failed < 3)
          std::fprintf(stderr, "stream failed: %s\n", st.status.error_message().c_str());
        --open;
        continue;
      }
      if (!ok) {
        // The stream broke: its end says why.
        if (o == stream::read && !st.finishing)
          record(false, st.start, clock_type::now());
        st.finish();
        continue;
      }
      if (o == stream::started) {
        send(st);
        continue;
      }
      if (o == stream::read) {
        const auto& r = st.reply.infer_response();
        bool good = st.reply.error_message().empty() && r.raw_output_contents_size() == 1
                    && r.raw_output_contents(0) == expected[st.slot];
        if (!good && failed < 3)
          std::fprintf(stderr, "stream answer wrong: %s\n", st.reply.error_message().c_str());
        record(good, st.start, clock_type::now());
        st.read_back = true;
      } else {
        st.write_back = true;
      }
      if (!st.write_back || !st.read_back)
        continue;
      if (stopping) {
        st.rw->WritesDone(st.tag(stream::written));
        st.finish();
        st.read_back = false; // the WritesDone tag comes back as a write
        continue;
      }
      send(st);
    }
    return report(concurrency, stubs.size(), seconds, latencies_us, failed, completed);
  }
  for (size_t s = 0; s < concurrency; ++s)
    start_call(s);
  size_t in_flight = concurrency;
  while (in_flight > 0 && cq.Next(&tag, &ok)) {
    std::unique_ptr<call> c(static_cast<call*>(tag));
    --in_flight;
    auto now = clock_type::now();
    bool good = ok && c->status.ok() && c->reply.raw_output_contents_size() == 1
                && c->reply.raw_output_contents(0) == expected[c->slot];
    record(good, c->start, now);
    if (!good && failed < 3 && !c->status.ok())
      std::fprintf(stderr, "call failed: %s\n", c->status.error_message().c_str());
    if (!stopping) {
      start_call(c->slot);
      ++in_flight;
    }
  }
  return report(concurrency, stubs.size(), seconds, latencies_us, failed, completed);
}

namespace {

int report(size_t concurrency, size_t channels, double seconds, std::vector<double>& latencies_us,
           size_t failed, size_t completed) {
  std::sort(latencies_us.begin(), latencies_us.end());
  auto pct = [&](double p) {
    if (latencies_us.empty())
      return 0.0;
    return latencies_us[std::min(latencies_us.size() - 1,
                                 static_cast<size_t>(p * latencies_us.size()))];
  };
  std::printf("{\"concurrency\":%zu,\"channels\":%zu,\"throughput\":%.1f,\"p50_us\":%.1f,"
              "\"p99_us\":%.1f,\"failed\":%zu,\"completed\":%zu}\n",
              concurrency, channels, latencies_us.size() / seconds, pct(0.5), pct(0.99),
              failed, completed);
  return failed == 0 ? 0 : 1;
}

} // namespace
