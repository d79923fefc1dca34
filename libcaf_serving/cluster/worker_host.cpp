#include "cluster/worker_host.hpp"

#include "cluster/secret.hpp"
#include "cluster/tls.hpp"
#include "executor/builtin_backend.hpp"
#include "executor/executor_actor.hpp"
#include "repository/model_repository.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <iostream>
#include <map>
#include <mutex>
#include <set>

namespace caf_serving::cluster {

result<host_port> parse_host_port(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return bad_request("'" + text + "' is not HOST:PORT (for example 127.0.0.1:9100)");
  auto port_text = text.substr(colon + 1);
  // Digits only: strtoul would also take " 80", "+80" and "-1" (as 2^64 - 1).
  bool digits = port_text.size() <= 5
                && port_text.find_first_not_of("0123456789") == std::string::npos;
  auto port = digits ? std::strtoul(port_text.c_str(), nullptr, 10) : 0;
  if (!digits || port == 0 || port > 65535)
    return bad_request("'" + text + "': the port must be a number from 1 to 65535");
  return host_port{text.substr(0, colon), static_cast<uint16_t>(port)};
}

namespace {

/// Server nodes that proved the secret; executors check each batch's sender.
class authorized_nodes {
public:
  void add(const caf::node_id& n) {
    std::lock_guard<std::mutex> guard(mutex_);
    nodes_.insert(n);
  }
  bool contains(const caf::node_id& n) const {
    std::lock_guard<std::mutex> guard(mutex_);
    return nodes_.count(n) > 0;
  }

private:
  mutable std::mutex mutex_;
  std::set<caf::node_id> nodes_;
};

executor::executor_actor spawn_worker_executor(caf::actor_system& sys,
                                               std::shared_ptr<executor::backend> be,
                                               const model_config& config,
                                               std::shared_ptr<authorized_nodes> auth) {
  auto body = [be, config, auth](executor::executor_actor::pointer self)
    -> executor::executor_actor::behavior_type {
    return {
      [self, be, config, auth](run_batch& msg) -> caf::result<batch_result_message> {
        auto sender = self->current_sender();
        if (!sender || !auth->contains(sender->node())) {
          std::cerr << "caf-serving-worker: refused a batch for model '" << config.name
                    << "' from node "
                    << (sender ? to_string(sender->node()) : std::string("(anonymous)"))
                    << ", which has not proved the cluster secret" << std::endl;
          return make_cluster_error(cluster_errc::refused,
                                    "this worker serves only servers that proved the "
                                    "cluster secret");
        }
        return executor::run_one_batch(*be, config, msg.reader());
      },
    };
  };
  if (be->blocks())
    return sys.spawn<caf::detached>(body);
  return sys.spawn(body);
}

struct host_state {
  worker_config cfg;
  worker_info info;
  std::shared_ptr<authorized_nodes> auth;
  /// The nonce last given to each node that asked for a challenge.
  std::map<caf::node_id, std::string> nonces;
  /// Joining a server: the server's registry once joined.
  caf::actor joined;
  bool joining = false;
};

using host_ptr = caf::stateful_actor<host_state>*;

using retry_join_atom = caf::atom_constant<caf::atom("rejoin")>;

void join(host_ptr self) {
  auto& st = self->state;
  if (!st.cfg.join_to || st.joining || st.joined)
    return;
  st.joining = true;
  auto target = *st.cfg.join_to;
  auto where = target.host + ":" + std::to_string(target.port);
  auto timeout = std::chrono::duration_cast<caf::timespan>(st.cfg.request_timeout);
  auto retry = [self, where](const std::string& why) {
    self->state.joining = false;
    std::cerr << "caf-serving-worker: cannot join " << where << ": " << why << "; retrying in "
              << self->state.cfg.retry_interval.count() << " ms" << std::endl;
    self->delayed_send(self, self->state.cfg.retry_interval, retry_join_atom::value);
  };
  auto mm = link_manager(self->system());
  self->request(mm, timeout, caf::connect_atom::value, target.host, target.port)
    .then(
      [self, retry, timeout, where](const caf::node_id&, caf::strong_actor_ptr& ptr,
                                    const std::set<std::string>&) {
        if (!ptr)
          return retry("nothing is published there");
        auto registry = caf::actor_cast<caf::actor>(ptr);
        self->request(registry, timeout, challenge_atom::value)
          .then(
            [self, registry, retry, timeout, where](const std::string& nonce) {
              auto& st = self->state;
              auto proof = prove(st.cfg.secret, "worker", nonce);
              self->request(registry, timeout, join_atom::value, proof,
                            caf::actor_cast<caf::actor>(self), st.cfg.name)
                .then(
                  [self, registry, where](const std::string& server) {
                    auto& st = self->state;
                    st.joining = false;
                    st.joined = registry;
                    self->monitor(registry);
                    std::cout << "joined server " << server << " at " << where << std::endl;
                  },
                  [retry](caf::error& e) { retry("the server refused: " + to_string(e)); });
            },
            [retry](caf::error& e) { retry(to_string(e)); });
      },
      [self, retry](caf::error& e) { retry(self->system().render(e)); });
}

} // namespace

result<worker_host> start_worker(caf::actor_system& sys, worker_config config) {
  auto entries = repository::scan_repository(config.repository, {});
  if (!entries)
    return entries.error();
  worker_host host;
  auto auth = std::make_shared<authorized_nodes>();
  worker_info info;
  info.name = config.name;
  for (const auto& e : *entries) {
    if (!e.config) {
      host.failed.push_back(e.name + ": " + e.config.error().message);
      continue;
    }
    const auto& cfg = e.config->config;
    if (cfg.backend != "builtin") {
      host.failed.push_back(e.name + ": only backend \"builtin\" is served by this build");
      continue;
    }
    auto be = executor::make_builtin_backend(cfg);
    if (!be) {
      host.failed.push_back(e.name + ": " + be.error().message);
      continue;
    }
    int instances = 0;
    for (const auto& g : cfg.instance_groups)
      instances += g.count;
    if (instances <= 0)
      instances = static_cast<int>(std::max<uint32_t>(config.default_instances, 1));
    for (auto version : e.versions) {
      worker_model m;
      m.name = e.name;
      m.version = version;
      for (int i = 0; i < instances; ++i)
        m.executors.push_back(
          caf::actor_cast<caf::actor>(spawn_worker_executor(sys, *be, cfg, auth)));
      host.executors.insert(host.executors.end(), m.executors.begin(), m.executors.end());
      host.loaded.push_back(e.name + " version " + std::to_string(version) + " ("
                            + std::to_string(instances) + " executors)");
      info.models.push_back(std::move(m));
    }
  }
  host.actor = sys.spawn([cfg = std::move(config), info = std::move(info), auth](
                           host_ptr self) mutable -> caf::behavior {
    auto& st = self->state;
    st.cfg = std::move(cfg);
    st.info = std::move(info);
    st.auth = auth;
    self->set_down_handler([self](caf::down_msg& dm) {
      if (dm.source != self->state.joined.address())
        return;
      self->state.joined = nullptr;
      std::cerr << "caf-serving-worker: lost the server it joined; joining again" << std::endl;
      join(self);
    });
    join(self);
    return {
      [self](challenge_atom) -> std::string {
        auto nonce = make_nonce();
        if (auto sender = self->current_sender())
          self->state.nonces[sender->node()] = nonce;
        return nonce;
      },
      [self](hello_atom, const std::string& proof) -> caf::result<worker_info> {
        auto& st = self->state;
        auto sender = self->current_sender();
        auto node = sender ? sender->node() : caf::node_id{};
        auto it = st.nonces.find(node);
        bool ok = sender && it != st.nonces.end()
                  && verify(st.cfg.secret, "server", it->second, proof);
        if (it != st.nonces.end())
          st.nonces.erase(it); // one proof per challenge
        if (!ok) {
          std::cerr << "caf-serving-worker: refused server node " << to_string(node)
                    << ": it did not prove the cluster secret (wrong secret?)" << std::endl;
          return make_cluster_error(cluster_errc::refused,
                                    "worker '" + st.cfg.name
                                      + "' refused this server: wrong cluster secret");
        }
        st.auth->add(node);
        std::cout << "accepted server node " << to_string(node) << std::endl;
        return st.info;
      },
      [self](retry_join_atom) { join(self); },
    };
  });
  return host;
}

} // namespace caf_serving::cluster
