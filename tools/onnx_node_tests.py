#!/usr/bin/env python3
"""Writes ONNX's backend node tests (onnx.backend.test.case.node) to a folder.

Usage:
    onnx_node_tests.py write OUT [--fit-opset 13:17] [--only OP[,OP...]] [--cases NAME,...]
    onnx_node_tests.py report --cases-dir OUT --results RESULTS.tsv --operators OPS.txt
                       --opsets "13 17" --markdown docs/onnx-conformance.md
                       [--failures conform-failures.md]

Each case gets the layout of onnx/backend/test/data/node:
    OUT/<case>/model.onnx
    OUT/<case>/test_data_set_0/input_K.pb, output_K.pb   (TensorProto, SequenceProto, ...)
and OUT/manifest.tsv lists one case a line, tab-separated:
    case  operator  opset  written_opset  rtol  atol
where `operator` is the operator the case tests (for a function's "_expanded" case,
the function's operator, not the nodes of its body), `opset` the case's own
default-domain opset and `written_opset` the one model.onnx imports.

--fit-opset LO:HI rewrites a case's default-domain opset into [LO, HI] (the
nearest opset there) when every operator of the graph, subgraphs included, has
the same version at both opsets (onnx.defs tells), so the model means exactly
the same; an engine that supports only LO..HI can then run cases written at
older or newer opsets. Cases that cannot be fitted keep their opset.

ONNX's own runner compares with rtol 1e-3 and atol 1e-7 unless a case says
otherwise; the manifest carries each case's values.

`report` turns the results of caf-serving-onnx-conformance (--results) into
the conformance table: totals, one row per operator, and every case of an
operator the engine supports (--operators, from --list-operators) that did not
pass, with the reason. scripts/onnx-conformance runs all three steps.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import shutil
import sys

import onnx
import onnx.backend.test.case.node as node_cases
import onnx.defs
from onnx import TensorProto, numpy_helper


def _write_value(path: str, value, type_proto: onnx.TypeProto, name: str) -> None:
    """Serializes one input or output as onnx's cmd_tools does for model tests."""
    if type_proto.HasField("map_type"):
        proto = numpy_helper.from_dict(value, name)
    elif type_proto.HasField("sequence_type"):
        proto = numpy_helper.from_list(value, name)
    elif type_proto.HasField("optional_type"):
        proto = numpy_helper.from_optional(value, name)
    elif isinstance(value, TensorProto):
        proto = value
    else:
        proto = numpy_helper.from_array(value, name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def _nodes(graph: onnx.GraphProto):
    """Every node of `graph` and of the subgraphs in its attributes."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _nodes(g)


def _version_at(op: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset, "").since_version
    except Exception:  # not defined at that opset
        return None


def fitted_opset(model: onnx.ModelProto, lo: int, hi: int) -> int:
    """The opset in [lo, hi] nearest the model's at which every default-domain
    operator of the graph resolves to the same schema version; else the model's."""
    opset = _default_opset(model)
    if opset == 0 or lo <= opset <= hi:
        return opset
    ops = {n.op_type for n in _nodes(model.graph) if n.domain in ("", "ai.onnx")}
    want = {op: _version_at(op, opset) for op in ops}
    if any(v is None for v in want.values()):
        return opset
    candidates = range(hi, lo - 1, -1) if opset > hi else range(lo, hi + 1)
    for target in candidates:
        if all(_version_at(op, target) == v for op, v in want.items()):
            return target
    return opset


def _set_opset(model: onnx.ModelProto, opset: int) -> None:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = opset


def _parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        lo_i, hi_i = int(lo), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not LO:HI, e.g. 13:17") from None
    if lo_i > hi_i:
        raise argparse.ArgumentTypeError(f"'{text}': LO is above HI")
    return lo_i, hi_i


def write_cases(args: argparse.Namespace) -> int:

    only = {o for o in args.only.split(",") if o}
    names = {c for c in args.cases.split(",") if c}
    cases = node_cases.collect_testcases()
    # The operator of a case: its single node's, or for "<name>_expanded[_verN]"
    # the operator of <name>, whose function body the expanded graph inlines.
    op_of = {c.name: c.model.graph.node[0].op_type for c in cases
             if "_expanded" not in c.name and len(c.model.graph.node) > 0}

    def operator(case) -> str:
        if "_expanded" in case.name:
            base = case.name[: case.name.index("_expanded")]
            if base in op_of:
                return op_of[base]
        return op_of.get(case.name, case.model.graph.node[0].op_type)

    os.makedirs(args.out, exist_ok=True)
    written = 0
    with open(os.path.join(args.out, "manifest.tsv"), "w") as manifest:
        manifest.write("# case\toperator\topset\twritten_opset\trtol\tatol\n")
        for case in cases:
            op = operator(case)
            if (only and op not in only) or (names and case.name not in names):
                continue
            model = case.model
            opset = _default_opset(model)
            target = fitted_opset(model, *args.fit_opset) if args.fit_opset else opset
            if target != opset:
                model = onnx.ModelProto.FromString(model.SerializeToString())
                _set_opset(model, target)
            case_dir = os.path.join(args.out, case.name)
            if os.path.exists(case_dir):
                shutil.rmtree(case_dir)
            os.makedirs(case_dir)
            with open(os.path.join(case_dir, "model.onnx"), "wb") as f:
                f.write(model.SerializeToString())
            for i, (inputs, outputs) in enumerate(case.data_sets):
                data_dir = os.path.join(case_dir, f"test_data_set_{i}")
                os.makedirs(data_dir)
                for j, value in enumerate(inputs):
                    vi = model.graph.input[j]
                    _write_value(os.path.join(data_dir, f"input_{j}.pb"), value, vi.type, vi.name)
                for j, value in enumerate(outputs):
                    vi = model.graph.output[j]
                    _write_value(os.path.join(data_dir, f"output_{j}.pb"), value, vi.type, vi.name)
            manifest.write(f"{case.name}\t{op}\t{opset}\t{target}\t{case.rtol!r}\t{case.atol!r}\n")
            written += 1
    print(f"wrote {written} node cases of onnx {onnx.__version__} to {args.out}", file=sys.stderr)
    return 0


def _read_tsv(path: str) -> list[list[str]]:
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]


def short_reason(detail: str) -> str:
    """The engine's message without the parts every case repeats."""
    text = re.sub(r"^model '[^']*': ", "", detail)
    text = re.sub(r"^model\.onnx: ", "", text)
    text = re.sub(r"; supported operators: .*", "", text)
    text = re.sub(r"; re-export it, e\.g\. .*", "", text)
    text = text.replace("|", "\\|")
    return text if len(text) <= 220 else text[:217] + "..."


def refusal_kind(detail: str) -> str:
    """A refusal's reason in a few words, for the summary of why cases are refused."""
    kinds = (
        (r"the model uses opset (\d+)", lambda m: f"opset {m.group(1)} outside the engine's range"),
        (r"element type|is [A-Z]+[0-9]*; the engine runs", lambda m: "element type the engine does not run"),
        (r"does not support at opset", lambda m: "function expansion uses an unsupported operator"),
        (r"must be known before the model runs", lambda m: "needs an input's value at load"),
        (r"the engine runs tensors only", lambda m: "sequence, map or optional value"),
    )
    for pattern, name in kinds:
        m = re.search(pattern, detail)
        if m:
            return name(m)
    return "attribute, input form or output the engine does not run"


def write_report(args: argparse.Namespace) -> int:
    manifest = {row[0]: row for row in _read_tsv(os.path.join(args.cases_dir, "manifest.tsv"))}
    results = _read_tsv(args.results)
    with open(args.operators) as f:
        supported = {line.strip() for line in f if line.strip()}
    lo, hi = (int(x) for x in args.opsets.split())
    by_op: dict[str, list[list[str]]] = collections.defaultdict(list)
    for row in results:
        row += [""] * (4 - len(row))
        by_op[row[1]].append(row)
    totals = collections.Counter(r[2] for r in results)
    sup_rows = [r for op in supported for r in by_op.get(op, [])]
    sup_totals = collections.Counter(r[2] for r in sup_rows)
    fitted = [n for n, m in manifest.items() if len(m) > 3 and m[2] != m[3]]

    out = []
    w = out.append
    w("# ONNX backend node tests through the engine")
    w("")
    w(f"Written by `scripts/onnx-conformance` on {datetime.date.today().isoformat()}: the "
      f"{len(results)} node tests of onnx {onnx.__version__} "
      "(`onnx.backend.test.case.node`), each imported, compiled and run by "
      "`caf-serving-onnx-conformance` as the server does it (load_onnx_model with "
      "max_batch_size 0, the case's input shapes, a backend instance running the compiled "
      "plan), in a child process of its own, and compared with ONNX's expected outputs at "
      "ONNX's tolerances (rtol 1e-3, atol 1e-7 unless the case sets others; exact for "
      "integers, bool and strings).")
    w("")
    w(f"The engine supports default-domain opsets {lo} to {hi}. "
      + (f"{len(fitted)} cases written at another opset were rewritten to the nearest opset in "
         f"{lo}..{hi} at which every operator of the case has the same version (onnx.defs), "
         "so that the model means the same; cases that could not be fitted keep their opset "
         "and are refused for it." if args.fitted else
         "Cases at other opsets are run as written (refused for their opset)."))
    w("")
    w("To run it again: build the runner (`cmake --build build --target "
      "caf-serving-onnx-conformance`), then `scripts/onnx-conformance` (it needs PyPI for "
      "onnx 1.23.2; `--help` lists its options). One case by hand: `tools/onnx_node_tests.py "
      "write /tmp/cases --fit-opset 13:17 --cases test_relu` and `caf-serving-onnx-conformance "
      "/tmp/cases --constant-inputs --verbose`. CI runs a sample of passing cases "
      "(tests/onnx/node_cases, `ctest -R onnx.node_cases`).")
    w("")
    constant_passes = [r for r in results if r[2] == "pass" and r[3]]
    if args.constant_inputs:
        w("The runner ran with `--constant-inputs`: where the engine refused a case because a "
          "node needs an input's value before the run (Clip's min and max, Expand's shape, "
          "Slice's starts...; exported models carry these as initializers, node tests feed "
          "them as inputs), that input became an initializer holding the case's value and the "
          f"case was loaded again. {len(constant_passes)} passing cases needed that; the "
          "table below lists them.")
        w("")
    w("## Totals")
    w("")
    w("| | cases | passed | failed | refused at load | crashed |")
    w("|---|---:|---:|---:|---:|---:|")
    for label, c, n in (("all operators", totals, len(results)),
                        (f"the {len(supported)} operators the engine supports", sup_totals, len(sup_rows))):
        w(f"| {label} | {n} | {c['pass']} | {c['fail']} | {c['refused']} | {c['crashed']} |")
    w("")
    w("A case of a supported operator is refused when it uses an opset, element type, "
      "attribute value or input form the engine does not (yet) run, or when its function "
      "expansion (`_expanded` cases) uses other operators; the reason is the engine's own load "
      "error.")
    w("")
    refused_kinds = collections.Counter(refusal_kind(r[3]) for r in sup_rows if r[2] == "refused")
    if refused_kinds:
        w("| why cases of supported operators are refused | cases |")
        w("|---|---:|")
        for kind, n in sorted(refused_kinds.items(), key=lambda kv: (-kv[1], kv[0])):
            w(f"| {kind} | {n} |")
        w("")
    w("## Operators the engine supports")
    w("")
    def opset_note(case: str) -> str:
        m = manifest.get(case, [])
        return f" (opset {m[2]} run as {m[3]})" if len(m) > 3 and m[2] != m[3] else ""

    w("| operator | passed / cases | failed | refused | crashed | opset rewritten |")
    w("|---|---:|---:|---:|---:|---:|")
    for op in sorted(supported):
        rows = by_op.get(op, [])
        c = collections.Counter(r[2] for r in rows)
        rewritten = sum(1 for r in rows if opset_note(r[0]))
        w(f"| {op} | {c['pass']} / {len(rows)} | {c['fail']} | {c['refused']} | {c['crashed']} "
          f"| {rewritten} |")
    w("")
    w("### Cases of supported operators that do not pass")
    w("")
    w("Cases of one operator with the same result and reason share a row.")
    w("")
    w("| operator | cases | result | reason |")
    w("|---|---|---|---|")
    failures = sorted((r for r in sup_rows if r[2] != "pass"),
                      key=lambda r: ({"fail": 0, "crashed": 1, "refused": 2}.get(r[2], 3), r[1], r[0]))
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for r in failures:
        grouped.setdefault((r[1], r[2], short_reason(r[3])), []).append(r[0] + opset_note(r[0]))
    for (op, status, reason), names in grouped.items():
        w(f"| {op} | {', '.join(names)} | {status} | {reason} |")
    w("")
    if constant_passes:
        w("### Cases that pass with inputs made constants")
        w("")
        w("| operator | case | constants |")
        w("|---|---|---|")
        for r in sorted(constant_passes, key=lambda r: (r[1], r[0])):
            w(f"| {r[1]} | {r[0]}{opset_note(r[0])} | {short_reason(r[3])} |")
        w("")
    w("## Operators the engine does not support")
    w("")
    w("Every case of these is refused at load with the error that names the operator; "
      "a case passes only where its function expansion uses supported operators.")
    w("")
    w("| operator | passed / cases |")
    w("|---|---:|")
    for op in sorted(set(by_op) - supported):
        rows = by_op[op]
        c = collections.Counter(r[2] for r in rows)
        w(f"| {op} | {c['pass']} / {len(rows)} |")
    w("")
    with open(args.markdown, "w") as f:
        f.write("\n".join(out))
    if args.failures:
        with open(args.failures, "w") as f:
            f.write(f"# Node-test cases of supported operators that do not pass "
                    f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)\n\n")
            f.write("Written by scripts/onnx-conformance (conform helper); one line each: "
                    "operator, case, result, reason.\n\n")
            for r in failures:
                f.write(f"- {r[1]} | {r[0]} | {r[2]} | {short_reason(r[3])}\n")
    print(f"{len(sup_rows)} cases of supported operators: {sup_totals['pass']} passed; "
          f"wrote {args.markdown}", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wr = sub.add_parser("write", help="write the node cases to a folder")
    wr.add_argument("out", help="folder to write the cases to (replaced case by case)")
    wr.add_argument("--fit-opset", type=_parse_range, metavar="LO:HI",
                    help="rewrite a case's opset into LO..HI where its operators are unchanged")
    wr.add_argument("--only", default="", help="comma-separated operators to write")
    wr.add_argument("--cases", default="", help="comma-separated case names to write")
    wr.set_defaults(func=write_cases)
    rp = sub.add_parser("report", help="write the conformance table from a run's results")
    rp.add_argument("--cases-dir", required=True, help="the folder `write` wrote (its manifest)")
    rp.add_argument("--results", required=True, help="caf-serving-onnx-conformance --results")
    rp.add_argument("--operators", required=True, help="caf-serving-onnx-conformance --list-operators")
    rp.add_argument("--opsets", required=True, help="caf-serving-onnx-conformance --opsets")
    rp.add_argument("--fitted", action="store_true", help="the cases were written with --fit-opset")
    rp.add_argument("--constant-inputs", action="store_true",
                    help="the runner ran with --constant-inputs")
    rp.add_argument("--markdown", required=True, help="the table to write")
    rp.add_argument("--failures", help="also list the failing cases of supported operators here")
    rp.set_defaults(func=write_report)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
