#include "cuda/gpu_options.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;
using namespace caf_serving::cuda;

namespace {

model_config gpu_model(int max_batch) {
  model_config c;
  c.name = "m";
  c.max_batch_size = max_batch;
  c.instance_groups.push_back({"g", 1, instance_kind::gpu, {}});
  return c;
}

} // namespace

TEST_CASE("default buckets are powers of two up to max_batch_size, plus max_batch_size") {
  CHECK(default_buckets(gpu_model(8)) == std::vector<uint32_t>{1, 2, 4, 8});
  CHECK(default_buckets(gpu_model(12)) == std::vector<uint32_t>{1, 2, 4, 8, 12});
  CHECK(default_buckets(gpu_model(1)) == std::vector<uint32_t>{1});
  CHECK(default_buckets(gpu_model(0)) == std::vector<uint32_t>{1});
}

TEST_CASE("preferred batch sizes are the buckets, plus max_batch_size") {
  auto c = gpu_model(32);
  c.dynamic_batching.preferred_batch_sizes = {16, 4, 8};
  CHECK(default_buckets(c) == std::vector<uint32_t>{4, 8, 16, 32});
}

TEST_CASE("precision parameter") {
  auto c = gpu_model(4);
  CHECK(read_gpu_options(c)->compute == precision::fp32);
  c.parameters["precision"] = "bf16";
  CHECK(read_gpu_options(c)->compute == precision::bf16);
  c.parameters["precision"] = "int8";
  auto bad = read_gpu_options(c);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("'int8'") != std::string::npos);
  CHECK(bad.error().message.find("\"fp16\"") != std::string::npos);
}

TEST_CASE("instance groups: count instances on each listed GPU") {
  auto c = gpu_model(4);
  c.instance_groups = {{"a", 2, instance_kind::gpu, {0, 1}}, {"cpu", 3, instance_kind::cpu, {}}};
  auto o = read_gpu_options(c);
  REQUIRE(o);
  REQUIRE(o->placements.size() == 4);
  CHECK(o->placements[0].device == 0);
  CHECK(o->placements[1].device == 0);
  CHECK(o->placements[1].index_on_device == 1);
  CHECK(o->placements[2].device == 1);
  CHECK(o->placements[3].index_on_device == 1);
  CHECK(wants_gpu(c));
  c.instance_groups = {{"cpu", 1, instance_kind::cpu, {}}};
  CHECK_FALSE(wants_gpu(c));
  c.instance_groups = {{"g", 1, instance_kind::gpu, {-1}}};
  CHECK_FALSE(read_gpu_options(c));
}

TEST_CASE("graph batch sizes parameter overrides the buckets") {
  auto c = gpu_model(16);
  c.parameters["cuda_graph_batch_sizes"] = "8, 1,4,4";
  CHECK(read_gpu_options(c)->buckets == std::vector<uint32_t>{1, 4, 8});
  c.parameters["cuda_graph_batch_sizes"] = "none";
  CHECK(read_gpu_options(c)->buckets.empty());
  c.parameters["cuda_graph_batch_sizes"] = "1,32";
  auto bad = read_gpu_options(c);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("'32'") != std::string::npos);
}
