#!/usr/bin/env python3
"""Side by side on the same ONNX files, same machine, same run: caf-serving's CPU
executor (caf-onnx-bench) against ONNX Runtime (Python, same thread count).

    python3 bench/onnx/run_bench.py --build build-onnx --models build-onnx/bench-models \
        --threads 2 --seconds 10 [--only resnet50_opset17,bert_base_opset17] [--batches 1,32] \
        [--repeat 3]

Models come from `tools/export_onnx_models.py bench --out <models>` (exported when
missing). Prints one table row per model and batch: inferences/s of both, the ratio
(engine / ONNX Runtime), and the engine's GFLOP/s against the measured FMA peak.
With --repeat N each model and batch runs N times, engine and ONNX Runtime
alternating, and the row gives the medians (the ratio is the median of the
per-repeat ratios), so that load from other processes hits both alike.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort


def ort_throughput(path, batch, threads, seconds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    feeds = {}
    for i in sess.get_inputs():
        shape = [batch] + [d for d in i.shape[1:]]
        if "int64" in i.type:
            if "mask" in i.name:
                feeds[i.name] = np.ones(shape, np.int64)
            elif "type" in i.name:
                feeds[i.name] = np.zeros(shape, np.int64)
            else:
                feeds[i.name] = rng.integers(0, 100, shape, dtype=np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape, dtype=np.float32)
    for _ in range(3):
        sess.run(None, feeds)
    runs, t0 = 0, time.perf_counter()
    while True:
        sess.run(None, feeds)
        runs += 1
        el = time.perf_counter() - t0
        if el >= seconds and runs >= 3:
            break
    return runs * batch / el


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-onnx")
    ap.add_argument("--models", default="build-onnx/bench-models")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--only", default="resnet50_opset17,bert_base_opset17")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    models = pathlib.Path(args.models)
    names = args.only.split(",")
    if not all((models / "models" / n / "1" / "model.onnx").exists() for n in names):
        subprocess.check_call([sys.executable, "tools/export_onnx_models.py", "bench", "--out",
                               str(models), "--opsets", "17"])
    bench = pathlib.Path(args.build) / "bench" / "onnx" / "caf-onnx-bench"
    print(f"{'model':<20} {'batch':>5} {'caf-serving/s':>14} {'onnxruntime/s':>14} {'ratio':>6} "
          f"{'GFLOP/s':>8} {'peak':>7} {'%peak':>6}  ratios of the repeats")
    for name in names:
        path = models / "models" / name / "1" / "model.onnx"
        for b in [int(x) for x in args.batches.split(",")]:
            engs, orts, ratios = [], [], []
            for _ in range(args.repeat):
                out = subprocess.check_output([str(bench), str(path), "--batch", str(b),
                                               "--threads", str(args.threads), "--seconds",
                                               str(args.seconds)])
                eng = json.loads(out.decode().strip().splitlines()[-1])
                o = ort_throughput(path, b, args.threads, args.seconds)
                engs.append(eng)
                orts.append(o)
                ratios.append(eng["inferences_per_s"] / o)
            e = float(np.median([x["inferences_per_s"] for x in engs]))
            gf = float(np.median([x["gflops"] for x in engs]))
            pk = float(np.median([x["fma_peak_gflops"] for x in engs]))
            print(f"{name:<20} {b:>5} {e:>14.2f} {float(np.median(orts)):>14.2f} "
                  f"{float(np.median(ratios)):>6.2f} {gf:>8.1f} {pk:>7.1f} {100 * gf / pk:>5.1f}%  "
                  + " ".join(f"{r:.2f}" for r in ratios),
                  flush=True)


if __name__ == "__main__":
    main()
