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

`--only issue16` (or any of its names) runs issue 16's rows, exported here when
missing (torch, torchvision and transformers needed, random weights): BERT-base
(12 layers, hidden 768) at sequence lengths 16, 128 and 384, ViT-B/16,
MobileNetV3-large, EfficientNet-B0 and ResNet-50 at 224x224, ResNet-50 at 64x64, and
ResNet-50 quantized to int8 by onnxruntime.quantization.quantize_static in QDQ
format. `--row-seconds S` ends a row's rounds once it has run S seconds (at least
3 rounds), so that the large rows get fewer rounds than the small ones.

With `--group N` a window is a turn of N batches instead of `--seconds`, timed over
all but its first batch (which finds the other engine's data in the caches): many
short turns (`--repeat 60` and more) follow the machine's speed more closely than a
few long windows.

`--isa AVX2` (any ONEDNN_MAX_CPU_ISA value) runs the engine capped at that level, as
on a machine that has nothing above it: oneDNN and the engine's own kernels (and at
AVX2, OpenBLAS's Haswell kernels). ONNX Runtime has no such cap and runs at the
machine's best. Every row names the ISA the engine ran at (`isa`: oneDNN's).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort


# Issue 16's rows: name -> (input, how it is exported). Fixed non-batch shapes (the
# sequence length, the image size), a variable batch.
ISSUE16 = {
    "bert_base_s16": "seq 16",
    "bert_base_s128": "seq 128",
    "bert_base_s384": "seq 384",
    "vit_b16": "224x224",
    "mobilenetv3_large": "224x224",
    "efficientnet_b0": "224x224",
    "resnet50": "224x224",
    "resnet50_64": "64x64",
    "resnet50_int8_qdq": "224x224",
}


def export_issue16(models, names):
    """Exports those of issue 16's models in `names` that `models` lacks."""
    root = pathlib.Path(__file__).resolve().parent.parent.parent
    sys.path.insert(0, str(root / "tools"))
    import torch
    import torchvision
    import export_onnx_models as ex
    torch.set_num_threads(2)
    # nn.MultiheadAttention's inference fast path (ViT) has no ONNX export.
    torch.backends.mha.set_fastpath_enabled(False)
    torch.manual_seed(16)

    def missing(n):
        return n in names and not (models / "models" / n / "1" / "model.onnx").exists()

    with torch.no_grad():
        bert = None
        for seq in (16, 128, 384):
            if missing(f"bert_base_s{seq}"):
                bert = bert or ex.bert_model("bert")  # 12 layers, hidden 768, 12 heads
                ex.export_bert(models, f"bert_base_s{seq}", bert, 17, 1, seq, 30522, seq,
                               max_batch_size=32)
        vision = {"vit_b16": (torchvision.models.vit_b_16, 224),
                  "mobilenetv3_large": (torchvision.models.mobilenet_v3_large, 224),
                  "efficientnet_b0": (torchvision.models.efficientnet_b0, 224),
                  "resnet50": (torchvision.models.resnet50, 224),
                  "resnet50_64": (torchvision.models.resnet50, 64)}
        for n, (make, hw) in vision.items():
            if missing(n) or (n == "resnet50" and missing("resnet50_int8_qdq")):
                if (models / "models" / n / "1" / "model.onnx").exists():
                    continue
                ex.export_resnet(models, n, make(), 17, 1, hw, 5, max_batch_size=32)
    if missing("resnet50_int8_qdq"):
        quantize_qdq(models, "resnet50", "resnet50_int8_qdq")


def quantize_qdq(models, src, name):
    """`src` quantized by onnxruntime.quantization.quantize_static in QDQ format
    (QuantizeLinear/DequantizeLinear pairs around Conv, MatMul, ...), calibrated on
    a few random images; config.pbtxt copied from `src`."""
    import shutil
    from onnxruntime import quantization as q
    src_file = models / "models" / src / "1" / "model.onnx"
    dst = models / "models" / name
    (dst / "1").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    sess = ort.InferenceSession(str(src_file), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [1] + list(inp.shape[1:])

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.left = [{inp.name: rng.standard_normal(shape, dtype=np.float32)}
                         for _ in range(4)]

        def get_next(self):
            return self.left.pop() if self.left else None

    q.quantize_static(str(src_file), str(dst / "1" / "model.onnx"), Reader(),
                      quant_format=q.QuantFormat.QDQ, activation_type=q.QuantType.QInt8,
                      weight_type=q.QuantType.QInt8)
    cfg = (models / "models" / src / "config.pbtxt").read_text()
    (dst / "config.pbtxt").write_text(cfg.replace(f'name: "{src}"', f'name: "{name}"'))


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
        # env: the variables to add (an ISA cap), or None for this process's.
        self.proc = subprocess.Popen(
            [str(bench), str(path), "--batch", str(batch), "--threads", str(threads),
             "--seconds", str(seconds), "--windows", str(windows), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=None if env is None else {**os.environ, **env})
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
    ap.add_argument("--row-seconds", type=float, default=0,
                    help="end a row's rounds after this many seconds (at least 3 rounds; 0: all)")
    ap.add_argument("--engine-flags", default="",
                    help='plan flags passed to caf-onnx-bench, such as "--winograd 0"')
    ap.add_argument("--markdown", help="also write the table as Markdown to this file")
    ap.add_argument("--isa", default="",
                    help="cap the engine at this ONEDNN_MAX_CPU_ISA level (AVX2, AVX512_CORE, ...)")
    args = ap.parse_args()
    if args.group == 1 or args.group < 0:
        ap.error("--group takes at least 2 batches (the first of a turn is not timed)")
    models = pathlib.Path(args.models)
    names = [m for n in args.only.split(",") for m in (ISSUE16 if n == "issue16" else [n])]
    have = lambda n: (models / "models" / n / "1" / "model.onnx").exists()
    if not all(have(n) for n in names if n in ISSUE16):
        export_issue16(models, names)
    if not all(have(n) for n in names if n not in ISSUE16):
        subprocess.check_call([sys.executable, "tools/export_onnx_models.py", "bench", "--out",
                               str(models), "--opsets", "17"])
    md = []
    bench = pathlib.Path(args.build) / "bench" / "onnx" / "caf-onnx-bench"
    isa_env = None
    if args.isa:
        isa_env = {"ONEDNN_MAX_CPU_ISA": args.isa}
        if args.isa.startswith("AVX2"):
            isa_env["OPENBLAS_CORETYPE"] = "Haswell"
    print(f"{'model':<20} {'batch':>5} {'isa':>16} {'caf-serving/s':>14} {'onnxruntime/s':>14} "
          f"{'ratio':>6} {'quartiles':>11} {'GFLOP/s':>8} {'peak':>7} {'%peak':>6}  "
          "ratios of the rounds")
    for name in names:
        path = models / "models" / name / "1" / "model.onnx"
        for b in [int(x) for x in args.batches.split(",")]:
            extra = (["--group", str(args.group)] if args.group else []) + args.engine_flags.split()
            eng = EngineRunner(bench, path, b, args.threads, args.seconds, args.repeat,
                               env=isa_env, extra=extra)
            isa = eng.info.get("onednn_isa", "?")
            o = OrtRunner(path, b, args.threads)
            ort_window = (lambda: o.turn(args.group)) if args.group else (
                lambda: o.window(args.seconds))
            engs, orts, ratios = [], [], []
            started = time.perf_counter()
            for r in range(args.repeat):
                if (args.row_seconds and r >= 3
                        and time.perf_counter() - started > args.row_seconds):
                    break
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
            print(f"{name:<20} {b:>5} {isa:>16} {e:>14.2f} {float(np.median(orts)):>14.2f} "
                  f"{float(np.median(ratios)):>6.2f} {q1:>5.2f}-{q3:<5.2f} {gf:>8.1f} {pk:>7.1f} "
                  f"{100 * gf / pk:>5.1f}%  " + " ".join(f"{r:.2f}" for r in ratios),
                  flush=True)
            md.append(f"| {name} | {ISSUE16.get(name, '')} | {b} | {isa} | {e:.2f} | "
                      f"{float(np.median(orts)):.2f} | {float(np.median(ratios)):.2f} "
                      f"({q1:.2f}-{q3:.2f}) | {len(ratios)} |")
            if args.markdown:
                pathlib.Path(args.markdown).write_text(
                    "| model | input | batch | engine ISA | caf-serving inferences/s"
                    " | onnxruntime inferences/s | ratio median (q1-q3) | rounds |\n"
                    "|---|---|---|---|---|---|---|---|\n"
                    + "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
