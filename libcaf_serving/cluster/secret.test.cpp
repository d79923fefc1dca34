#include "cluster/secret.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace caf_serving::cluster;

TEST_CASE("proof: HMAC-SHA256 of role|nonce, as openssl computes it") {
  // echo -n "server|abc" | openssl dgst -sha256 -hmac Jefe
  CHECK(prove("Jefe", "server", "abc")
        == "f23760e39a9eae7a3ad030ba2750845dc3a4aa279c42b140afa0620a7889fd4c");
}

TEST_CASE("verify: right secret passes; wrong secret, role or nonce fails") {
  auto nonce = make_nonce();
  CHECK(nonce.size() == 64);
  CHECK(make_nonce() != nonce);
  auto proof = prove("s3cret", "server", nonce);
  CHECK(verify("s3cret", "server", nonce, proof));
  CHECK_FALSE(verify("other", "server", nonce, proof));
  CHECK_FALSE(verify("s3cret", "worker", nonce, proof));
  CHECK_FALSE(verify("s3cret", "server", make_nonce(), proof));
  CHECK_FALSE(verify("s3cret", "server", nonce, proof.substr(1)));
  CHECK_FALSE(verify("s3cret", "server", "", prove("s3cret", "server", "")));
}

TEST_CASE("load_secret: file first, then environment, errors name the fix") {
  auto path = std::filesystem::temp_directory_path() / "caf_serving_secret_test.txt";
  { std::ofstream(path) << "from-file\n"; }
  unsetenv(secret_env);
  auto s = load_secret(path.string());
  REQUIRE(s);
  CHECK(*s == "from-file");
  setenv(secret_env, "from-env", 1);
  CHECK(*load_secret(std::nullopt) == "from-env");
  unsetenv(secret_env);
  auto none = load_secret(std::nullopt);
  REQUIRE_FALSE(none);
  CHECK(none.error().message.find("--cluster-secret-file") != std::string::npos);
  { std::ofstream(path) << "\n"; }
  CHECK_FALSE(load_secret(path.string()));
  std::filesystem::remove(path);
  CHECK_FALSE(load_secret(path.string()));
}
