#include "onnx/importer.hpp"

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
    default:
      return fail(origin, what + " has ONNX element type " + std::to_string(t)
                            + ", which the engine does not support (FLOAT, INT64, INT32, BOOL, "
                              "UINT8, INT8, DOUBLE are)");
  }
}

template <class Field>
void copy_field(const Field& f, std::vector<uint8_t>& out, size_t elem) {
  out.resize(static_cast<size_t>(f.size()) * elem);
  for (int i = 0; i < f.size(); ++i) {
    auto v = f.Get(i);
    std::memcpy(out.data() + i * elem, &v, elem);
  }
}

result<constant_ptr> convert_tensor(const pb::TensorProto& t, const std::string& origin) {
  auto dt = convert_type(t.data_type(), origin, "tensor '" + t.name() + "'");
  if (!dt)
    return dt.error();
  if (t.data_location() == pb::TensorProto::EXTERNAL)
    return fail(origin, "tensor '" + t.name() + "' keeps its data in an external file; "
                        "save the model with all tensors inside the .onnx file");
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
  if (t.has_raw_data()) {
    out->bytes.assign(t.raw_data().begin(), t.raw_data().end());
  } else {
    switch (*dt) {
      case datatype::fp32: copy_field(t.float_data(), out->bytes, 4); break;
      case datatype::fp64: copy_field(t.double_data(), out->bytes, 8); break;
      case datatype::int64: copy_field(t.int64_data(), out->bytes, 8); break;
      default: {
        // INT32, BOOL, UINT8, INT8 are stored widened in int32_data.
        out->bytes.resize(t.int32_data_size() * elem);
        for (int i = 0; i < t.int32_data_size(); ++i) {
          int32_t v = t.int32_data(i);
          if (elem == 4)
            std::memcpy(out->bytes.data() + i * 4, &v, 4);
          else
            out->bytes[i] = static_cast<uint8_t>(v);
        }
      }
    }
  }
  if (out->bytes.size() != n * elem)
    return fail(origin, "tensor '" + t.name() + "' has shape " + shape_string(out->shape)
                          + " but holds " + std::to_string(out->bytes.size()) + " bytes, not "
                          + std::to_string(n * elem) + "; the file is damaged");
  // Doubles are used only as constants; the engine computes in fp32.
  if (*dt == datatype::fp64) {
    auto f = make_tensor(datatype::fp32, out->shape);
    for (size_t i = 0; i < n; ++i)
      f->as_mut<float>()[i] = static_cast<float>(out->as<double>()[i]);
    return constant_ptr(f);
  }
  return constant_ptr(out);
}


/// Every node whose operator the engine cannot run, grouped by operator (with
/// its domain when that is not ONNX's), most used first: one error that lists
/// them all, so that a user sees the whole gap at once instead of one operator
/// per attempt.
std::optional<serving_error> refuse_unsupported(const pb::GraphProto& pg, int64_t opset,
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
    foreign_domain = foreign_domain || !default_domain;
    std::string key = default_domain ? pn.op_type() : pn.domain() + "." + pn.op_type();
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
    // An operator the engine runs, but that ONNX defines only after this opset.
    if (const auto* e = find_operator(op))
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
    what += "; the engine runs only the default ONNX domain (a model saved after onnxruntime's "
            "transformer optimizer uses com.microsoft operators: serve the model before "
            "optimization)";
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

result<graph> import_model(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return fail(path.string(), "cannot open the ONNX file; put the model at <model>/<version>/"
                               "model.onnx");
  std::stringstream ss;
  ss << in.rdbuf();
  return import_model_bytes(ss.str(), path.string());
}

result<graph> import_model_bytes(const std::string& bytes, const std::string& origin) {
  pb::ModelProto model;
  if (bytes.empty() || !model.ParseFromString(bytes))
    return fail(origin, "not a valid ONNX file (the protobuf does not parse: truncated or not "
                        "ONNX); re-export the model");
  if (!model.has_graph() || model.graph().node_size() == 0)
    return fail(origin, "not a valid ONNX file (no graph, or a graph without nodes); "
                        "re-export the model");
  graph g;
  g.producer = model.producer_name() + " " + model.producer_version();
  for (const auto& op : model.opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx")
      g.opset = op.version();
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
  if (auto refused = refuse_unsupported(pg, g.opset, origin))
    return *refused;
  std::map<std::string, int> by_name;
  auto value_of = [&](const std::string& name) -> int {
    auto it = by_name.find(name);
    if (it != by_name.end())
      return it->second;
    int v = g.add_value(name);
    by_name[name] = v;
    return v;
  };

  for (const auto& init : pg.initializer()) {
    auto t = convert_tensor(init, origin);
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
    g.inputs.push_back(v);
  }

  for (const auto& pn : pg.node()) {
    std::string node_name = pn.name().empty() ? pn.op_type() + "_" + std::to_string(g.nodes.size())
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
    for (const auto& o : pn.output())
      outs.push_back(o.empty() ? -1 : value_of(o));
    auto& n = g.add_node(pn.op_type(), node_name, std::move(ins), std::move(outs));
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
          auto t = convert_tensor(a.t(), origin);
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
    const auto& tt = out.type().tensor_type();
    if (tt.has_shape() && !g.values[v].shape_known) {
      auto& val = g.values[v];
      for (const auto& d : tt.shape().dim())
        val.shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
      if (auto dt = convert_type(tt.elem_type(), origin, "graph output '" + out.name() + "'"))
        val.dtype = *dt;
    }
    g.outputs.push_back(v);
  }
  return g;
}

} // namespace caf_serving::onnx
