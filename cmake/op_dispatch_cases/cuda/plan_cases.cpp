// Cases for cmake/CafServingOpDispatch.cmake (never compiled): a backend.

// Refused: a run of ifs on the node's name (2 offences, the second and third).
std::optional<data_plan> plan(const graph& g, const node& n) {
  if (n.op == "Transpose")
    return transpose(g, n);
  if (n.op == "Concat") return concat(g, n);
  if (n.op == "Split") {
    return split(g, n);
  }
  return std::nullopt;
}

// Left alone: two ifs on the name with another statement between them.
bool special(const node& n) {
  if (n.op == "Mul")
    return true;
  bool pooled = pools(n);
  if (n.op == "GlobalAveragePool")
    return pooled;
  return false;
}

// Refused: an else-if on a name's constant (1 offence).
std::vector<int> tied(const node& n) {
  if (n.op == quant_add_op && spans(n))
    return {n.inputs[0], n.inputs[3], n.outputs[0]};
  else if (n.op == quant_max_pool_op)
    return {n.inputs[0], n.outputs[0]};
  return {};
}
