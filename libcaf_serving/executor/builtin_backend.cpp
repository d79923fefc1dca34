#include "executor/builtin_backend.hpp"

#include "executor/threaded_backend.hpp"

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

namespace caf_serving::executor {

namespace {

using exec_result = std::variant<std::monostate, serving_error>;

/// What the identity function does to a batch that holds the fault marker, for
/// the supervision tests: fail it with an error value, throw from execute, or
/// break the executor (executor_broken).
/// `hold` (asynchronous only) holds the batch until another is submitted after it.
enum class fault_kind { none, error, exception, broken, hang, hold };

struct fault_config {
  fault_kind kind = fault_kind::none;
  /// A batch faults when an FP32 element of its first input equals this.
  float marker = 0;
};

/// How the identity function spends a batch's cost: a GPU-like curve of a fixed
/// cost per batch plus a small cost per row, the shape that makes batching pay.
struct cost_config {
  std::chrono::microseconds per_batch{0};
  std::chrono::microseconds per_item{0};
  /// Sleeping frees the core (like waiting on a device); spinning holds it
  /// (like a CPU kernel), so a slow model can stand in for either. A spin
  /// lasts until the thread has used the delay in CPU time: a fixed amount of
  /// work, which takes longer on a busy machine, as a kernel's would.
  bool spin = false;

  std::chrono::microseconds of(uint32_t rows) const {
    return per_batch + per_item * static_cast<int64_t>(rows);
  }
  bool any() const { return per_batch.count() > 0 || per_item.count() > 0; }
};

/// Whether an FP32 element of the batch's first input equals `marker`.
bool holds_marker(const batch_view& batch, float marker) {
  if (batch.inputs.empty() || batch.inputs[0].dtype != datatype::fp32)
    return false;
  const auto& in = batch.inputs[0];
  for (size_t i = 0; i + sizeof(float) <= in.size; i += sizeof(float)) {
    float v;
    std::memcpy(&v, in.data + i, sizeof v);
    if (v == marker)
      return true;
  }
  return false;
}

std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

void spend(const cost_config& cost, uint32_t rows) {
  auto d = cost.of(rows);
  if (d.count() <= 0)
    return;
  if (!cost.spin) {
    std::this_thread::sleep_for(d);
    return;
  }
  auto until = thread_cpu_time() + d;
  while (thread_cpu_time() < until) {
  }
}

class identity_backend final : public backend {
public:
  identity_backend(const model_config& cfg, cost_config cost, fault_config fault)
      : name_(cfg.name), outputs_(cfg.outputs), cost_(cost), fault_(fault) {}

  bool blocks() const override { return cost_.any(); }

  exec_result execute(const batch_view& batch, output_writer& out) override {
    spend(cost_, batch.rows);
    if (fault_.kind != fault_kind::none && holds_marker(batch, fault_.marker)) {
      switch (fault_.kind) {
        case fault_kind::error:
          return serving_error{status_code::internal,
                               "model '" + name_ + "': injected fault (fault: \"error\")"};
        case fault_kind::exception:
          throw std::runtime_error("injected fault (fault: \"throw\")");
        case fault_kind::broken:
          throw executor_broken("injected fault (fault: \"crash\")");
        case fault_kind::hang:
          // Long enough for any test's --executor-timeout-ms; the server
          // process is normally gone before it returns.
          std::this_thread::sleep_for(std::chrono::seconds(30));
          break;
        case fault_kind::none:
        case fault_kind::hold: // threaded_backend holds it
          break;
      }
    }
    for (size_t i = 0; i < outputs_.size(); ++i) {
      const auto& in = batch.inputs[i];
      auto* dst = out.allocate(outputs_[i].name, in.dtype, in.shape, in.size);
      if (in.size > 0)
        std::memcpy(dst, in.data, in.size);
    }
    return {};
  }

private:
  std::string name_;
  std::vector<tensor_config> outputs_;
  cost_config cost_;
  fault_config fault_;
};

template <class T>
void add_sub(const batch_view& batch, T* sum, T* diff) {
  const auto& a = batch.inputs[0];
  const auto& b = batch.inputs[1];
  size_t n = a.size / sizeof(T);
  const T* x = reinterpret_cast<const T*>(a.data);
  const T* y = reinterpret_cast<const T*>(b.data);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T>) {
      // Wrap like two's complement hardware instead of overflowing (UB in C++).
      using U = std::make_unsigned_t<T>;
      sum[i] = static_cast<T>(static_cast<U>(x[i]) + static_cast<U>(y[i]));
      diff[i] = static_cast<T>(static_cast<U>(x[i]) - static_cast<U>(y[i]));
    } else {
      sum[i] = x[i] + y[i];
      diff[i] = x[i] - y[i];
    }
  }
}

/// The elements of a BYTES tensor (4-byte little-endian length, then the bytes).
std::vector<std::string_view> bytes_elements(const tensor_view& t) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos + 4 <= t.size) {
    uint32_t n = 0;
    std::memcpy(&n, t.data + pos, 4);
    pos += 4;
    if (n > t.size - pos)
      break; // the ingress validated the framing; a short tail cannot happen
    out.emplace_back(reinterpret_cast<const char*>(t.data + pos), n);
    pos += n;
  }
  return out;
}

/// Triton's "simple_string" model: each element is the decimal text of an
/// INT32, and the outputs are the texts of the sums and differences.
result<int32_t> parse_int32_text(std::string_view text, std::string_view input, size_t index) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
    return serving_error{status_code::bad_request,
                         "element " + std::to_string(index) + " of input '" + std::string(input)
                           + "' is '" + s + "', not the decimal text of an INT32: this model "
                           "adds and subtracts numbers written as strings"};
  return static_cast<int32_t>(v);
}

exec_result add_sub_text(const model_config& cfg, const batch_view& batch, output_writer& out) {
  auto a = bytes_elements(batch.inputs[0]);
  auto b = bytes_elements(batch.inputs[1]);
  std::string sum;
  std::string diff;
  auto append = [](std::string& to, int32_t v) {
    auto text = std::to_string(v);
    uint32_t n = static_cast<uint32_t>(text.size());
    to.append(reinterpret_cast<const char*>(&n), 4);
    to += text;
  };
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    auto x = parse_int32_text(a[i], cfg.inputs[0].name, i);
    if (!x)
      return x.error();
    auto y = parse_int32_text(b[i], cfg.inputs[1].name, i);
    if (!y)
      return y.error();
    using U = uint32_t;
    append(sum, static_cast<int32_t>(static_cast<U>(*x) + static_cast<U>(*y)));
    append(diff, static_cast<int32_t>(static_cast<U>(*x) - static_cast<U>(*y)));
  }
  const auto& shape = batch.inputs[0].shape;
  std::memcpy(out.allocate(cfg.outputs[0].name, datatype::bytes, shape, sum.size()), sum.data(),
              sum.size());
  std::memcpy(out.allocate(cfg.outputs[1].name, datatype::bytes, shape, diff.size()),
              diff.data(), diff.size());
  return {};
}

class add_sub_backend final : public backend {
public:
  explicit add_sub_backend(const model_config& cfg) : cfg_(cfg) {}

  bool blocks() const override { return false; }

  exec_result execute(const batch_view& batch, output_writer& out) override {
    const auto& a = batch.inputs[0];
    if (a.dtype == datatype::bytes)
      return add_sub_text(cfg_, batch, out);
    auto* sum = out.allocate(cfg_.outputs[0].name, a.dtype, a.shape, a.size);
    auto* diff = out.allocate(cfg_.outputs[1].name, a.dtype, a.shape, a.size);
    if (a.dtype == datatype::int32)
      add_sub(batch, reinterpret_cast<int32_t*>(sum), reinterpret_cast<int32_t*>(diff));
    else
      add_sub(batch, reinterpret_cast<float*>(sum), reinterpret_cast<float*>(diff));
    return {};
  }

private:
  model_config cfg_;
};

serving_error config_error(const model_config& cfg, const std::string& what) {
  return {status_code::bad_request, "model '" + cfg.name + "' (builtin backend): " + what};
}

} // namespace

result<std::shared_ptr<backend>> make_builtin_backend(const model_config& cfg) {
  auto fn = cfg.parameters.find("function");
  if (fn == cfg.parameters.end())
    return config_error(cfg, "config.pbtxt needs parameters { key: \"function\" value: { "
                             "string_value: \"identity\" } } (or \"add_sub\")");
  if (fn->second == "identity") {
    if (cfg.inputs.size() != cfg.outputs.size())
      return config_error(cfg, "identity needs as many outputs as inputs, got "
                                 + std::to_string(cfg.inputs.size()) + " inputs and "
                                 + std::to_string(cfg.outputs.size()) + " outputs");
    for (size_t i = 0; i < cfg.inputs.size(); ++i)
      if (cfg.inputs[i].dtype != cfg.outputs[i].dtype || cfg.inputs[i].dims != cfg.outputs[i].dims)
        return config_error(cfg, "identity output '" + cfg.outputs[i].name
                                   + "' must have the datatype and dims of input '"
                                   + cfg.inputs[i].name + "'");
    cost_config cost;
    for (auto [key, field] : {std::pair{"delay_us", &cost.per_batch},
                              std::pair{"delay_per_item_us", &cost.per_item}}) {
      auto d = cfg.parameters.find(key);
      if (d == cfg.parameters.end())
        continue;
      char* end = nullptr;
      auto us = std::strtoll(d->second.c_str(), &end, 10);
      if (d->second.empty() || *end != '\0' || us < 0 || us > 60'000'000)
        return config_error(cfg, std::string("parameter ") + key
                                   + " must be a number of microseconds from 0 to 60000000, "
                                     "not '" + d->second + "'");
      *field = std::chrono::microseconds(us);
    }
    if (auto m = cfg.parameters.find("delay_mode"); m != cfg.parameters.end()) {
      if (m->second == "spin")
        cost.spin = true;
      else if (m->second != "sleep")
        return config_error(cfg, "parameter delay_mode must be \"sleep\" (the batch waits "
                                 "without a core, like a GPU) or \"spin\" (it holds a core, "
                                 "like a CPU kernel), not '" + m->second + "'");
    }
    // Stands in for a model that takes long to load (an ONNX compile, a
    // warm-up), for the tests that check that loading blocks nothing else.
    if (auto d = cfg.parameters.find("load_delay_us"); d != cfg.parameters.end()) {
      char* end = nullptr;
      auto us = std::strtoll(d->second.c_str(), &end, 10);
      if (d->second.empty() || *end != '\0' || us < 0 || us > 60'000'000)
        return config_error(cfg, "parameter load_delay_us must be a number of microseconds "
                                 "from 0 to 60000000, not '" + d->second + "'");
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
    fault_config fault;
    if (auto f = cfg.parameters.find("fault"); f != cfg.parameters.end()) {
      if (f->second == "error")
        fault.kind = fault_kind::error;
      else if (f->second == "throw")
        fault.kind = fault_kind::exception;
      else if (f->second == "crash")
        fault.kind = fault_kind::broken;
      else if (f->second == "hang")
        fault.kind = fault_kind::hang;
      else if (f->second == "hold")
        fault.kind = fault_kind::hold;
      else
        return config_error(cfg, "parameter fault must be \"error\", \"throw\", \"crash\", "
                                 "\"hang\" or \"hold\" (with asynchronous \"true\"), "
                                 "not '" + f->second + "'");
      auto m = cfg.parameters.find("fault_marker");
      char* end = nullptr;
      if (m == cfg.parameters.end() || m->second.empty()
          || (fault.marker = std::strtof(m->second.c_str(), &end), *end != '\0'))
        return config_error(cfg, "parameter fault needs fault_marker: the FP32 value that "
                                 "marks a batch to fault, e.g. \"-999\"");
    }
    auto identity = std::make_shared<identity_backend>(cfg, cost, fault);
    auto a = cfg.parameters.find("asynchronous");
    if (a == cfg.parameters.end() || a->second == "false") {
      if (fault.kind == fault_kind::hold)
        return config_error(cfg, "parameter fault \"hold\" needs asynchronous \"true\"");
      return std::shared_ptr<backend>(identity);
    }
    if (a->second != "true")
      return config_error(cfg, "parameter asynchronous must be \"true\" or \"false\", not '"
                                 + a->second + "'");
    threaded_config tc;
    if (auto d = cfg.parameters.find("pipeline_depth"); d != cfg.parameters.end()) {
      char* end = nullptr;
      auto n = std::strtol(d->second.c_str(), &end, 10);
      if (d->second.empty() || *end != '\0' || n < 1 || n > 64)
        return config_error(cfg, "parameter pipeline_depth must be a number of batches from 1 "
                                 "to 64, not '" + d->second + "'");
      tc.pipeline_depth = static_cast<uint32_t>(n);
    }
    if (fault.kind == fault_kind::hold)
      tc.hold = [marker = fault.marker](const batch_view& b) { return holds_marker(b, marker); };
    return make_threaded_backend(std::move(identity), std::move(tc));
  }
  if (fn->second == "add_sub") {
    if (cfg.inputs.size() != 2 || cfg.outputs.size() != 2)
      return config_error(cfg, "add_sub needs exactly two inputs and two outputs");
    auto t = cfg.inputs[0].dtype;
    if (t != datatype::int32 && t != datatype::fp32 && t != datatype::bytes)
      return config_error(cfg, "add_sub computes INT32, FP32 or BYTES (numbers as text), not "
                                 + std::string(to_string(t)));
    for (const auto* tc : {&cfg.inputs[1], &cfg.outputs[0], &cfg.outputs[1]})
      if (tc->dtype != t || tc->dims != cfg.inputs[0].dims)
        return config_error(cfg, "add_sub needs every input and output to have the datatype "
                                 "and dims of '" + cfg.inputs[0].name + "'; '" + tc->name
                                   + "' differs");
    return std::shared_ptr<backend>(std::make_shared<add_sub_backend>(cfg));
  }
  return config_error(cfg, "unknown builtin function '" + fn->second
                             + "'; the builtin backend offers \"identity\" and \"add_sub\"");
}

} // namespace caf_serving::executor
