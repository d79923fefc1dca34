#!/usr/bin/env python3
"""Streams the same greedy generations over gRPC (tritonclient.grpc, one stream per
request) and HTTP generate_stream against a running caf-serving, alternating,
and prints wall time, tokens/s, median time to first response and the
server's CPU seconds for each run (issue 34). Manual; CTest never runs it.

    build/tritonclient-venv/bin/python tools/grpc_generate_measure.py \
        GRPC_HOST:PORT HTTP_HOST:PORT STREAMS TOKENS SERVER_PID
"""
import json, queue, sys, threading, time, urllib.request
import numpy as np
import tritonclient.grpc as grpcclient
G, H = sys.argv[1], sys.argv[2]
PID = int(sys.argv[5])
import os
def cpu():
    f = open(f"/proc/{PID}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
N, T = int(sys.argv[3]), int(sys.argv[4])
def inputs(p):
    def t(name, dt, v):
        x = grpcclient.InferInput(name, [1], dt); x.set_data_from_numpy(np.array([v], dtype=object if dt == "BYTES" else bool)); return x
    return [t("text_input", "BYTES", p.encode()), t("stream", "BOOL", True),
            t("sampling_parameters", "BYTES", json.dumps({"temperature": "0", "max_tokens": str(T), "ignore_eos": "true"}).encode()),
            t("exclude_input_in_output", "BOOL", True)]
def grpc_one(i, out):
    c = grpcclient.InferenceServerClient(G); q = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    t0 = time.time(); c.async_stream_infer("tiny_gpt2", inputs(f"prompt {i}"), request_id=str(i))
    n = 0; first = None
    while True:
        r, e = q.get(); n += 1
        if first is None: first = time.time() - t0
        if r.get_response().parameters["triton_final_response"].bool_param: break
    c.stop_stream(); out[i] = (time.time() - t0, first, n)
def http_one(i, out):
    body = json.dumps({"text_input": f"prompt {i}", "parameters": {"max_tokens": T, "temperature": 0, "ignore_eos": True}}).encode()
    t0 = time.time(); req = urllib.request.Request(f"http://{H}/v2/models/tiny_gpt2/generate_stream", data=body)
    resp = urllib.request.urlopen(req); first = None; n = 0
    for line in resp:
        if line.startswith(b"data: "):
            n += 1
            if first is None: first = time.time() - t0
    out[i] = (time.time() - t0, first, n)
for name, f in (("grpc", grpc_one), ("http", http_one)) * 3:
    out = {}; ts = [threading.Thread(target=f, args=(i, out)) for i in range(N)]
    c0 = cpu(); t0 = time.time(); [t.start() for t in ts]; [t.join() for t in ts]; wall = time.time() - t0; scpu = cpu() - c0
    ttft = sorted(v[1] for v in out.values())[N // 2] * 1000
    print(f"{name}: {N} streams x {T} tokens: wall {wall:.2f} s, {N*T/wall:.0f} tokens/s, median ttft {ttft:.1f} ms, responses/stream {out[0][2]}, server CPU {scpu:.2f} s")
