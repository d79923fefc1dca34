/// A bare KServe gRPC endpoint for bench/grpc/run: ModelInfer answered at once
/// with its input as the output (what identity_fp32 computes), no actors, no
/// validation. It shows what grpc++ 1.51 itself costs per call on this
/// machine, with each of its two server APIs:
///
///   bare-grpc-endpoint callback   grpc's callback API (the ingress used it before the
///                                 completion queues)
///   bare-grpc-endpoint cq N       the asynchronous completion-queue API, N
///                                 threads each polling a queue of its own
///
/// Prints "GRPC listening on 127.0.0.1:PORT" and serves until killed.

#include "grpc_service.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace pb = inference;

namespace {

void echo(const pb::ModelInferRequest& request, pb::ModelInferResponse& reply) {
  reply.set_model_name(request.model_name());
  reply.set_model_version("1");
  reply.set_id(request.id());
  auto* out = reply.add_outputs();
  out->set_name("OUTPUT0");
  out->set_datatype("FP32");
  for (auto d : request.inputs(0).shape())
    out->add_shape(d);
  reply.add_raw_output_contents(request.raw_input_contents(0));
}

class callback_service final : public pb::GRPCInferenceService::CallbackService {
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const pb::ModelInferRequest* request,
                                       pb::ModelInferResponse* reply) override {
    echo(*request, *reply);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

using async_service = pb::GRPCInferenceService::AsyncService;

/// One ModelInfer call of the completion-queue API.
struct cq_call {
  async_service& service;
  grpc::ServerCompletionQueue& cq;
  grpc::ServerContext ctx;
  pb::ModelInferRequest request;
  pb::ModelInferResponse reply;
  grpc::ServerAsyncResponseWriter<pb::ModelInferResponse> writer{&ctx};
  bool answered = false;

  cq_call(async_service& s, grpc::ServerCompletionQueue& q) : service(s), cq(q) {
    service.RequestModelInfer(&ctx, &request, &writer, &cq, &cq, this);
  }
  void proceed(bool ok) {
    if (answered || !ok) {
      delete this;
      return;
    }
    new cq_call(service, cq);
    echo(request, reply);
    answered = true;
    writer.Finish(reply, grpc::Status::OK, this);
  }
};

} // namespace

int main(int argc, char** argv) {
  std::string api = argc > 1 ? argv[1] : "callback";
  int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  callback_service callback;
  async_service async;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  if (api == "cq") {
    builder.RegisterService(&async);
    for (int i = 0; i < threads; ++i)
      queues.push_back(builder.AddCompletionQueue());
  } else {
    builder.RegisterService(&callback);
  }
  auto server = builder.BuildAndStart();
  std::printf("GRPC listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  if (api != "cq") {
    server->Wait();
    return 0;
  }
  std::vector<std::thread> pollers;
  for (auto& q : queues)
    pollers.emplace_back([&async, cq = q.get()] {
      new cq_call(async, *cq);
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok))
        static_cast<cq_call*>(tag)->proceed(ok);
    });
  for (auto& t : pollers)
    t.join();
}
