#include "cluster/secret.hpp"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace caf_serving::cluster {

namespace {

std::string to_hex(const unsigned char* data, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

serving_error secret_error(const std::string& what) {
  return {status_code::bad_request, what};
}

} // namespace

result<std::string> load_secret(const std::optional<std::string>& file) {
  std::string secret;
  if (file) {
    std::ifstream in(*file);
    if (!in)
      return secret_error("cannot read the cluster secret file '" + *file
                          + "'; create it (e.g. head -c 32 /dev/urandom | base64 > FILE; "
                            "chmod 600 FILE) or check the path");
    std::stringstream ss;
    ss << in.rdbuf();
    secret = ss.str();
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r'))
      secret.pop_back();
    if (secret.empty())
      return secret_error("the cluster secret file '" + *file + "' is empty; put the secret in it");
    return secret;
  }
  if (const char* env = std::getenv(secret_env); env && *env)
    return std::string(env);
  return secret_error(std::string("no cluster secret: give --cluster-secret-file FILE or set ")
                      + secret_env + "; every server and worker of a cluster needs the same one");
}

std::string make_nonce() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1)
    throw std::runtime_error("the OS random generator failed (RAND_bytes)");
  return to_hex(bytes, sizeof(bytes));
}

std::string prove(std::string_view secret, std::string_view role, std::string_view nonce) {
  std::string text(role);
  text += '|';
  text += nonce;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac, &len);
  return to_hex(mac, len);
}

bool verify(std::string_view secret, std::string_view role, std::string_view nonce,
            std::string_view proof) {
  auto expected = prove(secret, role, nonce);
  if (nonce.empty() || proof.size() != expected.size())
    return false;
  return CRYPTO_memcmp(expected.data(), proof.data(), expected.size()) == 0;
}

} // namespace caf_serving::cluster
