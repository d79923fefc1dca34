#include "onnx/importer.hpp"

#include "onnx/external_data.hpp"
#include "core/half.hpp"
#include "onnx/op_registry.hpp"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace caf_serving::onnx {

namespace {

namespace pb = ::onnx;

serving_error fail(const std::string& origin, const std::string& what) {
  return {status_code::bad_request, origin + ": " + what};
}

result<datatype> convert_type(int32_t t, const std::string& origin, const std::string& what) {
  switch (t) {
    case pb::TensorProto::FLOAT: return datatype::fp32;
    case pb::TensorProto::INT64: return datatype::int64;
    case pb::TensorProto::INT32: return datatype::int32;
    case pb::TensorProto::BOOL: return datatype::bool_;
    case pb::TensorProto::UINT8: return datatype::uint8;
    case pb::TensorProto::INT8: return datatype::int8;
    case pb::TensorProto::DOUBLE: return datatype::fp64;
    case pb::TensorProto::FLOAT16: return datatype::fp16;
    case pb::TensorProto::BFLOAT16: return datatype::bf16;
    case pb::TensorProto::INT16: return datatype::int16;
    case pb::TensorProto::UINT16: return datatype::uint16;
    case pb::TensorProto::UINT32: return datatype::uint32;
    case pb::TensorProto::UINT64: return datatype::uint64;
    case pb::TensorProto::STRING: return datatype::bytes;
    default:
      return fail(origin, what + " has ONNX element type " + std::to_string(t)
                            + ", which the engine does not support (FLOAT, FLOAT16, BFLOAT16, "
                              "DOUBLE, INT64, INT32, INT16, INT8, UINT64, UINT32, UINT16, "
                              "UINT8, BOOL and STRING are)");
  }
}

/// Whether the engine holds `t` only at the graph's edges and computes it as fp32.
bool computed_as_fp32(datatype t) {
  return t == datatype::fp16 || t == datatype::bf16 || t == datatype::fp64;
}

template <class Field>
void copy_field(const Field& f, tensor_bytes& out, size_t elem) {
  out.assign(static_cast<size_t>(f.size()) * elem, 0);
  for (int i = 0; i < f.size(); ++i) {
    auto v = f.Get(i);
    std::memcpy(out.data() + i * elem, &v, elem); // little-endian: the low bytes
  }
}

/// The external_data entries of `t`; errors name what is malformed.
result<external_location> external_location_of(const pb::TensorProto& t,
                                               const std::string& origin) {
  external_location where;
  for (const auto& e : t.external_data()) {
    if (e.key() == "location") {
      where.location = e.value();
      continue;
    }
    if (e.key() != "offset" && e.key() != "length")
      continue; // "checksum" and others carry nothing the engine needs
    const auto& text = e.value();
    uint64_t n = 0;
    bool digits = !text.empty() && text.size() <= 19;
    for (char c : text) {
      digits = digits && c >= '0' && c <= '9';
      n = n * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!digits)
      return fail(origin, "tensor '" + t.name() + "' has external_data " + e.key() + " '" + text
                            + "', which is not a byte count; the file is damaged");
    if (e.key() == "offset")
      where.offset = n;
    else
      where.length = n;
  }
  return where;
}

/// Half and double tensors in the file become fp32 constants: the engine
/// computes those types in fp32 (half only at the graph's edges, see
/// import_model_from).
constant_ptr widen_to_fp32(const tensor_data& t) {
  auto f = make_tensor(datatype::fp32, t.shape);
  auto n = static_cast<size_t>(t.elements());
  float* to = f->as_mut<float>();
  for (size_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case datatype::fp64: to[i] = static_cast<float>(t.as<double>()[i]); break;
      case datatype::fp16: to[i] = fp16_to_float(t.as<uint16_t>()[i]); break;
      default: to[i] = bf16_to_float(t.as<uint16_t>()[i]); break;
    }
  }
  return f;
}

/// `files` resolves external data; null when the model was read from memory.
result<constant_ptr> convert_tensor(const pb::TensorProto& t, const std::string& origin,
                                    external_files* files) {
  auto dt = convert_type(t.data_type(), origin, "tensor '" + t.name() + "'");
  if (!dt)
    return dt.error();
  if (*dt == datatype::bytes)
    return fail(origin, "tensor '" + t.name() + "' is a STRING constant; the engine passes "
                        "STRING inputs through to outputs but does not compute on strings: "
                        "do the string processing before or after the model");
  auto out = std::make_shared<tensor_data>();
  out->dtype = *dt;
  out->shape.assign(t.dims().begin(), t.dims().end());
  // The dims come from the file: check them before anything multiplies them.
  constexpr uint64_t max_elements = uint64_t{1} << 40;
  uint64_t checked = 1;
  for (auto d : out->shape) {
    if (d < 0 || (d > 0 && checked > max_elements / static_cast<uint64_t>(d)))
      return fail(origin, "tensor '" + t.name() + "' has shape " + shape_string(out->shape)
                            + ", with a negative dimension or more than 2^40 elements; the "
                              "file is damaged");
    checked *= static_cast<uint64_t>(d);
  }
  size_t elem = element_size(*dt);
  size_t n = static_cast<size_t>(checked);
  if (t.data_location() == pb::TensorProto::EXTERNAL) {
    if (!files)
      return fail(origin, "tensor '" + t.name() + "' keeps its data in an external file, but "
                          "the model was read from memory; load it from its model.onnx file");
    auto where = external_location_of(t, origin);
    if (!where)
      return where.error();
    auto bytes = files->read(*where, n * elem, elem, t.name());
    if (!bytes)
      return fail(origin, bytes.error().message);
    out->bytes = std::move(*bytes);
  } else if (t.has_raw_data()) {
    out->bytes.assign(t.raw_data().begin(), t.raw_data().end());
  } else {
    switch (*dt) {
      case datatype::fp32: copy_field(t.float_data(), out->bytes, 4); break;
      case datatype::fp64: copy_field(t.double_data(), out->bytes, 8); break;
      case datatype::int64: copy_field(t.int64_data(), out->bytes, 8); break;
      case datatype::uint32: copy_field(t.uint64_data(), out->bytes, 4); break;
      case datatype::uint64: copy_field(t.uint64_data(), out->bytes, 8); break;
      default:
        // INT32, INT16, UINT16, INT8, UINT8, BOOL, and FLOAT16/BFLOAT16 as
        // their bits, are stored widened in int32_data.
        copy_field(t.int32_data(), out->bytes, elem);
    }
  }
  if (out->bytes.size() != n * elem)
    return fail(origin, "tensor '" + t.name() + "' has shape " + shape_string(out->shape)
                          + " but holds " + std::to_string(out->bytes.size()) + " bytes, not "
                          + std::to_string(n * elem) + "; the file is damaged");
  if (computed_as_fp32(*dt))
    return widen_to_fp32(*out);
  return constant_ptr(out);
}

/// Every node whose operator the engine cannot run, grouped by operator (with
/// its domain when that is not ONNX's), most used first: one error that lists
/// them all, so that a user sees the whole gap at once instead of one operator
/// per attempt.
std::optional<serving_error> refuse_unsupported(const pb::GraphProto& pg, int64_t opset,
                                                int64_t contrib_opset,
                                                const std::string& origin) {
  struct use {
    size_t first = 0; ///< node index of the first use, to break ties in file order
    std::vector<std::string> nodes;
  };
  std::map<std::string, use> missing;
  bool foreign_domain = false;
  for (int i = 0; i < pg.node_size(); ++i) {
    const auto& pn = pg.node(i);
    bool default_domain = pn.domain().empty() || pn.domain() == "ai.onnx";
    if (default_domain && operator_version(pn.op_type(), opset))
      continue;
    std::string key = default_domain ? pn.op_type() : pn.domain() + "." + pn.op_type();
    // com.microsoft operators are registered as "com.microsoft.<op>" (ops_contrib.hpp).
    if (pn.domain() == "com.microsoft" && operator_version(key, contrib_opset))
      continue;
    foreign_domain = foreign_domain || !default_domain;
    auto [it, fresh] = missing.try_emplace(key);
    if (fresh)
      it->second.first = static_cast<size_t>(i);
    // Nodes are numbered as the graph IR names unnamed ones.
    it->second.nodes.push_back(pn.name().empty() ? pn.op_type() + "_" + std::to_string(i)
                                                 : pn.name());
  }
  if (missing.empty())
    return std::nullopt;
  std::vector<std::pair<std::string, const use*>> order;
  size_t nodes = 0;
  for (const auto& [op, u] : missing) {
    order.emplace_back(op, &u);
    nodes += u.nodes.size();
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->nodes.size() != b.second->nodes.size()
             ? a.second->nodes.size() > b.second->nodes.size()
             : a.second->first < b.second->first;
  });
  // A 12-layer encoder repeats each node 12 times or more: the first few name it.
  constexpr size_t names_shown = 8;
  std::string list;
  for (const auto& [op, u] : order) {
    size_t count = u->nodes.size();
    list += (list.empty() ? "'" : ", '") + op + "' in " + std::to_string(count)
            + (count == 1 ? " node (" : " nodes (");
    for (size_t k = 0; k < u->nodes.size() && k < names_shown; ++k)
      list += (k ? ", '" : "'") + u->nodes[k] + "'";
    if (count > names_shown)
      list += " and " + std::to_string(count - names_shown) + " more";
    list += ")";
    // An operator the engine runs, but that ONNX defines only after this opset, or a
    // com.microsoft one in a model that does not import that domain at version 1.
    if (op.rfind("com.microsoft.", 0) == 0 && find_operator(op))
      list += " (the model does not import the com.microsoft domain at version "
              + std::to_string(find_operator(op)->since.front()) + ")";
    else if (const auto* e = find_operator(op))
      list += " (ONNX defines it from opset " + std::to_string(e->since.front()) + ")";
  }
  std::string supported;
  for (const auto& o : supported_operators())
    supported += (supported.empty() ? "" : ", ") + o;
  std::string what = std::to_string(nodes) + (nodes == 1 ? " node uses " : " nodes use ")
                     + std::to_string(order.size())
                     + (order.size() == 1 ? " operator" : " operators") + " that the engine "
                     "does not support at opset " + std::to_string(opset) + ": " + list;
  if (foreign_domain)
    what += "; the engine runs the default ONNX domain and the com.microsoft operators among "
            "the supported ones (version 1, as onnxruntime's transformer optimizer writes them); serve the "
            "model before optimization, or optimize it with those operators only";
  return fail(origin, what + "; supported operators: " + supported);
}
} // namespace

const std::vector<std::string>& supported_operators() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> v;
    for (const auto& e : registered_operators())
      v.push_back(e.op);
    return v;
  }();
  return all;
}

namespace {

/// The importer; `files` resolves external data (null: the model came from memory).
result<graph> import_model_from(const std::string& bytes, const std::string& origin,
                                external_files* files) {
  pb::ModelProto model;
  if (bytes.empty() || !model.ParseFromString(bytes))
    return fail(origin, "not a valid ONNX file (the protobuf does not parse: truncated or not "
                        "ONNX); re-export the model");
  if (!model.has_graph() || model.graph().node_size() == 0)
    return fail(origin, "not a valid ONNX file (no graph, or a graph without nodes); "
                        "re-export the model");
  graph g;
  g.producer = model.producer_name() + " " + model.producer_version();
  int64_t contrib_opset = 0; // the com.microsoft domain's version; 0 when not imported
  for (const auto& op : model.opset_import()) {
    if (op.domain().empty() || op.domain() == "ai.onnx")
      g.opset = op.version();
    if (op.domain() == "com.microsoft")
      contrib_opset = op.version();
  }
  if (g.opset == 0)
    return fail(origin, "the model imports no default-domain opset; re-export it with an opset "
                        "from " + std::to_string(min_opset) + " to " + std::to_string(max_opset));
  if (g.opset < min_opset || g.opset > max_opset)
    return fail(origin, "the model uses opset " + std::to_string(g.opset)
                          + ", but the engine supports opsets " + std::to_string(min_opset)
                          + " to " + std::to_string(max_opset)
                          + "; re-export it with an opset in that range, e.g. "
                            "torch.onnx.export(..., opset_version=18)");

  const auto& pg = model.graph();
  if (auto refused = refuse_unsupported(pg, g.opset, contrib_opset, origin))
    return *refused;
  std::map<std::string, int> by_name;
  /// STRING values (graph inputs and Identity copies of them): the input each copies.
  std::map<int, std::string> string_source;
  auto value_of = [&](const std::string& name) -> int {
    auto it = by_name.find(name);
    if (it != by_name.end())
      return it->second;
    int v = g.add_value(name);
    by_name[name] = v;
    return v;
  };

  for (const auto& init : pg.initializer()) {
    auto t = convert_tensor(init, origin, files);
    if (!t)
      return t.error();
    by_name[init.name()] = g.add_constant(init.name(), *t);
  }
  for (const auto& in : pg.input()) {
    if (by_name.count(in.name()))
      continue; // an initializer listed as input (IR version < 4)
    const auto& tt = in.type().tensor_type();
    auto dt = convert_type(tt.elem_type(), origin, "graph input '" + in.name() + "'");
    if (!dt)
      return dt.error();
    std::vector<int64_t> shape;
    for (const auto& d : tt.shape().dim())
      shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
    int v = g.add_value(in.name(), *dt, shape, tt.has_shape());
    by_name[in.name()] = v;
    if (*dt == datatype::bytes) {
      // Served as Triton's BYTES beside the computation, never inside it.
      g.strings.inputs.push_back({in.name(), shape});
      string_source[v] = in.name();
      continue;
    }
    g.inputs.push_back(v);
    if (computed_as_fp32(*dt)) {
      // Clients send half (or double); the graph computes on its fp32 copy.
      int wide = g.add_value(in.name() + "/fp32");
      auto& cast = g.add_node("Cast", in.name() + "/to_fp32", {v}, {wide});
      cast.set_i("to", pb::TensorProto::FLOAT);
      by_name[in.name()] = wide;
    }
  }

  for (int index = 0; index < pg.node_size(); ++index) {
    const auto& pn = pg.node(index);
    std::string node_name = pn.name().empty() ? pn.op_type() + "_" + std::to_string(index)
                                              : pn.name();
    std::vector<int> ins, outs;
    for (const auto& i : pn.input()) {
      if (i.empty()) {
        ins.push_back(-1);
        continue;
      }
      if (!by_name.count(i))
        return fail(origin, "node '" + node_name + "' (" + pn.op_type() + ") reads '" + i
                              + "', which no earlier node, input or initializer produces; the "
                                "graph is not in topological order or is damaged");
      ins.push_back(by_name[i]);
    }
    if (auto reads_string = std::find_if(ins.begin(), ins.end(), [&](int v) {
          return v >= 0 && string_source.count(v) > 0;
        });
        reads_string != ins.end()) {
      if (pn.op_type() != "Identity" || pn.output_size() != 1 || pn.output(0).empty())
        return fail(origin, "node '" + node_name + "' (" + pn.op_type() + ") computes on the "
                              "STRING tensor '" + g.values[*reads_string].name
                              + "'; the engine passes STRING inputs through to outputs "
                                "(Identity) but does not compute on strings: do the string "
                                "processing before or after the model");
      int out = value_of(pn.output(0));
      g.values[out].dtype = datatype::bytes;
      string_source[out] = string_source[*reads_string];
      continue;
    }
    for (const auto& o : pn.output())
      outs.push_back(o.empty() ? -1 : value_of(o));
    // A com.microsoft node keeps its domain in its op, apart from the engine's own fused
    // operators of the same name (ops_contrib.hpp).
    std::string op = pn.domain() == "com.microsoft" ? "com.microsoft." + pn.op_type()
                                                    : pn.op_type();
    auto& n = g.add_node(op, node_name, std::move(ins), std::move(outs));
    for (const auto& a : pn.attribute()) {
      attribute at;
      switch (a.type()) {
        case pb::AttributeProto::INT: at.kind = attribute::kind_t::i; at.i = a.i(); break;
        case pb::AttributeProto::FLOAT: at.kind = attribute::kind_t::f; at.f = a.f(); break;
        case pb::AttributeProto::STRING: at.kind = attribute::kind_t::s; at.s = a.s(); break;
        case pb::AttributeProto::INTS:
          at.kind = attribute::kind_t::ints;
          at.ints.assign(a.ints().begin(), a.ints().end());
          break;
        case pb::AttributeProto::FLOATS:
          at.kind = attribute::kind_t::floats;
          at.floats.assign(a.floats().begin(), a.floats().end());
          break;
        case pb::AttributeProto::TENSOR: {
          at.kind = attribute::kind_t::tensor;
          auto t = convert_tensor(a.t(), origin, files);
          if (!t)
            return t.error();
          at.t = *t;
          break;
        }
        default:
          return fail(origin, "node '" + node_name + "' (" + pn.op_type() + ", opset "
                                + std::to_string(g.opset) + ") has attribute '" + a.name()
                                + "' of a kind the engine does not read");
      }
      n.attrs[a.name()] = std::move(at);
    }
  }
  // Each node against the version of its operator that the opset selects.
  for (const auto& n : g.nodes)
    if (auto why = check_node_version(g, n))
      return fail(origin, "node '" + n.name + "' (" + n.op + ", opset " + std::to_string(g.opset)
                            + "): " + *why);
  for (const auto& out : pg.output()) {
    if (!by_name.count(out.name()))
      return fail(origin, "graph output '" + out.name() + "' is produced by no node");
    int v = by_name[out.name()];
    if (auto s = string_source.find(v); s != string_source.end()) {
      g.strings.outputs.push_back({out.name(), s->second});
      continue;
    }
    const auto& tt = out.type().tensor_type();
    auto declared = convert_type(tt.elem_type(), origin, "graph output '" + out.name() + "'");
    if (declared && computed_as_fp32(*declared)) {
      // The graph computes the fp32 value; a last Cast stores it as the model
      // declares, so that clients receive half (or double).
      g.values[v].name = out.name() + "/fp32";
      std::vector<int64_t> shape;
      for (const auto& d : tt.shape().dim())
        shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
      int stored = g.add_value(out.name(), *declared, shape);
      auto& cast = g.add_node("Cast", out.name() + "/to_" + std::string(to_string(*declared)),
                              {v}, {stored});
      cast.set_i("to", *declared == datatype::fp16   ? pb::TensorProto::FLOAT16
                       : *declared == datatype::bf16 ? pb::TensorProto::BFLOAT16
                                                     : pb::TensorProto::DOUBLE);
      cast.set_i("storage", 1);
      g.outputs.push_back(stored);
      continue;
    }
    if (tt.has_shape() && !g.values[v].shape_known) {
      auto& val = g.values[v];
      for (const auto& d : tt.shape().dim())
        val.shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
      if (declared)
        val.dtype = *declared;
    }
    g.outputs.push_back(v);
  }
  return g;
}

} // namespace

result<graph> import_model(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return fail(path.string(), "cannot open the ONNX file; put the model at <model>/<version>/"
                               "model.onnx");
  std::stringstream ss;
  ss << in.rdbuf();
  external_files files(path.parent_path());
  return import_model_from(ss.str(), path.string(), &files);
}

result<graph> import_model_bytes(const std::string& bytes, const std::string& origin) {
  return import_model_from(bytes, origin, nullptr);
}

} // namespace caf_serving::onnx
