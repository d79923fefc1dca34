#include "cluster/tls.hpp"

#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <dlfcn.h>

#include <fstream>
#include <memory>

namespace caf_serving::cluster {

const char* tls_usage_text =
  "  --tls-certificate F        TLS on every cluster link: this node's PEM certificate\n"
  "                             (chain), signed by the --tls-ca; needs --tls-key and\n"
  "                             --tls-ca; peers must show a certificate of that CA\n"
  "  --tls-key F                the certificate's PEM private key\n"
  "  --tls-ca F                 PEM file of the CA that signs every node's certificate\n"
  "  --tls-passphrase-file F    first line: the passphrase of an encrypted --tls-key\n";

bool parse_tls_flag(const std::string& flag, const std::string& value, tls_config& tls) {
  if (flag == "--tls-certificate")
    tls.certificate = value;
  else if (flag == "--tls-key")
    tls.key = value;
  else if (flag == "--tls-ca")
    tls.ca = value;
  else if (flag == "--tls-passphrase-file")
    tls.passphrase_file = value;
  else
    return false;
  return true;
}

namespace {

std::string ssl_errors() {
  std::string out;
  while (auto e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out += out.empty() ? "" : "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

int passphrase_cb(char* buf, int size, int, void* user) {
  const auto* pass = static_cast<const std::string*>(user);
  auto n = std::min<size_t>(pass->size(), static_cast<size_t>(size));
  std::copy_n(pass->data(), n, buf);
  return static_cast<int>(n);
}

} // namespace

result<tls_config> check_tls_files(tls_config tls) {
  if (!tls.enabled())
    return tls;
  if (tls.certificate.empty() || tls.key.empty() || tls.ca.empty())
    return bad_request("TLS needs all three of --tls-certificate, --tls-key and --tls-ca "
                       "(the node's certificate, its key, and the CA that signs every "
                       "node's certificate); docs/cluster.md shows how to make them");
  if (!tls.passphrase_file.empty()) {
    std::ifstream in(tls.passphrase_file);
    if (!in || !std::getline(in, tls.passphrase) || tls.passphrase.empty())
      return bad_request("--tls-passphrase-file " + tls.passphrase_file
                         + ": cannot read a passphrase from its first line");
  }
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()),
                                                         SSL_CTX_free);
  if (!ctx)
    return bad_request("cannot create an OpenSSL context: " + ssl_errors());
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), tls.certificate.c_str()) != 1)
    return bad_request("--tls-certificate " + tls.certificate
                       + ": not a readable PEM certificate (" + ssl_errors() + ")");
  SSL_CTX_set_default_passwd_cb(ctx.get(), passphrase_cb);
  SSL_CTX_set_default_passwd_cb_userdata(ctx.get(), &tls.passphrase);
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), tls.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return bad_request("--tls-key " + tls.key
                       + ": not the PEM private key of --tls-certificate, or an encrypted "
                         "key without the right --tls-passphrase-file ("
                       + ssl_errors() + ")");
  if (SSL_CTX_check_private_key(ctx.get()) != 1)
    return bad_request("--tls-key " + tls.key + " is not the key of --tls-certificate "
                       + tls.certificate + " (" + ssl_errors() + ")");
  if (SSL_CTX_load_verify_locations(ctx.get(), tls.ca.c_str(), nullptr) != 1)
    return bad_request("--tls-ca " + tls.ca + ": not a readable PEM CA certificate ("
                       + ssl_errors() + ")");
  return tls;
}

void configure_tls(caf::actor_system_config& cfg, const tls_config& tls) {
  if (!tls.enabled())
    return;
  cfg.openssl_certificate = tls.certificate;
  cfg.openssl_key = tls.key;
  cfg.openssl_cafile = tls.ca;
  cfg.openssl_passphrase = tls.passphrase;
  cfg.load<caf::openssl::manager>();
}

caf::io::middleman_actor link_manager(caf::actor_system& sys) {
  if (sys.has_openssl_manager())
    return sys.openssl_manager().actor_handle();
  return sys.middleman().actor_handle();
}

caf::expected<uint16_t> publish_link(caf::actor_system& sys, const caf::actor& whom,
                                     uint16_t port, const char* address, bool reuse) {
  if (sys.has_openssl_manager())
    return caf::openssl::publish(whom, port, address, reuse);
  return caf::io::publish(whom, port, address, reuse);
}

} // namespace caf_serving::cluster

// -- CAF 0.17's OpenSSL error queue --------------------------------------------------
//
// OpenSSL keeps one error queue per thread, and SSL_get_error() answers
// SSL_ERROR_SSL whenever that queue is not empty, whatever the call before it
// did. CAF's sessions all run on the middleman's one multiplexer thread, and CAF
// drains the queue only inside its log macros, which release builds compile out.
// So one failed handshake (a peer with a certificate of another CA, or a peer
// without TLS) leaves its errors in the queue, and the next SSL_read of every
// healthy link on that thread reads as a failure: the server dropped all its
// workers when one stranger knocked (seen in cluster_it.tls.test). OpenSSL's rule
// is to clear the queue before each I/O call; CAF does not, so these definitions
// in the executable take the place of libssl's for libcaf_openssl (the dynamic
// linker binds the executable's symbols first) and clear it before calling the
// real function.

namespace {

template <class Fn>
Fn real_ssl_function(const char* name) {
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
  if (!fn)
    std::abort(); // libssl is linked: cannot happen
  return fn;
}

} // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static auto real = real_ssl_function<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto real = real_ssl_function<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static auto real = real_ssl_function<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

int SSL_connect(SSL* ssl) {
  static auto real = real_ssl_function<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

} // extern "C"
