#include "repository/model_repository.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

namespace caf_serving::repository {

namespace fs = std::filesystem;

namespace {

/// A version directory's name: decimal digits only, fitting in int64.
std::optional<int64_t> parse_version(const std::string& name) {
  // No leading zeros: "01" would name the same version as "1".
  if (name.empty() || name.size() > 18 || (name.size() > 1 && name[0] == '0'))
    return std::nullopt;
  int64_t value = 0;
  for (char c : name) {
    if (c < '0' || c > '9')
      return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

std::string versions_text(const std::vector<int64_t>& versions) {
  std::string out;
  for (size_t i = 0; i < versions.size(); ++i) {
    if (i > 0)
      out += ", ";
    out += std::to_string(versions[i]);
  }
  return out;
}

/// A model name that is safe to join onto the repository path: a load request
/// must not reach outside the repository.
bool is_plain_name(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.front() == '.')
    return false;
  return name.find_first_of("/\\") == std::string_view::npos
         && name.find('\0') == std::string_view::npos;
}

result<std::string> read_file(const fs::path& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in)
    return bad_request("cannot read " + path.string()
                       + "; check that the file exists and is readable");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

model_entry failed(model_entry entry, serving_error err) {
  entry.config = std::move(err);
  entry.versions.clear();
  entry.version_dirs.clear();
  return entry;
}

/// Loads one model directory that is known to exist.
model_entry load_dir(const fs::path& model_dir, const std::string& name,
                     const scan_config& cfg) {
  model_entry entry{name, model_dir, {}, {},
                    bad_request("model '" + name + "' was not loaded")};
  auto config_path = model_dir / "config.pbtxt";
  std::error_code ec;
  std::string text;
  if (fs::exists(config_path, ec)) {
    auto contents = read_file(config_path);
    if (!contents)
      return failed(std::move(entry),
                    bad_request("model '" + name + "': "
                                + contents.error().message));
    text = std::move(*contents);
  } else if (!cfg.allow_missing_io) {
    return failed(std::move(entry),
                  bad_request("model '" + name + "': no config.pbtxt in "
                              + model_dir.string()
                              + "; add one that names the backend, inputs "
                                "and outputs"));
  }

  parse_context ctx{name, config_path.string(), cfg.allow_missing_io};
  auto parsed = parse_model_config_full(text, ctx);
  if (!parsed)
    return failed(std::move(entry), parsed.error());

  for (const auto& [output, file] : parsed->label_filenames) {
    if (!fs::is_regular_file(model_dir / file, ec))
      return failed(std::move(entry),
                    bad_request("model '" + name + "': output '" + output
                                + "' names label_filename '" + file
                                + "', but " + (model_dir / file).string()
                                + " is no file; add it (one label per line) "
                                  "or remove label_filename"));
  }

  auto available = list_versions(model_dir);
  if (available.empty())
    return failed(std::move(entry),
                  bad_request("model '" + name + "': no version directory in "
                              + model_dir.string() + "; put the model file in "
                              + (model_dir / "1").string() + "/"));
  auto chosen = select_versions(parsed->versions, available, name);
  if (!chosen)
    return failed(std::move(entry), chosen.error());

  entry.versions = std::move(*chosen);
  for (auto v : entry.versions)
    entry.version_dirs.push_back(model_dir / std::to_string(v));
  entry.config = std::move(*parsed);
  return entry;
}

} // namespace

std::vector<int64_t> list_versions(const fs::path& model_dir) {
  std::vector<int64_t> versions;
  std::error_code ec;
  for (fs::directory_iterator it{model_dir, ec}, end; !ec && it != end;
       it.increment(ec)) {
    if (!it->is_directory(ec))
      continue;
    if (auto v = parse_version(it->path().filename().string()))
      versions.push_back(*v);
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

result<std::vector<int64_t>>
select_versions(const version_policy& policy,
                const std::vector<int64_t>& available, std::string_view model) {
  switch (policy.kind) {
    case version_policy_kind::all:
      return available;
    case version_policy_kind::specific: {
      std::vector<int64_t> missing;
      for (auto v : policy.versions)
        if (!std::binary_search(available.begin(), available.end(), v))
          missing.push_back(v);
      if (!missing.empty())
        return bad_request(
          "model '" + std::string{model} + "': version_policy asks for version "
          + versions_text(missing) + ", but only version "
          + versions_text(available)
          + " exist; add the version directory or change version_policy");
      return policy.versions;
    }
    case version_policy_kind::latest:
    default: {
      auto n = std::min<size_t>(policy.num_versions, available.size());
      return std::vector<int64_t>(available.end() - n, available.end());
    }
  }
}

model_entry load_model_config(const fs::path& repo, std::string_view name,
                              const scan_config& cfg) {
  std::string model{name};
  auto dir = repo / model;
  model_entry entry{model, dir, {}, {},
                    bad_request("model '" + model + "' was not loaded")};
  if (!is_plain_name(name))
    return failed(std::move(entry),
                  bad_request("'" + model + "' is not a model name; a model "
                              "is named by its directory in the repository, "
                              "without '/' or a leading '.'"));
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return failed(std::move(entry),
                  not_found("model '" + model + "' is not in the repository "
                            + repo.string() + "; create " + dir.string()
                            + "/ with a config.pbtxt and a version directory"));
  return load_dir(dir, model, cfg);
}

result<std::vector<model_entry>>
scan_repository(const fs::path& repo, const scan_config& cfg) {
  std::error_code ec;
  if (!fs::is_directory(repo, ec))
    return not_found("model repository " + repo.string()
                     + " is no directory; pass the directory that holds one "
                       "subdirectory per model");
  std::vector<std::string> names;
  fs::directory_iterator it{repo, ec};
  if (ec)
    return bad_request("cannot read model repository " + repo.string() + ": "
                       + ec.message());
  for (fs::directory_iterator end; it != end; it.increment(ec)) {
    if (ec)
      return bad_request("cannot read model repository " + repo.string()
                         + ": " + ec.message());
    auto name = it->path().filename().string();
    if (!is_plain_name(name) || !it->is_directory(ec))
      continue;
    names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  std::vector<model_entry> entries;
  entries.reserve(names.size());
  for (const auto& name : names)
    entries.push_back(load_dir(repo / name, name, cfg));
  return entries;
}

// -- model control -------------------------------------------------------------

model_entry load_model_with_config(const fs::path& model_dir, std::string_view name,
                                   parsed_model_config config) {
  std::string model{name};
  model_entry entry{model, model_dir, {}, {},
                    bad_request("model '" + model + "' was not loaded")};
  std::error_code ec;
  for (const auto& [output, file] : config.label_filenames)
    if (!fs::is_regular_file(model_dir / file, ec))
      return failed(std::move(entry),
                    bad_request("model '" + model + "': output '" + output
                                + "' names label_filename '" + file + "', but "
                                + (model_dir / file).string()
                                + " is no file; send it as a file: parameter or remove "
                                  "label_filename"));
  auto available = list_versions(model_dir);
  if (available.empty())
    return failed(std::move(entry),
                  bad_request("model '" + model + "': no version directory in "
                              + model_dir.string()
                              + "; send the model file as file:1/<name>"));
  auto chosen = select_versions(config.versions, available, model);
  if (!chosen)
    return failed(std::move(entry), chosen.error());
  entry.versions = std::move(*chosen);
  for (auto v : entry.versions)
    entry.version_dirs.push_back(model_dir / std::to_string(v));
  entry.config = std::move(config);
  return entry;
}

std::vector<std::string> list_model_names(const fs::path& repo) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it{repo, ec}, end; !ec && it != end; it.increment(ec)) {
    auto name = it->path().filename().string();
    if (is_plain_name(name) && it->is_directory(ec))
      names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t model_fingerprint(const fs::path& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    return 0;
  // FNV-1a over the sorted entries, so that the order of readdir does not matter.
  std::vector<std::string> rows;
  for (fs::recursive_directory_iterator it{model_dir, ec}, end; !ec && it != end;
       it.increment(ec)) {
    auto status = it->symlink_status(ec);
    if (ec)
      break;
    auto row = fs::relative(it->path(), model_dir, ec).string();
    row += '|' + std::to_string(static_cast<int>(status.type()));
    if (fs::is_regular_file(status))
      row += '|' + std::to_string(it->file_size(ec));
    auto written = it->last_write_time(ec);
    row += '|' + std::to_string(written.time_since_epoch().count());
    rows.push_back(std::move(row));
  }
  std::sort(rows.begin(), rows.end());
  uint64_t hash = 1469598103934665603ull;
  for (const auto& row : rows)
    for (char c : row + '\n') {
      hash ^= static_cast<unsigned char>(c);
      hash *= 1099511628211ull;
    }
  return hash == 0 ? 1 : hash;
}

} // namespace caf_serving::repository
