// Cases for cmake/CafServingOpDispatch.cmake (never compiled): a pass.

// Refused: an else-if chain on the node's name (2 offences, one per else-if).
void fuse(graph& g, node& n) {
  if (n.op == "Conv")
    n.op = "FusedConv";
  else if (n.op == "MatMul")
    n.op = "FusedMatMul";
  else if (n.op == "Gemm")
    n.op = "FusedGemm";
}

// Refused: a conditional expression choosing by the name twice (1 offence).
int fallback_axis(const node& n) {
  return n.op == "ArgMax" ? 0 : n.op == "ArgMin" ? 0 : -1;
}

// Left alone: one special case, and a pattern over the neighbouring nodes.
bool fusable(const graph& g, const node& n, int p) {
  if (n.op == "Mul")
    return false;
  if (g.nodes[p].op == "Add" && g.nodes[p + 1].op == "Relu")
    return true;
  return g.nodes[p].op == "Sigmoid";
}
