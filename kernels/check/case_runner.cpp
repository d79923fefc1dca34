#include "check/case_runner.hpp"

#include "check/case_runner_elementwise.hpp"
#include "check/device_buffer.hpp"
#include "check/case_runner_data.hpp"

#include "cpu/half.hpp"
#include "cpu/reference.hpp"
#include "cuda/add_layer_norm.hpp"
#include "cuda/attention.hpp"
#include "cuda/batch_copy.hpp"
#include "cuda/check.hpp"
#include "cuda/convert.hpp"
#include "cuda/epilogue.hpp"
#include "cuda/softmax.hpp"
#include "cuda/softmax_top_k.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <utility>

namespace caf_serving::kernels {
namespace {

// ---- typed host data -----------------------------------------------------------------

/// Values already rounded to `type`, as floats for the references and as the raw
/// bytes the device gets.
struct host_tensor {
  dtype type = dtype::f32;
  std::vector<float> values;
  std::vector<std::uint8_t> bytes;
};

void store(dtype type, float x, std::uint8_t* out) {
  if (type == dtype::f32) {
    std::memcpy(out, &x, 4);
  } else {
    std::uint16_t bits = type == dtype::f16 ? to_fp16(x).bits : to_bf16(x).bits;
    std::memcpy(out, &bits, 2);
  }
}

float load(dtype type, const std::uint8_t* in) {
  if (type == dtype::f32) {
    float x;
    std::memcpy(&x, in, 4);
    return x;
  }
  std::uint16_t bits;
  std::memcpy(&bits, in, 2);
  return type == dtype::f16 ? to_float(fp16_bits{bits}) : to_float(bf16_bits{bits});
}

host_tensor random_tensor(dtype type, std::size_t n, float lo, float hi,
                          std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  host_tensor t{type, std::vector<float>(n), std::vector<std::uint8_t>(n * dtype_size(type))};
  for (std::size_t i = 0; i < n; ++i) {
    store(type, dist(rng), t.bytes.data() + i * dtype_size(type));
    t.values[i] = load(type, t.bytes.data() + i * dtype_size(type));
  }
  return t;
}

device_buffer to_device(const host_tensor& t) {
  device_buffer d(t.bytes.size());
  d.upload(t.bytes.data());
  return d;
}

std::vector<float> download_floats(const device_buffer& d, dtype type) {
  auto raw = d.download();
  std::size_t n = raw.size() / dtype_size(type);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = load(type, raw.data() + i * dtype_size(type));
  return out;
}

check_result compare(const std::vector<float>& got, const std::vector<float>& want,
                     tolerance tol, const char* what) {
  check_result r;
  if (got.size() != want.size()) {
    r.ok = false;
    r.detail = std::string(what) + ": " + std::to_string(got.size()) + " elements, expected "
               + std::to_string(want.size());
    return r;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    bool good = err <= tol.abs + tol.rel * std::fabs(want[i]); // false for NaN
    if (!std::isnan(err))
      r.max_abs_error = std::max(r.max_abs_error, err);
    if (!good && r.ok) {
      r.ok = false;
      std::ostringstream os;
      os << what << "[" << i << "] = " << got[i] << ", expected " << want[i]
         << " (error " << err << " > " << tol.abs << " + " << tol.rel << "·|expected|)";
      r.detail = os.str();
    }
  }
  return r;
}

check_result merge(check_result a, const check_result& b) {
  if (a.ok && !b.ok)
    a.detail = b.detail;
  a.ok = a.ok && b.ok;
  a.max_abs_error = std::max(a.max_abs_error, b.max_abs_error);
  return a;
}

// ---- one class per op ----------------------------------------------------------------

class epilogue_run : public case_run {
public:
  epilogue_run(const kernel_case& c, const case_size& s, case_run_config cfg) : c_(c) {
    std::mt19937_64 rng(cfg.seed);
    std::size_t count = s.rows * s.cols * s.inner;
    layout_ = {s.cols, s.inner};
    auto x = random_tensor(c.type, count, -3.0f, 3.0f, rng);
    auto bias = random_tensor(c.type, s.cols, -1.0f, 1.0f, rng);
    auto res = random_tensor(c.type, count, -1.0f, 1.0f, rng);
    in_ = to_device(x);
    if (c.bias)
      bias_ = to_device(bias);
    if (c.residual)
      res_ = to_device(res);
    out_ = device_buffer(count * dtype_size(c.type));
    count_ = count;
    if (cfg.with_reference) { // the unfused chain: bias, activation and residual in order
      auto y = c.bias ? ref::add_bias(x.values, bias.values, layout_) : x.values;
      if (c.residual && c.residual_first)
        y = ref::add(y, res.values);
      y = ref::apply_activation(y, c.act, c.act_params);
      want_ = c.residual && !c.residual_first ? ref::add(y, res.values) : y;
    }
  }
  void poison(cudaStream_t stream) override {
    out_.poison(stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    epilogue_args a;
    a.type = c_.type;
    a.input = in_.get();
    a.bias = bias_.get();
    a.residual = res_.get();
    a.output = out_.get();
    a.count = count_;
    a.layout = layout_;
    a.act = c_.act;
    a.params = c_.act_params;
    a.residual_first = c_.residual_first;
    a.threads = cfg.threads;
    launch_epilogue(a, stream);
  }
  check_result verify() override {
    return compare(download_floats(out_, c_.type), want_, c_.tol, "output");
  }
  work_size work() const override {
    double elems = static_cast<double>(count_) * (2 + (c_.residual ? 1 : 0));
    return {elems * dtype_size(c_.type), 0};
  }

private:
  const kernel_case& c_;
  bias_layout layout_;
  std::size_t count_ = 0;
  device_buffer in_, bias_, res_, out_;
  std::vector<float> want_;
};

class layer_norm_run : public case_run {
public:
  layer_norm_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : c_(c), shape_{s.rows, s.cols} {
    std::mt19937_64 rng(cfg.seed);
    std::size_t n = s.rows * s.cols;
    // An offset in the input checks that the mean is removed before the variance.
    auto x = random_tensor(c.type, n, 2.0f, 4.0f, rng);
    auto res = random_tensor(c.type, n, -1.0f, 1.0f, rng);
    auto gamma = random_tensor(c.type, s.cols, 0.5f, 1.5f, rng);
    auto beta = random_tensor(c.type, s.cols, -0.5f, 0.5f, rng);
    in_ = to_device(x);
    if (c.residual)
      res_ = to_device(res);
    gamma_ = to_device(gamma);
    beta_ = to_device(beta);
    out_ = device_buffer(n * dtype_size(c.type));
    if (c.residual)
      sum_ = device_buffer(n * dtype_size(c.type));
    if (cfg.with_reference) { // the unfused chain: add, then layer norm
      auto sum = c.residual ? ref::add(x.values, res.values) : x.values;
      // The kernel returns the sum rounded to the type; normalise what it rounds from.
      want_sum_ = sum;
      for (auto& v : want_sum_) {
        std::uint8_t b[4];
        store(c.type, v, b);
        v = load(c.type, b);
      }
      want_ = ref::layer_norm(sum, shape_, gamma.values, beta.values, eps_);
    }
  }
  void poison(cudaStream_t stream) override {
    out_.poison(stream);
    sum_.poison(stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    add_layer_norm_args a;
    a.type = c_.type;
    a.input = in_.get();
    a.residual = res_.get();
    a.gamma = gamma_.get();
    a.beta = beta_.get();
    a.output = out_.get();
    a.sum_output = sum_.get();
    a.rows = shape_.rows;
    a.cols = shape_.cols;
    a.eps = eps_;
    a.threads = cfg.threads;
    launch_add_layer_norm(a, stream);
  }
  check_result verify() override {
    auto r = compare(download_floats(out_, c_.type), want_, c_.tol, "output");
    if (c_.residual) // the sum itself is exact before its one rounding
      r = merge(r, compare(download_floats(sum_, c_.type), want_sum_, {0, 0}, "sum_output"));
    return r;
  }
  work_size work() const override {
    double elems = static_cast<double>(shape_.rows * shape_.cols);
    return {elems * dtype_size(c_.type) * (c_.residual ? 4 : 2), 0};
  }

private:
  const kernel_case& c_;
  ref::row_shape shape_;
  float eps_ = 1e-5f;
  device_buffer in_, res_, gamma_, beta_, out_, sum_;
  std::vector<float> want_, want_sum_;
};

class softmax_run : public case_run {
public:
  softmax_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : c_(c), shape_{s.rows, s.cols} {
    std::mt19937_64 rng(cfg.seed);
    auto x = random_tensor(c.type, s.rows * s.cols, -8.0f, 8.0f, rng);
    in_ = to_device(x);
    out_ = device_buffer(x.bytes.size());
    mask_.kind = c.mask;
    if (c.mask_shape != softmax_mask_shape::rows) {
      scores_mask(c.mask_shape, s, rng);
      if (cfg.with_reference)
        want_ = ref::softmax(x.values, shape_, mask_);
      return;
    }
    // Two mask rows broadcast over all rows; the second one masks everything, to
    // check that fully masked rows come out as zeros.
    mask_.mask_rows = std::min<std::size_t>(2, s.rows);
    std::size_t mask_elems = mask_.mask_rows * s.cols;
    if (c.mask == mask_kind::additive) {
      std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
      for (std::size_t i = 0; i < mask_elems; ++i)
        mask_.additive.push_back(i % 5 == 0 ? -INFINITY : dist(rng));
      upload_additive_mask();
    } else if (c.mask == mask_kind::boolean) {
      std::bernoulli_distribution keep(0.7);
      for (std::size_t i = 0; i < mask_elems; ++i)
        mask_.keep.push_back(i >= s.cols ? 0 : keep(rng) ? 1 : 0);
      mask_data_ = device_buffer(mask_elems);
      mask_data_.upload(mask_.keep.data());
    }
    if (cfg.with_reference)
      want_ = ref::softmax(x.values, shape_, mask_);
  }
  void poison(cudaStream_t stream) override {
    out_.poison(stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    softmax_args a;
    a.type = c_.type;
    a.input = in_.get();
    a.output = out_.get();
    a.rows = shape_.rows;
    a.cols = shape_.cols;
    a.mask = c_.mask;
    a.mask_data = mask_data_.get();
    a.mask_type = c_.mask_type;
    a.mask_rows = mask_.mask_rows;
    a.mask_layout = mask_.layout;
    a.threads = cfg.threads;
    launch_softmax(a, stream);
  }
  check_result verify() override {
    return compare(download_floats(out_, c_.type), want_, c_.tol, "output");
  }
  work_size work() const override {
    return {static_cast<double>(shape_.rows * shape_.cols) * dtype_size(c_.type) * 2, 0};
  }

private:
  /// An additive attention mask of `shape` for scores [batch, heads, seq] x cols,
  /// with its strides: values in [-4, 4] and -inf, fully masked rows included.
  void scores_mask(softmax_mask_shape shape, const case_size& s, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    std::size_t keys = s.cols;
    auto& l = mask_.layout;
    l.heads = s.heads;
    l.queries = s.seq;
    auto& m = mask_.additive;
    switch (shape) {
      case softmax_mask_shape::padding: // [B, 1, 1, K]
        l.outer = keys;
        for (std::size_t b = 0; b < s.batch; ++b)
          for (std::size_t k = 0; k < keys; ++k)
            m.push_back(b == 1 || (k > 0 && k % 5 == 0) ? -INFINITY : dist(rng));
        break;
      case softmax_mask_shape::causal: // [Q, K], aligned at the end as torch's is_causal
        l.query = keys;
        for (std::size_t q = 0; q < s.seq; ++q)
          for (std::size_t k = 0; k < keys; ++k)
            m.push_back(k + s.seq > q + keys ? -INFINITY : dist(rng));
        break;
      case softmax_mask_shape::full: // [B, H, Q, K]
        l.query = keys;
        l.head = s.seq * keys;
        l.outer = s.heads * s.seq * keys;
        for (std::size_t i = 0; i < s.rows * keys; ++i)
          m.push_back(i % 5 == 0 ? -INFINITY : dist(rng));
        break;
      case softmax_mask_shape::rows:
        break;
    }
    upload_additive_mask();
  }

  /// Stores the additive mask in the case's mask_type on the device, and keeps
  /// for the reference the values the kernel reads (rounded to that type).
  void upload_additive_mask() {
    const dtype t = c_.mask_type;
    std::vector<std::uint8_t> bytes(mask_.additive.size() * dtype_size(t));
    for (std::size_t i = 0; i < mask_.additive.size(); ++i) {
      store(t, mask_.additive[i], bytes.data() + i * dtype_size(t));
      mask_.additive[i] = load(t, bytes.data() + i * dtype_size(t));
    }
    mask_data_ = device_buffer(bytes.size());
    mask_data_.upload(bytes.data());
  }

  const kernel_case& c_;
  ref::row_shape shape_;
  ref::softmax_mask mask_;
  device_buffer in_, out_, mask_data_;
  std::vector<float> want_;
};

/// [batch, heads, seq, dim] bytes rearranged to [batch, seq, heads, dim] (`to_bshd`)
/// or back: the executor's [B, S, H*D] layout, with the heads interleaved.
std::vector<std::uint8_t> swap_heads_and_seq(const std::vector<std::uint8_t>& in,
                                             const ref::attention_shape& s, std::size_t element,
                                             bool to_bshd) {
  std::vector<std::uint8_t> out(in.size());
  std::size_t row = s.head_dim * element;
  for (std::size_t b = 0; b < s.batch; ++b)
    for (std::size_t h = 0; h < s.heads; ++h)
      for (std::size_t i = 0; i < s.seq; ++i) {
        std::size_t bhsd = ((b * s.heads + h) * s.seq + i) * row;
        std::size_t bshd = ((b * s.seq + i) * s.heads + h) * row;
        std::memcpy(out.data() + (to_bshd ? bshd : bhsd), in.data() + (to_bshd ? bhsd : bshd),
                    row);
      }
  return out;
}

class attention_run : public case_run {
public:
  attention_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : c_(c), shape_{s.batch, s.heads, s.seq, static_cast<std::size_t>(c.head_dim)} {
    std::mt19937_64 rng(cfg.seed);
    std::size_t n = s.batch * s.heads * s.seq * shape_.head_dim;
    // Q and K in [-2, 2] give scores with a standard deviation of ~1.3 after the
    // 1/sqrt(d) scale: peaked enough that the online max and rescaling matter.
    auto q = random_tensor(c.type, n, -2.0f, 2.0f, rng);
    auto k = random_tensor(c.type, n, -2.0f, 2.0f, rng);
    auto v = random_tensor(c.type, n, -1.0f, 1.0f, rng);
    q_ = to_device(laid_out(q));
    k_ = to_device(laid_out(k));
    v_ = to_device(laid_out(v));
    o_ = device_buffer(q.bytes.size());
    ref::attention_masks masks;
    if (c.padded) { // lengths 0..seq, the first always full
      std::uniform_int_distribution<int> len(0, static_cast<int>(s.seq));
      for (std::size_t b = 0; b < s.batch; ++b)
        masks.key_lengths.push_back(b == 0 ? static_cast<int>(s.seq) : len(rng));
      if (s.batch > 1)
        masks.key_lengths[1] = 0; // a sequence with no keys at all
      lengths_dev_ = device_buffer(masks.key_lengths.size() * sizeof(int));
      lengths_dev_.upload(masks.key_lengths.data());
    }
    if (c.attention_mask != attention_mask_shape::none)
      make_mask(s, masks, rng);
    scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    if (cfg.with_reference)
      want_ = ref::attention(q.values, k.values, v.values, shape_, masks, scale_);
  }
  void poison(cudaStream_t stream) override {
    o_.poison(stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    attention_args a;
    a.rows_per_warp = cfg.rows_per_warp;
    a.type = c_.type;
    a.q = q_.get();
    a.k = k_.get();
    a.v = v_.get();
    a.o = o_.get();
    auto d = static_cast<std::int64_t>(shape_.head_dim);
    auto seq = static_cast<std::int64_t>(shape_.seq);
    auto h = static_cast<std::int64_t>(shape_.heads);
    if (c_.heads_interleaved) // [B, S, H*D]
      a.strides = {seq * h * d, d, h * d};
    else // [B, H, S, D]
      a.strides = {h * seq * d, seq * d, d};
    a.batch = static_cast<int>(shape_.batch);
    a.heads = static_cast<int>(shape_.heads);
    a.seq = static_cast<int>(shape_.seq);
    a.head_dim = c_.head_dim;
    a.key_lengths = static_cast<const int*>(lengths_dev_.get());
    a.mask = mask_;
    a.mask.data = mask_dev_.get();
    a.softmax_scale = scale_;
    launch_attention(a, stream);
  }
  check_result verify() override {
    auto raw = o_.download();
    if (c_.heads_interleaved)
      raw = swap_heads_and_seq(raw, shape_, dtype_size(c_.type), false);
    std::vector<float> got(raw.size() / dtype_size(c_.type));
    for (std::size_t i = 0; i < got.size(); ++i)
      got[i] = load(c_.type, raw.data() + i * dtype_size(c_.type));
    return compare(got, want_, c_.tol, "output");
  }
  work_size work() const override {
    double bhs = static_cast<double>(shape_.batch * shape_.heads * shape_.seq);
    double d = static_cast<double>(shape_.head_dim);
    return {4 * bhs * d * dtype_size(c_.type), 4 * bhs * static_cast<double>(shape_.seq) * d};
  }

private:
  /// A [batch, heads, seq, dim] tensor in the case's layout.
  host_tensor laid_out(host_tensor t) const {
    if (c_.heads_interleaved)
      t.bytes = swap_heads_and_seq(t.bytes, shape_, dtype_size(t.type), true);
    return t;
  }

  /// The case's additive mask (attention_mask_shape), rounded to its type, into
  /// `masks` for the reference and onto the device with its strides.
  void make_mask(const case_size& s, ref::attention_masks& masks, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    // What a masked key holds: -inf, or torch's finfo(float32).min in an f32
    // GPT-2-style mask (the kernel must still give those rows a uniform softmax).
    const bool lowest = c_.attention_mask == attention_mask_shape::padding_causal
                        && c_.attention_mask_type == dtype::f32;
    const float masked = lowest ? std::numeric_limits<float>::lowest() : -INFINITY;
    std::size_t seq = s.seq;
    std::vector<float> m;
    switch (c_.attention_mask) {
      case attention_mask_shape::padding: // [B, 1, 1, S]
        masks.batch = seq;
        for (std::size_t b = 0; b < s.batch; ++b)
          for (std::size_t j = 0; j < seq; ++j)
            m.push_back(b == 1 || (j > 0 && j % 7 == 0) ? masked : dist(rng));
        break;
      case attention_mask_shape::causal: // [S, S]
        masks.query = seq;
        for (std::size_t i = 0; i < seq; ++i)
          for (std::size_t j = 0; j < seq; ++j)
            m.push_back(j > i ? masked : dist(rng));
        break;
      case attention_mask_shape::padding_causal: { // [B, 1, S, S], left padding
        masks.batch = seq * seq;
        masks.query = seq;
        std::uniform_int_distribution<std::size_t> pad(0, seq / 2);
        for (std::size_t b = 0; b < s.batch; ++b) {
          std::size_t p = b == 0 ? 0 : b == 1 ? std::min<std::size_t>(5, seq) : pad(rng);
          for (std::size_t i = 0; i < seq; ++i)
            for (std::size_t j = 0; j < seq; ++j)
              m.push_back(j > i || j < p ? masked : dist(rng));
        }
        break;
      }
      case attention_mask_shape::per_head: // [B, H, S, S]
        masks.query = seq;
        masks.head = seq * seq;
        masks.batch = s.heads * seq * seq;
        for (std::size_t i = 0; i < s.batch * s.heads * seq * seq; ++i)
          m.push_back(i % 5 == 0 ? masked : dist(rng));
        break;
      case attention_mask_shape::none:
        return;
    }
    dtype type = c_.attention_mask_type;
    std::vector<std::uint8_t> bytes(m.size() * dtype_size(type));
    for (std::size_t i = 0; i < m.size(); ++i) {
      store(type, m[i], bytes.data() + i * dtype_size(type));
      m[i] = load(type, bytes.data() + i * dtype_size(type));
    }
    masks.additive = m;
    mask_dev_ = device_buffer(bytes.size());
    mask_dev_.upload(bytes.data());
    mask_.type = type;
    mask_.batch = static_cast<std::int64_t>(masks.batch);
    mask_.head = static_cast<std::int64_t>(masks.head);
    mask_.query = static_cast<std::int64_t>(masks.query);
  }

  const kernel_case& c_;
  ref::attention_shape shape_;
  attention_mask mask_;
  float scale_ = 0;
  device_buffer q_, k_, v_, o_, lengths_dev_, mask_dev_;
  std::vector<float> want_;
};

class batch_copy_run : public case_run {
public:
  batch_copy_run(const kernel_case& c, const case_size& s, case_run_config cfg) : c_(c) {
    std::mt19937_64 rng(cfg.seed);
    // Request sizes: the largest is s.cols, the others random and ragged; offsets in
    // the batch buffer are 16-byte aligned, as an executor lays its batches out.
    std::uniform_int_distribution<std::size_t> size(0, s.cols);
    std::uniform_int_distribution<int> byte(0, 254); // 0xff is the poison
    std::vector<std::vector<std::uint8_t>> requests(s.rows);
    offsets_.push_back(0);
    for (std::size_t i = 0; i < s.rows; ++i) {
      std::size_t bytes = i == 0 ? s.cols : size(rng);
      for (std::size_t j = 0; j < bytes; ++j)
        requests[i].push_back(static_cast<std::uint8_t>(byte(rng)));
      offsets_.push_back(offsets_.back() + (bytes + 15) / 16 * 16);
    }
    max_bytes_ = s.cols;
    for (std::size_t i = 0; i < s.rows; ++i) {
      sizes_.push_back(requests[i].size());
      request_buffers_.emplace_back(requests[i].size());
      total_ += requests[i].size();
    }
    batch_ = device_buffer(offsets_.back());
    std::vector<std::uint8_t> batch_bytes(offsets_.back(), 0xff);
    for (std::size_t i = 0; i < s.rows; ++i)
      std::copy(requests[i].begin(), requests[i].end(), batch_bytes.begin() + offsets_[i]);
    if (c.operation == op::gather) {
      for (std::size_t i = 0; i < s.rows; ++i)
        request_buffers_[i].upload(requests[i].data());
      want_batch_ = batch_bytes; // padding between requests stays poisoned
    } else {
      batch_.upload(batch_bytes.data());
      want_requests_ = requests;
    }
    std::vector<void*> ptrs;
    for (auto& b : request_buffers_)
      ptrs.push_back(b.get());
    ptrs_dev_ = device_buffer(ptrs.size() * sizeof(void*));
    ptrs_dev_.upload(ptrs.data());
    offsets_dev_ = device_buffer(offsets_.size() * sizeof(std::size_t));
    offsets_dev_.upload(offsets_.data());
    sizes_dev_ = device_buffer(sizes_.size() * sizeof(std::size_t));
    sizes_dev_.upload(sizes_.data());
  }
  void poison(cudaStream_t stream) override {
    if (c_.operation == op::gather)
      batch_.poison(stream);
    else
      for (auto& b : request_buffers_)
        b.poison(stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    batch_copy_args a;
    a.request_buffers = static_cast<void* const*>(ptrs_dev_.get());
    a.request_bytes = static_cast<const std::size_t*>(sizes_dev_.get());
    a.batch_offsets = static_cast<const std::size_t*>(offsets_dev_.get());
    a.batch = batch_.get();
    a.request_count = static_cast<int>(request_buffers_.size());
    a.max_request_bytes = max_bytes_;
    a.threads = cfg.threads;
    if (c_.operation == op::gather) {
      // Offsets are rounded up to 16, so each request writes only its own bytes:
      // the padding must stay poisoned, which checks no request overruns.
      launch_gather(a, stream);
    } else {
      launch_scatter(a, stream);
    }
  }
  check_result verify() override {
    CAF_CUDA_CHECK(cudaDeviceSynchronize());
    check_result r;
    auto fail = [&r](std::string what) {
      if (r.ok)
        r.detail = std::move(what);
      r.ok = false;
    };
    if (c_.operation == op::gather) {
      auto got = batch_.download();
      for (std::size_t i = 0; i < got.size(); ++i)
        if (got[i] != want_batch_[i]) {
          fail("batch byte " + std::to_string(i) + " = " + std::to_string(got[i])
               + ", expected " + std::to_string(want_batch_[i]));
          break;
        }
    } else {
      for (std::size_t i = 0; i < request_buffers_.size(); ++i)
        if (request_buffers_[i].download() != want_requests_[i])
          fail("request " + std::to_string(i) + " differs from its part of the batch");
    }
    return r;
  }
  work_size work() const override {
    return {2.0 * static_cast<double>(total_), 0};
  }

private:
  const kernel_case& c_;
  std::vector<std::size_t> offsets_, sizes_;
  std::size_t max_bytes_ = 0, total_ = 0;
  std::vector<device_buffer> request_buffers_;
  device_buffer batch_, ptrs_dev_, offsets_dev_, sizes_dev_;
  std::vector<std::uint8_t> want_batch_;
  std::vector<std::vector<std::uint8_t>> want_requests_;
};

class convert_run : public case_run {
public:
  convert_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : c_(c), count_(s.rows) {
    std::mt19937_64 rng(cfg.seed);
    // Wide enough to hit fp16 overflow to infinity and subnormals.
    auto x = random_tensor(c.type, count_, -70000.0f, 70000.0f, rng);
    std::uniform_real_distribution<float> tiny(-1e-5f, 1e-5f);
    for (std::size_t i = 0; i < count_; i += 3) { // every third value small
      float v = tiny(rng);
      store(c.type, v, x.bytes.data() + i * dtype_size(c.type));
      x.values[i] = load(c.type, x.bytes.data() + i * dtype_size(c.type));
    }
    in_ = to_device(x);
    out_ = device_buffer(count_ * dtype_size(c.convert_to));
    if (cfg.with_reference)
      for (float v : x.values) { // the host's round-to-nearest-even conversion
        std::uint8_t b[4];
        store(c.convert_to, v, b);
        want_.push_back(load(c.convert_to, b));
      }
  }
  void poison(cudaStream_t stream) override {
    out_.poison(stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    convert_args a;
    a.from = c_.type;
    a.to = c_.convert_to;
    a.input = in_.get();
    a.output = out_.get();
    a.count = count_;
    a.threads = cfg.threads;
    launch_convert(a, stream);
  }
  check_result verify() override {
    auto got = download_floats(out_, c_.convert_to);
    // Infinities compare equal to themselves; anything else must match exactly.
    auto want = want_;
    for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
      if (std::isinf(got[i]) && got[i] == want[i])
        got[i] = want[i] = 0;
    return compare(got, want, c_.tol, "output");
  }
  work_size work() const override {
    return {static_cast<double>(count_) * (dtype_size(c_.type) + dtype_size(c_.convert_to)), 0};
  }

private:
  const kernel_case& c_;
  std::size_t count_;
  device_buffer in_, out_;
  std::vector<float> want_;
};

class top_k_run : public case_run {
public:
  top_k_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : c_(c), shape_{s.rows, s.cols}, k_(s.k) {
    std::mt19937_64 rng(cfg.seed);
    auto x = random_tensor(dtype::f32, s.rows * s.cols, -10.0f, 10.0f, rng);
    if (s.cols > 3) // a tie, which must go to the lower index
      x.values[2] = x.values[3] = 11.0f;
    std::memcpy(x.bytes.data(), x.values.data(), x.bytes.size());
    in_ = to_device(x);
    probs_ = device_buffer(s.rows * k_ * sizeof(float));
    indices_ = device_buffer(s.rows * k_ * sizeof(std::int32_t));
    if (cfg.with_reference)
      for (auto& row : ref::softmax_top_k(x.values, shape_, k_)) {
        want_probs_.insert(want_probs_.end(), row.probabilities.begin(), row.probabilities.end());
        want_indices_.insert(want_indices_.end(), row.indices.begin(), row.indices.end());
      }
  }
  void poison(cudaStream_t stream) override {
    probs_.poison(stream);
    indices_.poison(stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    softmax_top_k_args a;
    a.logits = static_cast<const float*>(in_.get());
    a.probabilities = static_cast<float*>(probs_.get());
    a.indices = static_cast<std::int32_t*>(indices_.get());
    a.rows = shape_.rows;
    a.cols = shape_.cols;
    a.k = static_cast<int>(k_);
    a.threads = cfg.threads;
    launch_softmax_top_k(a, stream);
  }
  check_result verify() override {
    auto r = compare(download_floats(probs_, dtype::f32), want_probs_, c_.tol, "probability");
    auto raw = indices_.download();
    std::vector<float> got(raw.size() / 4), want(want_indices_.begin(), want_indices_.end());
    for (std::size_t i = 0; i < got.size(); ++i) {
      std::int32_t v;
      std::memcpy(&v, raw.data() + 4 * i, 4);
      got[i] = static_cast<float>(v);
    }
    return merge(r, compare(got, want, {0, 0}, "index"));
  }
  work_size work() const override {
    return {static_cast<double>(shape_.rows * shape_.cols) * 4, 0};
  }

private:
  const kernel_case& c_;
  ref::row_shape shape_;
  std::size_t k_;
  device_buffer in_, probs_, indices_;
  std::vector<float> want_probs_;
  std::vector<std::int32_t> want_indices_;
};

} // namespace

std::vector<launch_config> launch_configs(op o) {
  switch (o) {
    case op::attention:
      return {{0, 0}, {0, 16}, {0, 32}}; // 4 warps, 64-key tiles; 16 or 32 rows a warp
    case op::add_layer_norm:
    case op::softmax:
    case op::softmax_top_k:
      return {{0}, {32}, {128}, {1024}};
    default:
      return {{0}, {32}, {1024}};
  }
}

std::unique_ptr<case_run> make_case_run(const kernel_case& c, const case_size& s,
                                        case_run_config cfg) {
  switch (c.operation) {
    case op::epilogue:
      return std::make_unique<epilogue_run>(c, s, cfg);
    case op::add_layer_norm:
      return std::make_unique<layer_norm_run>(c, s, cfg);
    case op::softmax:
      return std::make_unique<softmax_run>(c, s, cfg);
    case op::attention:
      return std::make_unique<attention_run>(c, s, cfg);
    case op::gather:
    case op::scatter:
      return std::make_unique<batch_copy_run>(c, s, cfg);
    case op::convert:
      return std::make_unique<convert_run>(c, s, cfg);
    case op::softmax_top_k:
      return std::make_unique<top_k_run>(c, s, cfg);
    case op::binary:
    case op::unary:
    case op::where:
    case op::cast:
      return make_elementwise_run(c, s, cfg);
    case op::permute:
    case op::strided_copy:
    case op::gather_axis:
    case op::reduce:
      return make_data_case_run(c, s, cfg);
  }
  return nullptr;
}

std::string describe(op o, const case_size& s) {
  auto x = [](std::initializer_list<std::size_t> v) {
    std::string out;
    for (auto n : v)
      out += (out.empty() ? "" : "x") + std::to_string(n);
    return out;
  };
  switch (o) {
    case op::epilogue:
      return s.inner == 1 ? x({s.rows, s.cols}) : x({s.rows, s.cols, s.inner});
    case op::attention:
      return x({s.batch, s.heads, s.seq});
    case op::convert:
      return x({s.rows});
    case op::softmax_top_k:
      return x({s.rows, s.cols}) + " k" + std::to_string(s.k);
    case op::binary:
    case op::unary:
    case op::where:
    case op::cast:
      return describe_elementwise(s);
    case op::softmax: // attention scores: batch x heads x queries x keys
      return s.batch * s.heads * s.seq > 1 ? x({s.batch, s.heads, s.seq, s.cols})
                                           : x({s.rows, s.cols});
    case op::permute:
    case op::strided_copy:
    case op::gather_axis:
    case op::reduce:
      return describe_data(s);
    default:
      return x({s.rows, s.cols});
  }
}

device_probe probe_device() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess)
    return {false, std::string("no CUDA device: cudaGetDeviceCount returned ")
                     + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")"};
  if (count == 0)
    return {false, "no CUDA device: cudaGetDeviceCount found 0 devices"};
  return {true, ""};
}

} // namespace caf_serving::kernels
