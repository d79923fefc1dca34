#include "cluster/worker_host.hpp"

#include "cluster/detached_io.hpp"
#include "cluster/model_hash.hpp"
#include "cluster/secret.hpp"
#include "cluster/tls.hpp"
#include "executor/executor_actor.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
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

/// The handle a server gets for one of the worker's executors: checks that each
/// batch comes from a server that proved the secret and hands it on to the
/// executor, which answers the server directly. It dies with the executor
/// (linked), so that a server sees a retired executor (reload, unload) as lost
/// and runs its batches elsewhere.
caf::actor spawn_gate(caf::actor_system& sys, executor::executor_actor target,
                      std::string model, std::shared_ptr<authorized_nodes> auth) {
  auto gate = sys.spawn([target, model, auth](executor::executor_actor::pointer self)
                          -> executor::executor_actor::behavior_type {
    self->link_to(target);
    return {
      [self, target, model, auth](run_batch& msg) -> caf::result<batch_result_message> {
        auto sender = self->current_sender();
        // A sender on this node is the bulk channel's session actor, which
        // runs only batches of servers that presented their token.
        bool local = sender && sender->node() == self->node();
        if (!sender || (!local && !auth->contains(sender->node()))) {
          std::cerr << "caf-serving-worker: refused a batch for model '" << model
                    << "' from node "
                    << (sender ? to_string(sender->node()) : std::string("(anonymous)"))
                    << ", which has not proved the cluster secret" << std::endl;
          return make_cluster_error(cluster_errc::refused,
                                    "this worker serves only servers that proved the "
                                    "cluster secret");
        }
        return self->delegate(target, std::move(msg));
      },
    };
  });
  return caf::actor_cast<caf::actor>(gate);
}

struct host_state {
  worker_config cfg;
  std::shared_ptr<server::model_directory> models;
  /// Beside a repository of its own: the manager of the shipped models (its
  /// repository is the cache directory); null without one.
  std::shared_ptr<server::model_directory> shipped;
  /// The gates and hash of each model served now (what servers are told).
  std::map<std::string, std::vector<worker_model>> served;
  /// Loads asked for by servers and under way on the manager's loader thread.
  std::map<uint64_t, caf::typed_response_promise<std::vector<worker_model>>> loads;
  uint64_t next_load = 0;
  std::shared_ptr<authorized_nodes> auth;
  /// The nonce last given to each node that asked for a challenge.
  std::map<caf::node_id, std::string> nonces;
  /// Joining a server: the server's registry once joined.
  caf::actor joined;
  bool joining = false;
};

using host_ptr = caf::stateful_actor<host_state>*;

using retry_join_atom = caf::atom_constant<caf::atom("rejoin")>;
/// From the loader thread: a load asked for by a server finished.
using load_done_atom = caf::atom_constant<caf::atom("wloaded")>;
/// From a detached actor: the files a server shipped are written and hashed.
using files_written_atom = caf::atom_constant<caf::atom("wwritten")>;

/// The directory the worker's manager loads `name` from.
std::filesystem::path model_dir(const server::model_directory& models, const std::string& name) {
  return models.repository() / name;
}

/// The hash of `name` as `models` serves it now: its directory and the config
/// override its newest version was loaded with (model_hash.hpp).
result<std::string> served_hash(const server::model_directory& models, const std::string& name) {
  auto versions = models.versions(name);
  return hash_model_dir(model_dir(models, name),
                        versions.empty() ? std::string() : versions.back()->config_override);
}

/// One worker_model per served version of `name`, each with a gate per executor.
std::vector<worker_model> describe(caf::actor_system& sys, const server::model_directory& models,
                                   const std::string& name, const std::string& hash,
                                   bool shipped, const std::shared_ptr<authorized_nodes>& auth,
                                   bulk_listener* bulk) {
  std::vector<worker_model> out;
  for (const auto& p : models.versions(name)) {
    worker_model m;
    m.name = name;
    m.version = p->version;
    m.hash = hash;
    m.shipped = shipped;
    for (const auto& e : p->executors) {
      m.executors.push_back(spawn_gate(sys, e, name, auth));
      if (bulk)
        bulk->add_target(m.executors.back());
    }
    out.push_back(std::move(m));
  }
  return out;
}

worker_info make_info(host_ptr self) {
  auto& st = self->state;
  worker_info info;
  info.name = st.cfg.name;
  for (const auto& [name, versions] : st.served)
    info.models.insert(info.models.end(), versions.begin(), versions.end());
  info.placement = st.cfg.placement;
  info.accepts_files = st.cfg.repository.empty() || st.shipped != nullptr;
  info.own_repository = !st.cfg.repository.empty();
  return info;
}

/// The manager that loads shipped files: the cache's beside a repository of the
/// worker's own, else the only one (whose repository is the cache).
server::model_directory& files_manager(host_state& st) {
  return st.shipped ? *st.shipped : *st.models;
}

/// True when the worker serves `name` from shipped files.
bool serves_shipped(const host_state& st, const std::string& name) {
  auto it = st.served.find(name);
  return it != st.served.end() && !it->second.empty() && it->second.front().shipped;
}

bool authorized(host_ptr self) {
  auto sender = self->current_sender();
  return sender && self->state.auth->contains(sender->node());
}

caf::error load_error(const std::string& why) {
  return make_cluster_error(cluster_errc::model_load_failed, why);
}

void start_load(host_ptr self, uint64_t id, const model_shipment& s, bool from_files);

/// A server's load (or reload): files shipped are written into the cache and
/// checked against the server's hash first; the manager loads on its loader
/// thread, and the answer is the model's new gates.
caf::typed_response_promise<std::vector<worker_model>> load_for_server(host_ptr self,
                                                                       model_shipment& s) {
  auto& st = self->state;
  // Before the promise: making it takes the sender out of the current message.
  bool allowed = authorized(self);
  auto rp = self->make_response_promise<std::vector<worker_model>>();
  if (!allowed) {
    rp.deliver(make_cluster_error(cluster_errc::refused,
                                  "this worker takes loads only from servers that proved the "
                                  "cluster secret"));
    return rp;
  }
  const auto& placement = st.cfg.placement;
  if (!placement.empty()
      && std::find(placement.begin(), placement.end(), s.name) == placement.end()) {
    rp.deliver(load_error("model '" + s.name + "' is not placed on worker '" + st.cfg.name
                          + "' (--models)"));
    return rp;
  }
  std::error_code ec;
  bool from_files = !s.files.empty() || st.cfg.repository.empty()
                    || (st.shipped && serves_shipped(st, s.name));
  if (!s.files.empty() && !st.cfg.repository.empty()) {
    // The server ships a model it has no word of in this worker (say, it was
    // unloaded there and loaded again): a copy in the worker's own repository
    // is loaded instead, and the hashes then tell whether it is the server's.
    bool own_copy = std::filesystem::exists(st.cfg.repository / s.name, ec);
    if (own_copy && !serves_shipped(st, s.name)) {
      std::cout << "model " << s.name << ": loading this worker's own copy in "
                << st.cfg.repository.string() << ", not the files the server shipped"
                << std::endl;
      s.files.clear();
      from_files = false;
    }
  }
  if (!s.files.empty()) {
    if (!st.cfg.repository.empty() && (!st.shipped
                                       || std::filesystem::exists(st.cfg.repository / s.name, ec))) {
      rp.deliver(load_error("worker '" + st.cfg.name + "' has its own copy of model '" + s.name
                            + "' in " + st.cfg.repository.string()
                            + " and takes no shipped files for it; update it there"));
      return rp;
    }
    uint64_t total = 0;
    for (const auto& f : s.files)
      total += f.bytes.size();
    if (total > st.cfg.max_model_bytes) {
      rp.deliver(load_error("model '" + s.name + "' is " + std::to_string(total)
                            + " bytes, more than this worker's --max-model-bytes ("
                            + std::to_string(st.cfg.max_model_bytes) + ")"));
      return rp;
    }
    // Written and hashed on a detached actor: 200 MB would hold a CAF worker,
    // and with it the batching timers, for seconds (detached_io.hpp).
    auto id = ++st.next_load;
    st.loads.emplace(id, rp);
    run_detached(self->system(), caf::actor_cast<caf::actor>(self),
                 [id, dir = model_dir(files_manager(st), s.name), total,
                  s = std::move(s)]() mutable {
                   std::string error;
                   auto written = write_model_files(dir, s.files);
                   auto hash = written ? hash_model_dir(dir, s.config) : written.error();
                   if (!written)
                     error = written.error().message;
                   else if (!hash || *hash != s.hash)
                     error = "the files of model '" + s.name + "' arrived with hash "
                             + (hash ? hash->substr(0, 12) : std::string("(unreadable)"))
                             + ", not the server's " + s.hash.substr(0, 12);
                   auto files = static_cast<uint64_t>(s.files.size());
                   s.files.clear(); // on disk now
                   return caf::make_message(files_written_atom::value, id, std::move(s), files,
                                            total, error);
                 });
    return rp;
  }
  auto id = ++st.next_load;
  st.loads.emplace(id, rp);
  start_load(self, id, s, from_files);
  return rp;
}

/// The load of a server's model by this worker's manager (the shipped files, if
/// any, written already); load_done_atom delivers load `id`'s answer.
void start_load(host_ptr self, uint64_t id, const model_shipment& s, bool from_files) {
  auto& st = self->state;
  auto me = caf::actor_cast<caf::actor>(self);
  auto manager = from_files && st.shipped ? st.shipped : st.models;
  // The hash of what was loaded, override included: a load without one keeps
  // an override loaded before (model_manager), which the server then sees.
  // Called on the manager's loader thread, which the manager joins before it
  // goes: the manager outlives the call.
  auto done = [me, id, name = s.name, from_files, models = manager.get()](
                std::variant<std::monostate, serving_error> r) {
    std::string error, hash;
    if (auto* e = std::get_if<serving_error>(&r)) {
      error = e->message;
    } else if (auto h = served_hash(*models, name)) {
      hash = *h;
    } else {
      error = h.error().message;
    }
    caf::anon_send(me, load_done_atom::value, id, name, error, hash, from_files);
  };
  if (s.config.empty()) {
    manager->load_async(s.name, std::move(done));
  } else {
    // The server's copy runs a config override: load with the same parameter.
    server::load_parameters params;
    params.config = s.config;
    manager->request_load(s.name, std::move(params), std::move(done));
  }
}

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
  std::error_code ec;
  auto root = config.repository.empty() ? config.cache_dir : config.repository;
  if (config.repository.empty()) {
    if (config.cache_dir.empty())
      return bad_request("a worker needs --model-repository DIR, or --model-cache-dir DIR for "
                         "the models its servers ship");
    std::filesystem::create_directories(config.cache_dir, ec);
    if (ec)
      return serving_error{status_code::internal, "cannot create --model-cache-dir "
                                                    + config.cache_dir.string() + ": "
                                                    + ec.message()};
  }
  // The servers decide what is served; the models are loaded on their word,
  // and at start the placed models (all by default) of the repository or cache.
  worker_host host;
  auto models = config.make_models(
    root, config.placement.empty() ? std::vector<std::string>{"*"} : config.placement);
  if (!models)
    return models.error();
  host.models = *models;
  // Beside a repository of its own, a worker takes shipped files for the models
  // missing there, into the cache, loaded by a manager of their own (the same
  // model manager, on another directory; nothing is loaded from it at start).
  if (!config.repository.empty() && !config.cache_dir.empty()) {
    std::filesystem::create_directories(config.cache_dir, ec);
    if (ec)
      return serving_error{status_code::internal, "cannot create --model-cache-dir "
                                                    + config.cache_dir.string() + ": "
                                                    + ec.message()};
    auto shipped = config.make_models(config.cache_dir, {});
    if (!shipped)
      return shipped.error();
    host.shipped = *shipped;
  }
  bool everything_shipped = config.repository.empty();
  auto auth = std::make_shared<authorized_nodes>();
  std::map<std::string, std::vector<worker_model>> served;
  for (const auto& row : host.models->index()) {
    if (row.state == "READY" && !served.count(row.name)) {
      auto hash = served_hash(*host.models, row.name);
      if (!hash) {
        host.failed.push_back(row.name + ": " + hash.error().message);
        continue;
      }
      served[row.name] = describe(sys, *host.models, row.name, *hash, everything_shipped, auth,
                                  config.bulk.get());
      for (const auto& m : served[row.name])
        host.loaded.push_back(row.name + " version " + std::to_string(m.version) + " ("
                              + std::to_string(m.executors.size()) + " executors)");
    } else if (!row.state.empty() && row.state != "READY") {
      host.failed.push_back(row.name + ": " + row.reason);
    }
  }
  host.actor = sys.spawn([cfg = std::move(config), models = host.models, shipped = host.shipped,
                          served = std::move(served), auth](host_ptr self) mutable
                         -> caf::behavior {
    auto& st = self->state;
    st.cfg = std::move(cfg);
    st.models = models;
    st.shipped = shipped;
    st.served = std::move(served);
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
        auto info = make_info(self);
        if (st.cfg.bulk) {
          info.bulk_port = st.cfg.bulk->port();
          info.bulk_host = st.cfg.bulk_host;
          info.bulk_token = st.cfg.bulk->issue_token(to_string(node));
        }
        return info;
      },
      [self](load_model_atom, model_shipment& s) { return load_for_server(self, s); },
      [self](files_written_atom, uint64_t id, const model_shipment& s, uint64_t files,
             uint64_t total, const std::string& error) {
        auto& st = self->state;
        auto it = st.loads.find(id);
        if (it == st.loads.end())
          return;
        if (!error.empty()) {
          it->second.deliver(load_error(error));
          st.loads.erase(it);
          return;
        }
        std::cout << "model " << s.name << ": " << files << " files (" << total
                  << " bytes) received from the server" << std::endl;
        start_load(self, id, s, true);
      },
      [self](load_done_atom, uint64_t id, const std::string& name, const std::string& error,
             const std::string& hash, bool from_files) {
        auto& st = self->state;
        auto it = st.loads.find(id);
        if (it == st.loads.end())
          return;
        auto rp = it->second;
        st.loads.erase(it);
        if (!error.empty()) {
          std::cerr << "caf-serving-worker: model '" << name << "' did not load: " << error
                    << std::endl;
          rp.deliver(load_error(error));
          return;
        }
        auto& models = st.served[name];
        models = describe(self->system(), from_files ? files_manager(st) : *st.models, name,
                          hash, from_files, st.auth, st.cfg.bulk.get());
        std::cout << "model " << name << " loaded for the server (hash " << hash.substr(0, 12)
                  << ")" << std::endl;
        rp.deliver(models);
      },
      [self](unload_model_atom, const std::string& name) {
        if (!authorized(self))
          return;
        auto& st = self->state;
        (serves_shipped(st, name) ? files_manager(st) : *st.models).unload(name);
        st.served.erase(name);
        std::cout << "model " << name << " unloaded for the server" << std::endl;
      },
      [self](retry_join_atom) { join(self); },
    };
  });
  return host;
}

} // namespace caf_serving::cluster
