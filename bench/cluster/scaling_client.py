#!/usr/bin/env python3
"""Closed-loop client for bench/cluster/scaling.sh: CONCURRENCY threads each send
one request at a time (KServe binary tensors) for SECONDS, check every answer
against a reference output, and print a JSON summary with the completions per
half second (to see a worker's loss and the recovery). Standard library only.

  scaling_client.py PORT MODEL REFERENCE_DIR SECONDS CONCURRENCY [ATOL]
"""
import array, http.client, json, os, sys, threading, time

port, model, ref_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
seconds, concurrency = float(sys.argv[4]), int(sys.argv[5])
atol = float(sys.argv[6]) if len(sys.argv) > 6 else 2e-2

manifest = [l.split() for l in open(os.path.join(ref_dir, "manifest.txt")) if l.strip()]
inp = next(m for m in manifest if m[0] == "input")
out = next(m for m in manifest if m[0] == "output")
in_bytes = open(os.path.join(ref_dir, inp[4]), "rb").read()
ref = array.array("f", open(os.path.join(ref_dir, out[4]), "rb").read())
shape = [int(x) for x in inp[3].split(",")]
header = json.dumps({
    "inputs": [{"name": inp[1], "datatype": "FP32", "shape": shape,
                "parameters": {"binary_data_size": len(in_bytes)}}],
    "outputs": [{"name": out[1], "parameters": {"binary_data": True}}]}).encode()
body = header + in_bytes
headers = {"Content-Type": "application/octet-stream",
           "Inference-Header-Content-Length": str(len(header))}

lock = threading.Lock()
done = []          # (time since start, ok)
failures = []
start = time.monotonic()
stop_at = start + seconds


def check(resp, data):
    if resp.status != 200:
        return "status %d: %s" % (resp.status, data[:200])
    hlen = int(resp.getheader("Inference-Header-Content-Length", "0"))
    got = array.array("f", data[hlen:])
    if len(got) != len(ref):
        return "got %d values, want %d" % (len(got), len(ref))
    worst = max(abs(a - b) for a, b in zip(got, ref))
    if worst > atol:
        return "max abs diff %.4g > %.4g" % (worst, atol)
    return None


def client():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while time.monotonic() < stop_at:
        try:
            conn.request("POST", "/v2/models/%s/infer" % model, body, headers)
            resp = conn.getresponse()
            why = check(resp, resp.read())
        except Exception as e:  # a dropped connection counts as a failure
            why = repr(e)
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        with lock:
            done.append((time.monotonic() - start, why is None))
            if why is not None:
                failures.append(why)


threads = [threading.Thread(target=client) for _ in range(concurrency)]
for t in threads:
    t.start()
for t in threads:
    t.join()
elapsed = time.monotonic() - start
bins = [0] * (int(elapsed * 2) + 1)
for t, ok in done:
    if ok:
        bins[int(t * 2)] += 1
ok = sum(1 for _, good in done if good)
print(json.dumps({"sent": len(done), "ok": ok, "failed": len(done) - ok,
                  "seconds": round(elapsed, 2), "rps": round(ok / elapsed, 2),
                  "per_half_second": bins, "first_failures": failures[:3]}))
