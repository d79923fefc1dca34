#include "check/case_runner_elementwise.hpp"

#include "cpu/reference_elementwise.hpp"
#include "cuda/check.hpp"
#include "cuda/elementwise.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <utility>

namespace caf_serving::kernels {
namespace {

/// An owned device allocation whose element pointer may sit `offset` bytes past the
/// (256-byte aligned) start, to exercise the unaligned paths.
class offset_buffer {
public:
  offset_buffer() = default;
  offset_buffer(std::size_t bytes, std::size_t offset) : bytes_(bytes), offset_(offset) {
    CAF_CUDA_CHECK(cudaMalloc(&base_, bytes_ + offset_ + 1));
  }
  offset_buffer(const offset_buffer&) = delete;
  offset_buffer& operator=(const offset_buffer&) = delete;
  offset_buffer(offset_buffer&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), bytes_(o.bytes_), offset_(o.offset_) {
  }
  offset_buffer& operator=(offset_buffer&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    std::swap(offset_, o.offset_);
    return *this;
  }
  ~offset_buffer() {
    if (base_)
      cudaFree(base_);
  }
  void* get() const {
    return base_ ? static_cast<std::uint8_t*>(base_) + offset_ : nullptr;
  }
  void upload(const std::vector<std::uint8_t>& host) const {
    CAF_CUDA_CHECK(cudaMemcpy(get(), host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  void poison(cudaStream_t stream) const {
    CAF_CUDA_CHECK(cudaMemsetAsync(get(), 0xff, bytes_, stream));
  }
  std::vector<std::uint8_t> download() const {
    std::vector<std::uint8_t> host(bytes_);
    CAF_CUDA_CHECK(cudaDeviceSynchronize()); // whatever stream the kernel ran on
    CAF_CUDA_CHECK(cudaMemcpy(host.data(), get(), bytes_, cudaMemcpyDeviceToHost));
    return host;
  }

private:
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t offset_ = 0;
};

std::int64_t count_of(const std::vector<std::int64_t>& dims) {
  std::int64_t n = 1;
  for (auto d : dims)
    n *= d;
  return n;
}

void store_integer(dtype t, std::int64_t v, std::uint8_t* data, std::size_t i) {
  std::size_t size = dtype_size(t);
  if (t == dtype::boolean)
    v = v != 0 ? 1 : 0;
  std::memcpy(data + i * size, &v, size); // little-endian: the low bytes
}

// Values Cast and the float operators must get right at the edges: NaN, infinities,
// halves (truncation and half-to-even), the integer types' limits and past them, fp16's
// largest finite value and past it, and subnormals.
constexpr float special_floats[] = {
  NAN,     INFINITY, -INFINITY, 0.5f,   -0.5f,  -1.5f,  2.5f,    127.5f,  128.0f,  -129.0f,
  255.9f,  256.0f,   -0.0f,     3e9f,   -3e9f,  1e19f,  -1e19f,  65504.f, 70000.f, 1e-6f,
  -2.7f,   1e-40f};

/// `n` random elements of `t` for `spec`; `divisor`: the operand `spec.nonzero` keeps
/// away from zero.
std::vector<std::uint8_t> random_elements(dtype t, std::size_t n, const elementwise_spec& spec,
                                          bool divisor, std::mt19937_64& rng) {
  std::vector<std::uint8_t> out(n * dtype_size(t));
  if (t == dtype::boolean) {
    std::bernoulli_distribution coin(0.5);
    for (std::size_t i = 0; i < n; ++i)
      out[i] = coin(rng) ? 1 : 0;
    return out;
  }
  if (is_floating(t)) {
    std::uniform_real_distribution<float> dist(spec.lo, spec.hi);
    constexpr std::size_t specials = sizeof(special_floats) / sizeof(float);
    for (std::size_t i = 0; i < n; ++i) {
      float x = dist(rng);
      if (spec.quantum > 0)
        x = std::round(x / spec.quantum) * spec.quantum;
      if (divisor && spec.nonzero && std::fabs(x) < 0.25f)
        x = std::copysign(0.25f + std::fabs(x), x);
      if (spec.extremes && i % 5 == 0)
        x = special_floats[(i / 5) % specials];
      ref::store_value(t, x, out.data(), i);
    }
    return out;
  }
  int bits = static_cast<int>(8 * dtype_size(t));
  bool is_signed = t != dtype::u8;
  std::int64_t lo = 0, hi = 0;
  if (bits == 64) {
    lo = std::numeric_limits<std::int64_t>::min();
    hi = std::numeric_limits<std::int64_t>::max();
  } else if (is_signed) {
    lo = -(std::int64_t{1} << (bits - 1));
    hi = (std::int64_t{1} << (bits - 1)) - 1;
  } else {
    hi = (std::int64_t{1} << bits) - 1;
  }
  std::uniform_int_distribution<std::int64_t> full(lo, hi), small(-8, 8);
  std::uniform_int_distribution<std::int64_t> ranged(static_cast<std::int64_t>(spec.lo),
                                                     static_cast<std::int64_t>(spec.hi));
  const std::int64_t specials[] = {0, -1, 1, lo, hi, lo + 1, 2, -2};
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t v;
    if (!spec.extremes)
      v = ranged(rng);
    else if (i % 4 == 0)
      v = specials[(i / 4) % 8];
    else
      v = i % 4 == 1 ? full(rng) : small(rng);
    if (!is_signed && v < 0)
      v = -v;
    store_integer(t, v, out.data(), i);
  }
  return out;
}

/// Element by element: integers and bool exactly; floats within `tol`, with NaN
/// matching only NaN and infinities only themselves.
check_result compare_elements(dtype t, const std::vector<std::uint8_t>& got,
                              const std::vector<std::uint8_t>& want, tolerance tol) {
  check_result r;
  if (got.size() != want.size()) {
    r.ok = false;
    r.detail = "output: " + std::to_string(got.size()) + " bytes, expected "
               + std::to_string(want.size());
    return r;
  }
  std::size_t n = want.size() / dtype_size(t);
  for (std::size_t i = 0; i < n; ++i) {
    bool good;
    double g, w, err;
    if (is_floating(t)) {
      g = ref::load_value(t, got.data(), i);
      w = ref::load_value(t, want.data(), i);
      err = std::fabs(g - w);
      good = g == w || (std::isnan(g) && std::isnan(w)) || err <= tol.abs + tol.rel * std::fabs(w);
      if (std::isfinite(err))
        r.max_abs_error = std::max(r.max_abs_error, err);
    } else {
      std::int64_t gi = ref::load_integer(t, got.data(), i), wi = ref::load_integer(t, want.data(), i);
      if (t == dtype::boolean) // the kernel must write 0 or 1, not any nonzero byte
        gi = got[i], wi = want[i];
      good = gi == wi;
      g = static_cast<double>(gi);
      w = static_cast<double>(wi);
      err = good ? 0 : 1;
    }
    if (!good && r.ok) {
      r.ok = false;
      std::ostringstream os;
      os << "output[" << i << "] = " << g << ", expected " << w << " (" << dtype_name(t)
         << ", tolerance " << tol.abs << " + " << tol.rel << "·|expected|)";
      r.detail = os.str();
    }
  }
  return r;
}

class elementwise_run : public case_run {
public:
  elementwise_run(const kernel_case& c, const case_size& s, case_run_config cfg) : c_(c) {
    std::mt19937_64 rng(cfg.seed);
    auto shapes = pattern_shapes(c, s);
    const auto& e = c.elementwise;
    std::vector<dtype> types;
    switch (c.operation) {
      case op::binary:
        types = {c.type, c.type};
        out_type_ = binary_output_type(e.binary, c.type);
        break;
      case op::where:
        types = {dtype::boolean, c.type, c.type};
        out_type_ = c.type;
        break;
      case op::cast:
        types = {c.type};
        out_type_ = c.convert_to;
        break;
      default:
        types = {c.type};
        out_type_ = c.type;
    }
    count_ = static_cast<std::size_t>(count_of(shapes.output));
    bool misaligned = e.pattern == broadcast_pattern::misaligned;
    std::vector<std::vector<std::uint8_t>> host;
    for (std::size_t k = 0; k < types.size(); ++k) {
      auto n = static_cast<std::size_t>(count_of(shapes.operands[k]));
      host.push_back(random_elements(types[k], n, e, k == 1, rng));
      inputs_.emplace_back(host.back().size(), misaligned ? dtype_size(types[k]) : 0);
      inputs_.back().upload(host.back());
      bytes_ += static_cast<double>(host.back().size());
    }
    output_ = offset_buffer(count_ * dtype_size(out_type_), misaligned ? dtype_size(out_type_) : 0);
    bytes_ += static_cast<double>(count_ * dtype_size(out_type_));
    if (c.operation == op::binary)
      binary_layout_ = make_broadcast_layout<2>(shapes.output,
                                                {shapes.operands[0], shapes.operands[1]});
    if (c.operation == op::where)
      where_layout_ = make_broadcast_layout<3>(
        shapes.output, {shapes.operands[0], shapes.operands[1], shapes.operands[2]});
    if (!cfg.with_reference)
      return;
    switch (c.operation) {
      case op::binary:
        want_ = ref::binary(e.binary, c.type, binary_layout_, host[0].data(), host[1].data());
        break;
      case op::where:
        want_ = ref::where(c.type, where_layout_, host[0].data(), host[1].data(), host[2].data());
        break;
      case op::cast:
        want_ = ref::cast(c.type, c.convert_to, host[0].data(), count_);
        break;
      default:
        want_ = ref::unary(e.unary, c.type, e.params, host[0].data(), count_);
    }
  }
  void poison(cudaStream_t stream) override {
    output_.poison(stream);
  }
  void launch(launch_config cfg, cudaStream_t stream) override {
    const auto& e = c_.elementwise;
    switch (c_.operation) {
      case op::binary: {
        binary_args a;
        a.op = e.binary;
        a.type = c_.type;
        a.layout = binary_layout_;
        a.a = inputs_[0].get();
        a.b = inputs_[1].get();
        a.output = output_.get();
        a.threads = cfg.threads;
        launch_binary(a, stream);
        break;
      }
      case op::where: {
        where_args a;
        a.type = c_.type;
        a.layout = where_layout_;
        a.condition = inputs_[0].get();
        a.x = inputs_[1].get();
        a.y = inputs_[2].get();
        a.output = output_.get();
        a.threads = cfg.threads;
        launch_where(a, stream);
        break;
      }
      case op::cast: {
        cast_args a;
        a.from = c_.type;
        a.to = c_.convert_to;
        a.input = inputs_[0].get();
        a.output = output_.get();
        a.count = count_;
        a.threads = cfg.threads;
        launch_cast(a, stream);
        break;
      }
      default: {
        unary_args a;
        a.op = e.unary;
        a.type = c_.type;
        a.params = e.params;
        a.input = inputs_[0].get();
        a.output = output_.get();
        a.count = count_;
        a.threads = cfg.threads;
        launch_unary(a, stream);
      }
    }
  }
  check_result verify() override {
    return compare_elements(out_type_, output_.download(), want_, c_.tol);
  }
  work_size work() const override {
    return {bytes_, 0};
  }

private:
  const kernel_case& c_;
  dtype out_type_ = dtype::f32;
  std::size_t count_ = 0;
  double bytes_ = 0; ///< each operand once (broadcast ones at their own size) + the output
  std::vector<offset_buffer> inputs_;
  offset_buffer output_;
  broadcast_layout<2> binary_layout_;
  broadcast_layout<3> where_layout_;
  std::vector<std::uint8_t> want_;
};

} // namespace

std::unique_ptr<case_run> make_elementwise_run(const kernel_case& c, const case_size& size,
                                               case_run_config config) {
  return std::make_unique<elementwise_run>(c, size, config);
}

std::string describe_elementwise(const case_size& s) {
  std::string out;
  auto field = [&out](const char* name, std::size_t v) {
    if (v != 1)
      out += (out.empty() ? "" : " ") + std::string(name) + std::to_string(v);
  };
  field("b", s.batch);
  field("h", s.heads);
  field("s", s.seq);
  field("r", s.rows);
  field("c", s.cols);
  field("i", s.inner);
  return out.empty() ? "1" : out;
}

} // namespace caf_serving::kernels
