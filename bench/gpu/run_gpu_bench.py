#!/usr/bin/env python3
"""ResNet-50 and BERT-base (seq 128) at batch 1, 8, 32, 128 on one GPU: the engine's
CUDA executor (caf-cuda-bench) next to PyTorch eager, PyTorch + CUDA graphs and
torch.compile(mode="max-autotune"), same weights (random), same precision.

    bench/gpu/run_gpu_bench.py --out DIR [--engine-bench PATH] [--precision fp16]
                               [--batches 1,8,32,128] [--skip-compile]

Writes DIR/models/<name>/{config.pbtxt,1/model.onnx} (exported here, opset 17),
DIR/bench.jsonl (one line per engine, model and batch) and DIR/table.md.
Runs on the GPU machine (PyTorch, torchvision, transformers, onnx are there)."""
import argparse, json, os, pathlib, subprocess, sys, time

import torch

BATCHES = [1, 8, 32, 128]
SEQ = 128


def models():
    import torchvision
    from transformers import BertConfig, BertModel
    resnet = torchvision.models.resnet50().eval()
    bert = BertModel(BertConfig()).eval()  # bert-base: 12 layers, hidden 768, 12 heads

    class Bert(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return {
        "resnet50": (resnet, lambda b: (torch.randn(b, 3, 224, 224),), ["input"], ["logits"],
                     [("input", "TYPE_FP32", [3, 224, 224])], [("logits", "TYPE_FP32", [1000])]),
        "bert_base_seq128": (Bert(bert), lambda b: (torch.randint(0, 30522, (b, SEQ)),
                                                    torch.ones(b, SEQ, dtype=torch.int64)),
                             ["input_ids", "attention_mask"], ["hidden"],
                             [("input_ids", "TYPE_INT64", [SEQ]), ("attention_mask", "TYPE_INT64", [SEQ])],
                             [("hidden", "TYPE_FP32", [SEQ, 768])]),
    }


def export(name, model, make_inputs, in_names, out_names, ins, outs, root, max_batch):
    d = root / "models" / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    f = d / "1" / "model.onnx"
    if not f.exists():
        dyn = {n: {0: "batch"} for n in in_names + out_names}
        torch.onnx.export(model, make_inputs(1), str(f), input_names=in_names, output_names=out_names,
                          dynamic_axes=dyn, opset_version=17, dynamo=False)
    cfg = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch}"]
    for key, items in (("input", ins), ("output", outs)):
        cfg.append(key + " [")
        cfg.append(",\n".join(f'  {{ name: "{n}" data_type: {t} dims: {dims} }}' for n, t, dims in items))
        cfg.append("]")
    (d / "config.pbtxt").write_text("\n".join(cfg) + "\n")
    return d


def time_fn(fn, iters=50, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def torch_rows(name, model, make_inputs, batches, dtype, skip_compile):
    rows = []
    m = model.cuda().to(dtype) if dtype != torch.float32 else model.cuda()
    for b in batches:
        x = [t.cuda() for t in make_inputs(b)]
        x = [t.to(dtype) if t.is_floating_point() else t for t in x]
        with torch.inference_mode():
            eager = time_fn(lambda: m(*x))
            rows.append(("torch eager", b, eager))
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    m(*x)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                m(*x)
            rows.append(("torch + CUDA graphs", b, time_fn(g.replay)))
        if not skip_compile:
            try:
                c = torch.compile(m, mode="max-autotune")
                with torch.inference_mode():
                    rows.append(("torch.compile max-autotune", b, time_fn(lambda: c(*x), iters=30, warmup=3)))
            except Exception as e:  # report and go on: the other columns still count
                print(f"torch.compile failed for {name} batch {b}: {e}", file=sys.stderr)
    return [{"engine": e, "model": name, "batch": b, "median_ms": ms,
             "inferences_per_s": b * 1000.0 / ms} for e, b, ms in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine-bench", default="")
    ap.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--skip-compile", action="store_true")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in a.batches.split(",")]
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.precision]
    torch.backends.cudnn.benchmark = True
    results = []
    with open(out / "bench.jsonl", "w") as log:
        for name, (model, mk, inn, outn, ins, outs) in models().items():
            d = export(name, model, mk, inn, outn, ins, outs, out, max(batches))
            if a.engine_bench and os.path.exists(a.engine_bench):
                t = time.time()
                p = subprocess.run([a.engine_bench, str(d), a.precision] + [str(b) for b in batches],
                                   capture_output=True, text=True, timeout=900)
                sys.stderr.write(p.stderr)
                for line in p.stdout.splitlines():
                    r = json.loads(line)
                    results.append(r)
                    log.write(line + "\n")
                print(f"engine {name}: {time.time() - t:.0f} s (rc {p.returncode})", file=sys.stderr)
            for r in torch_rows(name, model, mk, batches, dtype, a.skip_compile):
                results.append(r)
                log.write(json.dumps(r) + "\n")
            log.flush()
    lines = [f"GPU: {torch.cuda.get_device_name()}; precision {a.precision}; median of timed batches", "",
             "| model | batch | engine | median ms | inferences/s |", "| --- | ---: | --- | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r['model']} | {r['batch']} | {r['engine']} | {r['median_ms']:.3f} | {r['inferences_per_s']:.0f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
