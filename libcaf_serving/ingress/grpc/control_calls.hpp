#pragma once
/// The calls of inference.GRPCInferenceService other than ModelInfer and
/// ModelStreamInfer (health, metadata, configuration, statistics, the
/// repository, shared memory, settings) as plain handlers: a request in, a
/// response filled and a status out. grpc_server serves them on its
/// completion queues.
///
/// Why none may be on grpc's callback API beside completion-queue
/// inference: any callback method makes grpc 1.51 start its two "nexting"
/// threads, which poll the same sockets as the completion-queue threads and
/// hand every call they read over to them (bench/RESULTS.md: 25 instead of 32
/// us of server CPU a ModelInfer call at concurrency 64 without them).
///
/// Usage (grpc_server.cpp):
///
///     control_calls calls(models, shm, draining, strict_readiness);
///     pb::ServerReadyResponse response;
///     Status s = calls.server_ready(request, &response);

#include "ingress/shared_memory.hpp"
#include "server/model_directory.hpp"

#include "grpc_service.grpc.pb.h"

#include <atomic>
#include <functional>
#include <memory>

namespace caf_serving::ingress {

class control_calls {
public:
  using Status = ::grpc::Status;

  /// `draining` is the server's drain flag: set, the server is neither ready
  /// nor are its models. `strict_readiness`: ready only while every model is.
  control_calls(server::model_directory& models, std::shared_ptr<shared_memory_registry> shm,
                const std::atomic<bool>& draining, bool strict_readiness)
      : models_(models), shm_(std::move(shm)), draining_(draining),
        strict_readiness_(strict_readiness) {}

  Status server_live(const inference::ServerLiveRequest&, inference::ServerLiveResponse*) const;
  Status server_ready(const inference::ServerReadyRequest&, inference::ServerReadyResponse*) const;
  Status model_ready(const inference::ModelReadyRequest&, inference::ModelReadyResponse*) const;
  Status server_metadata(const inference::ServerMetadataRequest&,
                         inference::ServerMetadataResponse*) const;
  Status model_metadata(const inference::ModelMetadataRequest&,
                        inference::ModelMetadataResponse*) const;
  Status model_config(const inference::ModelConfigRequest&, inference::ModelConfigResponse*) const;
  Status model_statistics(const inference::ModelStatisticsRequest&,
                          inference::ModelStatisticsResponse*) const;
  Status repository_index(const inference::RepositoryIndexRequest&,
                          inference::RepositoryIndexResponse*) const;
  /// The load runs on the model manager's loader thread: `done` is called
  /// once, from there or (for a bad request) before this returns.
  void repository_model_load(const inference::RepositoryModelLoadRequest&,
                             std::function<void(Status)> done) const;
  Status repository_model_unload(const inference::RepositoryModelUnloadRequest&,
                                 inference::RepositoryModelUnloadResponse*) const;
  Status system_shared_memory_status(const inference::SystemSharedMemoryStatusRequest&,
                                     inference::SystemSharedMemoryStatusResponse*) const;
  Status system_shared_memory_register(const inference::SystemSharedMemoryRegisterRequest&,
                                       inference::SystemSharedMemoryRegisterResponse*) const;
  Status system_shared_memory_unregister(const inference::SystemSharedMemoryUnregisterRequest&,
                                         inference::SystemSharedMemoryUnregisterResponse*) const;
  Status cuda_shared_memory_status(const inference::CudaSharedMemoryStatusRequest&,
                                   inference::CudaSharedMemoryStatusResponse*) const;
  Status cuda_shared_memory_register(const inference::CudaSharedMemoryRegisterRequest&,
                                     inference::CudaSharedMemoryRegisterResponse*) const;
  Status cuda_shared_memory_unregister(const inference::CudaSharedMemoryUnregisterRequest&,
                                       inference::CudaSharedMemoryUnregisterResponse*) const;
  Status trace_setting(const inference::TraceSettingRequest&,
                       inference::TraceSettingResponse*) const;
  Status log_settings(const inference::LogSettingsRequest&, inference::LogSettingsResponse*) const;

private:
  /// Not draining, and (strict readiness) every model ready.
  bool ready() const;

  /// The model `name` at `version` (a request's text; empty: the latest), or
  /// why there is none.
  result<std::shared_ptr<const server::model_pipeline>>
  find_model(const std::string& name, const std::string& version) const;

  server::model_directory& models_;
  std::shared_ptr<shared_memory_registry> shm_;
  const std::atomic<bool>& draining_;
  bool strict_readiness_;
};

} // namespace caf_serving::ingress
