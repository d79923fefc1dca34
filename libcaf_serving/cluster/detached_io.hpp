#pragma once
/// File work of whole models (hashing a directory, reading one to ship it,
/// writing one shipped here) off CAF's shared workers: those also keep the
/// batching timers (core/timed_sharing.hpp), and on 2 cores one of them
/// busy hashing 200 MB stalls every batching delay of the process. The work
/// runs on a detached actor of its own thread, which sends what it returns to
/// the actor that asked and ends.
///
///     run_detached(self->system(), caf::actor_cast<caf::actor>(self), [dir] {
///       auto h = hash_model_dir(dir);
///       return caf::make_message(hashed_atom::value, h ? *h : std::string());
///     });

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/message.hpp>

#include <utility>

namespace caf_serving::cluster {

/// Runs `work` (returning a caf::message) on a detached actor and sends the
/// message to `to`.
template <class Work>
void run_detached(caf::actor_system& sys, caf::actor to, Work work) {
  sys.spawn<caf::detached>([to = std::move(to), work = std::move(work)](
                             caf::event_based_actor* self) mutable {
    self->send(to, work());
  });
}

} // namespace caf_serving::cluster
