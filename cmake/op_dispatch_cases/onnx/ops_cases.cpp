// Cases for cmake/CafServingOpDispatch.cmake (never compiled): an operator file.

// Refused: an operator file picks by the name (1 offence).
void run_unary(const node& n, const tensor_ref& x, const tensor_ref& y) {
  each(x, y, n.op == "Sin" ? sine : cosine);
}
