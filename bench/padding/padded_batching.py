#!/usr/bin/env python3
"""Padded batching against equal-shape-only batching on a dynamic-sequence BERT (issue 16).

    # 1. export (needs torch + transformers, e.g. /work/wt/zoo-venv):
    /work/wt/zoo-venv/bin/python bench/padding/padded_batching.py export --out /tmp/padbench \
        [--layers 12 --hidden 768 --heads 12 --intermediate 3072]   # BERT-base (default)
    # 2. measure (numpy only):
    python3 bench/padding/padded_batching.py run --out /tmp/padbench --binary build/apps/caf-serving/caf-serving \
        [--seconds 20 --repeat 3 --concurrency 16 --min-len 16 --max-len 256]

`export` writes one BertModel with random weights (nothing is downloaded), TorchScript
exporter at opset 17, dynamic batch and sequence axes, as two models of one repository:
  bert_exact   dynamic_batching as Triton does it: only equal shapes share a batch
  bert_padded  the same file with padded_batching on input_ids/attention_mask/token_type_ids,
               last_hidden_state sliced back, padded_batching_max_waste --max-waste
`run` starts one caf-serving on that repository and runs, back to back and alternating
(ABAB...), a closed loop of --concurrency clients against each model for --seconds, every
request one row of a length drawn uniformly from [--min-len, --max-len] (the same seeded
sequence for both). It prints requests/s, P50 and P99 latency per window and the medians,
and the ratio padded / exact of the medians. A warm-up window per model runs first (plans
compile per shape). The machine is shared; compare ratios, not absolute numbers.
"""
import argparse
import http.client
import json
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def export(args):
    import torch
    import transformers
    out = pathlib.Path(args.out)
    torch.manual_seed(1)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=args.hidden,
                                  num_hidden_layers=args.layers,
                                  num_attention_heads=args.heads,
                                  intermediate_size=args.intermediate,
                                  max_position_embeddings=512, attn_implementation="eager")
    model = transformers.BertModel(cfg).eval()

    class wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids, return_dict=True)
            return o.last_hidden_state, o.pooler_output

    ids = torch.randint(0, 30522, (2, 16))
    args_t = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    tmp = out / "model.onnx"
    out.mkdir(parents=True, exist_ok=True)
    dyn = {n: {0: "batch", 1: "sequence"} for n in INPUTS}
    dyn["last_hidden_state"] = {0: "batch", 1: "sequence"}
    dyn["pooler_output"] = {0: "batch"}
    torch.onnx.export(wrapper(model), args_t, str(tmp), dynamo=False, input_names=INPUTS,
                      output_names=["last_hidden_state", "pooler_output"], dynamic_axes=dyn,
                      opset_version=17, do_constant_folding=True)
    for name, extra in (("bert_exact", ""), ("bert_padded", padded_params(args.max_waste))):
        d = out / "models" / name / "1"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp, d / "model.onnx")
        (d.parent / "config.pbtxt").write_text(config(name, args) + extra)
    tmp.unlink()
    print(f"wrote {out}/models/{{bert_exact,bert_padded}} (layers {args.layers}, hidden "
          f"{args.hidden})")


def config(name, args):
    inputs = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in INPUTS)
    return f'''name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {args.max_batch}
input [
{inputs}
]
output [
  {{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, {args.hidden} ] }},
  {{ name: "pooler_output" data_type: TYPE_FP32 dims: [ {args.hidden} ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us} }}
'''


def padded_params(max_waste):
    spec = ";".join(f"{n}:1:0" for n in INPUTS)
    return (f'parameters {{ key: "padded_batching" value: {{ string_value: "{spec}" }} }}\n'
            f'parameters {{ key: "padded_batching_max_waste" value: {{ string_value: '
            f'"{max_waste}" }} }}\n'
            'parameters { key: "padded_outputs" value: { string_value: "last_hidden_state:1" } }\n')


def request_body(length, rng):
    ids = rng.integers(1000, 30000, length).tolist()
    body = {"inputs": [
        {"name": "input_ids", "shape": [1, length], "datatype": "INT64", "data": ids},
        {"name": "attention_mask", "shape": [1, length], "datatype": "INT64",
         "data": [1] * length},
        {"name": "token_type_ids", "shape": [1, length], "datatype": "INT64",
         "data": [0] * length}],
        "outputs": [{"name": "pooler_output"}]}
    return json.dumps(body).encode()


def window(port, model, seconds, concurrency, lengths, seed):
    """Closed loop: each client sends its next request when the last one is answered."""
    stop = time.monotonic() + seconds
    latencies = []
    errors = []
    lock = threading.Lock()

    def client(c):
        rng = np.random.default_rng(seed * 1000 + c)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine = []
        while time.monotonic() < stop:
            length = int(rng.integers(lengths[0], lengths[1] + 1))
            body = request_body(length, rng)
            t0 = time.monotonic()
            conn.request("POST", f"/v2/models/{model}/infer", body,
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                with lock:
                    errors.append(data[:300])
                continue
            mine.append(time.monotonic() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    if errors:
        print(f"  {model}: {len(errors)} errors, first: {errors[0]!r}", file=sys.stderr)
    lat = sorted(latencies)
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3 if lat else float("nan")
    return {"rps": len(lat) / elapsed, "p50_ms": pct(0.5), "p99_ms": pct(0.99), "n": len(lat)}


def metric(port, name, model):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    m = re.search(re.escape(name) + r'\{model="' + model + r'"[^}]*\} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else float("nan")


def run(args):
    out = pathlib.Path(args.out)
    cmd = [args.binary, "--model-repository", str(out / "models"), "--http-address",
           "127.0.0.1", "--http-port", "0", "--metrics-port", "0"] + args.server_arg
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ports = {}
    try:
        for line in server.stdout:
            for key, tag in (("http", "HTTP listening on "), ("metrics", "metrics listening on ")):
                if tag in line:
                    ports[key] = int(line.strip().rsplit(":", 1)[1])
            if len(ports) == 2:
                break
        threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
        lengths = (args.min_len, args.max_len)
        models = ["bert_exact", "bert_padded"]
        for m in models:  # warm-up: plans compile per shape
            w = window(ports["http"], m, args.warmup, args.concurrency, lengths, 999)
            print(f"warm-up {m}: {w['rps']:.2f} req/s", flush=True)
        results = {m: [] for m in models}
        for r in range(args.repeat):
            order = models if r % 2 == 0 else models[::-1]
            for m in order:
                w = window(ports["http"], m, args.seconds, args.concurrency, lengths, r)
                results[m].append(w)
                print(f"round {r} {m}: {w['rps']:.2f} req/s  P50 {w['p50_ms']:.0f} ms  "
                      f"P99 {w['p99_ms']:.0f} ms  ({w['n']} requests)", flush=True)
        med = {m: {k: statistics.median(w[k] for w in results[m]) for k in ("rps", "p50_ms", "p99_ms")}
               for m in models}
        for m in models:
            batches = metric(ports["metrics"], "caf_serving_inference_exec_count", m)
            rows = metric(ports["metrics"], "caf_serving_inference_count", m)
            padded = metric(ports["metrics"], "caf_serving_padded_batches", m)
            print(f"median {m}: {med[m]['rps']:.2f} req/s  P50 {med[m]['p50_ms']:.0f} ms  "
                  f"P99 {med[m]['p99_ms']:.0f} ms;  rows/batch {rows / batches:.2f}, "
                  f"mixed-length batches {padded:.0f}")
        a, b = med["bert_padded"], med["bert_exact"]
        print(f"padded / exact: throughput x{a['rps'] / b['rps']:.2f}, P50 x{a['p50_ms'] / b['p50_ms']:.2f}, "
              f"P99 x{a['p99_ms'] / b['p99_ms']:.2f}")
        print(json.dumps({"median": med, "windows": results}))
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", required=True)
    e.add_argument("--layers", type=int, default=12)
    e.add_argument("--hidden", type=int, default=768)
    e.add_argument("--heads", type=int, default=12)
    e.add_argument("--intermediate", type=int, default=3072)
    e.add_argument("--max-batch", type=int, default=16)
    e.add_argument("--delay-us", type=int, default=5000)
    e.add_argument("--max-waste", type=float, default=0.25)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--binary", default="build/apps/caf-serving/caf-serving")
    r.add_argument("--seconds", type=float, default=20)
    r.add_argument("--warmup", type=float, default=20)
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--concurrency", type=int, default=16)
    r.add_argument("--min-len", type=int, default=16)
    r.add_argument("--max-len", type=int, default=256)
    r.add_argument("--server-arg", action="append", default=[],
                   help="extra caf-serving flag (repeat), e.g. --server-arg=--executor-threads=2")
    args = p.parse_args()
    export(args) if args.cmd == "export" else run(args)


if __name__ == "__main__":
    main()
