#include "ingress/response_cache.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <thread>

using namespace caf_serving;
using namespace caf_serving::ingress;

namespace {

infer_input input(std::string name, datatype dtype, std::vector<int64_t> shape,
                  std::string bytes) {
  infer_input in;
  in.name = std::move(name);
  in.dtype = dtype;
  in.shape = std::move(shape);
  in.owned = std::move(bytes);
  in.data = in.owned;
  return in;
}

/// A request with one FP32 input "x" of 4 elements whose bytes are `fill`.
infer_request request_of(char fill, std::vector<requested_output> outputs = {}) {
  infer_request r;
  r.inputs.push_back(input("x", datatype::fp32, {1, 4}, std::string(16, fill)));
  r.outputs = std::move(outputs);
  return r;
}

/// An answer with one output of `bytes` bytes, all `fill`.
cached_response answer_of(size_t bytes, char fill = 'a') {
  cached_response r;
  r.outputs.push_back({"y", datatype::uint8, {1, static_cast<int64_t>(bytes)},
                       std::string(bytes, fill)});
  return r;
}

std::shared_ptr<const void> new_owner() {
  return std::make_shared<int>(0);
}

/// The key of request_of(fill), owning its bytes (the request is gone after).
cache_key key_of(char fill, const std::shared_ptr<const void>& owner) {
  auto r = request_of(fill);
  auto k = cache_key::of(r, owner);
  k.own();
  return k;
}

} // namespace

TEST_CASE("hash_bytes: deterministic, seeded, and sensitive to every byte and the length") {
  std::string text(100, 'q');
  CHECK(hash_bytes(text, 1) == hash_bytes(text, 1));
  CHECK(hash_bytes(text, 1) != hash_bytes(text, 2));
  std::set<uint64_t> seen;
  for (size_t i = 0; i < text.size(); ++i) {
    auto flipped = text;
    flipped[i] ^= 1;
    seen.insert(hash_bytes(flipped, 1));
  }
  for (size_t n = 0; n <= text.size(); ++n)
    seen.insert(hash_bytes(std::string_view(text).substr(0, n), 1));
  CHECK(seen.size() == 2 * text.size() + 1);
}

TEST_CASE("cache keys: equal for the same inputs and outputs, in any input order") {
  auto owner = new_owner();
  infer_request a;
  a.inputs.push_back(input("x", datatype::int32, {1, 2}, std::string(8, '\1')));
  a.inputs.push_back(input("y", datatype::int32, {1, 2}, std::string(8, '\2')));
  a.id = "first";
  infer_request b = a;
  std::swap(b.inputs[0], b.inputs[1]);
  b.id = "second";         // the id is the request's, not the answer's
  b.priority = 2;          // nor do priority and timeout change the answer
  b.timeout_us = 1000;
  b.binary_data_output = true; // how the answer is written out is per request
  auto ka = cache_key::of(a, owner);
  auto kb = cache_key::of(b, owner);
  CHECK(ka.hash() == kb.hash());
  CHECK(ka == kb);

  SUBCASE("an owned key equals the viewed one and outlives the request") {
    auto owned = cache_key::of(a, owner);
    owned.own();
    a.inputs.clear(); // the views of `ka` dangle now; `owned` does not
    CHECK(owned == kb);
    auto moved = std::move(owned);
    CHECK(moved == kb);
  }
}

TEST_CASE("cache keys differ when anything that shapes the answer differs") {
  auto owner = new_owner();
  auto base = request_of('\1', {{"y", false, 0}});
  auto key = cache_key::of(base, owner);

  auto other_bytes = base;
  other_bytes.inputs[0].owned[15] = '\2';
  other_bytes.inputs[0].data = other_bytes.inputs[0].owned;
  CHECK(cache_key::of(other_bytes, owner) != key);

  auto other_dtype = base;
  other_dtype.inputs[0].dtype = datatype::int32; // same bytes, another meaning
  CHECK(cache_key::of(other_dtype, owner) != key);

  auto other_shape = base;
  other_shape.inputs[0].shape = {2, 2};
  CHECK(cache_key::of(other_shape, owner) != key);

  auto other_name = base;
  other_name.inputs[0].name = "z";
  CHECK(cache_key::of(other_name, owner) != key);

  auto all_outputs = base;
  all_outputs.outputs.clear();
  CHECK(cache_key::of(all_outputs, owner) != key);

  auto classified = base;
  classified.outputs[0].classification = 3;
  CHECK(cache_key::of(classified, owner) != key);

  auto binary = base;
  binary.outputs[0].binary = true; // written out per request: same answer
  CHECK(cache_key::of(binary, owner) == key);

  // Another pipeline (another model, version, or a reload) never shares answers.
  CHECK(cache_key::of(base, new_owner()) != key);
}

TEST_CASE("a hash collision never returns another request's answer") {
  auto owner = new_owner();
  response_cache cache({1 << 20});
  auto ka = key_of('a', owner);
  auto kb = key_of('b', owner);
  ka.force_hash_for_test(42);
  kb.force_hash_for_test(42);
  REQUIRE(cache.insert(ka, answer_of(8, 'A')));
  CHECK(cache.find(kb) == nullptr);
  REQUIRE(cache.insert(kb, answer_of(8, 'B')));
  CHECK(cache.current().entries == 2);
  REQUIRE(cache.find(ka) != nullptr);
  CHECK(cache.find(ka)->outputs[0].data == std::string(8, 'A'));
  REQUIRE(cache.find(kb) != nullptr);
  CHECK(cache.find(kb)->outputs[0].data == std::string(8, 'B'));
}

TEST_CASE("the cache holds at most max_bytes and evicts the least recently used first") {
  auto owner = new_owner();
  auto key = [&](char c) { return key_of(c, owner); };
  auto cost = response_cache::charge(key('a'), answer_of(100));
  // Room for exactly three entries of this size.
  response_cache cache({3 * cost});
  REQUIRE(cache.insert(key('a'), answer_of(100)));
  REQUIRE(cache.insert(key('b'), answer_of(100)));
  REQUIRE(cache.insert(key('c'), answer_of(100)));
  CHECK(cache.current().bytes == 3 * cost);
  CHECK(cache.current().evictions == 0);

  // 'a' is used, so 'b' is now the least recently used.
  REQUIRE(cache.find(key('a')) != nullptr);
  REQUIRE(cache.insert(key('d'), answer_of(100)));
  CHECK(cache.find(key('b')) == nullptr);
  CHECK(cache.find(key('a')) != nullptr);
  CHECK(cache.find(key('c')) != nullptr);
  CHECK(cache.find(key('d')) != nullptr);
  CHECK(cache.current().evictions == 1);
  CHECK(cache.current().bytes <= cache.current().max_bytes);

  // A larger answer makes room by evicting as many as it needs, oldest first
  // ('a', then 'c', after the finds above).
  REQUIRE(response_cache::charge(key('e'), answer_of(100 + cost)) == 2 * cost);
  REQUIRE(cache.insert(key('e'), answer_of(100 + cost)));
  CHECK(cache.find(key('a')) == nullptr);
  CHECK(cache.find(key('c')) == nullptr);
  CHECK(cache.find(key('d')) != nullptr);
  CHECK(cache.find(key('e')) != nullptr);
  CHECK(cache.current().bytes <= cache.current().max_bytes);
}

TEST_CASE("an answer larger than the whole cache is not cached and evicts nothing") {
  auto owner = new_owner();
  auto small = key_of('s', owner);
  auto big = key_of('b', owner);
  response_cache cache({4096});
  REQUIRE(cache.insert(small, answer_of(16)));
  CHECK_FALSE(cache.insert(big, answer_of(4096)));
  CHECK(cache.find(big) == nullptr);
  CHECK(cache.find(small) != nullptr);
  CHECK(cache.current().too_large == 1);
  CHECK(cache.current().entries == 1);
}

TEST_CASE("inserting a key already cached keeps one entry") {
  auto owner = new_owner();
  response_cache cache({1 << 20});
  auto k = key_of('a', owner);
  REQUIRE(cache.insert(k, answer_of(8, 'A')));
  REQUIRE(cache.insert(k, answer_of(8, 'B')));
  CHECK(cache.current().entries == 1);
  CHECK(cache.find(k)->outputs[0].data == std::string(8, 'A'));
}

TEST_CASE("cached answers come back as the outputs that went in") {
  std::string bytes = {'\x01', '\x00', '\x00', '\x00', 'z'};
  std::vector<output_view> outputs(2);
  outputs[0].name = "scores";
  outputs[0].dtype = datatype::fp32;
  outputs[0].shape = {1, 2};
  outputs[0].data = "abcdefgh";
  outputs[1].name = "label";
  outputs[1].dtype = datatype::bytes;
  outputs[1].shape = {1};
  outputs[1].data = bytes;
  auto copy = cached_response::copy_of(outputs);
  auto views = copy.views();
  REQUIRE(views.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(views[i].name == outputs[i].name);
    CHECK(views[i].dtype == outputs[i].dtype);
    CHECK(views[i].shape == outputs[i].shape);
    CHECK(views[i].data == outputs[i].data);
    CHECK(views[i].data.data() != outputs[i].data.data()); // a copy, not a view
  }
}

TEST_CASE("many threads finding and inserting keep the byte bound") {
  auto owner = new_owner();
  auto cost = response_cache::charge(key_of('a', owner), answer_of(64));
  response_cache cache({8 * cost});
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        char c = static_cast<char>('a' + (i * 7 + t) % 16);
        auto request = request_of(c); // viewed by k, as in the server
        auto k = cache_key::of(request, owner);
        if (auto hit = cache.find(k)) {
          if (hit->outputs[0].data != std::string(64, c))
            ++wrong;
        } else {
          cache.insert(k, answer_of(64, c));
        }
      }
    });
  for (auto& t : threads)
    t.join();
  CHECK(wrong == 0);
  CHECK(cache.current().bytes <= 8 * cost);
  CHECK(cache.current().entries <= 8);
}

TEST_CASE("a key larger than the cache is not admitted, so a miss need not copy it") {
  auto owner = new_owner();
  infer_request big;
  big.inputs.push_back(input("x", datatype::uint8, {1, 5000}, std::string(5000, 'x')));
  response_cache cache({4096});
  CHECK_FALSE(cache.admits(cache_key::of(big, owner)));
  CHECK(cache.admits(key_of('a', owner)));
  CHECK(cache.current().too_large == 1);
}

TEST_CASE("the cache's size and evictions are on /metrics") {
  auto owner = new_owner();
  auto cost = response_cache::charge(key_of('a', owner), answer_of(10));
  response_cache cache({cost});
  REQUIRE(cache.insert(key_of('a', owner), answer_of(10)));
  REQUIRE(cache.insert(key_of('b', owner), answer_of(10)));
  auto text = cache.prometheus();
  CHECK(text.find("\ncaf_serving_cache_entries 1\n") != std::string::npos);
  CHECK(text.find("\ncaf_serving_cache_bytes " + std::to_string(cost) + "\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_cache_max_bytes " + std::to_string(cost) + "\n")
        != std::string::npos);
  CHECK(text.find("\ncaf_serving_cache_evictions 1\n") != std::string::npos);
  CHECK(text.find("# TYPE caf_serving_cache_too_large counter\n") != std::string::npos);
}
