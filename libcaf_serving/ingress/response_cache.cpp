#include "ingress/response_cache.hpp"

#include <algorithm>
#include <cstring>

namespace caf_serving::ingress {

// -- hashing ------------------------------------------------------------------

namespace {

constexpr uint64_t prime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t prime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t prime3 = 0x165667B19E3779F9ULL;

uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

uint64_t load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// The two halves of the 128-bit product, folded: every bit of both factors
/// reaches the result (unless one factor is zero; collisions are harmless here).
uint64_t fold(uint64_t x, uint64_t y) {
  auto product = static_cast<unsigned __int128>(x) * y;
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

/// Spreads every input bit over the whole result.
uint64_t finalize(uint64_t h) {
  h ^= h >> 33;
  h *= prime2;
  h ^= h >> 29;
  h *= prime3;
  h ^= h >> 32;
  return h;
}

// -- key encoding --------------------------------------------------------------

template <class T>
void append_raw(std::string& out, T value) {
  char buf[sizeof(T)];
  std::memcpy(buf, &value, sizeof(T));
  out.append(buf, sizeof(T));
}

void append_text(std::string& out, std::string_view text) {
  append_raw(out, static_cast<uint32_t>(text.size()));
  out.append(text);
}

} // namespace

uint64_t hash_bytes(std::string_view bytes, uint64_t seed) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  uint64_t a = seed ^ prime1;
  if (n >= 48) {
    // Three independent lanes, each folding 16 bytes into its state with one
    // 64x64->128-bit multiply: about 10 bytes per cycle, twice what a
    // multiply per 8 bytes gives.
    uint64_t b = a, c = a;
    for (; n >= 48; p += 48, n -= 48) {
      a = fold(load64(p) ^ prime2, load64(p + 8) ^ a);
      b = fold(load64(p + 16) ^ prime3, load64(p + 24) ^ b);
      c = fold(load64(p + 32) ^ prime1, load64(p + 40) ^ c);
    }
    a ^= b ^ rotl(c, 29);
  }
  for (; n >= 16; p += 16, n -= 16)
    a = fold(load64(p) ^ prime2, load64(p + 8) ^ a);
  uint64_t tail[2] = {0, 0};
  std::memcpy(tail, p, n);
  a = fold(tail[0] ^ prime3, tail[1] ^ a);
  return finalize(a ^ bytes.size());
}

// -- cache_key -------------------------------------------------------------------

cache_key cache_key::of(const infer_request& request, const std::shared_ptr<const void>& owner) {
  cache_key key;
  key.owner_ = owner;
  // Inputs by name: the order a client lists them in does not change the result.
  std::vector<const infer_input*> inputs;
  inputs.reserve(request.inputs.size());
  for (const auto& in : request.inputs)
    inputs.push_back(&in);
  std::sort(inputs.begin(), inputs.end(),
            [](const infer_input* a, const infer_input* b) { return a->name < b->name; });
  auto& h = key.header_;
  append_raw(h, static_cast<uint32_t>(inputs.size()));
  for (const auto* in : inputs) {
    append_text(h, in->name);
    append_raw(h, static_cast<uint8_t>(in->dtype));
    append_raw(h, static_cast<uint32_t>(in->shape.size()));
    for (auto d : in->shape)
      append_raw(h, d);
    append_raw(h, static_cast<uint64_t>(in->data.size()));
    key.data_.push_back(in->data);
    key.data_bytes_ += in->data.size();
  }
  // Outputs in the request's order, which is the response's order.
  append_raw(h, static_cast<uint32_t>(request.outputs.size()));
  for (const auto& out : request.outputs) {
    append_text(h, out.name);
    append_raw(h, out.classification);
  }
  uint64_t hash = hash_bytes(h, reinterpret_cast<uintptr_t>(owner.get()));
  for (auto piece : key.data_)
    hash = hash_bytes(piece, hash);
  key.hash_ = hash;
  return key;
}

void cache_key::own() {
  if (owned_ && data_.size() == 1 && data_[0].data() == owned_->data())
    return;
  auto bytes = std::make_shared<std::string>();
  bytes->reserve(data_bytes_);
  for (auto piece : data_)
    bytes->append(piece);
  data_.assign(1, std::string_view(*bytes));
  owned_ = std::move(bytes);
}

bool cache_key::operator==(const cache_key& other) const {
  if (hash_ != other.hash_ || data_bytes_ != other.data_bytes_ || header_ != other.header_)
    return false;
  if (owner_.owner_before(other.owner_) || other.owner_.owner_before(owner_))
    return false;
  // The same bytes, however each side is cut into pieces.
  size_t i = 0, j = 0, at_i = 0, at_j = 0;
  while (i < data_.size() && j < other.data_.size()) {
    auto a = data_[i].substr(at_i);
    auto b = other.data_[j].substr(at_j);
    size_t n = std::min(a.size(), b.size());
    if (n > 0 && std::memcmp(a.data(), b.data(), n) != 0)
      return false;
    at_i += n;
    at_j += n;
    if (at_i == data_[i].size()) {
      ++i;
      at_i = 0;
    }
    if (at_j == other.data_[j].size()) {
      ++j;
      at_j = 0;
    }
  }
  return true;
}

// -- cached_response -------------------------------------------------------------

cached_response cached_response::copy_of(const std::vector<output_view>& outputs) {
  cached_response r;
  r.outputs.reserve(outputs.size());
  for (const auto& o : outputs)
    r.outputs.push_back({std::string(o.name), o.dtype, o.shape, std::string(o.data)});
  return r;
}

std::vector<output_view> cached_response::views() const {
  std::vector<output_view> out;
  out.reserve(outputs.size());
  for (const auto& o : outputs) {
    output_view v;
    v.name = o.name;
    v.dtype = o.dtype;
    v.shape = o.shape;
    v.data = o.data;
    out.push_back(std::move(v));
  }
  return out;
}

size_t cached_response::size() const {
  size_t n = 0;
  for (const auto& o : outputs)
    n += sizeof(cached_output) + o.name.size() + o.shape.size() * sizeof(int64_t) + o.data.size();
  return n;
}

// -- response_cache --------------------------------------------------------------

response_cache::response_cache(response_cache_config cfg) : cfg_(cfg) {}

size_t response_cache::charge(const cache_key& key, const cached_response& value) {
  return key.size() + value.size() + entry_overhead_bytes;
}

void response_cache::touch(const entry* e) {
  auto [from, to] = index_.equal_range(e->key.hash());
  for (auto it = from; it != to; ++it)
    if (it->second->get() == e) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return;
    }
}

std::shared_ptr<const cached_response> response_cache::find(const cache_key& key) {
  // Entries with the same hash, taken under the lock; compared (every byte)
  // outside it. Almost always zero or one.
  std::vector<std::shared_ptr<const entry>> candidates;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [from, to] = index_.equal_range(key.hash());
    for (auto it = from; it != to; ++it)
      candidates.push_back(*it->second);
  }
  for (const auto& c : candidates)
    if (c->key == key) {
      std::lock_guard<std::mutex> lock(mutex_);
      touch(c.get()); // evicted meanwhile: the answer is still right
      return c->value;
    }
  return nullptr;
}

bool response_cache::insert(cache_key key, cached_response value) {
  key.own();
  size_t cost = charge(key, value);
  if (cost > cfg_.max_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++too_large_;
    return false;
  }
  // Two identical requests that missed at once: the first answer stays. (Two
  // inserting at the very same moment may both get in; the spare copy is the
  // first to be evicted.)
  if (find(key))
    return true;
  auto e = std::make_shared<entry>();
  e->charge = cost;
  e->value = std::make_shared<const cached_response>(std::move(value));
  e->key = std::move(key);
  uint64_t hash = e->key.hash();
  // Freed after the lock is released: releasing large buffers takes a while.
  std::vector<std::shared_ptr<const entry>> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (bytes_ + cost > cfg_.max_bytes && !lru_.empty()) {
      auto victim = std::prev(lru_.end());
      auto [from, to] = index_.equal_range((*victim)->key.hash());
      for (auto it = from; it != to; ++it)
        if (it->second == victim) {
          index_.erase(it);
          break;
        }
      bytes_ -= (*victim)->charge;
      evicted.push_back(std::move(*victim));
      lru_.erase(victim);
      ++evictions_;
    }
    lru_.push_front(std::move(e));
    index_.emplace(hash, lru_.begin());
    bytes_ += cost;
  }
  return true;
}

bool response_cache::admits(const cache_key& key) {
  if (key.size() + entry_overhead_bytes <= cfg_.max_bytes)
    return true;
  std::lock_guard<std::mutex> lock(mutex_);
  ++too_large_;
  return false;
}

response_cache::usage response_cache::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  usage u;
  u.entries = lru_.size();
  u.bytes = bytes_;
  u.max_bytes = cfg_.max_bytes;
  u.evictions = evictions_;
  u.too_large = too_large_;
  return u;
}

std::string response_cache::prometheus() const {
  auto u = current();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, uint64_t value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n"
           + name + " " + std::to_string(value) + "\n";
  };
  metric("caf_serving_cache_entries", "gauge", "Answers held by the response cache", u.entries);
  metric("caf_serving_cache_bytes", "gauge",
         "Bytes the response cache holds (keys, answers, bookkeeping)", u.bytes);
  metric("caf_serving_cache_max_bytes", "gauge", "The response cache's bound (--cache-config)",
         u.max_bytes);
  metric("caf_serving_cache_evictions", "counter",
         "Answers dropped from the response cache to make room", u.evictions);
  metric("caf_serving_cache_too_large", "counter",
         "Answers not cached because they alone exceed the cache's bound", u.too_large);
  return out;
}

} // namespace caf_serving::ingress
