#pragma once
/// Command-line options of `caf-serving`, with Triton's flag names where Triton
/// has the flag.

#include "cluster/tls.hpp"
#include "core/thread_config.hpp"
#include "ingress/http_server.hpp"
#include "ingress/grpc/grpc_server.hpp"
#include "ingress/response_cache.hpp"
#include "core/limits.hpp"
#include "server/model_manager.hpp"

#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace caf_serving::app {

/// Scaling across nodes (docs/cluster.md).
struct cluster_options {
  /// Workers to use, "HOST:PORT" each (--worker, repeatable).
  std::vector<std::string> workers;
  /// Listen for workers that join (--cluster-port; 0 picks a free port).
  std::optional<uint16_t> listen_port;
  /// Address of that listener; empty: every interface.
  std::string listen_address;
  /// File with the cluster's shared secret; else CAF_SERVING_CLUSTER_SECRET.
  std::optional<std::string> secret_file;
  /// Also run executors in this process (default); false: workers only.
  bool local_executors = true;
  /// Credit window: batches one remote executor may hold at once.
  uint32_t remote_credits = 2;
  /// A remote batch is presumed lost at max(factor x predicted, floor) after it was
  /// sent; before its executor is measured, after remote_timeout_ms.
  uint32_t remote_timeout_ms = 10000;
  double remote_timeout_factor = 4.0;
  uint32_t remote_timeout_floor_ms = 500;
  uint32_t heartbeat_ms = 200;
  uint32_t node_timeout_ms = 1000;
  /// Largest model shipped to a worker without a repository (--max-ship-bytes).
  uint64_t max_ship_bytes = 1ull << 30;
  /// Batches (and results) of at least this many bytes go over the workers' bulk
  /// channels (--bulk-threshold-bytes); 0: never. Off under TLS.
  uint64_t bulk_threshold_bytes = 1ull << 20;
  /// --tls-certificate/--tls-key/--tls-ca/--tls-passphrase-file: TLS on every link.
  cluster::tls_config tls;

  bool enabled() const { return !workers.empty() || listen_port.has_value(); }
};

struct server_options {
  std::string model_repository;
  ingress::http_server_config http;
  /// The KServe gRPC ingress (docs/grpc.md): --allow-grpc, --grpc-address,
  /// --grpc-port, --grpc-infer-response-compression-level,
  /// --grpc-stream-max-in-flight. Its limits, readiness and shared-memory
  /// settings are HTTP's, copied after parsing.
  bool grpc_enabled = true;
  ingress::grpc_server_config grpc;
  thread_config threads;
  uint32_t max_queue_size = 1024;
  /// --kv-cache-bytes: each generative model's KV cache; 0: its own default.
  uint64_t kv_cache_bytes = 0;
  /// --executor-timeout-ms: a local executor silent this long on a batch is
  /// replaced and the batch sent once more; 0: never.
  uint32_t executor_timeout_ms = 60000;
  /// --max-batch-bytes: largest sum of tensor bytes in one batch.
  uint64_t max_batch_bytes = max_data_field_bytes;
  uint32_t executor_depth = 1;
  /// --cache-config local,size=N (Triton's flag; also its older
  /// --response-cache-byte-size N): the response cache; size 0: none.
  ingress::response_cache_config cache;
  cluster_options cluster;
  /// Model control (Triton's flags): --model-control-mode, --load-model
  /// (repeatable; "*" alone for all), --repository-poll-secs,
  /// --strict-model-config, and --model-load-max-file-bytes (the engine's: the
  /// most bytes of file: parameters one load may write).
  server::model_control_mode model_control_mode = server::model_control_mode::none;
  std::vector<std::string> load_models;
  uint32_t repository_poll_secs = 15;
  bool strict_model_config = false;
  uint64_t model_load_max_file_bytes = uint64_t{256} << 20;
  /// --print-plan MODEL: print the model's optimized ONNX plan (at
  /// --print-plan-batch rows, split for --executor-threads) and exit.
  std::optional<std::string> print_plan;
  int64_t print_plan_batch = 1;
};

struct show_help {};

/// Parses argv; a string is a usage error that says which flag is wrong and why.
std::variant<server_options, show_help, std::string> parse_options(int argc, char** argv);

/// The text --help prints.
std::string usage();

} // namespace caf_serving::app
