#include "conformance.hpp"

#include "executor/backend.hpp"
#include "onnx/importer.hpp"
#include "onnx_cpu/onnx_backend.hpp"

#include <onnx/onnx-data_pb.h>
#include <onnx/onnx_pb.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>

namespace caf_serving::conformance {

namespace {

namespace pb = ::onnx;
namespace fs = std::filesystem;

result<std::string> read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return bad_request(path.string() + " cannot be opened");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

/// The engine's datatype for an ONNX element type, if it has one.
bool engine_type(int32_t t, datatype& out) {
  switch (t) {
    case pb::TensorProto::FLOAT: out = datatype::fp32; return true;
    case pb::TensorProto::DOUBLE: out = datatype::fp64; return true;
    case pb::TensorProto::FLOAT16: out = datatype::fp16; return true;
    case pb::TensorProto::BFLOAT16: out = datatype::bf16; return true;
    case pb::TensorProto::INT8: out = datatype::int8; return true;
    case pb::TensorProto::INT16: out = datatype::int16; return true;
    case pb::TensorProto::INT32: out = datatype::int32; return true;
    case pb::TensorProto::INT64: out = datatype::int64; return true;
    case pb::TensorProto::UINT8: out = datatype::uint8; return true;
    case pb::TensorProto::UINT16: out = datatype::uint16; return true;
    case pb::TensorProto::UINT32: out = datatype::uint32; return true;
    case pb::TensorProto::UINT64: out = datatype::uint64; return true;
    case pb::TensorProto::BOOL: out = datatype::bool_; return true;
    case pb::TensorProto::STRING: out = datatype::bytes; return true;
    default: return false;
  }
}

template <class T>
void append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { // subnormal: normalise
      int e = -1;
      do { ++e; man <<= 1; } while (!(man & 0x400));
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool floating(datatype t) {
  return t == datatype::fp32 || t == datatype::fp64 || t == datatype::fp16
         || t == datatype::bf16;
}

/// Element i as a double (floating point and integers).
double element(const loaded_tensor& t, size_t i) {
  const char* p = t.bytes.data() + i * element_size(t.dtype);
  auto get = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t.dtype) {
    case datatype::fp32: return get(float{});
    case datatype::fp64: return get(double{});
    case datatype::fp16: return half_to_float(get(uint16_t{}));
    case datatype::bf16: return bf16_to_float(get(uint16_t{}));
    case datatype::int8: return get(int8_t{});
    case datatype::int16: return get(int16_t{});
    case datatype::int32: return get(int32_t{});
    case datatype::int64: return static_cast<double>(get(int64_t{}));
    case datatype::uint8: return get(uint8_t{});
    case datatype::uint16: return get(uint16_t{});
    case datatype::uint32: return get(uint32_t{});
    case datatype::uint64: return static_cast<double>(get(uint64_t{}));
    case datatype::bool_: return get(uint8_t{}) != 0;
    case datatype::bytes: return 0;
  }
  return 0;
}

/// BYTES elements as strings.
std::vector<std::string> strings_of(const loaded_tensor& t) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at + 4 <= t.bytes.size()) {
    uint32_t len;
    std::memcpy(&len, t.bytes.data() + at, 4);
    at += 4;
    out.push_back(t.bytes.substr(at, len));
    at += len;
  }
  return out;
}

/// Output buffers of one run, kept by name.
struct collecting_writer final : executor::output_writer {
  std::map<std::string, loaded_tensor, std::less<>> outputs;
  uint8_t* allocate(std::string_view name, datatype dtype, const std::vector<int64_t>& shape,
                    size_t bytes) override {
    auto& t = outputs[std::string(name)];
    t.name = std::string(name);
    t.dtype = dtype;
    t.shape = shape;
    t.bytes.assign(bytes, '\0');
    return reinterpret_cast<uint8_t*>(t.bytes.data());
  }
};

std::vector<fs::path> data_sets(const fs::path& dir) {
  std::vector<fs::path> sets;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
      sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  return sets;
}

/// The engine's messages name the model file by its full path; the case's
/// folder already names it.
std::string without_path(std::string text, const fs::path& model) {
  std::string full = model.string();
  for (size_t at; (at = text.find(full)) != std::string::npos;)
    text.replace(at, full.size(), "model.onnx");
  return text;
}

/// The graph input a load error says must be known before the run: the
/// engine words it "Clip's min and max must be known before the model runs
/// (it depends on 'min', ...)" or "Tile's repeats ('y') must be known before
/// the model runs"; the quoted input name that comes first, among those not
/// yet constants. -1 when the error is about something else.
int constant_input_named(const std::string& message, const std::vector<std::string>& inputs,
                         const std::vector<bool>& constant) {
  if (message.find("must be known before the model runs") == std::string::npos)
    return -1;
  int first = -1;
  size_t first_at = std::string::npos;
  for (size_t k = 0; k < inputs.size(); ++k) {
    auto at = message.find("'" + inputs[k] + "'");
    if (!constant[k] && at < first_at) {
      first = static_cast<int>(k);
      first_at = at;
    }
  }
  return first;
}

/// Names of the element types newer than Debian's protobuf classes.
std::string element_type_name(int32_t t) {
  static const char* const newer[] = {"FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                      "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1",
                                      "FLOAT8E8M0", "UINT2", "INT2", "FLOAT6E2M3",
                                      "FLOAT6E3M2"};
  if (pb::TensorProto::DataType_IsValid(t))
    return pb::TensorProto::DataType_Name(static_cast<pb::TensorProto::DataType>(t));
  if (t >= 17 && t < 17 + static_cast<int32_t>(std::size(newer)))
    return newer[t - 17];
  return "";
}

} // namespace

const char* to_string(case_status s) {
  switch (s) {
    case case_status::pass: return "pass";
    case case_status::fail: return "fail";
    case case_status::refused: return "refused";
    case case_status::crashed: return "crashed";
  }
  return "?";
}

result<loaded_tensor> parse_tensor(const std::string& bytes, const std::string& origin) {
  pb::TensorProto t;
  if (!t.ParseFromString(bytes))
    return bad_request(origin + " is not a TensorProto");
  if (t.data_type() == pb::TensorProto::UNDEFINED)
    return bad_request(origin + " holds no tensor element type");
  loaded_tensor out;
  out.name = t.name();
  if (!engine_type(t.data_type(), out.dtype)) {
    auto name = element_type_name(t.data_type());
    return bad_request(origin + " has ONNX element type " + std::to_string(t.data_type())
                       + (name.empty() ? "" : " (" + name + ")")
                       + ", which the engine has no datatype for");
  }
  if (t.data_location() == pb::TensorProto::EXTERNAL)
    return bad_request(origin + " keeps its data in an external file");
  out.shape.assign(t.dims().begin(), t.dims().end());
  uint64_t n = 1;
  for (auto d : out.shape) {
    if (d < 0 || (d > 0 && n > (uint64_t{1} << 34) / static_cast<uint64_t>(d)))
      return bad_request(origin + " has shape " + shape_text(out.shape)
                         + ", negative or over 2^34 elements");
    n *= static_cast<uint64_t>(d);
  }
  size_t elem = element_size(out.dtype);
  if (out.dtype == datatype::bytes) {
    for (const auto& s : t.string_data()) {
      append(out.bytes, static_cast<uint32_t>(s.size()));
      out.bytes += s;
    }
    if (static_cast<uint64_t>(t.string_data_size()) != n)
      return bad_request(origin + " has shape " + shape_text(out.shape) + " but "
                         + std::to_string(t.string_data_size()) + " strings");
    return out;
  }
  if (t.has_raw_data()) {
    out.bytes = t.raw_data();
  } else {
    switch (out.dtype) {
      case datatype::fp32: for (float v : t.float_data()) append(out.bytes, v); break;
      case datatype::fp64: for (double v : t.double_data()) append(out.bytes, v); break;
      case datatype::int64: for (int64_t v : t.int64_data()) append(out.bytes, v); break;
      case datatype::uint32:
        for (uint64_t v : t.uint64_data()) append(out.bytes, static_cast<uint32_t>(v));
        break;
      case datatype::uint64: for (uint64_t v : t.uint64_data()) append(out.bytes, v); break;
      default:
        // INT32, INT16, INT8, UINT16, UINT8, BOOL, FLOAT16 and BFLOAT16 (as
        // bits) are stored widened in int32_data.
        for (int32_t v : t.int32_data())
          out.bytes.append(reinterpret_cast<const char*>(&v), elem); // little-endian
    }
  }
  if (out.bytes.size() != n * elem)
    return bad_request(origin + " has shape " + shape_text(out.shape) + " but holds "
                       + std::to_string(out.bytes.size()) + " bytes, not "
                       + std::to_string(n * elem));
  return out;
}

result<loaded_tensor> read_tensor_file(const fs::path& path) {
  auto bytes = read_file(path);
  if (!bytes)
    return bytes.error();
  return parse_tensor(*bytes, path.filename().string());
}

comparison compare(const loaded_tensor& expected, const loaded_tensor& actual, tolerance tol) {
  comparison c;
  if (expected.dtype != actual.dtype) {
    c.detail = "element type " + std::string(caf_serving::to_string(actual.dtype))
               + ", expected " + std::string(caf_serving::to_string(expected.dtype));
    return c;
  }
  if (expected.shape != actual.shape) {
    c.detail = "shape " + shape_text(actual.shape) + ", expected " + shape_text(expected.shape);
    return c;
  }
  std::ostringstream first;
  first.precision(9);
  if (expected.dtype == datatype::bytes) {
    auto e = strings_of(expected), a = strings_of(actual);
    for (size_t i = 0; i < e.size(); ++i)
      if (i >= a.size() || a[i] != e[i]) {
        if (c.mismatches++ == 0)
          first << "element " << i << " is '" << (i < a.size() ? a[i] : "") << "', expected '"
                << e[i] << "'";
      }
  } else {
    double rtol = expected.dtype == datatype::bf16 ? std::max(tol.rtol, 1.0 / 64) : tol.rtol;
    size_t n = expected.bytes.size() / element_size(expected.dtype);
    bool exact = !floating(expected.dtype);
    for (size_t i = 0; i < n; ++i) {
      double e = element(expected, i), a = element(actual, i);
      bool ok;
      if (exact) {
        // Compare the bits: int64 and uint64 do not fit a double exactly.
        size_t w = element_size(expected.dtype);
        ok = std::memcmp(expected.bytes.data() + i * w, actual.bytes.data() + i * w, w) == 0
             || (expected.dtype == datatype::bool_ && (e != 0) == (a != 0));
      } else if (std::isnan(e) || std::isnan(a)) {
        ok = std::isnan(e) && std::isnan(a);
      } else if (std::isinf(e) || std::isinf(a)) {
        ok = e == a;
      } else {
        ok = std::fabs(a - e) <= tol.atol + rtol * std::fabs(e);
      }
      if (std::isfinite(a - e))
        c.max_abs_error = std::max(c.max_abs_error, std::fabs(a - e));
      if (!ok && c.mismatches++ == 0)
        first << "element " << i << " is " << a << ", expected " << e;
    }
  }
  c.equal = c.mismatches == 0;
  if (!c.equal) {
    std::ostringstream os;
    os.precision(3);
    size_t total = expected.dtype == datatype::bytes ? strings_of(expected).size()
                   : expected.bytes.size() / element_size(expected.dtype);
    os << c.mismatches << " of " << total << " elements differ, max |error| "
       << c.max_abs_error << "; " << first.str();
    c.detail = os.str();
  }
  return c;
}

case_result run_case(const case_config& cfg) {
  auto fail = [](case_status s, std::string detail) { return case_result{s, std::move(detail)}; };
  fs::path model_file = cfg.dir / "model.onnx";
  auto model_bytes = read_file(model_file);
  if (!model_bytes)
    return fail(case_status::refused, model_bytes.error().message);
  pb::ModelProto proto;
  if (!proto.ParseFromString(*model_bytes))
    return fail(case_status::refused, "model.onnx is not an ONNX model");
  // Sequences, maps and optionals have no tensor of their own to feed.
  for (const auto* values : {&proto.graph().input(), &proto.graph().output()})
    for (const auto& v : *values)
      if (!v.type().has_tensor_type())
        return fail(case_status::refused,
                    std::string(values == &proto.graph().input() ? "input '" : "output '")
                      + v.name() + "' is a "
                      + (v.type().has_sequence_type()   ? "sequence"
                         : v.type().has_optional_type() ? "optional"
                         : v.type().has_map_type()      ? "map"
                                                        : "non-tensor value")
                      + "; the engine runs tensors only");
  auto sets = data_sets(cfg.dir);
  if (sets.empty())
    return fail(case_status::refused, "the case has no test_data_set_N folder");

  // Inputs and outputs by position: input_K.pb is the graph's K-th input.
  auto read_set = [](const fs::path& set, const char* prefix,
                     int count) -> result<std::vector<loaded_tensor>> {
    std::vector<loaded_tensor> out;
    for (int k = 0; k < count; ++k) {
      auto t = read_tensor_file(set / (prefix + std::to_string(k) + ".pb"));
      if (!t)
        return bad_request(set.filename().string() + "/" + t.error().message);
      out.push_back(std::move(*t));
    }
    return out;
  };
  auto first_read = read_set(sets[0], "input_", proto.graph().input_size());
  if (!first_read)
    return fail(case_status::refused, first_read.error().message);
  auto first_inputs = std::move(*first_read);

  // The original inputs, by position; those made constants leave the graph.
  std::vector<std::string> input_names;
  for (const auto& in : proto.graph().input())
    input_names.push_back(in.name());
  std::vector<bool> constant(input_names.size(), false);
  std::string constant_names;
  auto constants_note = [&] {
    return constant_names.empty() ? std::string() : " (with " + constant_names + " as constants)";
  };
  onnx::onnx_model_config mcfg;
  mcfg.model_file = model_file;
  mcfg.config.name = cfg.dir.filename().string();
  mcfg.config.max_batch_size = 0;
  mcfg.auto_complete = false;
  mcfg.threads = 1;
  std::optional<onnx::onnx_model> model;
  while (!model) {
    mcfg.config.inputs.clear();
    for (size_t k = 0; k < input_names.size(); ++k)
      if (!constant[k]) {
        tensor_config t;
        t.name = input_names[k];
        t.dtype = first_inputs[k].dtype;
        t.dims = first_inputs[k].shape;
        mcfg.config.inputs.push_back(std::move(t));
      }
    auto g = onnx::import_model_bytes(proto.SerializeAsString(), model_file.string());
    auto loaded = g ? onnx::load_onnx_graph(std::move(*g), mcfg)
                    : result<onnx::onnx_model>(g.error());
    if (loaded) {
      model = std::move(*loaded);
      break;
    }
    std::string message = without_path(loaded.error().message, model_file);
    // With one data set, an input the engine needs before the run (Clip's
    // min, Reshape's shape) becomes an initializer holding the case's value,
    // as an exported model has it.
    auto k = cfg.constant_inputs && sets.size() == 1
               ? constant_input_named(message, input_names, constant)
               : -1;
    if (k < 0)
      return fail(case_status::refused, message + constants_note());
    auto bytes = read_file(sets[0] / ("input_" + std::to_string(k) + ".pb"));
    auto* init = proto.mutable_graph()->add_initializer();
    if (!bytes || !init->ParseFromString(*bytes))
      return fail(case_status::refused, message);
    init->set_name(input_names[k]);
    auto* inputs = proto.mutable_graph()->mutable_input();
    for (int i = 0; i < inputs->size(); ++i)
      if (inputs->Get(i).name() == input_names[k]) {
        inputs->DeleteSubrange(i, 1);
        break;
      }
    constant[k] = true;
    constant_names += (constant_names.empty() ? "'" : ", '") + input_names[k] + "'";
  }
  auto instance = model->make_instance();

  for (size_t s = 0; s < sets.size(); ++s) {
    auto inputs = s == 0 ? result<std::vector<loaded_tensor>>(std::move(first_inputs))
                         : read_set(sets[s], "input_", static_cast<int>(input_names.size()));
    if (!inputs)
      return fail(case_status::refused, inputs.error().message);
    auto expected = read_set(sets[s], "output_", proto.graph().output_size());
    if (!expected)
      return fail(case_status::refused, expected.error().message);
    executor::batch_view batch;
    batch.rows = 1;
    for (size_t k = 0; k < input_names.size(); ++k) {
      const auto& t = (*inputs)[k];
      if (constant[k])
        continue;
      batch.inputs.push_back({input_names[k], t.dtype, t.shape,
                              reinterpret_cast<const uint8_t*>(t.bytes.data()), t.bytes.size()});
    }
    collecting_writer out;
    auto run = instance->execute(batch, out);
    std::string where = sets.size() > 1 ? sets[s].filename().string() + ": " : "";
    if (auto* e = std::get_if<serving_error>(&run))
      return fail(case_status::fail, where + "the run failed: "
                                       + without_path(e->message, model_file) + constants_note());
    for (int k = 0; k < proto.graph().output_size(); ++k) {
      const auto& name = proto.graph().output(k).name();
      auto it = out.outputs.find(name);
      if (it == out.outputs.end())
        return fail(case_status::fail, where + "output " + std::to_string(k) + " '" + name
                                         + "' was not produced");
      auto c = compare((*expected)[k], it->second, cfg.tol);
      if (!c.equal)
        return fail(case_status::fail, where + "output " + std::to_string(k) + " '" + name
                                         + "': " + c.detail + constants_note());
    }
  }
  return {case_status::pass, constant_names.empty() ? "" : constants_note().substr(1)};
}

case_result run_case_isolated(const case_config& cfg, const isolation_config& iso) {
  return run_isolated([&cfg] { return run_case(cfg); }, iso);
}

case_result run_isolated(const std::function<case_result()>& work, const isolation_config& iso) {
  int fds[2];
  if (pipe(fds) != 0)
    return {case_status::crashed, std::string("pipe() failed: ") + std::strerror(errno)};
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return {case_status::crashed, std::string("fork() failed: ") + std::strerror(errno)};
  }
  if (pid == 0) {
    close(fds[0]);
    // The engine's load messages would interleave with the progress lines.
    int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0)
      dup2(null_fd, STDOUT_FILENO);
    if (iso.memory_mib > 0) {
      rlimit lim{iso.memory_mib << 20, iso.memory_mib << 20};
      setrlimit(RLIMIT_AS, &lim);
    }
    if (iso.timeout_s > 0)
      alarm(iso.timeout_s);
    case_result r;
    try {
      r = work();
    } catch (const std::bad_alloc&) {
      r = {case_status::crashed, "out of memory (over " + std::to_string(iso.memory_mib)
                                   + " MiB of address space)"};
    } catch (const std::exception& e) {
      r = {case_status::crashed, std::string("exception: ") + e.what()};
    }
    std::string msg = std::string(to_string(r.status)) + "\n" + r.detail;
    for (size_t at = 0; at < msg.size();) {
      ssize_t n = write(fds[1], msg.data() + at, msg.size() - at);
      if (n <= 0)
        break;
      at += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string msg;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    msg.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(st)) {
    int sig = WTERMSIG(st);
    if (sig == SIGALRM)
      return {case_status::crashed, "timed out after " + std::to_string(iso.timeout_s) + " s"};
    return {case_status::crashed, std::string("killed by signal ") + std::to_string(sig) + " ("
                                    + strsignal(sig) + ")"};
  }
  auto nl = msg.find('\n');
  if (nl == std::string::npos)
    return {case_status::crashed, "the case's process exited with status "
                                    + std::to_string(WEXITSTATUS(st)) + " and no result"};
  std::string status = msg.substr(0, nl);
  case_result r{case_status::crashed, msg.substr(nl + 1)};
  for (auto s : {case_status::pass, case_status::fail, case_status::refused, case_status::crashed})
    if (status == to_string(s))
      r.status = s;
  return r;
}

} // namespace caf_serving::conformance
