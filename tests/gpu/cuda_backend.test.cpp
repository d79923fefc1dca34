/// The CUDA backend against the CPU executor and ONNX Runtime, on every fixture
/// of tests/onnx/fixtures, at every captured bucket and on a padded batch whose
/// padding rows must be discarded. Needs a GPU: without one every case is
/// skipped (exit code 77, which CTest reports as "Skipped") with a message.
///
/// Tolerances (relative error of the whole output, ||gpu - ref|| / ||ref||):
/// - fp32: 1e-4, as the CPU backend's own test; cuBLASLt and cuDNN run true fp32
///   (CUBLAS_COMPUTE_32F, CUDNN_FMA_MATH) and only summation order differs.
/// - fp16: 1e-2. Storage mode (gpu_options.hpp): every value between steps and
///   every weight is rounded to 11 significant bits (relative error 2^-11 ~ 4.9e-4
///   per element), each kernel accumulates in fp32 and rounds its output once;
///   the error of a K-term dot product grows like sqrt(K) of independent
///   roundings relative to its norm, ~1.5e-2 worst case at K = 1152 for random
///   signs but ~3e-3 measured on such data elsewhere, and each layer adds one
///   rounding of its output (4.9e-4); a few layers deep, 1e-2 holds with margin.
/// - bf16: 4e-2: 8 significant bits (2^-8 ~ 3.9e-3 per rounding), the same
///   argument scaled by 8x.

#define DOCTEST_CONFIG_IMPLEMENT
#include "cuda/cuda_backend.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#include "repository/model_repository.hpp"
#include "support/gpu_zoo.hpp"

#include <cuda_runtime_api.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

using namespace caf_serving;
namespace fs = std::filesystem;

namespace {

/// The fixtures folder: CAF_SERVING_ONNX_FIXTURES in the environment (a build
/// carried to another machine, scripts/device-bundle), else the source tree's.
const fs::path fixtures = std::getenv("CAF_SERVING_ONNX_FIXTURES")
                            ? fs::path(std::getenv("CAF_SERVING_ONNX_FIXTURES"))
                            : fs::path(CAF_SERVING_ONNX_FIXTURES);

struct tensor {
  std::string name;
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Reference inputs and ONNX Runtime outputs (tools/export_onnx_models.py).
std::pair<std::vector<tensor>, std::vector<tensor>> read_reference(const std::string& model) {
  std::vector<tensor> in, out;
  std::istringstream lines(read_all(fixtures / "reference" / model / "manifest.txt"));
  std::string kind, name, type, dims, file;
  while (lines >> kind >> name >> type >> dims >> file) {
    tensor t;
    t.name = name;
    t.dtype = type == "TYPE_INT64" ? datatype::int64 : type == "TYPE_INT32" ? datatype::int32
                                                                             : datatype::fp32;
    std::stringstream ds(dims);
    for (std::string d; std::getline(ds, d, ',');) t.shape.push_back(std::stoll(d));
    t.bytes = read_all(fixtures / "reference" / model / file);
    (kind == "input" ? in : out).push_back(t);
  }
  return {in, out};
}

class collect final : public executor::output_writer {
public:
  std::map<std::string, std::string> outputs;
  uint8_t* allocate(std::string_view name, datatype, const std::vector<int64_t>&,
                    size_t bytes) override {
    auto& s = outputs[std::string(name)];
    s.assign(bytes, '\0');
    return reinterpret_cast<uint8_t*>(s.data());
  }
};

/// The reference inputs repeated (row by row, cyclically) to `rows` rows.
std::vector<tensor> tile(const std::vector<tensor>& in, uint32_t rows) {
  std::vector<tensor> out;
  for (const auto& t : in) {
    tensor r = t;
    size_t row = t.bytes.size() / t.shape[0];
    r.shape[0] = rows;
    r.bytes.clear();
    for (uint32_t i = 0; i < rows; ++i)
      r.bytes += t.bytes.substr((i % t.shape[0]) * row, row);
    out.push_back(r);
  }
  return out;
}

/// A batch of `in` (which must outlive it).
executor::batch_view view_of(const std::vector<tensor>& in) {
  executor::batch_view view;
  view.rows = static_cast<uint32_t>(in[0].shape[0]);
  for (const auto& t : in)
    view.inputs.push_back({t.name, t.dtype, t.shape,
                           reinterpret_cast<const uint8_t*>(t.bytes.data()), t.bytes.size()});
  return view;
}

std::map<std::string, std::string> run(executor::backend& be, const std::vector<tensor>& in) {
  auto view = view_of(in);
  collect c;
  auto status = be.execute(view, c);
  if (auto* e = std::get_if<serving_error>(&status)) FAIL(e->message);
  return c.outputs;
}

double relative_error(const std::string& got, const std::string& want) {
  REQUIRE(got.size() == want.size());
  const float* a = reinterpret_cast<const float*>(got.data());
  const float* b = reinterpret_cast<const float*>(want.data());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size() / 4; ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

bool have_gpu() {
  static bool gpu = [] {
    bool g = cuda::visible_devices() > 0;
    if (!g)
      std::cerr << "SKIPPED: no CUDA device visible; the CUDA backend's GPU tests need one "
                   "(run scripts/gpu-check on a GPU machine)\n";
    return g;
  }();
  return gpu;
}

void check_model(const std::string& name, cuda::precision p, double tolerance) {
  CAPTURE(name);
  auto entry = repository::load_model_config(fixtures / "models", name, {true});
  REQUIRE(entry.config);
  model_config cfg = entry.config->config;
  cfg.instance_groups = {{"gpu", 1, instance_kind::gpu, {0}}};
  cfg.parameters["precision"] = cuda::to_string(p);
  fs::path file = entry.version_dirs.back() / "model.onnx";
  auto model = cuda::load_cuda_model({file, cfg, {}});
  REQUIRE_MESSAGE(model, (model ? "" : model.error().message));
  auto inst = model->make_instance({0, 0});
  REQUIRE_MESSAGE(inst, (inst ? "" : inst.error().message));
  MESSAGE(name << " " << cuda::to_string(p) << ": " << inst->report.arena << ", "
               << inst->report.steps << " steps, " << inst->report.host_steps << " on the host");
  { // the dry run without a device chose the same steps (the report's: the largest size's)
    auto dry = cuda::plan_model({file, cfg, {}});
    REQUIRE_MESSAGE(dry, (dry ? "" : dry.error().message));
    REQUIRE(!dry->buckets.empty());
    const auto& largest = *std::max_element(
      dry->buckets.begin(), dry->buckets.end(),
      [](const auto& a, const auto& b) { return a.rows < b.rows; });
    CHECK(inst->report.steps == largest.steps);
    CHECK(inst->report.host_steps == largest.host_nodes.size());
    if (p != cuda::precision::fp32) { // storage mode: half values, edge conversions only
      CHECK(dry->storage == cuda::storage_type(p));
      CHECK(largest.arena_types.count("FP32") == 0);
      size_t float_edges = 0;
      for (const auto* ts : {&cfg.inputs, &cfg.outputs})
        for (const auto& t : *ts) float_edges += t.dtype == datatype::fp32;
      // A StorageCast step per fp32 edge, or the GEMM that writes a declared
      // output in fp32 itself (storage_plan.hpp).
      auto count = [&largest](const char* kernel) {
        auto it = largest.kernels.find(kernel);
        return it == largest.kernels.end() ? size_t{0} : it->second;
      };
      CHECK(count("convert") + count("cublaslt+convert") == float_edges);
    }
  }
  auto& gpu = *inst->backend;
  auto [inputs, reference] = read_reference(name);

  // Against ONNX Runtime on its own batch.
  auto out = run(gpu, inputs);
  for (const auto& r : reference)
    CHECK_MESSAGE(relative_error(out.at(r.name), r.bytes) < tolerance, r.name);

  if (model->config.max_batch_size == 0) return;
  onnx::onnx_model_config oc{file, model->config, 1, {}};
  auto cpu_model = onnx::load_onnx_model(oc);
  REQUIRE(cpu_model);
  auto cpu = cpu_model->make_instance();
  // Every captured bucket, full and padded by one row (padding discarded).
  for (uint32_t bucket : model->options.buckets)
    for (uint32_t rows : {bucket, bucket > 1 ? bucket - 1 : bucket}) {
      CAPTURE(rows);
      auto batch = tile(inputs, rows);
      auto want = run(*cpu, batch);
      auto got = run(gpu, batch);
      for (const auto& [oname, bytes] : want) {
        REQUIRE(got.at(oname).size() == bytes.size()); // padding rows dropped
        CHECK_MESSAGE(relative_error(got.at(oname), bytes) < tolerance, oname);
      }
    }
}

/// Inputs of `rows` rows for `cfg`: floats uniform in [-1, 1), integers in
/// [0, 100) (valid token ids, and a mask of ones where the name says mask), fixed
/// by `seed`.
std::vector<tensor> random_inputs(const model_config& cfg, uint32_t rows, uint32_t seed) {
  std::vector<tensor> out;
  uint64_t state = 0x9e3779b97f4a7c15ull * (seed + 1);
  auto next = [&] {
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return state;
  };
  for (const auto& t : cfg.inputs) {
    tensor x;
    x.name = t.name;
    x.dtype = t.dtype;
    x.shape = t.dims;
    x.shape.insert(x.shape.begin(), rows);
    int64_t n = 1;
    for (auto d : x.shape) n *= d;
    bool mask = t.name.find("mask") != std::string::npos;
    if (t.dtype == datatype::fp32) {
      std::vector<float> v(n);
      for (auto& f : v) f = static_cast<float>(next() % 2000000) / 1e6f - 1.f;
      x.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    } else {
      REQUIRE(t.dtype == datatype::int64);
      std::vector<int64_t> v(n);
      for (auto& i : v) i = mask ? 1 : static_cast<int64_t>(next() % 100);
      x.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
    }
    out.push_back(x);
  }
  return out;
}

std::vector<std::string> fixture_models() {
  std::vector<std::string> names;
  for (const auto& d : fs::directory_iterator(fixtures / "models")) names.push_back(d.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

} // namespace

TEST_CASE("fp32: every fixture matches ONNX Runtime and the CPU executor at every bucket") {
  if (!have_gpu()) return;
  for (const auto& name : fixture_models()) check_model(name, cuda::precision::fp32, 1e-4);
}

/// The fixtures whose FusedAttention runs as the device attention step
/// (cuda.plan_model.test asserts it), named here so that they are checked even
/// when a fixture before them in the loop above stops that case: padding masks
/// (BERT, DistilBERT, the contrib Attention's key lengths), causal masks, no mask
/// (ViT's MHA), ONNX's Attention (23) with a float mask or is_causal. fp32's 1e-4:
/// both products run CUBLAS_COMPUTE_32F, the softmax in fp32 (__expf).
TEST_CASE("fp32: the attention fixtures match ONNX Runtime and the CPU executor at every bucket") {
  if (!have_gpu()) return;
  for (const char* name : {"pattern_attention_padding_dynamo", "pattern_attention_padding_torchscript17",
                           "pattern_attention_causal_dynamo", "pattern_attention_causal_torchscript17",
                           "pattern_mha_vit_torchscript17", "bert_2layer_opset13", "bert_2layer_opset17",
                           "distilbert_2layer_opset13", "contrib_attention",
                           "contrib_bert_2layer_ort_optimized", "opset21_transformer",
                           "op_attention_float_mask", "op_attention_4d_causal"})
    check_model(name, cuda::precision::fp32, 1e-4);
}

/// The fixtures whose data-movement and reduction nodes run as device steps
/// (steps_data.cpp; cuda.steps_data.test asserts which), named here for the same
/// reason. They move bytes or reduce in fp32, so fp32's 1e-4 holds.
TEST_CASE("fp32: the data-movement and reduction fixtures match ONNX Runtime at every bucket") {
  if (!have_gpu()) return;
  for (const char* name : {"op_transpose", "op_split", "opset18_split_num_outputs", "op_tile",
                           "op_pad", "op_reducemax", "op_reducemax_opset20", "op_reduceprod",
                           "op_reducesum", "opset18_reduce_axes", "op_globalaveragepool",
                           "zoo_vit_tiny_dynamo_opset18"})
    check_model(name, cuda::precision::fp32, 1e-4);
}

/// The fixtures whose element-wise nodes run as device steps
/// (steps_elementwise.cpp; cuda.steps_elementwise.test asserts which), named here
/// for the same reason. fp32's 1e-4: the kernels compute in f32 (transcendentals
/// by CUDA's functions, within a few ulp).
TEST_CASE("fp32: the element-wise fixtures match ONNX Runtime at every bucket") {
  if (!have_gpu()) return;
  for (const char* name : {"op_abs", "op_ceil", "op_clip", "op_cos", "op_elu", "op_exp",
                           "op_floor", "op_gelu", "op_gelu_tanh", "op_hardsigmoid",
                           "op_hardswish", "op_leakyrelu", "op_log", "op_neg", "op_reciprocal",
                           "op_round", "op_sigmoid", "op_sin", "op_softplus", "op_tanh",
                           "op_min", "type_half_casts"})
    check_model(name, cuda::precision::fp32, 1e-4);
}

TEST_CASE("a token id past the vocabulary answers that batch with an error naming the Gather") {
  if (!have_gpu()) return;
  auto entry = repository::load_model_config(fixtures / "models", "bert_2layer_opset17", {true});
  REQUIRE(entry.config);
  model_config cfg = entry.config->config;
  cfg.instance_groups = {{"gpu", 1, instance_kind::gpu, {0}}};
  auto model = cuda::load_cuda_model({entry.version_dirs.back() / "model.onnx", cfg, {}});
  REQUIRE_MESSAGE(model, (model ? "" : model.error().message));
  auto inst = model->make_instance({0, 0});
  REQUIRE_MESSAGE(inst, (inst ? "" : inst.error().message));
  auto [inputs, reference] = read_reference("bert_2layer_opset17");
  auto bad = inputs;
  for (auto& t : bad)
    if (t.name == "input_ids") reinterpret_cast<int64_t*>(t.bytes.data())[3] = int64_t{1} << 40;
  executor::batch_view view;
  view.rows = static_cast<uint32_t>(bad[0].shape[0]);
  for (const auto& t : bad)
    view.inputs.push_back({t.name, t.dtype, t.shape,
                           reinterpret_cast<const uint8_t*>(t.bytes.data()), t.bytes.size()});
  collect c;
  auto status = inst->backend->execute(view, c);
  auto* e = std::get_if<serving_error>(&status);
  REQUIRE(e);
  CHECK(e->status == status_code::bad_request);
  CHECK(e->message.find("Gather") != std::string::npos);
  CHECK(e->message.find("input_ids") != std::string::npos);
  // The flag was the batch's own: the next batch runs and matches ONNX Runtime.
  auto out = run(*inst->backend, inputs);
  for (const auto& r : reference)
    CHECK_MESSAGE(relative_error(out.at(r.name), r.bytes) < 1e-4, r.name);
}

/// The fixtures of grouped and depthwise convolutions, the epilogue's activations
/// after a convolution (SiLU, Clip, HardSwish, Sigmoid, the residual before the
/// activation) and Gemm (transB, alpha, beta, broadcast C, Tanh), named for the
/// same reason. fp32's 1e-4: cuDNN with CUDNN_FMA_MATH, cuBLASLt CUBLAS_COMPUTE_32F,
/// the epilogue in fp32 (expf, tanhf).
TEST_CASE("fp32: the convolution and Gemm fixtures match ONNX Runtime and the CPU executor") {
  if (!have_gpu()) return;
  for (const char* name : {"op_conv", "op_conv_group", "op_gemm", "resnet_narrow_opset17",
                           "pattern_mobilenetv3_block_opset17", "pattern_mbconv_block_opset17",
                           "zoo_mobilenet_v3_block_dynamo_opset18"})
    check_model(name, cuda::precision::fp32, 1e-4);
}

/// Storage mode (values, weights and kernels in the half type, fp32 at the edges)
/// against ONNX Runtime's fp32 outputs and the CPU executor, at the tolerances
/// stated at the top.
TEST_CASE("fp16 and bf16 storage on the ResNet, MobileNet/EfficientNet-block, Gemm and BERT fixtures") {
  if (!have_gpu()) return;
  for (const char* name : {"resnet_narrow_opset17", "bert_2layer_opset17", "op_conv_group",
                           "op_gemm", "pattern_mobilenetv3_block_opset17",
                           "pattern_mbconv_block_opset17",
                           "zoo_mobilenet_v3_block_dynamo_opset18"}) {
    check_model(name, cuda::precision::fp16, 1e-2);
    check_model(name, cuda::precision::bf16, 4e-2);
  }
}

TEST_CASE("without a GPU, loading says so and how to fix it") {
  if (have_gpu()) return;
  model_config cfg;
  cfg.name = "m";
  cfg.instance_groups = {{"gpu", 1, instance_kind::gpu, {0}}};
  auto m = cuda::load_cuda_model({fixtures / "models/op_conv/1/model.onnx", cfg, {}});
  REQUIRE_FALSE(m);
  CHECK(m.error().message.find("no CUDA device is visible") != std::string::npos);
  CHECK(m.error().message.find("KIND_CPU") != std::string::npos);
}

namespace {

/// A fixture loaded for one GPU instance with `parameters` set and, when
/// `outputs` is not empty, only those outputs declared.
struct gpu_fixture {
  fs::path file;
  model_config config; ///< completed, as the instance serves it
  cuda::gpu_options options;
  std::shared_ptr<executor::backend> backend;
};

gpu_fixture load_fixture(const std::string& name,
                         const std::map<std::string, std::string>& parameters,
                         const std::vector<std::string>& outputs = {}) {
  auto entry = repository::load_model_config(fixtures / "models", name, {true});
  REQUIRE(entry.config);
  model_config cfg = entry.config->config;
  cfg.instance_groups = {{"gpu", 1, instance_kind::gpu, {0}}};
  for (const auto& [k, v] : parameters) cfg.parameters[k] = v;
  if (!outputs.empty()) {
    std::vector<tensor_config> kept;
    for (const auto& o : cfg.outputs)
      if (std::find(outputs.begin(), outputs.end(), o.name) != outputs.end()) kept.push_back(o);
    REQUIRE(kept.size() == outputs.size());
    cfg.outputs = kept;
  }
  gpu_fixture f;
  f.file = entry.version_dirs.back() / "model.onnx";
  auto model = cuda::load_cuda_model({f.file, cfg, {}});
  REQUIRE_MESSAGE(model, (model ? "" : model.error().message));
  auto inst = model->make_instance({0, 0});
  REQUIRE_MESSAGE(inst, (inst ? "" : inst.error().message));
  f.config = model->config;
  f.options = model->options;
  f.backend = inst->backend;
  return f;
}

/// The GPU instance against the CPU executor at each of `batch_rows`.
void check_against_cpu(gpu_fixture& f, const std::vector<uint32_t>& batch_rows, double tolerance) {
  auto [inputs, reference] = read_reference(f.file.parent_path().parent_path().filename());
  onnx::onnx_model_config oc{f.file, f.config, 1, {}};
  auto cpu_model = onnx::load_onnx_model(oc);
  REQUIRE_MESSAGE(cpu_model, (cpu_model ? "" : cpu_model.error().message));
  auto cpu = cpu_model->make_instance();
  for (uint32_t rows : batch_rows) {
    CAPTURE(rows);
    auto batch = tile(inputs, rows);
    auto want = run(*cpu, batch);
    auto got = run(*f.backend, batch);
    REQUIRE(got.size() == f.config.outputs.size());
    for (const auto& [oname, bytes] : want) {
      REQUIRE(got.at(oname).size() == bytes.size()); // padding rows dropped
      CHECK_MESSAGE(relative_error(got.at(oname), bytes) < tolerance, oname);
    }
  }
}

/// Free device memory now (cudaMemGetInfo through the backend's runtime).
size_t free_device_bytes() {
  size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return free;
}

} // namespace

TEST_CASE("cuda_graph_batch_sizes \"none\": a model with weights serves every batch size") {
  if (!have_gpu()) return;
  // The old backend planned no size with "none", uploaded no weights, and
  // failed every request.
  auto f = load_fixture("resnet_narrow_opset17", {{"cuda_graph_batch_sizes", "none"}});
  CHECK(f.options.buckets.empty());
  check_against_cpu(f, {1, 2, 3, 5, 8}, 1e-4);
}

TEST_CASE("a batch between buckets runs on a size planned at load, allocating nothing") {
  if (!have_gpu()) return;
  // Buckets 1 and 2 stop short of max_batch_size 8: 8 is planned at load and
  // runs uncaptured; 3..8 rows pad up to it.
  auto f = load_fixture("resnet_narrow_opset17", {{"cuda_graph_batch_sizes", "1,2"}});
  size_t before = free_device_bytes();
  check_against_cpu(f, {5, 3, 8, 2, 1}, 1e-4);
  // The old backend planned 5 and 3 here, on the request path, and cudaMalloc'd
  // an arena for each that it never freed.
  CHECK(free_device_bytes() == before);
}

TEST_CASE("outputs the config does not declare live in the arena; declared ones are served") {
  if (!have_gpu()) return;
  // Each fixture's graph has several outputs; only one is declared, so the
  // others have no I/O buffer. The old plan gave them no address at all, and
  // their kernels wrote through null pointers.
  for (const char* model : {"opset19_pools", "bert_2layer_opset13", "contrib_gelus"}) {
    CAPTURE(model);
    auto entry = repository::load_model_config(fixtures / "models", model, {true});
    REQUIRE(entry.config);
    const auto& outs = entry.config->config.outputs;
    REQUIRE(outs.size() >= 2);
    // The last output alone, then the first alone.
    for (const auto& keep : {outs.back().name, outs.front().name}) {
      CAPTURE(keep);
      auto f = load_fixture(model, {}, {keep});
      auto [inputs, reference] = read_reference(model);
      auto out = run(*f.backend, inputs);
      REQUIRE(out.size() == 1);
      for (const auto& r : reference)
        if (r.name == keep) CHECK(relative_error(out.at(keep), r.bytes) < 1e-4);
      check_against_cpu(f, {1, 3, 8}, 1e-4);
    }
  }
}

TEST_CASE("every captured graph, each bucket and slot, is verified at load on random inputs") {
  if (!have_gpu()) return;
  // make_instance fails when any (bucket, slot) replay differs from the direct
  // launch (replay_check.hpp); BERT's integer inputs get valid ids and masks.
  for (const char* name : {"resnet_narrow_opset17", "bert_2layer_opset17"}) {
    CAPTURE(name);
    auto f = load_fixture(name, {{"cuda_graph_batch_sizes", "1,3,8"}});
    CHECK(f.options.buckets == std::vector<uint32_t>{1, 3, 8});
    // Both slots serve: consecutive batches alternate between them.
    check_against_cpu(f, {3, 3, 8, 8, 1, 1}, 1e-4);
  }
}

namespace {

/// `rows` rows of the reference inputs starting at row `offset` (cyclically),
/// FP32 elements scaled by `scale`: batches whose data differ from each other.
std::vector<tensor> varied_batch(const std::vector<tensor>& in, uint32_t rows, size_t offset,
                                 float scale) {
  std::vector<tensor> out;
  for (const auto& t : in) {
    tensor r = t;
    size_t row = t.bytes.size() / t.shape[0];
    r.shape[0] = rows;
    r.bytes.clear();
    for (uint32_t i = 0; i < rows; ++i)
      r.bytes += t.bytes.substr(((i + offset) % t.shape[0]) * row, row);
    if (t.dtype == datatype::fp32) {
      auto* f = reinterpret_cast<float*>(r.bytes.data());
      for (size_t k = 0; k < r.bytes.size() / sizeof(float); ++k) f[k] *= scale;
    }
    out.push_back(std::move(r));
  }
  return out;
}

} // namespace

TEST_CASE("batches submitted back to back overlap and each gets exactly the synchronous result") {
  if (!have_gpu()) return;
  // Issue 20 item 6: submit() returns while the batch is on the device, so the
  // next batch's copy-in overlaps its compute. Each result must be its own
  // batch's, bit for bit what execute() computed for it: a slot reused too
  // early (staging or I/O buffers overwritten) or outputs delivered to the
  // wrong batch would differ.
  for (const char* name : {"resnet_narrow_opset17", "bert_2layer_opset17"}) {
    CAPTURE(name);
    auto f = load_fixture(name, {{"cuda_graph_batch_sizes", "1,3,8"}});
    REQUIRE(f.backend->asynchronous());
    CHECK(f.backend->pipeline_depth() == 2);
    auto [inputs, reference] = read_reference(name);
    // Captured sizes and padded ones (2 and 5 rows run on 3 and 8).
    const uint32_t sizes[] = {1, 3, 8, 2, 5, 1, 8, 3};
    constexpr size_t count = 32; // even: batch k runs in slot k % 2 in both passes
    std::vector<std::vector<tensor>> batches;
    for (size_t k = 0; k < count; ++k)
      batches.push_back(varied_batch(inputs, sizes[k % 8], k, 1.0f + 0.03f * static_cast<float>(k)));
    std::vector<std::map<std::string, std::string>> want;
    for (const auto& b : batches) want.push_back(run(*f.backend, b));
    CHECK(want[0] != want[8]); // the same size, other data: other outputs

    struct submitted {
      executor::batch_view view;
      collect out;
    };
    std::vector<std::unique_ptr<submitted>> subs;
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<std::optional<executor::batch_completion>> got(count);
    std::vector<size_t> order;
    for (size_t k = 0; k < count; ++k) {
      subs.push_back(std::make_unique<submitted>());
      subs.back()->view = view_of(batches[k]);
      f.backend->submit(subs.back()->view, subs.back()->out, [&, k](executor::batch_completion c) {
        std::lock_guard<std::mutex> guard(mutex);
        got[k] = std::move(c);
        order.push_back(k);
        cv.notify_all();
      });
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      REQUIRE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return order.size() == count; }));
    }
    for (size_t k = 0; k < count; ++k) {
      CAPTURE(k);
      const auto& c = *got[k];
      CHECK_FALSE(c.thrown);
      REQUIRE_MESSAGE(std::holds_alternative<std::monostate>(c.status),
                      std::get<serving_error>(c.status).message);
      CHECK(order[k] == k); // one compute stream: completed in submission order
      CHECK(c.compute_start_ns > 0);
      CHECK(c.compute_end_ns >= c.compute_start_ns);
      REQUIRE(subs[k]->out.outputs.size() == want[k].size());
      for (const auto& [oname, bytes] : want[k])
        CHECK_MESSAGE(subs[k]->out.outputs.at(oname) == bytes, oname);
    }
  }
}

/// Issue 20's target models (tests/gpu/zoo), their weights pseudo-random with
/// the real ones' mean and deviation (stage_gpu_zoo_model): every node runs on
/// the device (the dry run says so, cuda.target_models_plan.test), and the
/// instance must agree with the CPU backend (fp32) on the same weights at batch 1
/// and at a padded batch, at fp32 and in fp16 storage mode.
///
/// fp32, relative error 1e-3 of the whole output: both sides sum in other orders
/// through 12 (BERT, GPT-2, ViT) to 53 (ResNet-50) layers, and cuDNN may choose
/// Winograd or FFT convolutions, whose fp32 rounding differs from a direct
/// convolution's by about 1e-5 per layer.
///
/// fp16 storage, per model (fp16_tolerance): each layer rounds its output to
/// 2^-11 ~ 4.9e-4 and its GEMMs add the sqrt(K) term of the fixtures' 1e-2, so
/// the error grows like sqrt(layers) times that:
/// - BERT-base, DistilBERT, MiniLM, ViT-B/16: 1e-2. 6 to 12 encoder layers, each
///   ending in a LayerNorm that rescales the residual stream, so errors do not
///   compound in magnitude; ~5e-4 * sqrt(12 * 4 roundings) ~ 3.5e-3 plus GEMMs.
/// - GPT-2: 2e-2. 12 decoder layers without a final rescale of the residual
///   stream before the LM head's 768-term dot products over the vocabulary.
/// - ResNet-18/50, MobileNetV2/V3, EfficientNet-B0: 2e-2. 18 to 53 convolutions
///   with batch norm folded (no renormalisation between them), depthwise
///   convolutions with K = 9 or 25 whose outputs round with little averaging,
///   and Swish/HardSwish gates that pass the rounding of both factors on.
/// Not yet measured on a device: the first device run confirms or tightens these.
double fp16_tolerance(const std::string& model) {
  for (const char* encoder : {"bert_base", "distilbert_base", "minilm_l6", "vit_b_16"})
    if (model == encoder) return 1e-2;
  return 2e-2;
}

TEST_CASE("the target models on the device agree with the CPU backend, fp32 and fp16 storage") {
  if (!have_gpu()) return;
  auto root = fs::temp_directory_path() / "caf-gpu-target-models";
  for (const auto& name : testing::gpu_zoo_models()) {
    CAPTURE(name);
    auto dir = testing::stage_gpu_zoo_model(name, root, {testing::zoo_weights::pseudo_random, 20});
    REQUIRE_MESSAGE(dir, (dir ? "" : dir.error().message));
    auto entry = repository::load_model_config(root, name, {true});
    REQUIRE(entry.config);
    fs::path file = entry.version_dirs.back() / "model.onnx";
    for (auto p : {cuda::precision::fp32, cuda::precision::fp16}) {
      CAPTURE(cuda::to_string(p));
      const double tolerance = p == cuda::precision::fp32 ? 1e-3 : fp16_tolerance(name);
      model_config cfg = entry.config->config;
      cfg.parameters[cuda::precision_key] = cuda::to_string(p);
      auto model = cuda::load_cuda_model({file, cfg, {}});
      REQUIRE_MESSAGE(model, (model ? "" : model.error().message));
      auto inst = model->make_instance({0, 0});
      REQUIRE_MESSAGE(inst, (inst ? "" : inst.error().message));
      MESSAGE(name << " " << cuda::to_string(p) << ": " << inst->report.arena << ", "
                   << inst->report.steps << " steps, " << inst->report.host_steps
                   << " on the host");
      CHECK(inst->report.host_steps == 0);
      model_config cpu_cfg = model->config;
      cpu_cfg.instance_groups = {{"cpu", 1, instance_kind::cpu, {}}};
      onnx::onnx_model_config oc{file, cpu_cfg, 1, {}};
      auto cpu_model = onnx::load_onnx_model(oc);
      REQUIRE_MESSAGE(cpu_model, (cpu_model ? "" : cpu_model.error().message));
      auto cpu = cpu_model->make_instance();
      for (uint32_t rows : {1u, 7u}) {
        CAPTURE(rows);
        auto batch = random_inputs(model->config, rows, rows);
        auto want = run(*cpu, batch);
        auto got = run(*inst->backend, batch);
        for (const auto& [oname, bytes] : want) {
          REQUIRE(got.at(oname).size() == bytes.size());
          CHECK_MESSAGE(relative_error(got.at(oname), bytes) < tolerance, oname);
        }
      }
    }
    fs::remove_all(root / name);
  }
}

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  int rc = ctx.run();
  if (rc == 0 && !have_gpu()) return 77; // CTest: Skipped
  return rc;
}
