#pragma once
/// The cluster's shared secret and the challenge-response that proves it.
///
/// Only servers that know the secret may use a worker, and only workers that know
/// it may join a server. The secret itself never crosses the network: the side
/// that is asked sends a fresh random nonce, the asking side answers with
/// HMAC-SHA256(secret, role + "|" + nonce) in hex, and the asked side compares in
/// constant time. The role ("server" or "worker") keeps a proof made for one
/// direction from being replayed in the other. The secret comes from a file or
/// from the environment, never from the command line (where `ps` shows it).

#include "core/error.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace caf_serving::cluster {

/// The environment variable that may hold the secret.
inline constexpr const char* secret_env = "CAF_SERVING_CLUSTER_SECRET";

/// Reads the secret from `file` when given (trailing newlines dropped), else from
/// CAF_SERVING_CLUSTER_SECRET. An error says which source was empty or unreadable.
result<std::string> load_secret(const std::optional<std::string>& file);

/// 32 random bytes from the OS, in hex.
std::string make_nonce();

/// HMAC-SHA256(secret, role + "|" + nonce), in hex.
std::string prove(std::string_view secret, std::string_view role, std::string_view nonce);

/// Whether `proof` is the proof of `secret` for `role` and `nonce` (constant time).
bool verify(std::string_view secret, std::string_view role, std::string_view nonce,
            std::string_view proof);

} // namespace caf_serving::cluster
