#include "cluster/model_sync.hpp"

#include <algorithm>

namespace caf_serving::cluster {

namespace {

std::string short_hash(const std::string& h) {
  return h.substr(0, 12);
}

} // namespace

model_sync_plan plan_model_sync(const model_sync_input& in) {
  model_sync_plan out;
  auto placed = [&](const std::string& name) {
    return in.placement.empty()
           || std::find(in.placement.begin(), in.placement.end(), name) != in.placement.end();
  };
  for (const auto& [name, server_hash] : in.served) {
    if (!placed(name))
      continue;
    auto w = in.worker.find(name);
    if (w != in.worker.end() && w->second == server_hash) {
      out.attach.push_back(name);
      continue;
    }
    if (in.pending.count(name))
      continue;
    auto t = in.tried.find(name);
    if (t != in.tried.end() && t->second == server_hash) {
      if (w != in.worker.end())
        out.mismatched[name] = "the worker's copy differs from the server's (hash "
                               + short_hash(w->second) + " there, " + short_hash(server_hash)
                               + " here); update the worker's repository, or start it "
                                 "without one to have the files shipped";
      continue;
    }
    // A copy from the worker's own repository is reloaded from there; a model
    // it lacks, or holds from shipped files, is shipped (where it takes files).
    bool own_copy = w != in.worker.end() && in.own_repository && !in.shipped.count(name);
    bool ship = in.accepts_files && !own_copy;
    (ship ? out.ship : out.reload).push_back(name);
  }
  for (const auto& [name, hash] : in.worker)
    if (!in.served.count(name) && !in.pending.count(name))
      out.unload.push_back(name);
  return out;
}

} // namespace caf_serving::cluster
