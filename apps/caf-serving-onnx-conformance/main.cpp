/// caf-serving-onnx-conformance CASES_DIR [options]: runs ONNX's backend node
/// tests (written by tools/onnx_node_tests.py) through the engine, each case in
/// a child process, and reports pass / fail / refused / crashed per case.

#include "conformance.hpp"
#include "onnx/importer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

using namespace caf_serving;
namespace fs = std::filesystem;

namespace {

constexpr const char* usage =
  "usage: caf-serving-onnx-conformance CASES_DIR [options]\n"
  "  Runs every case in CASES_DIR (folders of model.onnx and test_data_set_N/input_K.pb,\n"
  "  output_K.pb, as tools/onnx_node_tests.py writes them; CASES_DIR/manifest.tsv gives each\n"
  "  case's operator and tolerances) through the engine's importer and compiled plans, each in\n"
  "  a child process, and compares the outputs at ONNX's tolerances (rtol 1e-3, atol 1e-7\n"
  "  unless the manifest says otherwise; exact for integers, bool and strings).\n"
  "options:\n"
  "  --results FILE     write one line per case: case, operator, status, detail (tab-separated)\n"
  "  --filter TEXT      run only the cases whose name contains TEXT\n"
  "  --timeout-s N      kill a case after N seconds (default 60; 0: never)\n"
  "  --memory-mib N     address space of a case's process in MiB (default 8192; 0: no limit)\n"
  "  --constant-inputs  make an input the engine needs before the run (Clip's min, Reshape's\n"
  "                     shape) a constant holding the case's value, as exported models have it\n"
  "  --in-process       run the cases in this process (for a debugger; a crash ends the run)\n"
  "  --verbose          print every case's result, not only failures and crashes\n"
  "  --list-operators   print the operators the engine supports, one a line, and exit\n"
  "  --opsets           print the engine's lowest and highest default-domain opset and exit\n"
  "exit status: 0 every case passed, 1 some case did not, 2 bad usage\n";

struct options {
  fs::path cases;
  fs::path results;
  std::string filter;
  conformance::isolation_config iso;
  bool in_process = false;
  bool constant_inputs = false;
  bool verbose = false;
};

struct case_entry {
  std::string name;
  std::string op;
  conformance::tolerance tol;
};

int usage_error(const std::string& what) {
  std::cerr << "caf-serving-onnx-conformance: " << what << "\n" << usage;
  return 2;
}

bool parse_count(const std::string& text, unsigned long& out) {
  char* end = nullptr;
  out = std::strtoul(text.c_str(), &end, 10);
  return !text.empty() && *end == '\0' && text[0] != '-';
}

/// The cases of manifest.tsv in its order, else every folder with a model.onnx.
std::vector<case_entry> find_cases(const fs::path& dir) {
  std::vector<case_entry> cases;
  std::ifstream manifest(dir / "manifest.tsv");
  if (manifest) {
    for (std::string line; std::getline(manifest, line);) {
      if (line.empty() || line[0] == '#')
        continue;
      std::vector<std::string> f;
      std::istringstream is(line);
      for (std::string field; std::getline(is, field, '\t');)
        f.push_back(field);
      case_entry c{f[0], f.size() > 1 ? f[1] : f[0], {}};
      if (f.size() > 5) {
        c.tol.rtol = std::strtod(f[4].c_str(), nullptr);
        c.tol.atol = std::strtod(f[5].c_str(), nullptr);
      }
      cases.push_back(c);
    }
    return cases;
  }
  for (const auto& e : fs::directory_iterator(dir))
    if (fs::exists(e.path() / "model.onnx"))
      cases.push_back({e.path().filename().string(), e.path().filename().string(), {}});
  std::sort(cases.begin(), cases.end(),
            [](const case_entry& a, const case_entry& b) { return a.name < b.name; });
  return cases;
}

/// One line of the results file: tabs and newlines in the detail become spaces.
std::string one_line(std::string s) {
  for (auto& ch : s)
    if (ch == '\t' || ch == '\n' || ch == '\r')
      ch = ' ';
  return s;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= args.size())
        return false;
      out = args[++i];
      return true;
    };
    std::string v;
    unsigned long n = 0;
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      return 0;
    } else if (a == "--list-operators") {
      for (const auto& op : onnx::supported_operators())
        std::cout << op << "\n";
      return 0;
    } else if (a == "--opsets") {
      std::cout << onnx::min_opset << " " << onnx::max_opset << "\n";
      return 0;
    } else if (a == "--results") {
      if (!value(v)) return usage_error("--results needs a file name");
      opt.results = v;
    } else if (a == "--filter") {
      if (!value(v)) return usage_error("--filter needs a text");
      opt.filter = v;
    } else if (a == "--timeout-s") {
      if (!value(v) || !parse_count(v, n))
        return usage_error("--timeout-s needs a count of seconds, e.g. --timeout-s 60");
      opt.iso.timeout_s = static_cast<unsigned>(n);
    } else if (a == "--memory-mib") {
      if (!value(v) || !parse_count(v, n))
        return usage_error("--memory-mib needs a count of MiB, e.g. --memory-mib 8192");
      opt.iso.memory_mib = n;
    } else if (a == "--constant-inputs") {
      opt.constant_inputs = true;
    } else if (a == "--in-process") {
      opt.in_process = true;
    } else if (a == "--verbose") {
      opt.verbose = true;
    } else if (!a.empty() && a[0] == '-') {
      return usage_error("unknown option '" + a + "'");
    } else if (opt.cases.empty()) {
      opt.cases = a;
    } else {
      return usage_error("one CASES_DIR only; '" + a + "' is a second");
    }
  }
  if (opt.cases.empty())
    return usage_error("give the folder of cases (tools/onnx_node_tests.py OUT writes one)");
  if (!fs::is_directory(opt.cases))
    return usage_error("'" + opt.cases.string() + "' is not a folder of cases");

  auto all = find_cases(opt.cases);
  std::vector<case_entry> cases;
  for (const auto& c : all)
    if (opt.filter.empty() || c.name.find(opt.filter) != std::string::npos)
      cases.push_back(c);
  if (cases.empty())
    return usage_error("no cases in '" + opt.cases.string() + "'"
                       + (opt.filter.empty() ? "" : " match '" + opt.filter + "'"));
  std::ofstream results;
  if (!opt.results.empty()) {
    results.open(opt.results);
    if (!results)
      return usage_error("cannot write '" + opt.results.string() + "'");
    results << "# case\toperator\tstatus\tdetail\n";
  }

  size_t counts[4] = {0, 0, 0, 0};
  auto started = std::chrono::steady_clock::now();
  auto last_progress = started;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    conformance::case_config cfg{opt.cases / c.name, c.tol, opt.constant_inputs};
    auto r = opt.in_process ? conformance::run_case(cfg)
                            : conformance::run_case_isolated(cfg, opt.iso);
    ++counts[static_cast<int>(r.status)];
    if (results)
      results << c.name << "\t" << c.op << "\t" << to_string(r.status) << "\t"
              << one_line(r.detail) << std::endl;
    bool show = opt.verbose || r.status == conformance::case_status::fail
                || r.status == conformance::case_status::crashed;
    if (show)
      std::cout << to_string(r.status) << " " << c.name << " (" << c.op << ")"
                << (r.detail.empty() ? "" : ": " + one_line(r.detail)) << std::endl;
    auto now = std::chrono::steady_clock::now();
    if (now - last_progress > std::chrono::seconds(10) || i + 1 == cases.size()) {
      last_progress = now;
      std::cerr << "[" << i + 1 << "/" << cases.size() << "] " << counts[0] << " passed, "
                << counts[1] << " failed, " << counts[2] << " refused, " << counts[3]
                << " crashed, "
                << std::chrono::duration_cast<std::chrono::seconds>(now - started).count()
                << " s" << std::endl;
    }
  }
  std::cout << counts[0] << " of " << cases.size() << " cases passed, " << counts[1]
            << " failed, " << counts[2] << " refused at load, " << counts[3] << " crashed"
            << std::endl;
  return counts[0] == cases.size() ? 0 : 1;
}
