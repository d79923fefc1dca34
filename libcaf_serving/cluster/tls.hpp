#pragma once
/// TLS on the links between a server and its workers, through CAF 0.17's OpenSSL
/// module (libcaf_openssl). With a certificate, its key and a CA, every link a
/// node opens or accepts (publish, connect, join) is TLS, and both ends must show
/// a certificate signed by that CA (CAF sets SSL_VERIFY_PEER and
/// SSL_VERIFY_FAIL_IF_NO_PEER_CERT on both sides). The shared-secret handshake
/// (secret.hpp) runs inside the encrypted link as before.
///
/// Pitfalls of CAF 0.17's module, which is why this file exists:
/// - CAF loads the certificate, key and CA anew for every connection, inside its
///   multiplexer thread, and throws there when one cannot be read: the process
///   dies on its first link. check_tls_files() loads them once at start-up so a
///   bad path or a wrong passphrase is a clear start-up error instead.
/// - The module does not replace the middleman: plain `io::publish` and the
///   middleman actor's `connect` keep working beside it, in clear text. Every
///   link must go through link_manager()/publish_link() to be TLS.
/// - Peers are verified against the CA only; CAF checks no host name.

#include "core/error.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman_actor.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace caf_serving::cluster {

/// --tls-certificate, --tls-key, --tls-ca, --tls-passphrase-file (both binaries).
struct tls_config {
  /// PEM certificate chain of this node, signed by `ca`.
  std::string certificate;
  /// PEM private key of `certificate`.
  std::string key;
  /// PEM file of the CA(s) that peers' certificates must be signed by.
  std::string ca;
  /// File whose first line is the key's passphrase (for an encrypted key).
  std::string passphrase_file;
  /// Read from passphrase_file by check_tls_files().
  std::string passphrase;

  bool enabled() const {
    return !certificate.empty() || !key.empty() || !ca.empty() || !passphrase_file.empty();
  }
};

/// Whether `flag` is one of the TLS flags; if so, stores `value` in `tls`.
bool parse_tls_flag(const std::string& flag, const std::string& value, tls_config& tls);

/// The TLS flags' lines for --help.
extern const char* tls_usage_text;

/// Loads the certificate, the key (with the passphrase) and the CA once, checks that
/// the key matches the certificate, and reads the passphrase file. The error says
/// which file and what to do. Does nothing when TLS is off.
result<tls_config> check_tls_files(tls_config tls);

/// Loads CAF's OpenSSL module with `tls`'s files (after configure_actor_system, which
/// loads the middleman). Does nothing when TLS is off.
void configure_tls(caf::actor_system_config& cfg, const tls_config& tls);

/// The actor that opens links: the OpenSSL module's when it is loaded, else the
/// middleman's. Answers connect_atom like the middleman actor.
caf::io::middleman_actor link_manager(caf::actor_system& sys);

/// Publishes `whom` on `port` over TLS when the OpenSSL module is loaded, else in
/// clear text.
caf::expected<uint16_t> publish_link(caf::actor_system& sys, const caf::actor& whom,
                                     uint16_t port, const char* address, bool reuse);

} // namespace caf_serving::cluster
