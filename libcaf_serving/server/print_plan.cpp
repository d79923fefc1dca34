#include "server/print_plan.hpp"

#include "onnx_cpu/onnx_backend.hpp"
#include "repository/model_repository.hpp"

namespace caf_serving::server {

result<std::string> describe_model_plan(const print_plan_request& req) {
  repository::scan_config sc;
  sc.allow_missing_io = true;
  auto entry = repository::load_model_config(req.repository, req.model, sc);
  if (!entry.config)
    return entry.config.error();
  if (entry.version_dirs.empty())
    return serving_error{status_code::bad_request,
                         "model '" + req.model + "' has no numeric version directory in "
                           + (req.repository / req.model).string()};
  const auto& cfg = entry.config->config;
  auto file = entry.version_dirs.back()
              / (cfg.default_model_filename.empty() ? std::string("model.onnx")
                                                    : cfg.default_model_filename);
  if (!std::filesystem::exists(file))
    return serving_error{status_code::bad_request,
                         "model '" + req.model + "' is not an ONNX model: there is no "
                           + file.string() + " (platform '" + cfg.platform + "', backend '"
                           + cfg.backend + "')"};
  onnx::onnx_model_config oc;
  oc.config = cfg;
  oc.model_file = file;
  oc.threads = std::max(1u, req.threads);
  return onnx::describe_plan(oc, req.batch);
}

} // namespace caf_serving::server
