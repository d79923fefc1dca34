#include "cuda/plan_sizes.hpp"

#include "cuda/gpu_options.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;
using namespace caf_serving::cuda;

namespace {

using sizes = std::vector<uint32_t>;

model_config gpu_model(int max_batch, const std::string& graph_sizes) {
  model_config c;
  c.name = "m";
  c.max_batch_size = max_batch;
  c.instance_groups.push_back({"g", 1, instance_kind::gpu, {}});
  c.parameters[graph_sizes_key] = graph_sizes;
  return c;
}

} // namespace

TEST_CASE("buckets that reach max_batch_size are exactly the planned sizes, all captured") {
  auto p = plan_sizes({1, 2, 4, 8}, 8);
  CHECK(p.planned == sizes{1, 2, 4, 8});
  CHECK(p.captured == sizes{1, 2, 4, 8});
}

TEST_CASE("buckets that stop short of max_batch_size: max_batch_size is planned, uncaptured") {
  auto p = plan_sizes({2, 4}, 16);
  CHECK(p.planned == sizes{2, 4, 16});
  CHECK(p.captured == sizes{2, 4});
  // A batch between the last bucket and max_batch_size runs on the planned
  // 16 directly; it was planned at load, not on the request path.
  auto r = run_shape_for(p, 5);
  REQUIRE(r);
  CHECK(r->size == 16);
  CHECK_FALSE(r->graph);
  CHECK(r->padding() == 11);
}

TEST_CASE("\"none\" captures nothing but still plans sizes, so constants are uploaded") {
  // read_gpu_options turns "none" into no buckets; with no planned size the
  // old backend uploaded no weights and failed every request.
  auto opts = read_gpu_options(gpu_model(8, "none"));
  REQUIRE(opts);
  CHECK(opts->buckets.empty());
  auto p = plan_sizes(opts->buckets, 8);
  CHECK(p.captured.empty());
  CHECK(p.planned == sizes{1, 2, 4, 8});
  for (uint32_t rows = 1; rows <= 8; ++rows) {
    auto r = run_shape_for(p, rows);
    REQUIRE(r);
    CHECK_FALSE(r->graph);
    CHECK(r->size >= rows);
    CHECK(r->size < 2 * rows); // never padded to twice its rows or more
  }
}

TEST_CASE("a model that does not batch plans one size of one row") {
  for (const auto& b : {sizes{}, sizes{1}}) {
    auto p = plan_sizes(b, 0);
    CHECK(p.planned == sizes{1});
    CHECK(p.captured == b);
    auto r = run_shape_for(p, 1);
    REQUIRE(r);
    CHECK(r->size == 1);
    CHECK(r->graph == !b.empty());
  }
}

TEST_CASE("every batch up to max_batch_size has a planned size; none above it") {
  for (const auto& b : {sizes{1, 2, 4, 8, 32}, sizes{3}, sizes{}, sizes{32}, sizes{5, 7}}) {
    auto p = plan_sizes(b, 32);
    CAPTURE(p.planned.size());
    CHECK(p.planned.back() == 32);
    CHECK(std::is_sorted(p.planned.begin(), p.planned.end()));
    for (uint32_t c : p.captured)
      CHECK(std::binary_search(p.planned.begin(), p.planned.end(), c));
    for (uint32_t rows = 1; rows <= 32; ++rows) {
      auto r = run_shape_for(p, rows);
      REQUIRE(r);
      CHECK(r->size >= rows);
      // The smallest planned size that holds the rows.
      auto smallest = *std::lower_bound(p.planned.begin(), p.planned.end(), rows);
      CHECK(r->size == smallest);
      CHECK(r->graph == std::binary_search(p.captured.begin(), p.captured.end(), r->size));
    }
    CHECK_FALSE(run_shape_for(p, 33));
    CHECK_FALSE(run_shape_for(p, 0));
  }
}

TEST_CASE("bucket lists out of order or with duplicates plan each size once") {
  auto p = plan_sizes({8, 2, 8, 4}, 8);
  CHECK(p.planned == sizes{2, 4, 8});
  CHECK(p.captured == sizes{2, 4, 8});
}
