#include "ingress/grpc/control_calls.hpp"

#include "ingress/grpc/convert.hpp"

#include <google/protobuf/util/json_util.h>

#include <iostream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace caf_serving::ingress {

namespace {

namespace pb = inference;
using ::grpc::Status;
using ::grpc::StatusCode;

/// The Triton release whose protocol this server speaks (as on HTTP: Triton's
/// clients check that the server calls itself "triton").
constexpr const char* triton_protocol_version = "2.51.0";

constexpr const char* server_extensions[]
  = {"classification",  "model_repository",    "model_repository(unload_dependents)",
     "schedule_policy", "model_configuration", "system_shared_memory",
     "statistics"};

Status as_status(Status s) {
  return s;
}

Status as_status(const serving_error& e) {
  return grpc_api::to_status(e);
}

Status shm_disabled() {
  return Status(StatusCode::UNAVAILABLE,
                "this server does not accept client shared memory; start it with "
                "--allow-client-shm true");
}

Status no_cuda_shm() {
  return Status(StatusCode::UNIMPLEMENTED,
                "caf-serving does not support CUDA shared memory yet: put the tensors in "
                "system shared memory (SystemSharedMemoryRegister) or in the request");
}

void fill(pb::StatisticDuration* out, const duration_stat& d) {
  out->set_count(d.count.load(std::memory_order_relaxed));
  out->set_ns(d.ns.load(std::memory_order_relaxed));
}

} // namespace

result<std::shared_ptr<const server::model_pipeline>>
control_calls::find_model(const std::string& name, const std::string& version) const {
  auto v = grpc_api::parse_version(version, name);
  if (!v)
    return v.error();
  return models_.find(name, *v);
}

bool control_calls::ready() const {
  return !draining_.load() && (!strict_readiness_ || models_.all_ready());
}

Status control_calls::server_live(const pb::ServerLiveRequest&,
                                  pb::ServerLiveResponse* response) const {
  response->set_live(true);
  return Status::OK;
}

Status control_calls::server_ready(const pb::ServerReadyRequest&,
                                   pb::ServerReadyResponse* response) const {
  response->set_ready(ready());
  return Status::OK;
}

Status control_calls::model_ready(const pb::ModelReadyRequest& request,
                                  pb::ModelReadyResponse* response) const {
  auto version = grpc_api::parse_version(request.version(), request.name());
  if (!version)
    return as_status(version.error());
  response->set_ready(!draining_.load() && models_.find(request.name(), *version).ok());
  return Status::OK;
}

Status control_calls::server_metadata(const pb::ServerMetadataRequest&,
                                      pb::ServerMetadataResponse* response) const {
  response->set_name("triton");
  response->set_version(triton_protocol_version);
  for (const char* e : server_extensions)
    response->add_extensions(e);
  return Status::OK;
}

Status control_calls::model_metadata(const pb::ModelMetadataRequest& request,
                                     pb::ModelMetadataResponse* response) const {
  auto m = find_model(request.name(), request.version());
  if (!m)
    return as_status(m.error());
  const auto& config = (*m)->config;
  response->set_name(config.name);
  for (const auto& p : models_.versions(config.name))
    response->add_versions(std::to_string(p->version));
  response->set_platform(config.platform.empty() ? config.backend : config.platform);
  bool batched = config.max_batch_size > 0;
  auto tensors = [batched](const std::vector<tensor_config>& from, auto add) {
    for (const auto& t : from) {
      auto* out = add();
      out->set_name(t.name);
      out->set_datatype(std::string(to_string(t.dtype)));
      if (batched)
        out->add_shape(-1);
      for (auto d : t.dims)
        out->add_shape(d);
    }
  };
  tensors(config.inputs, [response] { return response->add_inputs(); });
  tensors(config.outputs, [response] { return response->add_outputs(); });
  return Status::OK;
}

Status control_calls::model_config(const pb::ModelConfigRequest& request,
                                   pb::ModelConfigResponse* response) const {
  auto m = find_model(request.name(), request.version());
  if (!m)
    return as_status(m.error());
  // The same configuration HTTP serves at /config, read back into the
  // protobuf (a rare call: no second copy of the conversion is kept).
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto parsed = google::protobuf::util::JsonStringToMessage((*m)->config_json,
                                                            response->mutable_config(), options);
  if (!parsed.ok()) {
    std::cerr << "caf-serving: model '" << request.name()
              << "': its configuration did not convert for gRPC: " << parsed.ToString()
              << std::endl;
    return as_status(
      Status(StatusCode::INTERNAL, "the configuration of model '" + request.name()
                                     + "' could not be converted; see the server log"));
  }
  return Status::OK;
}

Status control_calls::model_statistics(const pb::ModelStatisticsRequest& request,
                                       pb::ModelStatisticsResponse* response) const {
  std::vector<std::shared_ptr<model_stats>> stats;
  if (request.name().empty()) {
    stats = models_.all_stats();
  } else {
    auto version = grpc_api::parse_version(request.version(), request.name());
    if (!version)
      return as_status(version.error());
    for (const auto& p : models_.versions(request.name()))
      if (*version == 0 || p->version == *version)
        stats.push_back(p->stats);
    if (stats.empty()) {
      auto m = models_.find(request.name(), *version);
      return as_status(bad_request("requested model '" + request.name() + "' is not available: "
                                   + (m ? std::string("it is not served") : m.error().message)));
    }
  }
  for (const auto& s : stats) {
    auto* out = response->add_model_stats();
    out->set_name(s->name);
    out->set_version(std::to_string(s->version));
    out->set_last_inference(s->last_inference_ms.load());
    out->set_inference_count(s->inference_count.load());
    out->set_execution_count(s->execution_count.load());
    auto* i = out->mutable_inference_stats();
    fill(i->mutable_success(), s->success);
    fill(i->mutable_fail(), s->fail);
    fill(i->mutable_queue(), s->queue);
    fill(i->mutable_compute_input(), s->compute_input);
    fill(i->mutable_compute_infer(), s->compute_infer);
    fill(i->mutable_compute_output(), s->compute_output);
    fill(i->mutable_cache_hit(), s->cache_hit);
    fill(i->mutable_cache_miss(), s->cache_miss);
  }
  return Status::OK;
}

Status control_calls::repository_index(const pb::RepositoryIndexRequest& request,
                                       pb::RepositoryIndexResponse* response) const {
  for (auto& row : models_.index()) {
    if (request.ready() && row.state != "READY")
      continue;
    auto* m = response->add_models();
    m->set_name(std::move(row.name));
    m->set_version(std::move(row.version));
    m->set_state(std::move(row.state));
    m->set_reason(std::move(row.reason));
  }
  return Status::OK;
}

void control_calls::repository_model_load(const pb::RepositoryModelLoadRequest& request,
                                          std::function<void(Status)> done) const {
  server::load_parameters params;
  for (const auto& [key, value] : request.parameters()) {
    using P = pb::ModelRepositoryParameter;
    if (key == "config") {
      if (value.parameter_choice_case() != P::kStringParam)
        return done(as_status(bad_request("load parameter 'config' must be a string_param "
                                          "holding the model configuration as JSON")));
      params.config = value.string_param();
    } else if (key.rfind("file:", 0) == 0) {
      if (value.parameter_choice_case() != P::kBytesParam)
        return done(as_status(
          bad_request("load parameter '" + key + "' must be a bytes_param holding the file")));
      params.files.push_back({key.substr(5), grpc_api::base64_encode(value.bytes_param())});
    } else {
      return done(as_status(bad_request("unknown load parameter '" + key
                                        + "'; a load takes 'config' and 'file:<path>'")));
    }
  }
  if (!params.files.empty() && !params.config)
    return done(as_status(bad_request("load parameters 'file:<path>' need a 'config' parameter "
                                      "too (the model's configuration as JSON)")));
  // The load runs on the model manager's loader thread; the call is
  // answered from there.
  models_.request_load(request.model_name(), std::move(params),
                       [done = std::move(done)](std::variant<std::monostate, serving_error> r) {
                         if (auto* e = std::get_if<serving_error>(&r))
                           done(grpc_api::to_status(*e));
                         else
                           done(Status::OK);
                       });
}

Status control_calls::repository_model_unload(const pb::RepositoryModelUnloadRequest& request,
                                              pb::RepositoryModelUnloadResponse*) const {
  server::unload_parameters params;
  for (const auto& [key, value] : request.parameters()) {
    if (key != "unload_dependents")
      return as_status(
        bad_request("unknown unload parameter '" + key + "'; an unload takes 'unload_dependents'"));
    params.unload_dependents = value.bool_param();
  }
  auto r = models_.request_unload(request.model_name(), params);
  if (auto* e = std::get_if<serving_error>(&r))
    return as_status(*e);
  return Status::OK;
}

// -- shared memory -------------------------------------------------------------

Status
control_calls::system_shared_memory_status(const pb::SystemSharedMemoryStatusRequest& request,
                                           pb::SystemSharedMemoryStatusResponse* response) const {
  std::optional<std::string> name;
  if (!request.name().empty())
    name = request.name();
  auto regions = shm_->status(name, region_kind::system);
  if (!regions)
    return as_status(regions.error());
  for (const auto& r : *regions) {
    auto& out = (*response->mutable_regions())[r.name];
    out.set_name(r.name);
    out.set_key(r.key);
    out.set_offset(r.offset);
    out.set_byte_size(r.byte_size);
  }
  return Status::OK;
}

Status
control_calls::system_shared_memory_register(const pb::SystemSharedMemoryRegisterRequest& request,
                                             pb::SystemSharedMemoryRegisterResponse*) const {
  if (!shm_->config().allow_client_shm)
    return as_status(shm_disabled());
  if (request.name().empty())
    return as_status(bad_request("'name' is necessary to register a system shared memory "
                                 "region"));
  auto r
    = shm_->register_system(request.name(), request.key(), request.offset(), request.byte_size());
  if (!r)
    return as_status(r.error());
  return Status::OK;
}

Status control_calls::system_shared_memory_unregister(
  const pb::SystemSharedMemoryUnregisterRequest& request,
  pb::SystemSharedMemoryUnregisterResponse*) const {
  if (!shm_->config().allow_client_shm)
    return as_status(shm_disabled());
  if (request.name().empty())
    shm_->unregister_all(region_kind::system);
  else
    shm_->unregister(request.name(), region_kind::system);
  return Status::OK;
}

// CUDA shared memory is answered as by a Triton built without GPU support,
// and as the HTTP side answers /v2/cudasharedmemory (shm_api.cpp): no region
// can exist, so the status of all is empty and unregistering succeeds (the
// clean-up Triton's examples start with); registering one is refused.
Status control_calls::cuda_shared_memory_status(const pb::CudaSharedMemoryStatusRequest& request,
                                                pb::CudaSharedMemoryStatusResponse*) const {
  if (request.name().empty())
    return Status::OK;
  if (shm_->status(request.name(), region_kind::system))
    return as_status(
      Status(StatusCode::NOT_FOUND, "The region named '" + request.name()
                                      + "' is registered as system shared memory, not CUDA shared "
                                        "memory; SystemSharedMemoryStatus shows it"));
  return as_status(
    Status(StatusCode::NOT_FOUND, "Unable to find cuda shared memory region: '" + request.name()
                                    + "'; caf-serving does not support CUDA shared memory yet"));
}
Status control_calls::cuda_shared_memory_register(const pb::CudaSharedMemoryRegisterRequest&,
                                                  pb::CudaSharedMemoryRegisterResponse*) const {
  if (!shm_->config().allow_client_shm)
    return as_status(shm_disabled());
  return as_status(no_cuda_shm());
}
Status control_calls::cuda_shared_memory_unregister(const pb::CudaSharedMemoryUnregisterRequest&,
                                                    pb::CudaSharedMemoryUnregisterResponse*) const {
  if (!shm_->config().allow_client_shm)
    return as_status(shm_disabled());
  return Status::OK; // no CUDA region can exist
}

Status control_calls::trace_setting(const pb::TraceSettingRequest&,
                                    pb::TraceSettingResponse*) const {
  return as_status(Status(StatusCode::UNIMPLEMENTED,
                          "caf-serving has no request tracing; per-request stage times "
                          "come with the request parameter timing=true (HTTP) and in "
                          "ModelStatistics"));
}
Status control_calls::log_settings(const pb::LogSettingsRequest&, pb::LogSettingsResponse*) const {
  return as_status(Status(StatusCode::UNIMPLEMENTED,
                          "caf-serving's log settings cannot be changed at run time; it "
                          "logs to stdout and stderr"));
}

} // namespace caf_serving::ingress
