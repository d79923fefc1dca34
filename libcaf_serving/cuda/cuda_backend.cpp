#include "cuda/cuda_backend.hpp"

#include "core/clock.hpp"
#include "cuda/capture_order.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_errors.hpp"
#include "cuda/device_arena.hpp"
#include "cuda/graph_plan.hpp"
#include "cuda/plan_sizes.hpp"
#include "cuda/replay_check.hpp"
#include "cuda/staging_slots.hpp"
#include "cuda/steps.hpp"
#include "onnx/importer.hpp"
#include "onnx/memory_plan.hpp"
#include "onnx/model_config.hpp"
#include "onnx/op_registry.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

namespace caf_serving::cuda {

namespace {

using exec_result = std::variant<std::monostate, serving_error>;

constexpr uint32_t staging_slots = 2;

/// Device memory an instance needs beyond its arena: cuDNN's and cuBLASLt's
/// handles and internal buffers, the instantiated CUDA graphs. A margin, not a
/// measurement; check_fits keeps it back from what cudaMemGetInfo reports free.
constexpr size_t reserve_bytes = size_t{256} << 20;

/// Content key of a constant, so the folded weights of different bucket plans
/// (new tensor_data objects with equal bytes) share one device copy.
struct constant_key {
  int dtype;
  dims_t shape;
  uint64_t hash;
  bool operator<(const constant_key& o) const {
    return std::tie(dtype, shape, hash) < std::tie(o.dtype, o.shape, o.hash);
  }
};

constant_key key_of(const onnx::tensor_data& t) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : t.bytes) h = (h ^ b) * 1099511628211ull;
  return {static_cast<int>(t.dtype), t.shape, h};
}

/// One planned size's graph and memory plan (graph_plan.hpp): the graph's
/// inputs and declared outputs in the I/O slots, everything else in the arena.
/// At precision fp16/bf16 the graph stores its values in that type, its weights
/// converted once per `constants` (storage_plan.hpp).
result<planned_graph> plan_at(const onnx::graph& graph, const model_config& config,
                              const onnx::pass_config& passes, uint32_t rows, precision p,
                              half_constants& constants) {
  return plan_graph({&graph, &config, passes, rows, device_alignment, storage_type(p),
                     &constants});
}

// ---------------------------------------------------------------- the backend

class cuda_backend final : public executor::backend {
public:
  struct setup {
    std::shared_ptr<const onnx::graph> graph; ///< inputs in config order
    model_config config;
    gpu_options options;
    onnx::pass_config passes;
    gpu_placement place;
  };

  explicit cuda_backend(setup s)
      : s_(std::move(s)),
        health_("model '" + s_.config.name + "' on GPU " + std::to_string(s_.place.device)) {}

  /// Never throws and never aborts, also after a sticky error (every call then
  /// fails at once, and its error is ignored here).
  ~cuda_backend() override {
    // First the completion thread: it completes every batch submitted (the
    // contract of executor::backend::submit), waiting for the device to end it.
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (completer_.joinable()) completer_.join();
    cudaSetDevice(s_.place.device);
    for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
    if (compute_) cudaStreamSynchronize(compute_);
    if (base_) cudaFree(base_);
    for (auto* p : staging_) if (p) cudaFreeHost(p);
    if (ctx_.cudnn) cudnnDestroy(ctx_.cudnn);
    if (ctx_.lt) cublasLtDestroy(ctx_.lt);
    for (auto st : {copy_in_, compute_, copy_out_}) if (st) cudaStreamDestroy(st);
    for (auto& ev : events_)
      for (auto e : {ev.in_done, ev.compute_start, ev.compute_done, ev.out_done})
        if (e) cudaEventDestroy(e);
    cudaGetLastError();
  }

  bool blocks() const override { return true; }

  /// Batches overlap (issue 20, item 6): while batch N computes, batch N+1 is
  /// copied in on the copy stream, and N's outputs go out during N+1's compute.
  bool asynchronous() const override { return true; }
  /// One batch per pinned staging slot.
  uint32_t pipeline_depth() const override { return staging_slots; }

  /// Everything of the class comment: handles, plans, arena, capture.
  instance_report prepare();

  /// Runs a batch on the smallest planned size holding it. Allocates, plans and
  /// searches nothing. After a CUDA error: recover() (a recoverable error
  /// answers this batch and the instance goes on; a sticky one throws
  /// executor::executor_broken, here and for every later batch).
  exec_result execute(const executor::batch_view& batch, executor::output_writer& out) override;

  /// execute() without waiting: takes a free staging slot (waiting while both
  /// hold a batch), copies the inputs into its pinned staging and enqueues
  /// copy-in (copy stream), the size's graph (compute stream, after the
  /// copy-in) and copy-out (copy stream, after the compute), then returns. The
  /// completion thread waits for the batches in order, copies each one's
  /// outputs from staging into `out`, frees its slot and calls `done`. Errors
  /// as in execute(): a bad batch or a recoverable CUDA error completes with an
  /// error value; a sticky one throws executor_broken here, or completes with
  /// it when the device reports it later.
  void submit(const executor::batch_view& batch, executor::output_writer& out,
              executor::completion_handler done) override;

private:
  result<planned_graph> plan_rows(uint32_t rows) {
    return plan_at(*s_.graph, s_.config, s_.passes, rows, s_.options.compute, half_weights_);
  }
  /// Pointer table of `pg` with activations at `arena` and I/O in `slot`.
  std::vector<void*> pointers(const planned_graph& pg, uint8_t* arena, uint32_t slot) const;
  std::vector<gpu_step> build_steps(const planned_graph& pg, uint8_t* arena, uint32_t slot);
  void run_steps(const std::vector<gpu_step>& steps) {
    for (const auto& st : steps) st.launch(compute_);
  }
  bool batched() const { return s_.config.max_batch_size > 0; }
  /// Bytes of each declared output at `rows` rows, read from `slot`'s buffers.
  std::vector<std::vector<uint8_t>> read_outputs(uint32_t slot, uint32_t rows);
  /// The captured graph of (`size`, `slot`) against that size's steps launched
  /// directly, on the same random inputs; throws, naming what differs.
  void verify_replay(uint32_t size, uint32_t slot);
  /// Enqueues `batch` in `slot` (inputs staged, copy-in, compute, copy-out,
  /// the slot's events); the rows it runs, or why it cannot run. Throws on a
  /// CUDA error.
  result<uint32_t> enqueue(const executor::batch_view& batch, uint32_t slot);
  /// Copies `rows` rows of each output from `slot`'s staging into `out`, once
  /// the slot's copy-out is done.
  void write_outputs(uint32_t slot, uint32_t rows, executor::output_writer& out);
  /// After a failed batch: waits for the three streams, reads and clears the
  /// error state, and classifies it (cuda_errors.hpp). Either thread may call it.
  serving_error recover(const std::string& detail);
  void ensure_usable() {
    std::lock_guard<std::mutex> guard(health_mutex_);
    health_.ensure_usable();
  }
  /// The completion thread's body: batches in submission order.
  void complete_in_order();

  setup s_;
  std::mutex health_mutex_; ///< the submitting and the completion thread
  instance_health health_;
  step_context ctx_; ///< handles and workspace every step uses
  cudaStream_t copy_in_ = nullptr, compute_ = nullptr, copy_out_ = nullptr;
  /// Per staging slot, as two batches are in flight at once: copy-in done (the
  /// compute stream waits on it), compute start and end (timed: the stage
  /// times), copy-out done (the completion thread waits on it).
  struct slot_events {
    cudaEvent_t in_done = nullptr, compute_start = nullptr, compute_done = nullptr,
                out_done = nullptr;
  };
  std::array<slot_events, staging_slots> events_{};
  uint8_t* base_ = nullptr;
  device_arena_layout layout_;
  std::vector<uint8_t*> staging_;
  std::map<constant_key, const void*> constants_;
  size_plan sizes_;
  /// The weights' half copies at precision fp16/bf16, made once for every size.
  half_constants half_weights_;
  std::map<uint32_t, planned_graph> plans_; ///< by planned size
  std::map<std::pair<uint32_t, uint32_t>, cudaGraphExec_t> graphs_; ///< (captured size, slot)
  std::map<std::pair<uint32_t, uint32_t>, std::vector<gpu_step>> direct_steps_; ///< (size, slot)
  uint32_t max_rows_ = 1;

  // -- batches in flight (submit / the completion thread) ----------------------
  //
  // One activation arena serves both slots: every batch's steps run on the one
  // compute stream, so the steps of two batches never run at once, and a
  // batch's activations are dead once its compute ends. What two batches in
  // flight do share in time is each slot's own: its input and output buffers
  // (copy-in of N+1 while N computes, copy-out of N while N+1 computes) and its
  // pinned staging, which the slot holds until its outputs are copied out of
  // staging. The device workspace and cuDNN/cuBLASLt handles, like the arena,
  // are used on the compute stream only.
  struct in_flight {
    uint32_t slot = 0;
    uint32_t rows = 0;
    executor::output_writer* out = nullptr;
    executor::completion_handler done;
    /// Failed before it reached the device: completed with this, in order.
    std::optional<serving_error> failed;
  };
  staging_slot_pool slots_{staging_slots};
  std::mutex mutex_; ///< queue_ and stopping_
  std::condition_variable cv_;
  std::deque<in_flight> queue_;
  bool stopping_ = false;
  std::thread completer_; ///< started by prepare(), joined first by the destructor
};

std::vector<void*> cuda_backend::pointers(const planned_graph& pg, uint8_t* arena,
                                          uint32_t slot) const {
  const auto& g = pg.g;
  std::vector<void*> p(g.values.size(), nullptr);
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (g.values[v].constant)
      p[v] = const_cast<void*>(constants_.at(key_of(*g.values[v].constant)));
    else if (pg.memory.offsets[v] >= 0)
      p[v] = arena + pg.memory.offsets[v];
  }
  for (size_t i = 0; i < g.inputs.size(); ++i)
    p[g.inputs[i]] = base_ + layout_.inputs[slot][i].offset;
  for (size_t i = 0; i < s_.config.outputs.size(); ++i)
    for (int v : g.outputs)
      if (g.values[v].name == s_.config.outputs[i].name)
        p[v] = base_ + layout_.outputs[slot][i].offset;
  return p;
}

std::vector<gpu_step> cuda_backend::build_steps(const planned_graph& pg, uint8_t* arena,
                                                uint32_t slot) {
  step_builder b{&ctx_, pg.g, pointers(pg, arena, slot), {}, slot, pg.storage, &pg.narrowed};
  b.build();
  return std::move(b.steps);
}

std::vector<std::vector<uint8_t>> cuda_backend::read_outputs(uint32_t slot, uint32_t rows) {
  std::vector<std::vector<uint8_t>> outs;
  for (size_t i = 0; i < s_.config.outputs.size(); ++i) {
    const auto& r = layout_.outputs[slot][i];
    std::vector<uint8_t> bytes(r.bytes / max_rows_ * (batched() ? rows : 1));
    CAF_CUDA_CHECK(cudaMemcpy(bytes.data(), base_ + r.offset, bytes.size(),
                              cudaMemcpyDeviceToHost));
    outs.push_back(std::move(bytes));
  }
  return outs;
}

void cuda_backend::verify_replay(uint32_t size, uint32_t slot) {
  // The same random inputs for both runs (replay_check.hpp says why random).
  for (size_t i = 0; i < s_.config.inputs.size(); ++i) {
    const auto& t = s_.config.inputs[i];
    size_t elements = static_cast<size_t>(onnx::element_count(t.dims)) * (batched() ? size : 1);
    auto bytes = replay_inputs(t.dtype, elements, uint64_t{size} * 1000 + slot * 100 + i);
    CAF_CUDA_CHECK(cudaMemcpy(base_ + layout_.inputs[slot][i].offset, bytes.data(), bytes.size(),
                              cudaMemcpyHostToDevice));
  }
  // Legacy-stream copies do not order against the non-blocking streams.
  CAF_CUDA_CHECK(cudaDeviceSynchronize());
  run_steps(direct_steps_.at({size, slot}));
  CAF_CUDA_CHECK(cudaStreamSynchronize(compute_));
  auto direct = read_outputs(slot, size);
  // NaN everywhere (0xff bytes), so an output the graph does not write differs.
  for (const auto& r : layout_.outputs[slot])
    CAF_CUDA_CHECK(cudaMemset(base_ + r.offset, 0xff, r.bytes));
  CAF_CUDA_CHECK(cudaDeviceSynchronize());
  CAF_CUDA_CHECK(cudaGraphLaunch(graphs_.at({size, slot}), compute_));
  CAF_CUDA_CHECK(cudaStreamSynchronize(compute_));
  auto replay = read_outputs(slot, size);
  for (size_t i = 0; i < s_.config.outputs.size(); ++i) {
    const auto& t = s_.config.outputs[i];
    if (auto why = compare_replay(t.name, t.dtype, replay[i], direct[i]))
      throw std::runtime_error("the captured graph of batch size " + std::to_string(size)
                               + " (staging slot " + std::to_string(slot)
                               + ") does not compute what its steps compute launched directly: "
                               + *why);
  }
}

instance_report cuda_backend::prepare() {
  CAF_CUDA_CHECK(cudaSetDevice(s_.place.device));
  for (auto* st : {&copy_in_, &compute_, &copy_out_})
    CAF_CUDA_CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
  for (auto& ev : events_) {
    CAF_CUDA_CHECK(cudaEventCreateWithFlags(&ev.in_done, cudaEventDisableTiming));
    CAF_CUDA_CHECK(cudaEventCreate(&ev.compute_start));
    CAF_CUDA_CHECK(cudaEventCreate(&ev.compute_done));
    CAF_CUDA_CHECK(cudaEventCreate(&ev.out_done));
  }
  CAF_CUDA_CHECK(cublasLtCreate(&ctx_.lt));
  CAF_CUDA_CHECK(cudnnCreate(&ctx_.cudnn));
  CAF_CUDA_CHECK(cudnnSetStream(ctx_.cudnn, compute_));
  ctx_.compute = s_.options.compute;

  // Plan every size a batch can run at (plan_sizes.hpp), here at load; collect
  // the constants they read (with "none" too: the old backend planned no size
  // then, uploaded no weights and failed every request).
  max_rows_ = static_cast<uint32_t>(std::max(s_.config.max_batch_size, 1));
  sizes_ = plan_sizes(s_.options.buckets, s_.config.max_batch_size);
  device_arena_request req;
  std::vector<const onnx::tensor_data*> unique;
  std::map<constant_key, size_t> seen;
  for (uint32_t rows : sizes_.planned) {
    auto pg = plan_rows(rows);
    if (!pg) throw std::runtime_error(pg.error().message);
    for (const auto& v : pg->g.values)
      if (v.constant && seen.emplace(key_of(*v.constant), unique.size()).second)
        unique.push_back(v.constant.get());
    req.bucket_arenas.push_back(pg->memory.arena_bytes);
    plans_.emplace(rows, std::move(*pg));
  }
  for (const auto* t : unique) req.weights.push_back(t->bytes.size());
  size_t max_channels = 1;
  for (const auto& [rows, pg] : plans_)
    for (const auto& n : pg.g.nodes)
      if (n.op == "FusedConv") max_channels = std::max<size_t>(max_channels, pg.g.values[n.outputs[0]].shape[1]);
  req.weights.push_back(max_channels * sizeof(float)); // ctx_.zeros
  auto row_bytes = [&](const tensor_config& t) {
    return static_cast<size_t>(onnx::element_count(t.dims)) * element_size(t.dtype);
  };
  for (const auto& t : s_.config.inputs) req.input_row_bytes.push_back(row_bytes(t));
  for (const auto& t : s_.config.outputs) req.output_row_bytes.push_back(row_bytes(t));
  req.max_rows = max_rows_;
  req.slots = staging_slots;
  req.workspace = workspace_bytes;
  layout_ = plan_device_arena(req);

  // A model that does not fit is a clear load error, before any allocation.
  size_t free_bytes = 0, total_bytes = 0;
  CAF_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (auto why = check_fits(layout_, free_bytes, reserve_bytes, s_.config.name, s_.place.device))
    throw std::runtime_error(*why);
  CAF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), layout_.total_bytes));
  CAF_CUDA_CHECK(cudaMemset(base_, 0, layout_.total_bytes));
  for (size_t i = 0; i < unique.size(); ++i) {
    void* dst = base_ + layout_.weights[i].offset;
    CAF_CUDA_CHECK(cudaMemcpy(dst, unique[i]->bytes.data(), unique[i]->bytes.size(),
                              cudaMemcpyHostToDevice));
    constants_[key_of(*unique[i])] = dst;
  }
  ctx_.zeros = base_ + layout_.weights.back().offset;
  // The legacy-stream memset and copies above do not order against the
  // non-blocking streams; finish them before any step runs.
  CAF_CUDA_CHECK(cudaDeviceSynchronize());
  ctx_.workspace = base_ + layout_.workspace.offset;
  for (uint32_t s = 0; s < staging_slots; ++s)
    staging_.push_back(pinned_alloc(layout_.staging_bytes_per_slot));

  instance_report report;
  report.device = s_.place.device;
  report.device_bytes = layout_.total_bytes;
  report.pinned_bytes = layout_.staging_bytes_per_slot * staging_slots;
  report.arena = describe(layout_);

  // Steps per (planned size, slot): descriptors, cuBLASLt heuristics and cuDNN's
  // algorithm search all happen here, none on the request path.
  uint8_t* arena = base_ + layout_.activations.offset;
  for (auto& [rows, pg] : plans_)
    for (uint32_t slot = 0; slot < staging_slots; ++slot)
      direct_steps_[{rows, slot}] = build_steps(pg, arena, slot);
  const auto& largest = direct_steps_.at({sizes_.planned.back(), 0});
  report.steps = largest.size();
  report.host_steps = std::count_if(largest.begin(), largest.end(), [](const gpu_step& s) { return s.host; });
  // Sizes that run uncaptured get their first launch (lazy module loading,
  // library set-up) here too, largest first as the captured ones.
  for (auto it = sizes_.planned.rbegin(); it != sizes_.planned.rend(); ++it)
    if (!std::binary_search(sizes_.captured.begin(), sizes_.captured.end(), *it))
      for (uint32_t slot = 0; slot < staging_slots; ++slot)
        run_steps(direct_steps_.at({*it, slot}));
  CAF_CUDA_CHECK(cudaStreamSynchronize(compute_));
  // Then warm-up / capture / verify of the captured sizes in capture_order.
  auto order = capture_order(sizes_.captured);
  if (auto broken = check_capture_order(order); !broken.empty())
    throw std::logic_error("capture order: " + broken);
  for (const auto& step : order) {
    switch (step.action) {
      case prepare_action::warm_up:
        for (uint32_t slot = 0; slot < staging_slots; ++slot)
          run_steps(direct_steps_.at({step.bucket, slot}));
        CAF_CUDA_CHECK(cudaStreamSynchronize(compute_));
        break;
      case prepare_action::capture:
        for (uint32_t slot = 0; slot < staging_slots; ++slot) {
          cudaGraph_t graph = nullptr;
          CAF_CUDA_CHECK(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal));
          run_steps(direct_steps_.at({step.bucket, slot}));
          CAF_CUDA_CHECK(cudaStreamEndCapture(compute_, &graph));
          cudaGraphExec_t exec = nullptr;
          CAF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
          CAF_CUDA_CHECK(cudaGraphDestroy(graph));
          graphs_[{step.bucket, slot}] = exec;
        }
        break;
      case prepare_action::verify:
        // Every slot's graph: each reads and writes its own I/O buffers.
        for (uint32_t slot = 0; slot < staging_slots; ++slot)
          verify_replay(step.bucket, slot);
        break;
      case prepare_action::ready:
        break;
    }
  }
  completer_ = std::thread([this] { complete_in_order(); });
  return report;
}

exec_result cuda_backend::execute(const executor::batch_view& batch, executor::output_writer& out) {
  ensure_usable();
  uint32_t slot = slots_.acquire();
  struct release_at_end {
    cuda_backend* self;
    uint32_t slot;
    ~release_at_end() { self->slots_.release(slot); }
  } release{this, slot};
  try {
    auto rows = enqueue(batch, slot);
    if (!rows) return rows.error();
    CAF_CUDA_CHECK(cudaEventSynchronize(events_[slot].out_done));
    if (auto bad = ctx_.flags.take(slot)) // a device step's error flag (Gather's indices)
      return serving_error{status_code::bad_request, "model '" + s_.config.name + "': " + *bad};
    write_outputs(slot, *rows, out);
    return {};
  } catch (const executor::executor_broken&) {
    throw;
  } catch (const std::exception& e) {
    return recover(e.what());
  }
}

void cuda_backend::submit(const executor::batch_view& batch, executor::output_writer& out,
                          executor::completion_handler done) {
  ensure_usable();
  in_flight f;
  f.slot = slots_.acquire();
  f.out = &out;
  f.done = std::move(done);
  try {
    auto rows = enqueue(batch, f.slot);
    if (rows)
      f.rows = *rows;
    else
      f.failed = rows.error();
  } catch (const executor::executor_broken&) {
    slots_.release(f.slot);
    throw;
  } catch (const std::exception& e) {
    try {
      f.failed = recover(e.what());
    } catch (...) { // sticky: executor_broken, and `done` is not called
      slots_.release(f.slot);
      throw;
    }
  }
  {
    std::lock_guard<std::mutex> guard(mutex_);
    queue_.push_back(std::move(f));
  }
  cv_.notify_all();
}

void cuda_backend::complete_in_order() {
  cudaSetDevice(s_.place.device);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return; // stopping, and every batch completed
    auto f = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    executor::batch_completion c;
    if (f.failed) {
      c.status = *f.failed;
    } else {
      try {
        const auto& ev = events_[f.slot];
        CAF_CUDA_CHECK(cudaEventSynchronize(ev.out_done));
        // The device's own times, placed on the host clock by the moment the
        // copy-out was seen done: compute_start is when the stream reached
        // this batch's graph (after its copy-in and the batch before it).
        int64_t seen = now_ns();
        float compute_ms = 0, copy_out_ms = 0;
        CAF_CUDA_CHECK(cudaEventElapsedTime(&compute_ms, ev.compute_start, ev.compute_done));
        CAF_CUDA_CHECK(cudaEventElapsedTime(&copy_out_ms, ev.compute_done, ev.out_done));
        c.compute_end_ns = seen - static_cast<int64_t>(copy_out_ms * 1e6);
        c.compute_start_ns = c.compute_end_ns - static_cast<int64_t>(compute_ms * 1e6);
        if (auto bad = ctx_.flags.take(f.slot)) // a device step's error flag (Gather's indices)
          c.status = serving_error{status_code::bad_request,
                                   "model '" + s_.config.name + "': " + *bad};
        else
          write_outputs(f.slot, f.rows, *f.out);
      } catch (const std::exception& e) {
        try {
          c.status = recover(e.what());
        } catch (...) { // sticky: executor_broken stops the executor
          c.thrown = std::current_exception();
        }
      }
    }
    slots_.release(f.slot);
    f.done(std::move(c));
    lock.lock();
  }
}

serving_error cuda_backend::recover(const std::string& detail) {
  // Drain what the failed batch enqueued, so the next batch starts on idle
  // streams; each call returns a sticky error if the context has one. With a
  // batch in flight in the other slot this waits for it too, which is harmless:
  // it completes as it would have.
  cudaError_t codes[] = {cudaSetDevice(s_.place.device), cudaStreamSynchronize(copy_in_),
                         cudaStreamSynchronize(compute_), cudaStreamSynchronize(copy_out_),
                         cudaGetLastError()}; // the last also clears a recoverable error
  std::string what = detail;
  for (auto c : codes)
    if (c != cudaSuccess && what.find(cudaGetErrorName(c)) == std::string::npos)
      what += std::string("; then ") + cudaGetErrorName(c);
  auto fault = worst_fault({codes[0], codes[1], codes[2], codes[3], codes[4]});
  std::lock_guard<std::mutex> guard(health_mutex_);
  return health_.after_failure(fault, what);
}

result<uint32_t> cuda_backend::enqueue(const executor::batch_view& batch, uint32_t slot) {
  CAF_CUDA_CHECK(cudaSetDevice(s_.place.device));
  uint32_t rows = batched() ? batch.rows : 1;
  auto run = run_shape_for(sizes_, rows);
  if (!run)
    return serving_error{status_code::bad_request,
                         "model '" + s_.config.name + "': batch of " + std::to_string(rows)
                           + " rows exceeds max_batch_size " + std::to_string(max_rows_)};
  // Set by warm-up's random inputs or this slot's previous batch: not this
  // batch's. The other slot's flags belong to the batch in flight there.
  ctx_.flags.take(slot);
  uint8_t* stage = staging_[slot];
  size_t slot_base = layout_.inputs[slot].empty() ? layout_.outputs[slot][0].offset
                                                  : layout_.inputs[slot][0].offset;
  const auto& ev = events_[slot];
  // Copy in: the real rows through pinned staging; padding rows are zeroed on
  // the device, so the planned size reads a defined batch.
  for (size_t i = 0; i < s_.config.inputs.size(); ++i) {
    const auto& t = batch.inputs.at(i);
    const auto& r = layout_.inputs[slot][i];
    if (t.size > r.bytes)
      return serving_error{status_code::bad_request,
                           "model '" + s_.config.name + "': input '" + std::string(t.name)
                             + "' has " + std::to_string(t.size) + " bytes, more than "
                             + std::to_string(r.bytes) + " for " + std::to_string(max_rows_)
                             + " rows"};
    std::memcpy(stage + (r.offset - slot_base), t.data, t.size);
    CAF_CUDA_CHECK(cudaMemcpyAsync(base_ + r.offset, stage + (r.offset - slot_base), t.size,
                                   cudaMemcpyHostToDevice, copy_in_));
    size_t padded = t.size / rows * run->size;
    if (padded > t.size)
      CAF_CUDA_CHECK(cudaMemsetAsync(base_ + r.offset + t.size, 0, padded - t.size, copy_in_));
  }
  CAF_CUDA_CHECK(cudaEventRecord(ev.in_done, copy_in_));
  CAF_CUDA_CHECK(cudaStreamWaitEvent(compute_, ev.in_done, 0));
  CAF_CUDA_CHECK(cudaEventRecord(ev.compute_start, compute_));
  if (run->graph)
    CAF_CUDA_CHECK(cudaGraphLaunch(graphs_.at({run->size, slot}), compute_));
  else
    run_steps(direct_steps_.at({run->size, slot}));
  CAF_CUDA_CHECK(cudaEventRecord(ev.compute_done, compute_));
  CAF_CUDA_CHECK(cudaStreamWaitEvent(copy_out_, ev.compute_done, 0));
  for (size_t i = 0; i < s_.config.outputs.size(); ++i) {
    const auto& r = layout_.outputs[slot][i];
    size_t bytes = r.bytes / max_rows_ * (batched() ? rows : 1);
    CAF_CUDA_CHECK(cudaMemcpyAsync(stage + (r.offset - slot_base), base_ + r.offset, bytes,
                                   cudaMemcpyDeviceToHost, copy_out_));
  }
  CAF_CUDA_CHECK(cudaEventRecord(ev.out_done, copy_out_));
  return rows;
}

void cuda_backend::write_outputs(uint32_t slot, uint32_t rows, executor::output_writer& out) {
  CAF_CUDA_CHECK(cudaEventSynchronize(events_[slot].out_done));
  uint8_t* stage = staging_[slot];
  size_t slot_base = layout_.inputs[slot].empty() ? layout_.outputs[slot][0].offset
                                                  : layout_.inputs[slot][0].offset;
  for (size_t i = 0; i < s_.config.outputs.size(); ++i) {
    const auto& t = s_.config.outputs[i];
    const auto& r = layout_.outputs[slot][i];
    size_t bytes = r.bytes / max_rows_ * (batched() ? rows : 1);
    dims_t shape_out = t.dims;
    if (batched()) shape_out.insert(shape_out.begin(), rows);
    uint8_t* dst = out.allocate(t.name, t.dtype, shape_out, bytes);
    std::memcpy(dst, stage + (r.offset - slot_base), bytes);
  }
}

} // namespace

std::vector<std::string> device_step_ops() {
  return device_steps().ops();
}

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {

/// The graph and configuration a GPU instance plans from: imported, completed
/// and checked as for the CPU backend, inputs in the configuration's order.
struct gpu_graph {
  model_config config;
  std::shared_ptr<const onnx::graph> graph;
  onnx::pass_config passes;
};

result<gpu_graph> import_for_gpu(const cuda_model_config& mcfg) {
  auto bad = [&](const std::string& what) {
    return serving_error{status_code::bad_request, "model '" + mcfg.config.name + "': " + what};
  };
  auto imported = onnx::import_model(mcfg.model_file);
  if (!imported) return bad(imported.error().message);
  onnx::graph g = std::move(*imported);
  if (!g.strings.inputs.empty())
    return bad("the graph has STRING tensors, which KIND_GPU instances do not pass through; use "
               "instance_group { kind: KIND_CPU }");
  // The model library completes and checks the configuration against the
  // graph, as for the CPU backend; the GPU instances then plan from the graph.
  auto completed = onnx::complete_model_config(g, {mcfg.model_file, mcfg.config});
  if (!completed) return completed.error();
  // The GPU plans run fixed shapes besides the batch; the CPU backend takes
  // variable ones (onnx_cpu/onnx_backend.hpp).
  for (const auto& t : completed->client.inputs)
    for (auto d : t.dims)
      if (d < 0)
        return bad("input '" + t.name + "' has a variable dimension besides the batch ("
                   + onnx::shape_string(t.dims) + "), which KIND_GPU instances do not run; give "
                   "it a fixed size in config.pbtxt dims, or use instance_group { kind: "
                   "KIND_CPU }");
  std::vector<int> ordered;
  for (const auto& t : completed->client.inputs)
    for (int v : g.inputs)
      if (g.values[v].name == t.name) ordered.push_back(v);
  g.inputs = ordered;
  gpu_graph out;
  out.config = completed->client;
  out.graph = std::make_shared<const onnx::graph>(std::move(g));
  // QDQ groups stay DQ -> fp32 operator -> Q on the GPU: the QLinearConv,
  // QLinearMatMul, QLinearAdd and QMaxPool that fuse_qdq writes have no device
  // step here, and would run as host reference kernels.
  out.passes = mcfg.passes;
  out.passes.fuse_qdq = false;
  return out;
}

} // namespace

result<plan_report> plan_model(const cuda_model_config& mcfg) {
  auto options = read_gpu_options(mcfg.config);
  if (!options) return options.error();
  auto gg = import_for_gpu(mcfg);
  if (!gg) return gg.error();
  auto sizes = plan_sizes(options->buckets, gg->config.max_batch_size);
  plan_report report;
  report.storage = storage_type(options->compute);
  half_constants constants;
  for (uint32_t rows : sizes.planned) {
    auto bg = plan_at(*gg->graph, gg->config, gg->passes, rows, options->compute, constants);
    if (!bg) return bg.error();
    step_builder b{nullptr, bg->g, std::vector<void*>(bg->g.values.size(), nullptr), {}, 0,
                   bg->storage, &bg->narrowed};
    b.build();
    plan_report::bucket pb;
    pb.rows = rows;
    pb.captured = std::binary_search(sizes.captured.begin(), sizes.captured.end(), rows);
    pb.arena_bytes = bg->memory.arena_bytes;
    for (size_t v = 0; v < bg->g.values.size(); ++v)
      if (bg->memory.offsets[v] >= 0)
        pb.arena_types[std::string(to_string(bg->g.values[v].dtype))] += 1;
    for (size_t i = 0; i < b.steps.size(); ++i) {
      const auto& st = b.steps[i];
      pb.kernels[st.kernel] += 1;
      if (st.host) pb.host_nodes.push_back(bg->g.nodes[i].op + " '" + bg->g.nodes[i].name + "'");
    }
    pb.steps = b.steps.size();
    report.buckets.push_back(std::move(pb));
  }
  return report;
}

result<cuda_model> load_cuda_model(const cuda_model_config& mcfg) {
  auto bad = [&](const std::string& what) {
    return serving_error{status_code::bad_request, "model '" + mcfg.config.name + "': " + what};
  };
  auto options = read_gpu_options(mcfg.config);
  if (!options) return options.error();
  int devices = visible_devices();
  if (devices == 0)
    return serving_error{status_code::unavailable,
                         "model '" + mcfg.config.name + "' asks for KIND_GPU instances, but no "
                         "CUDA device is visible (driver missing or CUDA_VISIBLE_DEVICES empty); "
                         "use instance_group { kind: KIND_CPU } on this machine"};
  for (const auto& p : options->placements)
    if (p.device >= devices)
      return bad("instance_group lists GPU " + std::to_string(p.device) + ", but only "
                 + std::to_string(devices) + " CUDA device(s) are visible (0.."
                 + std::to_string(devices - 1) + ")");
  auto gg = import_for_gpu(mcfg);
  if (!gg) return gg.error();
  auto shared = gg->graph;

  cuda_model m;
  m.config = gg->config;
  m.options = *options;
  std::ostringstream os;
  os << "CUDA, precision " << to_string(options->compute) << ", " << options->placements.size()
     << " instance(s), graphs at batch sizes [";
  for (size_t i = 0; i < options->buckets.size(); ++i)
    os << (i ? "," : "") << options->buckets[i];
  auto sizes = plan_sizes(options->buckets, gg->config.max_batch_size);
  os << "], planned at [";
  for (size_t i = 0; i < sizes.planned.size(); ++i)
    os << (i ? "," : "") << sizes.planned[i];
  os << "]";
  m.summary = os.str();
  m.make_instance = [shared, c = m.config, o = *options, passes = gg->passes](
                      const gpu_placement& p) -> result<cuda_instance> {
    try {
      auto be = std::make_shared<cuda_backend>(cuda_backend::setup{shared, c, o, passes, p});
      auto report = be->prepare();
      return cuda_instance{be, report};
    } catch (const std::exception& e) {
      return serving_error{status_code::internal,
                           "model '" + c.name + "' on GPU " + std::to_string(p.device)
                             + ": preparing the executor failed: " + e.what()};
    }
  };
  return m;
}

} // namespace caf_serving::cuda
