#pragma once
/// ONNX's backend node tests run through the engine: one case is a folder in
/// the layout of onnx/backend/test/data/node (model.onnx, test_data_set_N/
/// input_K.pb and output_K.pb, written by tools/onnx_node_tests.py).
///
/// Usage:
///
///     auto r = conformance::run_case({"/cases/test_relu", 1e-3, 1e-7});
///     if (r.status != conformance::case_status::pass) std::cout << r.detail;
///
/// A case is imported and compiled as the server does it (load_onnx_model with
/// max_batch_size 0 and the case's input shapes as the config's dims), run on
/// a backend instance (the compiled plan), and each output compared with
/// output_K.pb as ONNX's runner compares: |actual - expected| <= atol +
/// rtol * |expected| for floating point (NaN matches NaN, infinities match
/// exactly), exact for integers, bool and strings, and the same shape and
/// element type.

#include "core/datatype.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace caf_serving::conformance {

/// One tensor read from a .pb file, in the engine's layout: raw little-endian
/// elements (BYTES: each element a 4-byte length then its bytes).
struct loaded_tensor {
  std::string name;
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// Parses a serialized TensorProto. Fails for element types the engine has
/// no datatype for and for data that does not fill the shape, saying which.
/// (run_case refuses a case with sequence, map or optional inputs or outputs
/// from the model's types before it reads any data.)
result<loaded_tensor> read_tensor_file(const std::filesystem::path& path);

/// The same, from bytes; `origin` names them in errors.
result<loaded_tensor> parse_tensor(const std::string& bytes, const std::string& origin);

struct tolerance {
  double rtol = 1e-3;
  double atol = 1e-7;
};

/// What comparing one output found.
struct comparison {
  bool equal = false;
  /// The largest |actual - expected| over the elements (floating point and
  /// integers; 0 for strings and bool).
  double max_abs_error = 0;
  /// Elements outside the tolerance.
  size_t mismatches = 0;
  /// Empty when equal; else what differs: shape, type, or the first
  /// mismatching element with both values.
  std::string detail;
};

/// Compares as ONNX's backend runner does (np.testing.assert_allclose for
/// floating point, with rtol at least 2^-6 for BF16 as the runner widens it).
comparison compare(const loaded_tensor& expected, const loaded_tensor& actual, tolerance tol);

enum class case_status { pass, fail, refused, crashed };

/// "pass", "fail", "refused", "crashed".
const char* to_string(case_status s);

struct case_config {
  std::filesystem::path dir;
  tolerance tol;
  /// An input the engine refuses to take at run time (its load error says
  /// the node "depends on" it: Clip's min, Reshape's shape, Slice's starts)
  /// becomes an initializer holding the case's value, and the load is tried
  /// again; the result's detail names such inputs. Exported models carry
  /// these as constants; ONNX's node tests feed them as inputs.
  bool constant_inputs = false;
};

struct case_result {
  case_status status = case_status::crashed;
  /// Why it did not pass: the engine's load error (naming the operator and
  /// opset), the output that differed and by how much, or the run's error.
  /// For a pass, empty, or "with 'x' as constants" (case_config::constant_inputs).
  std::string detail;
};

/// Loads, runs and checks every test_data_set_N of the case in this process.
/// A crash of the engine ends the process: run it in a child
/// (run_case_isolated) to survive that.
case_result run_case(const case_config& cfg);

struct isolation_config {
  /// The child is killed after this long (0: no limit).
  unsigned timeout_s = 60;
  /// Address space of the child, in MiB (0: no limit).
  size_t memory_mib = 8192;
};

/// run_case() in a forked child with a time and memory limit: a crash, an
/// abort, a hang or running out of memory is case_status::crashed with the
/// signal or limit that ended it, and the caller goes on.
case_result run_case_isolated(const case_config& cfg, const isolation_config& iso);

/// Runs `work` in a forked child under `iso`'s limits and returns its result
/// (run_case_isolated is this with run_case).
case_result run_isolated(const std::function<case_result()>& work, const isolation_config& iso);

} // namespace caf_serving::conformance
