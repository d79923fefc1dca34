#!/usr/bin/env python3
"""scripts/onnx-zoo-check against the real caf-serving binary (issue 16's zoo check).

    zoo_check_test.py CAF_SERVING_BINARY SOURCE_ROOT WORK_DIR

1. On committed fixtures (the zoo's layout): every one loads and matches ONNX Runtime's
   reference, exit 0.
2. On a small zoo made here from one fixture: a correct copy matches; a copy whose reference
   was changed loads but is reported as not matching; a truncated model file and a model with
   an operator no engine has are reported as not loading, with the server's error and, in the
   work list, the missing operator; a failed export from skipped.txt is listed; exit 1.
Python's standard library only.
"""
import importlib.machinery
import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys


def run_check(script, server, zoo, work, *extra):
    p = subprocess.run([sys.executable, str(script), str(zoo), "--server", str(server),
                        "--work", str(work), *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    out = p.stdout.decode(errors="replace")
    print(out)
    return p.returncode, (work / "zoo-table.md").read_text()


def row(table, family, exporter, opset):
    rows = [l for l in table.split("\n")
            if l.startswith(f"| {family} | {exporter} | {opset} | ")]
    assert len(rows) == 1, f"one row for {family} {exporter} {opset} expected: {rows}"
    return rows[0]


def copy_fixture(fixtures, name, zoo, new):
    shutil.copytree(fixtures / "models" / name, zoo / "models" / new)
    cfg = zoo / "models" / new / "config.pbtxt"
    cfg.write_text(re.sub(r'^name: "[^"]*"', f'name: "{new}"', cfg.read_text(), count=1,
                          flags=re.M))
    shutil.copytree(fixtures / "reference" / name, zoo / "reference" / new)


def main():
    server, root, work = (pathlib.Path(a) for a in sys.argv[1:4])
    script = root / "scripts" / "onnx-zoo-check"
    fixtures = root / "tests" / "onnx" / "fixtures"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # 1. Fixtures that match.
    rc, table = run_check(script, server, fixtures, work / "fixtures",
                          "--models", "^(op_gemm|op_softmax|bert_2layer_opset17)$")
    assert rc == 0, f"exit {rc}"
    assert "Totals: 3 exported models, 3 load, 3 match" in table, table
    assert table.count("| yes (") == 6, table  # loads? and matches?
    # The CPU level the server ran at (ONEDNN_MAX_CPU_ISA in the @avx2 entries), and no
    # plan step of the committed fixtures on a oneDNN reference kernel at it.
    assert "(oneDNN " in table, table
    assert "reference kernels (slow)" not in table, table

    # 2. A zoo with each kind of failure.
    zoo = work / "zoo"
    copy_fixture(fixtures, "op_gemm", zoo, "good_torchscript_opset17")
    copy_fixture(fixtures, "op_gemm", zoo, "wrong_dynamo_opset17")
    out_bin = next((zoo / "reference" / "wrong_dynamo_opset17").glob("output_*.bin"))
    data = bytearray(out_bin.read_bytes())
    data[0:4] = bytes([0, 0, 0x80, 0x7F])  # +inf in the first element (little-endian FP32)
    out_bin.write_bytes(bytes(data))
    copy_fixture(fixtures, "op_gemm", zoo, "broken_torchscript_opset13")
    onnx_file = zoo / "models" / "broken_torchscript_opset13" / "1" / "model.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes()[:40])
    # The check script's own probe model: one node of an operator no engine has.
    loader = importlib.machinery.SourceFileLoader("onnx_zoo_check", str(script))
    spec = importlib.util.spec_from_loader("onnx_zoo_check", loader)
    check = importlib.util.module_from_spec(spec)
    loader.exec_module(check)
    unknown = zoo / "models" / "unknownop_dynamo_opset17"
    (unknown / "1").mkdir(parents=True)
    (unknown / "1" / "model.onnx").write_bytes(check.probe_model(17))
    (unknown / "config.pbtxt").write_text(
        'name: "unknownop_dynamo_opset17"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    (zoo / "reference" / "unknownop_dynamo_opset17").mkdir(parents=True)
    (zoo / "reference" / "unknownop_dynamo_opset17" / "info.txt").write_text(
        "opset ai.onnx 17\nop ai.onnx ZooCheckProbe 1\ntype FLOAT 2\n")
    (zoo / "skipped.txt").write_text(
        "swin_dynamo_opset20: dynamo export failed: an error torch raised\n")

    rc, table = run_check(script, server, zoo, work / "zoo-out")
    assert rc == 1, f"exit {rc}"
    assert re.search(r"\| yes \([0-9.e+-]+\) \|$", row(table, "good", "torchscript", "17")), table
    assert "| yes (" in row(table, "wrong", "dynamo", "17"), table
    assert "| NO (" in row(table, "wrong", "dynamo", "17"), table
    broken = row(table, "broken", "torchscript", "13")
    assert "| no: " in broken and "ONNX" in broken, broken
    unknown_row = row(table, "unknownop", "dynamo", "17")
    assert "| no: " in unknown_row and "ZooCheckProbe" in unknown_row, unknown_row
    assert "not exported: dynamo export failed: an error torch raised" in row(
        table, "swin", "dynamo", "20"), table
    assert "Totals: 4 exported models, 2 load, 1 match ONNX Runtime; 2 do not load; " \
           "1 load but do not match; 1 exports failed in torch." in table, table
    assert re.search(r"\| operator ZooCheckProbe \| 1 \| unknownop \|", table), table
    assert "broken_torchscript_opset13:" in (work / "zoo-out" / "load-errors.txt").read_text()
    print("zoo check test: passed")


if __name__ == "__main__":
    main()
