#!/usr/bin/env python3
"""Side by side on the same ONNX files, same machine, same run: caf-serving's CPU
executor (caf-onnx-bench) against ONNX Runtime (Python, same thread count).

    python3 bench/onnx/run_bench.py --build build-onnx --models build-onnx/bench-models \
        --threads 2 --seconds 2 --repeat 9 [--only resnet50_opset17,bert_base_opset17] \
        [--batches 1,32] [--group N]

Models come from `tools/export_onnx_models.py bench --out <models>` (exported when
missing). Both engines load each model once and stay loaded; then `--repeat`
rounds each time one window of `--seconds` of each engine, the order swapped every
round (ABBA). This machine's speed changes from minute to minute (a shared VM), so
short alternating windows measure both under the same conditions; each round gives
one ratio. Prints one table row per model and batch: the median inferences/s of
both, the median ratio (engine / ONNX Runtime) with its quartiles, and the engine's
GFLOP/s against the measured FMA peak.

With `--group N` a window is a turn of N batches instead of `--seconds`, timed over
all but its first batch (which finds the other engine's data in the caches): many
short turns (`--repeat 60` and more) follow the machine's speed more closely than a
few long windows.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort


def feeds_for(sess, batch):
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
    return feeds


class OrtRunner:
    """An ONNX Runtime session with `threads` intra-op threads, warmed up."""

    def __init__(self, path, batch, threads):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.batch = batch
        self.feeds = feeds_for(self.sess, batch)
        for _ in range(3):
            self.sess.run(None, self.feeds)

    def turn(self, group):
        """Inferences per second over the last group - 1 of `group` batches."""
        self.sess.run(None, self.feeds)
        t0 = time.perf_counter()
        for _ in range(group - 1):
            self.sess.run(None, self.feeds)
        return (group - 1) * self.batch / (time.perf_counter() - t0)

    def window(self, seconds):
        """Inferences per second over one window (at least 3 batches)."""
        runs, t0 = 0, time.perf_counter()
        while True:
            self.sess.run(None, self.feeds)
            runs += 1
            el = time.perf_counter() - t0
            if el >= seconds and runs >= 3:
                return runs * self.batch / el


class EngineRunner:
    """caf-onnx-bench --windows: the model loaded once, one window per request."""

    def __init__(self, bench, path, batch, threads, seconds, windows, env=None, extra=()):
        self.proc = subprocess.Popen(
            [str(bench), str(path), "--batch", str(batch), "--threads", str(threads),
             "--seconds", str(seconds), "--windows", str(windows), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = self._read()
        if not self.info.get("ready"):
            raise RuntimeError(f"caf-onnx-bench did not start: {self.info}")

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"caf-onnx-bench exited with status {self.proc.wait()}")
        return json.loads(line)

    def window(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-onnx")
    ap.add_argument("--models", default="build-onnx/bench-models")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2, help="length of one window")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--only", default="resnet50_opset17,bert_base_opset17")
    ap.add_argument("--repeat", type=int, default=9, help="alternating rounds")
    ap.add_argument("--group", type=int, default=0,
                    help="a window is a turn of this many batches (at least 2), the first not timed")
    args = ap.parse_args()
    if args.group == 1 or args.group < 0:
        ap.error("--group takes at least 2 batches (the first of a turn is not timed)")
    models = pathlib.Path(args.models)
    names = args.only.split(",")
    if not all((models / "models" / n / "1" / "model.onnx").exists() for n in names):
        subprocess.check_call([sys.executable, "tools/export_onnx_models.py", "bench", "--out",
                               str(models), "--opsets", "17"])
    bench = pathlib.Path(args.build) / "bench" / "onnx" / "caf-onnx-bench"
    print(f"{'model':<20} {'batch':>5} {'caf-serving/s':>14} {'onnxruntime/s':>14} {'ratio':>6} "
          f"{'quartiles':>11} {'GFLOP/s':>8} {'peak':>7} {'%peak':>6}  ratios of the rounds")
    for name in names:
        path = models / "models" / name / "1" / "model.onnx"
        for b in [int(x) for x in args.batches.split(",")]:
            extra = ["--group", str(args.group)] if args.group else []
            eng = EngineRunner(bench, path, b, args.threads, args.seconds, args.repeat,
                               extra=extra)
            o = OrtRunner(path, b, args.threads)
            ort_window = (lambda: o.turn(args.group)) if args.group else (
                lambda: o.window(args.seconds))
            engs, orts, ratios = [], [], []
            for r in range(args.repeat):
                if r % 2 == 0:
                    e = eng.window()["inferences_per_s"]
                    x = ort_window()
                else:
                    x = ort_window()
                    e = eng.window()["inferences_per_s"]
                engs.append(e)
                orts.append(x)
                ratios.append(e / x)
                print(f"  {name} batch {b} round {r + 1}/{args.repeat}: "
                      f"{e:.2f} / {x:.2f} = {e / x:.2f}", file=sys.stderr, flush=True)
            eng.close()
            del o
            e = float(np.median(engs))
            gf = e * eng.info["gflop_per_inference"]
            pk = eng.info["fma_peak_gflops"]
            q1, q3 = np.percentile(ratios, [25, 75])
            print(f"{name:<20} {b:>5} {e:>14.2f} {float(np.median(orts)):>14.2f} "
                  f"{float(np.median(ratios)):>6.2f} {q1:>5.2f}-{q3:<5.2f} {gf:>8.1f} {pk:>7.1f} "
                  f"{100 * gf / pk:>5.1f}%  " + " ".join(f"{r:.2f}" for r in ratios),
                  flush=True)


if __name__ == "__main__":
    main()
