#include "check/case_runner_data.hpp"
#include "check/device_buffer.hpp"

#include "cpu/data_reference.hpp"
#include "cpu/half.hpp"
#include "cuda/check.hpp"
#include "cuda/gather_axis.hpp"
#include "cuda/permute.hpp"
#include "cuda/reduce.hpp"
#include "cuda/strided_copy.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace caf_serving::kernels {
namespace {

using bytes = std::vector<std::uint8_t>;

device_buffer to_device(const bytes& host) {
  device_buffer d(host.size());
  d.upload(host.data());
  return d;
}

/// Random bytes other than 0xff, the poison: an element the kernel fails to write
/// cannot match by chance.
bytes random_bytes(std::size_t n, std::mt19937_64& rng) {
  bytes b(n);
  for (std::size_t i = 0; i < n; i += 8) { // 8 bytes a draw: embedding tables are ~100 MB
    std::uint64_t r = rng();
    for (std::size_t k = 0; k < 8 && i + k < n; ++k)
      b[i + k] = static_cast<std::uint8_t>(((r >> (8 * k)) & 0xff) % 255);
  }
  return b;
}

check_result compare_bytes(const bytes& got, const bytes& want, std::size_t element_size,
                           const char* what) {
  check_result r;
  if (got.size() != want.size()) {
    r.ok = false;
    r.detail = std::string(what) + ": " + std::to_string(got.size()) + " bytes, expected "
               + std::to_string(want.size());
    return r;
  }
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      r.ok = false;
      std::ostringstream os;
      os << what << " element " << i / element_size << " (byte " << i << ") = "
         << int(got[i]) << ", expected " << int(want[i]);
      r.detail = os.str();
      break;
    }
  return r;
}

tensor_dims dims_of(const std::vector<std::int64_t>& v) {
  tensor_dims t;
  for (auto d : v)
    t.dims[t.rank++] = d;
  return t;
}

std::int64_t count_of(const tensor_dims& t) {
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d)
    n *= t.dims[d];
  return n;
}

// ---- permute ---------------------------------------------------------------------------

class permute_run : public case_run {
public:
  permute_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : size_(c.data.element_bytes) {
    std::mt19937_64 rng(cfg.seed);
    shape_.rank = static_cast<int>(s.shape.size());
    for (int d = 0; d < shape_.rank; ++d) {
      shape_.dims[d] = s.shape[d];
      shape_.perm[d] = static_cast<int>(s.params[d]);
    }
    auto in = random_bytes(static_cast<std::size_t>(count_of(dims_of(s.shape))) * size_, rng);
    in_ = to_device(in);
    out_ = device_buffer(in.size());
    total_ = in.size();
    if (cfg.with_reference)
      want_ = ref::permute(in, size_, shape_);
  }
  void poison(cudaStream_t stream) override {
    out_.set(0xff, stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    permute_args a;
    a.input = in_.get();
    a.output = out_.get();
    a.element_size = size_;
    a.shape = shape_;
    a.threads = cfg.threads;
    launch_permute(a, stream);
  }
  check_result verify() override {
    return compare_bytes(out_.download(), want_, size_, "output");
  }
  work_size work() const override {
    return {2.0 * static_cast<double>(total_), 0};
  }

private:
  std::size_t size_;
  permute_shape shape_;
  std::size_t total_ = 0;
  device_buffer in_, out_;
  bytes want_;
};

// ---- strided copies ----------------------------------------------------------------------

class strided_copy_run : public case_run {
public:
  strided_copy_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : size_(c.data.element_bytes), pattern_(c.data.pattern) {
    std::mt19937_64 rng(cfg.seed);
    copy_case_boxes plan = plan_copy_case(c, s);
    boxes_ = plan.boxes;
    pad_value_ = plan.pad_value;
    std::int64_t src_count = plan.src_elements, dst_count = plan.dst_elements;
    auto src = random_bytes(static_cast<std::size_t>(src_count) * size_, rng);
    src_ = to_device(src);
    dst_ = device_buffer(static_cast<std::size_t>(dst_count) * size_);
    src_count_ = src_count;
    dst_count_ = dst_count;
    if (!cfg.with_reference)
      return;
    want_.assign(static_cast<std::size_t>(dst_count) * size_, 0xff);
    if (pattern_ == copy_pattern::pad)
      for (std::int64_t i = 0; i < dst_count; ++i)
        std::memcpy(want_.data() + i * size_, &pad_value_, size_); // little-endian
    for (const auto& p : boxes_) {
      strided_box whole = p.box; // the same box, placed in the whole buffers
      whole.src_offset += p.src_at;
      whole.dst_offset += p.dst_at;
      want_ = ref::strided_copy(src, std::move(want_), size_, whole);
    }
  }
  void poison(cudaStream_t stream) override {
    dst_.set(0xff, stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    if (pattern_ == copy_pattern::pad) {
      fill_args f;
      f.dst = dst_.get();
      f.element_size = size_;
      f.count = dst_count_;
      f.value = pad_value_;
      f.threads = cfg.threads;
      launch_fill(f, stream);
    }
    std::vector<strided_copy_args> copies;
    for (const auto& p : boxes_) {
      strided_copy_args a;
      a.src = static_cast<const std::uint8_t*>(src_.get()) + p.src_at * size_;
      a.dst = static_cast<std::uint8_t*>(dst_.get()) + p.dst_at * size_;
      a.element_size = size_;
      a.box = p.box;
      a.src_elements = src_count_ - p.src_at;
      a.dst_elements = dst_count_ - p.dst_at;
      a.threads = cfg.threads;
      copies.push_back(a);
    }
    if (copies.size() == 1)
      launch_strided_copy(copies.front(), stream);
    else
      launch_strided_copies(copies, stream);
  }
  check_result verify() override {
    return compare_bytes(dst_.download(), want_, size_, "output");
  }
  work_size work() const override {
    double moved = 0;
    for (const auto& p : boxes_)
      moved += static_cast<double>(box_count(p.box)) * size_;
    // Every element copied is read and written once (a broadcast source reads less).
    double fill = pattern_ == copy_pattern::pad ? static_cast<double>(dst_count_) * size_ : 0;
    return {2 * moved + fill, 0};
  }

private:
  std::size_t size_;
  copy_pattern pattern_;
  std::vector<placed_box> boxes_;
  std::uint64_t pad_value_ = 0;
  std::int64_t src_count_ = 0, dst_count_ = 0;
  device_buffer src_, dst_;
  bytes want_;
};

// ---- gather ------------------------------------------------------------------------------

class gather_axis_run : public case_run {
public:
  gather_axis_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : size_(c.data.element_bytes), indices_type_(c.data.indices) {
    std::mt19937_64 rng(cfg.seed);
    rank_ = static_cast<int>(s.shape.size());
    for (int d = 0; d < rank_; ++d)
      dims_[d] = s.shape[d];
    axis_ = static_cast<int>(s.params.at(0));
    std::int64_t count = 1;
    for (std::size_t k = 1; k < s.params.size(); ++k)
      count *= s.params[k];
    shape_ = make_gather_shape(rank_, dims_, axis_, count);
    std::int64_t dim = shape_.axis_dim;
    std::vector<std::int64_t> indices(static_cast<std::size_t>(count));
    for (std::size_t j = 0; j < indices.size(); ++j) {
      indices[j] = static_cast<std::int64_t>(rng() % (2 * dim)) - dim; // [-dim, dim)
      if (c.data.out_of_range && j % 5 == 2) // past either end
        indices[j] = j % 2 ? dim + static_cast<std::int64_t>(j) : -dim - 1;
    }
    auto data = random_bytes(static_cast<std::size_t>(count_of(dims_of(s.shape))) * size_, rng);
    data_ = to_device(data);
    bytes index_bytes;
    for (auto i : indices) {
      std::uint8_t b[8];
      if (indices_type_ == index_type::i64) {
        std::memcpy(b, &i, 8);
        index_bytes.insert(index_bytes.end(), b, b + 8);
      } else {
        auto i32 = static_cast<std::int32_t>(i);
        std::memcpy(b, &i32, 4);
        index_bytes.insert(index_bytes.end(), b, b + 4);
      }
    }
    indices_ = to_device(index_bytes);
    out_bytes_ = static_cast<std::size_t>(shape_.outer * count * shape_.inner) * size_;
    out_ = device_buffer(out_bytes_);
    flag_ = device_buffer(sizeof(int));
    if (cfg.with_reference)
      want_ = ref::gather_axis(data, size_, shape_, indices);
  }
  void poison(cudaStream_t stream) override {
    out_.set(0xff, stream);
    flag_.set(0, stream); // the executor zeroes the flag before the step
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    gather_axis_args a;
    a.data = data_.get();
    a.indices = indices_.get();
    a.output = out_.get();
    a.indices_type = indices_type_;
    a.element_size = size_;
    a.rank = rank_;
    std::memcpy(a.dims, dims_, sizeof dims_);
    a.axis = axis_;
    a.index_count = shape_.index_count;
    a.error_flag = reinterpret_cast<int*>(flag_.get());
    a.threads = cfg.threads;
    launch_gather_axis(a, stream);
  }
  check_result verify() override {
    auto r = compare_bytes(out_.download(), want_.output, size_, "output");
    auto flag_bytes = flag_.download();
    int flag;
    std::memcpy(&flag, flag_bytes.data(), sizeof flag);
    if (r.ok && flag != (want_.out_of_range ? 1 : 0)) {
      r.ok = false;
      r.detail = "error_flag = " + std::to_string(flag) + ", expected "
                 + (want_.out_of_range ? "1 (an index is out of range)" : "0");
    }
    return r;
  }
  work_size work() const override {
    double index_bytes = static_cast<double>(shape_.index_count)
                         * (indices_type_ == index_type::i64 ? 8 : 4);
    return {2.0 * static_cast<double>(out_bytes_) + index_bytes, 0};
  }

private:
  std::size_t size_;
  index_type indices_type_;
  int rank_ = 0;
  std::int64_t dims_[max_rank] = {};
  int axis_ = 0;
  gather_shape shape_;
  std::size_t out_bytes_ = 0;
  device_buffer data_, indices_, out_, flag_;
  ref::gather_result want_;
};

// ---- reduce ------------------------------------------------------------------------------

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

class reduce_run : public case_run {
public:
  reduce_run(const kernel_case& c, const case_size& s, case_run_config cfg)
    : c_(c), type_(c.type), width_(c.type == dtype::f32 ? 4 : 2) {
    std::mt19937_64 rng(cfg.seed);
    rank_ = static_cast<int>(s.shape.size());
    for (int d = 0; d < rank_; ++d)
      dims_[d] = s.shape[d];
    axis_count_ = static_cast<int>(s.params.size());
    for (int i = 0; i < axis_count_; ++i)
      axes_[i] = static_cast<int>(s.params[i]);
    shape_ = make_reduce_shape(rank_, dims_, axes_, axis_count_);
    auto n = static_cast<std::size_t>(shape_.outer * shape_.reduced * shape_.inner);
    bool prod = c.data.reduce == reduce_op::prod;
    std::uniform_real_distribution<float> dist(prod ? 0.9f : -1.0f, prod ? 1.1f : 1.0f);
    bytes raw(n * width_);
    std::vector<float> values(n);
    for (std::size_t i = 0; i < n; ++i) { // rounded to the type: both sides see the same
      store(type_, dist(rng), raw.data() + i * width_);
      values[i] = load(type_, raw.data() + i * width_);
    }
    in_ = to_device(raw);
    outputs_ = static_cast<std::size_t>(shape_.outer * shape_.inner);
    out_ = device_buffer(outputs_ * width_);
    if (cfg.with_reference)
      want_ = ref::reduce(values, shape_, c.data.reduce);
  }
  void poison(cudaStream_t stream) override {
    out_.set(0xff, stream); // NaN in every float type
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    reduce_args a;
    a.type = type_;
    a.input = in_.get();
    a.output = out_.get();
    a.op = c_.data.reduce;
    a.rank = rank_;
    std::memcpy(a.dims, dims_, sizeof dims_);
    std::memcpy(a.axes, axes_, sizeof axes_);
    a.axis_count = axis_count_;
    a.threads = cfg.threads;
    launch_reduce(a, stream);
  }
  check_result verify() override {
    auto raw = out_.download();
    check_result r;
    for (std::size_t i = 0; i < outputs_; ++i) {
      float got = load(type_, raw.data() + i * width_);
      double err = std::fabs(static_cast<double>(got) - want_[i]);
      if (!std::isnan(err))
        r.max_abs_error = std::max(r.max_abs_error, err);
      if (!(err <= c_.tol.abs + c_.tol.rel * std::fabs(want_[i])) && r.ok) { // NaN fails
        r.ok = false;
        std::ostringstream os;
        os << "output[" << i << "] = " << got << ", expected " << want_[i] << " (error "
           << err << ")";
        r.detail = os.str();
      }
    }
    return r;
  }
  work_size work() const override {
    double in = static_cast<double>(shape_.outer * shape_.reduced * shape_.inner);
    return {(in + static_cast<double>(outputs_)) * width_, 0};
  }

private:
  const kernel_case& c_;
  dtype type_;
  std::size_t width_;
  int rank_ = 0, axis_count_ = 0;
  std::int64_t dims_[max_rank] = {};
  int axes_[max_rank] = {};
  reduce_shape shape_;
  std::size_t outputs_ = 0;
  device_buffer in_, out_;
  std::vector<float> want_;
};

} // namespace

std::unique_ptr<case_run> make_data_case_run(const kernel_case& c, const case_size& s,
                                             case_run_config cfg) {
  switch (c.operation) {
    case op::permute:
      return std::make_unique<permute_run>(c, s, cfg);
    case op::strided_copy:
      return std::make_unique<strided_copy_run>(c, s, cfg);
    case op::gather_axis:
      return std::make_unique<gather_axis_run>(c, s, cfg);
    case op::reduce:
      return std::make_unique<reduce_run>(c, s, cfg);
    default:
      throw std::invalid_argument(std::string("make_data_case_run: ") + op_name(c.operation)
                                  + " is not a data-movement or reduction op");
  }
}

} // namespace caf_serving::kernels
