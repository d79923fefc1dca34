#include "cluster/node_registry.hpp"

#include "core/json.hpp"
#include "core/stats.hpp"

#include "cluster/detached_io.hpp"
#include "cluster/model_hash.hpp"
#include "cluster/model_sync.hpp"
#include "cluster/secret.hpp"
#include "cluster/tls.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <optional>
#include <iostream>
#include <set>
#include <tuple>

namespace caf_serving::cluster {

// -- status -----------------------------------------------------------------------

void cluster_status::set(const std::string& key, worker_status s) {
  std::lock_guard<std::mutex> guard(mutex_);
  workers_[key] = std::move(s);
}

std::vector<worker_status> cluster_status::workers() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<worker_status> out;
  for (const auto& [key, w] : workers_)
    out.push_back(w);
  return out;
}

std::string cluster_status::json() const {
  std::string out = "{\"workers\":[";
  bool first = true;
  for (const auto& w : workers()) {
    if (!first)
      out += ',';
    first = false;
    out += "{\"name\":";
    append_json_string(out, w.name);
    out += ",\"address\":";
    append_json_string(out, w.address);
    out += ",\"state\":";
    append_json_string(out, w.state);
    if (!w.reason.empty()) {
      out += ",\"reason\":";
      append_json_string(out, w.reason);
    }
    out += ",\"models\":[";
    for (size_t i = 0; i < w.models.size(); ++i) {
      if (i)
        out += ',';
      append_json_string(out, w.models[i]);
    }
    out += ']';
    if (!w.models_refused.empty()) {
      out += ",\"models_refused\":[";
      for (size_t i = 0; i < w.models_refused.size(); ++i) {
        if (i)
          out += ',';
        append_json_string(out, w.models_refused[i]);
      }
      out += ']';
    }
    out += ",\"batches_in_flight\":" + std::to_string(w.counters ? w.counters->in_flight.load() : 0);
    out += ",\"batches\":" + std::to_string(w.counters ? w.counters->batches.load() : 0);
    out += ",\"batches_lost\":" + std::to_string(w.counters ? w.counters->lost.load() : 0);
    out += ",\"batches_timed_out\":"
           + std::to_string(w.counters ? w.counters->timed_out.load() : 0);
    out += ",\"late_answers_dropped\":"
           + std::to_string(w.counters ? w.counters->late_dropped.load() : 0);
    out += ",\"bulk_batches\":"
           + std::to_string(w.counters ? w.counters->bulk_batches.load() : 0);
    out += '}';
  }
  return out + "]}";
}

std::string cluster_status::prometheus() const {
  auto ws = workers();
  if (ws.empty())
    return {};
  std::string up = "# HELP caf_serving_worker_up 1 when the worker is connected and "
                   "authenticated, else 0\n# TYPE caf_serving_worker_up gauge\n";
  std::string inflight = "# HELP caf_serving_worker_batches_in_flight Batches sent to the "
                         "worker and not yet answered\n"
                         "# TYPE caf_serving_worker_batches_in_flight gauge\n";
  std::string total = "# HELP caf_serving_worker_batches_total Batches sent to the worker\n"
                      "# TYPE caf_serving_worker_batches_total counter\n";
  std::string lost = "# HELP caf_serving_worker_batches_lost_total Batches sent back to the "
                     "queue because the worker was lost\n"
                     "# TYPE caf_serving_worker_batches_lost_total counter\n";
  std::string refused = "# HELP caf_serving_worker_model_refused 1 for each model a worker is "
                        "kept out of (its copy differs from the server's, or it failed to "
                        "load it)\n# TYPE caf_serving_worker_model_refused gauge\n";
  std::string timed_out = "# HELP caf_serving_worker_batches_timed_out_total Batches presumed "
                          "lost because they were far past their predicted completion\n"
                          "# TYPE caf_serving_worker_batches_timed_out_total counter\n";
  std::string late = "# HELP caf_serving_worker_late_answers_dropped_total Answers that came "
                     "after their batch had been re-run elsewhere, dropped\n"
                     "# TYPE caf_serving_worker_late_answers_dropped_total counter\n";
  std::string bulk = "# HELP caf_serving_worker_bulk_batches_total Batches sent over the "
                     "worker's bulk channel instead of the CAF link\n"
                     "# TYPE caf_serving_worker_bulk_batches_total counter\n";
  for (const auto& w : ws) {
    for (const auto& r : w.models_refused)
      refused += "caf_serving_worker_model_refused{worker=\"" + prometheus_label_value(w.name)
                 + "\",model=\"" + prometheus_label_value(r.substr(0, r.find(':'))) + "\"} 1\n";
    auto labels = "{worker=\"" + prometheus_label_value(w.name) + "\",address=\""
                  + prometheus_label_value(w.address)
                  + "\",state=\"" + w.state + "\"}";
    auto name_label = "{worker=\"" + prometheus_label_value(w.name) + "\"}";
    up += "caf_serving_worker_up" + labels + (w.state == "ready" ? " 1\n" : " 0\n");
    inflight += "caf_serving_worker_batches_in_flight" + name_label + " "
                + std::to_string(w.counters ? w.counters->in_flight.load() : 0) + "\n";
    total += "caf_serving_worker_batches_total" + name_label + " "
             + std::to_string(w.counters ? w.counters->batches.load() : 0) + "\n";
    lost += "caf_serving_worker_batches_lost_total" + name_label + " "
            + std::to_string(w.counters ? w.counters->lost.load() : 0) + "\n";
    timed_out += "caf_serving_worker_batches_timed_out_total" + name_label + " "
                 + std::to_string(w.counters ? w.counters->timed_out.load() : 0) + "\n";
    late += "caf_serving_worker_late_answers_dropped_total" + name_label + " "
            + std::to_string(w.counters ? w.counters->late_dropped.load() : 0) + "\n";
    bulk += "caf_serving_worker_bulk_batches_total" + name_label + " "
            + std::to_string(w.counters ? w.counters->bulk_batches.load() : 0) + "\n";
  }
  bool any_refused = false;
  for (const auto& w : ws)
    any_refused = any_refused || !w.models_refused.empty();
  return up + inflight + total + lost + timed_out + late + bulk
         + (any_refused ? refused : std::string());
}

// -- the registry actor -----------------------------------------------------------

namespace {

using sync_atom = caf::atom_constant<caf::atom("sync")>;
/// From a detached actor: the hash of a served model's directory (run_detached).
using model_hashed_atom = caf::atom_constant<caf::atom("mhashed")>;
/// From a detached actor: a model's files, read to be shipped to a worker.
using files_read_atom = caf::atom_constant<caf::atom("mfread")>;

struct worker_record {
  worker_status status;
  /// Static workers: where to connect again.
  std::optional<host_port> address;
  caf::actor handle;
  bool busy = false; ///< a connect or handshake is under way
  std::vector<worker_model> models;
  /// (scheduler, worker executor) pairs already attached (for this connection).
  std::set<std::pair<caf::actor_addr, caf::actor_addr>> attached;
  /// What the worker told at its greeting (protocol.hpp's worker_info).
  std::vector<std::string> placement;
  bool accepts_files = false;
  bool own_repository = false;
  /// model_sync_input's tried and pending, and why loads asked of it failed.
  std::map<std::string, std::string> tried;
  std::set<std::string> pending;
  std::map<std::string, std::string> load_errors;
  /// The worker's bulk channel on this connection (null: none) and its number,
  /// which tells a report of a broken channel from one of an older connection.
  std::shared_ptr<bulk_client> bulk;
  uint64_t bulk_generation = 0;
  /// A joined worker whose bulk channel broke while its CAF link stayed up:
  /// greeted again at the next sync (a dialled one is connected again).
  caf::actor regreet;
  /// Greeted with a repository of its own: the models it loaded from it are
  /// marked tried at the first sync that knows every served hash.
  bool own_models_untried = false;
  /// Greeted, and ready once every served model's hash is known (become_ready).
  bool greeted = false;
};

struct registry_state {
  registry_config cfg;
  server::model_directory* models = nullptr;
  std::shared_ptr<cluster_status> status;
  std::map<std::string, worker_record> workers;
  std::map<caf::node_id, std::string> nonces;
  /// Hash of each served model's directory, by the scheduler of its newest
  /// version (computed once per load, on a detached actor), and the schedulers
  /// whose hash is being computed.
  std::map<caf::actor_addr, std::pair<std::string, std::string>> hashes;
  std::set<caf::actor_addr> hashing;
  /// Schedulers whose directory could not be hashed: left out of the sync
  /// (as a model the server does not serve) until they are reloaded.
  std::set<caf::actor_addr> unhashable;
  /// Each live proxy: its worker's key, the scheduler it serves and the worker's
  /// executor. A proxy that quits while its worker is still ready (it gave up on
  /// a worker that kept timing out) is replaced at the next sync, unless the
  /// worker no longer serves that executor (a reload retired it).
  std::map<caf::actor_addr, std::tuple<std::string, caf::actor_addr, caf::actor_addr>> proxies;
  uint64_t bulk_generations = 0;
};

using self_ptr = caf::stateful_actor<registry_state>*;

void publish(self_ptr self, const std::string& key) {
  auto& w = self->state.workers.at(key);
  self->state.status->set(key, w.status);
}

void set_state(self_ptr self, const std::string& key, const std::string& state,
               const std::string& reason) {
  auto& w = self->state.workers.at(key);
  if (w.status.state != state || w.status.reason != reason) {
    auto& out = state == "ready" ? std::cout : std::cerr;
    // One write: the server's main thread prints its listening ports meanwhile.
    out << ("worker " + (w.status.name.empty() ? key : w.status.name) + " at "
            + w.status.address + ": " + state + (reason.empty() ? "" : " (" + reason + ")")
            + "\n")
        << std::flush;
  }
  w.status.state = state;
  w.status.reason = reason;
  publish(self, key);
}

/// The models the server serves now: name -> hash of the directory it loaded
/// them from (model_hash.hpp). Nothing while a hash is still being computed
/// (it starts here, on a detached actor; the answer syncs again): a plan made
/// without it would take that model for unloaded.
std::optional<std::map<std::string, std::string>> served_hashes(self_ptr self) {
  auto& st = self->state;
  std::map<std::string, std::string> out;
  std::map<caf::actor_addr, std::pair<std::string, std::string>> seen;
  std::set<caf::actor_addr> unhashable;
  bool complete = true;
  for (const auto& row : st.models->index()) {
    if (row.version.empty() || out.count(row.name))
      continue;
    auto versions = st.models->versions(row.name);
    if (versions.empty())
      continue;
    const auto& newest = versions.back();
    // Generative models run in this process only (issue 34): no worker
    // serves them yet.
    if (newest->generative)
      continue;
    auto addr = newest->scheduler.address();
    if (st.unhashable.count(addr)) {
      unhashable.insert(addr);
      continue;
    }
    auto it = st.hashes.find(addr);
    if (it == st.hashes.end()) {
      complete = false;
      if (st.hashing.insert(addr).second) {
        auto dir = newest->files ? newest->files->path() : st.models->repository() / row.name;
        run_detached(self->system(), caf::actor_cast<caf::actor>(self),
                     [addr, name = row.name, dir, override = newest->config_override] {
                       auto hash = hash_model_dir(dir, override);
                       return caf::make_message(model_hashed_atom::value, addr, name,
                                                hash ? *hash : std::string(),
                                                hash ? std::string() : hash.error().message);
                     });
      }
      continue;
    }
    seen.insert(*it);
    out[row.name] = it->second.second;
  }
  st.hashes = std::move(seen); // forget the pipelines no longer served
  st.unhashable = std::move(unhashable);
  if (!complete)
    return std::nullopt;
  return out;
}

/// Gives every scheduler of `name` a proxy for each of the worker's executors of
/// the same version that it has not had yet.
void attach_model(self_ptr self, const std::string& key, const std::string& name) {
  auto& st = self->state;
  auto& w = st.workers.at(key);
  for (const auto& m : w.models) {
    if (m.name != name)
      continue;
    for (const auto& p : st.models->versions(m.name)) {
      if (p->version != m.version || p->generative)
        continue;
      for (const auto& e : m.executors) {
        if (!w.attached.emplace(p->scheduler.address(), e.address()).second)
          continue;
        remote_executor_config rc;
        rc.remote = e;
        rc.node = w.status.name;
        rc.model = m.name;
        rc.timeout = st.cfg.remote_timeout;
        rc.counters = w.status.counters;
        rc.bulk = w.bulk;
        rc.bulk_threshold = st.cfg.bulk_threshold;
        auto proxy = spawn_remote_executor(self->system(), std::move(rc));
        self->monitor(proxy);
        st.proxies.emplace(proxy.address(),
                           std::make_tuple(key, p->scheduler.address(), e.address()));
        self->send(p->scheduler, scheduler::add_executor_atom::value,
                   scheduler::executor_entry{proxy, st.cfg.credits, w.status.name});
      }
    }
  }
}

void attach(self_ptr self, const std::string& key);

/// Where a worker loads a model from when the server asks it to.
enum class load_source { shipped_files, worker_repository };

void send_load(self_ptr self, const std::string& key, model_shipment s, bool ship);

/// Asks the worker to load `name` (from the files shipped with the request, or
/// from its own repository), and attaches what it then serves when the hashes
/// agree. Shipped files are read on a detached actor first (files_read_atom).
void ask_load(self_ptr self, const std::string& key, const std::string& name,
              const std::string& hash, load_source source) {
  bool ship = source == load_source::shipped_files;
  auto& st = self->state;
  auto& w = st.workers.at(key);
  auto versions = st.models->versions(name);
  model_shipment s{name, hash, {}, versions.empty() ? "" : versions.back()->config_override};
  w.pending.insert(name);
  if (!ship) {
    send_load(self, key, std::move(s), false);
    return;
  }
  auto dir = !versions.empty() && versions.back()->files ? versions.back()->files->path()
                                                         : st.models->repository() / name;
  run_detached(self->system(), caf::actor_cast<caf::actor>(self),
               [key, handle = w.handle, dir, max = st.cfg.max_ship_bytes,
                s = std::move(s)]() mutable {
                 auto files = read_model_files(dir, max);
                 if (files)
                   s.files = std::move(*files);
                 return caf::make_message(files_read_atom::value, key, handle, std::move(s),
                                          files ? std::string() : files.error().message);
               });
}

/// The load request itself, once any files to ship are read.
void send_load(self_ptr self, const std::string& key, model_shipment s, bool ship) {
  auto& st = self->state;
  auto& w = st.workers.at(key);
  auto name = s.name, hash = s.hash;
  std::cout << "worker " << w.status.name << ": " << (ship ? "shipping" : "reloading")
            << " model " << name << std::endl;
  auto handle = w.handle;
  auto timeout = std::chrono::duration_cast<caf::timespan>(st.cfg.load_timeout);
  self->request(handle, timeout, load_model_atom::value, std::move(s))
    .then(
      [self, key, name, hash, handle](std::vector<worker_model>& loaded) {
        auto& w = self->state.workers.at(key);
        if (w.handle != handle)
          return; // an answer on a connection since lost
        w.pending.erase(name);
        w.tried[name] = hash;
        w.load_errors.erase(name);
        w.models.erase(std::remove_if(w.models.begin(), w.models.end(),
                                      [&](const worker_model& m) { return m.name == name; }),
                       w.models.end());
        w.models.insert(w.models.end(), loaded.begin(), loaded.end());
        attach(self, key);
      },
      [self, key, name, hash, handle](caf::error& e) {
        auto& w = self->state.workers.at(key);
        if (w.handle != handle)
          return;
        w.pending.erase(name);
        w.tried[name] = hash;
        w.load_errors[name] = "load failed on the worker: " + self->system().render(e);
        attach(self, key);
      });
}

/// Brings the worker's models in line with the server's (model_sync.hpp) and
/// gives the schedulers the executors of every model both hold alike.
void attach(self_ptr self, const std::string& key) {
  auto& st = self->state;
  auto& w = st.workers.at(key);
  if (w.status.state != "ready" || !w.handle)
    return;
  auto served = served_hashes(self);
  if (!served)
    return; // again when the hash being computed arrives
  if (w.own_models_untried) {
    // A worker with a repository of its own has just loaded what is in it:
    // nothing to reload until the server loads a model anew.
    for (const auto& m : w.models)
      if (!m.shipped && served->count(m.name))
        w.tried[m.name] = (*served)[m.name];
    w.own_models_untried = false;
  }
  model_sync_input in;
  in.served = std::move(*served);
  for (const auto& m : w.models) {
    in.worker[m.name] = m.hash;
    if (m.shipped)
      in.shipped.insert(m.name);
  }
  in.placement = w.placement;
  in.accepts_files = w.accepts_files;
  in.own_repository = w.own_repository;
  in.tried = w.tried;
  in.pending = w.pending;
  auto plan = plan_model_sync(in);
  for (const auto& name : plan.attach)
    attach_model(self, key, name);
  for (const auto& name : plan.ship)
    ask_load(self, key, name, in.served[name], load_source::shipped_files);
  for (const auto& name : plan.reload)
    ask_load(self, key, name, in.served[name], load_source::worker_repository);
  for (const auto& name : plan.unload) {
    self->send(w.handle, unload_model_atom::value, name);
    w.models.erase(std::remove_if(w.models.begin(), w.models.end(),
                                  [&](const worker_model& m) { return m.name == name; }),
                   w.models.end());
    w.tried.erase(name);
    w.load_errors.erase(name);
  }
  std::vector<std::string> refused;
  for (const auto& [name, why] : plan.mismatched)
    refused.push_back(name + ": " + why);
  for (const auto& [name, why] : w.load_errors)
    if (in.served.count(name) && !plan.mismatched.count(name))
      refused.push_back(name + ": " + why);
  std::vector<std::string> models;
  for (const auto& m : w.models)
    if (!plan.mismatched.count(m.name))
      models.push_back(m.name + ":" + std::to_string(m.version));
  // Loads finish in any order (files are hashed and shipped on detached
  // actors): /v2 lists them sorted, so one state always reads the same.
  std::sort(models.begin(), models.end());
  if (refused != w.status.models_refused || models != w.status.models) {
    for (const auto& r : refused)
      if (std::find(w.status.models_refused.begin(), w.status.models_refused.end(), r)
          == w.status.models_refused.end())
        std::cerr << "worker " << w.status.name << " is kept out of model " << r << std::endl;
    w.status.models_refused = std::move(refused);
    w.status.models = std::move(models);
    publish(self, key);
  }
}

/// A greeted worker is ready, and gets its models, once every model the server
/// serves has its hash; until then it reads as connecting, as before greeting.
void become_ready(self_ptr self, const std::string& key) {
  auto& w = self->state.workers.at(key);
  if (!w.greeted || !w.handle || !served_hashes(self))
    return;
  w.greeted = false;
  set_state(self, key, "ready", "");
  attach(self, key);
}

/// Opens the bulk channel the worker announced in its greeting (it connects on
/// a thread of its own; until then, and if it cannot, batches take the CAF link).
void open_bulk(self_ptr self, const std::string& key, const worker_info& info) {
  auto& st = self->state;
  auto& w = st.workers.at(key);
  w.bulk.reset();
  if (st.cfg.bulk_threshold == 0 || info.bulk_port == 0
      || info.bulk_token.size() != bulk::token_bytes)
    return;
  // A dialled worker is reached where it was dialled; one that joined, at the
  // --address it announced.
  auto host = w.address ? w.address->host : info.bulk_host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    std::cerr << "worker " << info.name << " joined without an --address of its own: its "
              << "bulk channel cannot be reached, its batches stay on the CAF link" << std::endl;
    return;
  }
  auto generation = ++st.bulk_generations;
  w.bulk_generation = generation;
  auto me = caf::actor_cast<caf::actor>(self);
  bulk_client_config bc;
  bc.host = host;
  bc.port = info.bulk_port;
  bc.token = info.bulk_token;
  bc.worker = info.name;
  bc.limits = st.cfg.bulk;
  bc.on_lost = [me, key, generation](const std::string& why) {
    caf::anon_send(me, bulk_lost_atom::value, key, generation, why);
  };
  w.bulk = bulk_client::connect(self->system(), std::move(bc));
}

/// Proves the secret to the worker behind `handle` and, once it answers with its
/// models, attaches its executors.
void greet(self_ptr self, const std::string& key, caf::actor handle) {
  auto& st = self->state;
  auto timeout = std::chrono::duration_cast<caf::timespan>(st.cfg.request_timeout);
  st.workers.at(key).busy = true;
  auto fail = [self, key](const std::string& state, const std::string& why) {
    auto& w = self->state.workers.at(key);
    w.busy = false;
    w.handle = nullptr;
    set_state(self, key, state, why);
  };
  self->request(handle, timeout, challenge_atom::value)
    .then(
      [self, key, handle, timeout, fail](const std::string& nonce) {
        auto proof = prove(self->state.cfg.secret, "server", nonce);
        self->request(handle, timeout, hello_atom::value, proof)
          .then(
            [self, key, handle](worker_info& info) {
              auto& w = self->state.workers.at(key);
              w.busy = false;
              w.handle = handle;
              w.models = std::move(info.models);
              w.attached.clear();
              w.placement = std::move(info.placement);
              w.accepts_files = info.accepts_files;
              w.pending.clear();
              w.load_errors.clear();
              w.tried.clear();
              w.own_repository = info.own_repository;
              w.own_models_untried = info.own_repository; // marked in attach()
              w.status.name = info.name;
              w.status.models.clear();
              w.status.models_refused.clear();
              self->monitor(handle);
              open_bulk(self, key, info);
              w.greeted = true;
              become_ready(self, key);
            },
            [self, fail](caf::error& e) {
              bool refused = e.category() == cluster_error_category;
              fail(refused ? "refused" : "lost",
                   refused ? "the worker refused this server: wrong cluster secret?"
                           : self->system().render(e));
            });
      },
      [self, fail](caf::error& e) { fail("lost", self->system().render(e)); });
}

void connect(self_ptr self, const std::string& key) {
  auto& w = self->state.workers.at(key);
  if (w.busy || !w.address)
    return;
  w.busy = true;
  auto timeout = std::chrono::duration_cast<caf::timespan>(self->state.cfg.request_timeout);
  auto mm = link_manager(self->system());
  self->request(mm, timeout, caf::connect_atom::value, w.address->host, w.address->port)
    .then(
      [self, key](const caf::node_id&, caf::strong_actor_ptr& ptr,
                  const std::set<std::string>&) {
        auto& w = self->state.workers.at(key);
        if (!ptr) {
          w.busy = false;
          set_state(self, key, "lost", "no actor is published at " + w.status.address);
          return;
        }
        greet(self, key, caf::actor_cast<caf::actor>(ptr));
      },
      [self, key](caf::error& e) {
        auto& w = self->state.workers.at(key);
        w.busy = false;
        set_state(self, key, w.status.state == "connecting" ? "connecting" : "lost",
                  "cannot connect: " + self->system().render(e));
      });
}

} // namespace

node_registry start_registry(caf::actor_system& sys, server::model_directory& models,
                             registry_config config) {
  node_registry out;
  out.status = std::make_shared<cluster_status>();
  out.actor = sys.spawn([cfg = std::move(config), &models, status = out.status](
                          self_ptr self) mutable -> caf::behavior {
    auto& st = self->state;
    st.cfg = std::move(cfg);
    st.models = &models;
    st.status = status;
    served_hashes(self); // hashed meanwhile, before the first worker greets
    for (const auto& hp : st.cfg.workers) {
      auto key = hp.host + ":" + std::to_string(hp.port);
      worker_record w;
      w.address = hp;
      w.status.name = key;
      w.status.address = key;
      w.status.state = "connecting";
      w.status.counters = std::make_shared<node_counters>();
      st.workers.emplace(key, std::move(w));
      publish(self, key);
      connect(self, key);
    }
    self->set_down_handler([self](caf::down_msg& dm) {
      auto& st = self->state;
      if (auto it = st.proxies.find(dm.source); it != st.proxies.end()) {
        auto [key, scheduler, executor] = it->second;
        st.proxies.erase(it);
        if (auto w = st.workers.find(key); w != st.workers.end() && w->second.handle)
          w->second.attached.erase({scheduler, executor});
        return;
      }
      for (auto& [key, w] : self->state.workers) {
        if (w.regreet && w.regreet.address() == dm.source)
          w.regreet = nullptr;
        if (w.handle && w.handle.address() == dm.source) {
          w.handle = nullptr;
          w.bulk.reset();
          w.attached.clear();
          set_state(self, key, "lost", "node down: " + self->system().render(dm.reason));
        }
      }
    });
    self->send(self, sync_atom::value);
    return {
      [self](model_hashed_atom, const caf::actor_addr& addr, const std::string& name,
             const std::string& hash, const std::string& error) {
        auto& st = self->state;
        st.hashing.erase(addr);
        auto versions = st.models->versions(name);
        if (versions.empty() || versions.back()->scheduler.address() != addr)
          return; // reloaded or unloaded meanwhile
        if (!error.empty()) {
          std::cerr << "caf-serving: model '" << name << "' is not served by workers: its "
                    << "files cannot be hashed (" << error << ")" << std::endl;
          st.unhashable.insert(addr);
        } else {
          st.hashes[addr] = {name, hash};
        }
        for (auto& [key, w] : st.workers) {
          if (w.greeted)
            become_ready(self, key);
          else if (w.handle)
            attach(self, key);
        }
      },
      [self](files_read_atom, const std::string& key, const caf::actor& handle,
             model_shipment& s, const std::string& error) {
        auto& st = self->state;
        auto it = st.workers.find(key);
        if (it == st.workers.end() || it->second.handle != handle)
          return; // a connection since lost: its greeting cleared the pending load
        auto& w = it->second;
        if (!error.empty()) {
          w.pending.erase(s.name);
          w.tried[s.name] = s.hash;
          w.load_errors[s.name] = "not shipped: " + error;
          return;
        }
        send_load(self, key, std::move(s), true);
      },
      [self](sync_atom) {
        auto& st = self->state;
        for (auto& [key, w] : st.workers) {
          if (!w.handle && !w.busy && w.address) {
            connect(self, key);
          } else if (!w.handle && !w.busy && w.regreet) {
            auto handle = std::move(w.regreet);
            w.regreet = nullptr;
            greet(self, key, handle);
          }
          else if (w.handle)
            attach(self, key);
        }
        self->delayed_send(self, st.cfg.sync_interval, sync_atom::value);
      },
      // A worker's bulk channel broke (bulk_channel.hpp): the worker is lost as
      // when its CAF link drops. Its proxies fail their batches back to the
      // schedulers, which run them elsewhere; then it is connected (or greeted)
      // again, with a new token.
      [self](bulk_lost_atom, const std::string& key, uint64_t generation,
             const std::string& why) {
        auto& st = self->state;
        auto it = st.workers.find(key);
        if (it == st.workers.end() || it->second.bulk_generation != generation
            || !it->second.handle)
          return;
        auto& w = it->second;
        for (const auto& [proxy, where] : st.proxies)
          if (std::get<0>(where) == key)
            if (auto p = caf::actor_cast<caf::actor>(proxy))
              caf::anon_send(p, bulk_lost_atom::value, why);
        if (!w.address)
          w.regreet = w.handle;
        w.handle = nullptr;
        w.attached.clear();
        w.bulk.reset();
        set_state(self, key, "lost", "its bulk channel broke: " + why);
      },
      [self](challenge_atom) -> std::string {
        auto nonce = make_nonce();
        if (auto sender = self->current_sender())
          self->state.nonces[sender->node()] = nonce;
        return nonce;
      },
      [self](join_atom, const std::string& proof, caf::actor worker,
             const std::string& name) -> caf::result<std::string> {
        auto& st = self->state;
        auto sender = self->current_sender();
        auto node = sender ? sender->node() : caf::node_id{};
        auto it = st.nonces.find(node);
        bool ok = sender && worker && it != st.nonces.end()
                  && verify(st.cfg.secret, "worker", it->second, proof);
        if (it != st.nonces.end())
          st.nonces.erase(it);
        if (!ok) {
          std::cerr << "caf-serving: refused a worker from node " << to_string(node)
                    << " that wanted to join: it did not prove the cluster secret" << std::endl;
          return make_cluster_error(cluster_errc::refused,
                                    "server refused the join: wrong cluster secret");
        }
        // Keyed by the worker's name, not its node: a worker that joins again
        // (restarted, so with a new node id) takes its old row back.
        auto key = "joined:" + (name.empty() ? to_string(node) : name);
        auto& w = st.workers[key];
        if (w.handle && w.handle.node() != node) {
          std::cerr << "caf-serving: refused a worker named '" << name << "' from node "
                    << to_string(node) << ": a worker of that name is connected from node "
                    << to_string(w.handle.node()) << "; give each worker its own --name"
                    << std::endl;
          return make_cluster_error(cluster_errc::refused,
                                    "a worker named '" + name
                                      + "' is already connected to this server; give each "
                                        "worker its own --name");
        }
        if (w.busy)
          return make_cluster_error(cluster_errc::refused,
                                    "worker '" + name + "' is being greeted; join again");
        // A new row shows its key until the greeting completes (and names it).
        if (w.status.name.empty())
          w.status.name = key;
        w.status.address = "joined from node " + to_string(node);
        w.status.state = "connecting";
        if (!w.status.counters)
          w.status.counters = std::make_shared<node_counters>();
        publish(self, key);
        greet(self, key, worker);
        return st.cfg.server_name;
      },
    };
  });
  models.set_cluster_view({[s = out.status] { return s->json(); },
                           [s = out.status] { return s->prometheus(); }});
  return out;
}

} // namespace caf_serving::cluster
