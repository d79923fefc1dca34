#!/usr/bin/env python3
"""ResNet-50 int8 (or any int8 ONNX model) at every ISA level on one machine.

    python3 bench/onnx/int8_levels.py cost  [--build build] [--model M] [--rounds 9]
    python3 bench/onnx/int8_levels.py exact [--build build] [--model-dir D] [--isa AVX2] [--trials 4]

`cost`: three caf-onnx-bench processes on the model, uncapped (oneDNN's VNNI or AMX int8 where
the CPU has it), at ONEDNN_MAX_CPU_ISA=AVX512_CORE and at AVX2 (no VNNI: the exact int8 path),
measured in alternating windows (the order swapped every round); prints each level's median
inferences/s and its ratio to the uncapped one with quartiles.

`exact`: serves the model twice through caf-serving at one level (as configured, and with
parameters int8_onednn "false": the integer reference kernels), sends the same random images
to both and to ONNX Runtime, and prints whether the logits are identical and how far each is
from ONNX Runtime's. The model directory is Triton's layout with its config.pbtxt
(run_bench.py --only resnet50_int8_qdq exports build-onnx/bench-models/models/resnet50_int8_qdq).

Needs numpy and onnxruntime (PyPI); the engine's build, tests and server do not.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run_bench  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
MODEL_DIR = ROOT / "build-onnx/bench-models/models/resnet50_int8_qdq"


def cap(isa):
    """The environment that caps the engine at `isa` ("" for none)."""
    if not isa:
        return None
    env = {"ONEDNN_MAX_CPU_ISA": isa}
    if isa.startswith("AVX2"):
        env["OPENBLAS_CORETYPE"] = "Haswell"
    return env


def cost(args):
    bench = pathlib.Path(args.build) / "bench/onnx/caf-onnx-bench"
    model = pathlib.Path(args.model)
    for b in (1, 8):
        runners = {isa or "uncapped": run_bench.EngineRunner(
            bench, model, b, args.threads, args.seconds, args.rounds, env=cap(isa),
            extra=["--max-batch", "8"]) for isa in ("", "AVX512_CORE", "AVX2")}
        got = {k: [] for k in runners}
        order = list(runners)
        for r in range(args.rounds):
            for k in order if r % 2 == 0 else order[::-1]:
                got[k].append(runners[k].window()["inferences_per_s"])
        base = np.array(got["uncapped"])
        print(f"batch {b}: uncapped ({runners['uncapped'].info['onednn_isa']}) "
              f"{np.median(base):.2f}/s", flush=True)
        for k in ("AVX512_CORE", "AVX2"):
            x = np.array(got[k])
            q1, q2, q3 = np.percentile(x / base, [25, 50, 75])
            print(f"  {runners[k].info['onednn_isa']:>16}: {np.median(x):.2f}/s, ratio {q2:.2f} "
                  f"({q1:.2f}-{q3:.2f})", flush=True)
        for r in runners.values():
            r.close()


def infer(port, name, x):
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{name}/infer",
                                 data=body.encode() + x.tobytes(),
                                 headers={"Inference-Header-Content-Length": str(len(body))})
    with urllib.request.urlopen(req) as resp:
        at = int(resp.headers["Inference-Header-Content-Length"])
        return np.frombuffer(resp.read()[at:], dtype=np.float32)


def exact(args):
    import onnxruntime as ort
    src = pathlib.Path(args.model_dir)
    repo = pathlib.Path(tempfile.mkdtemp())
    reference = 'parameters { key: "int8_onednn" value: { string_value: "false" } }\n'
    for name, extra in (("engine", ""), ("reference", reference)):
        (repo / name / "1").mkdir(parents=True)
        os.symlink(src / "1" / "model.onnx", repo / name / "1" / "model.onnx")
        cfg = (src / "config.pbtxt").read_text()
        cfg = "\n".join(line for line in cfg.splitlines() if not line.startswith("name:"))
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{cfg}\n{extra}')
    binary = pathlib.Path(args.build) / "apps/caf-serving/caf-serving"
    server = subprocess.Popen(
        [str(binary), "--model-repository", str(repo), "--http-port", "0", "--allow-grpc",
         "false", "--allow-metrics", "false", "--executor-threads", str(args.threads)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, **(cap(args.isa) or {})})
    try:
        port = None
        for line in server.stdout:
            if line.startswith("CPU:") or line.startswith("warning:"):
                print(line.rstrip())
            if line.startswith("HTTP listening on"):
                port = int(line.rsplit(":", 1)[1])
                break
        if port is None:
            sys.exit("caf-serving did not start")
        sess = ort.InferenceSession(str(src / "1/model.onnx"), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(7)
        rel = lambda a, b: float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
        for trial in range(args.trials):
            x = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
            e, r = infer(port, "engine", x), infer(port, "reference", x)
            o = sess.run(None, {"input": x})[0].ravel()
            same = "identical to" if np.array_equal(e, r) else \
                f"{int((e != r).sum())} of {e.size} values differ from"
            print(f"trial {trial}: logits {same} the integer reference kernels' "
                  f"(max relative {rel(e, r):.3g}); from ONNX Runtime's: {rel(e, o):.3g}, "
                  f"reference kernels {rel(r, o):.3g}; top-1 equal: "
                  f"{np.array_equal(e.reshape(2, -1).argmax(1), o.reshape(2, -1).argmax(1))}")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(repo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost", help="the exact int8 path's speed against VNNI, one machine")
    c.add_argument("--model", default=str(MODEL_DIR / "1/model.onnx"))
    c.add_argument("--rounds", type=int, default=9)
    c.add_argument("--seconds", type=float, default=2)
    e = sub.add_parser("exact", help="the engine's int8 logits against its integer reference")
    e.add_argument("--model-dir", default=str(MODEL_DIR))
    e.add_argument("--isa", default="", help="ONEDNN_MAX_CPU_ISA for the server (AVX2, ...)")
    e.add_argument("--trials", type=int, default=4)
    for p in (c, e):
        p.add_argument("--build", default=str(ROOT / "build"))
        p.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cost(args) if args.what == "cost" else exact(args)


if __name__ == "__main__":
    main()
