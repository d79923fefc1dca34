#include "cluster/protocol.hpp"

#include <caf/io/middleman.hpp>

namespace caf_serving::cluster {

void configure_actor_system(caf::actor_system_config& cfg, const liveness_config& live) {
  cfg.load<caf::io::middleman>();
  cfg.add_message_type<run_batch>("caf_serving::run_batch");
  cfg.add_message_type<batch_result_message>("caf_serving::batch_result_message");
  cfg.add_message_type<worker_info>("caf_serving::worker_info");
  cfg.add_message_type<model_shipment>("caf_serving::model_shipment");
  cfg.add_message_type<std::vector<worker_model>>("caf_serving::worker_models");
  cfg.set("middleman.heartbeat-interval", caf::timespan{live.heartbeat});
  cfg.set("middleman.connection-timeout", caf::timespan{live.node_timeout});
}

} // namespace caf_serving::cluster
