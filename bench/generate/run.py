#!/usr/bin/env python3
"""The generative benchmark of issue 35: caf-serving against llama.cpp's llama-server and
onnxruntime-genai, arms alternating in one run, all measured by caf-serving-perf over
OpenAI's streamed /v1/completions. See bench/generate/README.md (and `--help`).
"""
import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
LLAMA_SDIST = "llama-cpp-python"


def log(*a):
    print("[bench]", *a, flush=True)


def served_name(arm, model):
    """The model's name on its arm's server: caf-targets serves a copy with targets."""
    return f"{model}_targets" if arm == "caf-targets" else model


# ---------------------------------------------------------------- the peers, built once

def llama_source(peers):
    found = sorted(peers.glob("llama_cpp_python-*/vendor/llama.cpp"))
    return found[-1] if found else None


def ensure_llama_server(peers, python):
    binary = peers / "llama-build" / "bin" / "llama-server"
    if binary.exists():
        log(f"llama-server: reusing {binary}")
        return binary
    peers.mkdir(parents=True, exist_ok=True)
    if llama_source(peers) is None:
        log(f"llama-server: downloading the {LLAMA_SDIST} sdist (its C++ sources) into {peers}")
        subprocess.run([python, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        LLAMA_SDIST, "-d", str(peers)], check=True)
        for t in sorted(peers.glob("llama_cpp_python-*.tar.gz")):
            log(f"llama-server: unpacking {t.name}")
            with tarfile.open(t) as tf:
                tf.extractall(peers)
    src = llama_source(peers)
    log(f"llama-server: building {src} (cmake, nice -n 10, -j2; 20-40 minutes on 2 cores; "
        f"log in {peers}/llama-build.log)")
    with open(peers / "llama-build.log", "a") as logf:
        subprocess.run(["nice", "-n", "10", "cmake", "-S", str(src), "-B",
                        str(peers / "llama-build"), "-DCMAKE_BUILD_TYPE=Release",
                        "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
                        "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF"],
                       check=True, stdout=logf, stderr=subprocess.STDOUT)
        p = subprocess.Popen(["nice", "-n", "10", "cmake", "--build", str(peers / "llama-build"),
                              "--target", "llama-server", "-j2"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            logf.write(line)
            if line.startswith("[") and "%]" in line[:8]:
                print("\r[bench] llama-server: " + line.strip()[:100].ljust(100), end="",
                      flush=True)
        print(flush=True)
        if p.wait() != 0:
            sys.exit(f"llama-server did not build: see {peers}/llama-build.log")
    return binary


def ensure_aiperf(peers):
    """aiperf in its own scratch venv; returns (path, None) or (None, why)."""
    venv = peers / "aiperf-venv"
    exe = venv / "bin" / "aiperf"
    if exe.exists():
        log(f"aiperf: reusing {exe}")
        return exe, None
    log(f"aiperf: pip install aiperf into {venv}")
    r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if r.returncode != 0:
        return None, "python -m venv failed: " + r.stderr.strip()[-300:]
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "aiperf"],
                       capture_output=True, text=True)
    if r.returncode != 0 or not exe.exists():
        return None, "pip install aiperf failed: " + (r.stderr or r.stdout).strip()[-400:]
    return exe, None


# ---------------------------------------------------------------- servers

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, arm, cmd, port, log_file, ready_path):
        self.arm, self.port = arm, port
        self.log = open(log_file, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.ready_path = ready_path
        self.cmd = cmd

    def wait_ready(self, timeout=600):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                sys.exit(f"{self.arm} exited at start ({self.proc.returncode}): see "
                         f"{self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.ready_path}",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.5)
        sys.exit(f"{self.arm} not ready after {timeout} s: see {self.log.name}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(server, limit_s=120):
    """Until the server has used under 5% of a core for a second: requests the client gave up
    at the end of a level (each engine cancels them at its own pace) must not run into the
    next arm's measurement."""
    end = time.time() + limit_s
    last = cpu_seconds(server.proc.pid)
    while time.time() < end:
        time.sleep(1.0)
        now = cpu_seconds(server.proc.pid)
        if now - last < 0.05:
            return
        last = now
    log(f"  {server.arm} still busy after {limit_s} s")


def wait_all_idle(servers):
    """Every server idle, not only the one measured next: one that is still cancelling or
    finishing the last level's requests would take cores from the arm being measured."""
    for s in set(servers.values()):
        wait_idle(s)


def warm(port, model, n=2):
    """Two short requests, so that first-call costs are not measured."""
    body = json.dumps({"model": model, "prompt": list(range(100, 164)), "max_tokens": 8,
                       "ignore_eos": True, "temperature": 0}).encode()
    for _ in range(n):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=120).read()


# ---------------------------------------------------------------- measuring

def long_tailed(path, n, median, low, high, seed):
    """Log-normal lengths (sigma 0.8, clipped), mean about 1.4x the median: a long tail."""
    rng = random.Random(seed)
    vals = [int(min(high, max(low, round(math.exp(rng.gauss(math.log(median), 0.8))))))
            for _ in range(n)]
    path.write_text("\n".join(map(str, vals)) + "\n")
    return sum(vals) / len(vals)


def perf(cfg, arm, port, model, level, out_dir, tag):
    """One caf-serving-perf measurement; returns the JSON's generation summary."""
    json_file = out_dir / f"{tag}.json"
    cmd = [str(cfg.perf), "--generate", "openai-completions", "-m", model,
           "-u", f"127.0.0.1:{port}", "--no-progress",
           "--ttft-target-ms", str(cfg.ttft_target_ms),
           "--tpot-target-ms", str(cfg.tpot_target_ms),
           "--json", str(json_file), "-f", str(out_dir / f"{tag}.csv"),
           "--drain-timeout-ms", str(cfg.drain_ms)]
    if level["kind"] == "closed":
        cmd += ["--prompt-tokens", str(cfg.prompt_tokens),
                "--output-tokens", str(cfg.output_tokens),
                "--concurrency-range", f"{level['c']}:{level['c']}:1",
                "-p", str(level["window_ms"]), "--warmup-interval", str(level["warmup_ms"]),
                "-r", "1"]
    else:
        cmd += ["--prompt-tokens", str(cfg.tail_prompts), "--output-tokens",
                str(cfg.tail_outputs), "--load", f"poisson:{level['rate']:.3f}",
                "-p", str(level["window_ms"]), "--warmup-interval", str(level["warmup_ms"]),
                "--seed", "35"]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    (out_dir / f"{tag}.txt").write_text(" ".join(cmd) + "\n\n" + r.stdout + r.stderr)
    if r.returncode != 0 or not json_file.exists():
        log(f"  {arm:10s} {tag}: caf-serving-perf failed ({r.returncode}): "
            f"{(r.stderr or r.stdout).strip()[-300:]}")
        return None
    step = json.loads(json_file.read_text())["steps"][0]
    g = dict(step["generation"])
    g["shed"] = step.get("slo", {}).get("shed", 0)
    g["failed"] = step.get("slo", {}).get("failed", 0) + sum(step.get("errors", {}).values())
    g["sent"] = step.get("sent", 0)
    g["seconds"] = time.time() - t0
    if level["kind"] == "closed" and g["requests"] > 0 and g["e2e"]["avg"] > 0:
        # Little's law: in a closed loop each of c clients has one request in flight, so
        # c x (output tokens per request) / (mean end-to-end time) is the rate, free of the
        # window's quantization (64 requests of equal length end together).
        g["tokens_per_s_little"] = (level["c"] * g["output_tokens"] / g["requests"]
                                    / (g["e2e"]["avg"] / 1e6))
    return g


def fmt_ms(us):
    return "-" if us is None else (f"{us / 1e3:,.0f}" if us >= 1e5 else f"{us / 1e3:,.1f}")


def row(model, arm, level, g):
    if g is None:
        return f"| {model} | {level['label']} | {arm} | failed | | | | | | |"
    tps = g.get("tokens_per_s_little", g["output_tokens_per_s"])
    return (f"| {model} | {level['label']} | {arm} | {tps:,.1f} | "
            f"{fmt_ms(g['ttft']['p50'])} / {fmt_ms(g['ttft']['p99'])} | "
            f"{fmt_ms(g['itl']['p50'])} / {fmt_ms(g['itl']['p99'])} | "
            f"{fmt_ms(g['tpot']['p50'])} | {g['goodput']:.2f} ({g['good']}/{g['requests']}) | "
            f"{g['requests']} | {g['shed'] + g['failed']} |")


# ---------------------------------------------------------------- aiperf against caf-serving-perf

def aiperf_check(cfg, server, model, hf_dir, out_dir, exe, why):
    """Both tools on the same server and load, alternating: TTFT and output tokens/s."""
    lines = []
    if exe is None:
        return [f"aiperf: not run: {why}"]
    c, n = cfg.aiperf_concurrency, cfg.aiperf_requests
    res = {}
    for round_ in range(cfg.aiperf_rounds):
        tag = f"aiperf_check_perf_{round_}"
        level = {"kind": "closed", "c": c, "window_ms": cfg.aiperf_window_ms,
                 "warmup_ms": 2000, "label": f"c{c}"}
        port = server.port
        wait_idle(server)
        g = perf(cfg, "caf-perf", port, model, level, out_dir, tag)
        if g:
            res.setdefault("caf-serving-perf", []).append(
                (g["ttft"]["avg"] / 1e3, g["ttft"]["p50"] / 1e3, g["output_tokens_per_s"],
                 g.get("tokens_per_s_little")))
        adir = out_dir / f"aiperf_{round_}"
        shutil.rmtree(adir, ignore_errors=True)
        cmd = [str(exe), "profile", "--model", model, "--url", f"http://127.0.0.1:{port}",
               "--endpoint-type", "completions", "--streaming",
               "--concurrency", str(c), "--request-count", str(n),
               "--warmup-request-count", str(c),
               "--synthetic-input-tokens-mean", str(cfg.prompt_tokens),
               "--synthetic-input-tokens-stddev", "0",
               "--output-tokens-mean", str(cfg.output_tokens), "--output-tokens-stddev", "0",
               "--extra-inputs", "ignore_eos:true", "--extra-inputs", "min_tokens:"
               + str(cfg.output_tokens), "--extra-inputs", "temperature:0",
               "--tokenizer", str(hf_dir), "--use-server-token-count",
               "--artifact-dir", str(adir), "--ui-type", "none"]
        # (Not HF_HUB_OFFLINE: aiperf 0.13 then looks a local tokenizer folder up as a
        # cached hub snapshot and fails.)
        wait_idle(server)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        (out_dir / f"aiperf_{round_}.txt").write_text(" ".join(cmd) + "\n\n" + r.stdout
                                                      + r.stderr)
        found = [adir / "profile_export_aiperf.json"]
        found = [f for f in found if f.exists()]
        if r.returncode != 0 or not found:
            tail = (r.stderr or r.stdout).strip().splitlines()[-6:]
            return [f"aiperf: ran but failed ({r.returncode}): " + " / ".join(tail)[-600:]]
        a = json.loads(found[0].read_text())
        ttft = a.get("time_to_first_token") or a.get("ttft") or {}
        otps = a.get("output_token_throughput") or {}
        res.setdefault("aiperf", []).append((ttft.get("avg"), ttft.get("p50"), otps.get("avg"),
                                             None))
    lines.append(f"aiperf check: {model} on caf-serving, concurrency {c}, prompts "
                 f"{cfg.prompt_tokens}, outputs {cfg.output_tokens} (ignore_eos), "
                 f"{cfg.aiperf_rounds} alternating round(s) each")
    lines.append("| tool | round | TTFT avg ms | TTFT P50 ms | output tokens/s | "
                 "by Little's law |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for tool, vals in res.items():
        for i, v in enumerate(vals):
            little = "-" if v[3] is None else f"{v[3]:.1f}"
            lines.append(f"| {tool} | {i + 1} | {v[0]:.1f} | {v[1]:.1f} | {v[2]:.1f} | "
                         f"{little} |")
    if len(res.get("aiperf", [])) == len(res.get("caf-serving-perf", [])) > 0:
        ours, theirs = res["caf-serving-perf"], res["aiperf"]
        mean = lambda xs: sum(xs) / len(xs)
        lines.append(
            f"ratio caf-serving-perf / aiperf: TTFT avg {mean([o[0] for o in ours]) / mean([t[0] for t in theirs]):.3f}, "
            f"TTFT P50 {mean([o[1] for o in ours]) / mean([t[1] for t in theirs]):.3f}, "
            f"output tokens/s {mean([o[2] for o in ours]) / mean([t[2] for t in theirs]):.3f}")
    return lines


# ---------------------------------------------------------------- main

def machine():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return platform.processor()
    model = next((l.split(":", 1)[1].strip() for l in out.splitlines()
                  if l.startswith("Model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in out.splitlines()
                  if l.startswith("Flags")), [])
    isa = [f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c")]
    return f"{model}, {os.cpu_count()} vCPUs, {' '.join(isa)}"


def main():
    # SIGTERM runs the `finally` that stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    ap = argparse.ArgumentParser(description=(__doc__ or "") + """
Builds llama.cpp's llama-server and installs aiperf once into --peers (not the repository),
makes the models once into --cache/bench-models (tools/generative_bench_models.py), starts
every server, then measures each level with every arm in turn (the order rotating), and
prints a table and the summary last. Results go to --out (JSON/CSV/text of every
measurement, summary.md).""", formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="small models (4 layers, 256 wide), fewer levels, shorter windows: "
                    "under 10 minutes once the peers and models exist")
    ap.add_argument("--build-dir", default=str(ROOT / "build"))
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/caf-serving"))
    ap.add_argument("--out", default=None, help="results folder (default /tmp/caf-gen-bench-TIME)")
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--arms", default="caf-serving,caf-targets,llama.cpp,ort-genai",
                    help="caf-targets: caf-serving with the model's ttft_target_ms and "
                         "tpot_target_ms set to --ttft-target-ms and --tpot-target-ms (the "
                         "latency-target scheduler) against caf-serving's fixed limits")
    ap.add_argument("--threads", type=int, default=2, help="compute threads of every engine")
    ap.add_argument("--ttft-target-ms", type=float, default=1000)
    ap.add_argument("--tpot-target-ms", type=float, default=100)
    ap.add_argument("--no-aiperf", action="store_true")
    ap.add_argument("--python", default=sys.executable)
    cfg = ap.parse_args()

    cfg.perf = pathlib.Path(cfg.build_dir) / "apps/caf-serving-perf/caf-serving-perf"
    caf = pathlib.Path(cfg.build_dir) / "apps/caf-serving/caf-serving"
    for b in (cfg.perf, caf):
        if not b.exists():
            sys.exit(f"{b} is missing: build it first (cmake --build build --target "
                     "caf-serving caf-serving-perf)")
    cache = pathlib.Path(cfg.cache)
    peers = cache / "peers"
    out = pathlib.Path(cfg.out or f"/tmp/caf-gen-bench-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    arms = cfg.arms.split(",")
    models = cfg.models.split(",")

    # --quick asks for 64 output tokens: at concurrency 64 a request of 128 lives 30-40 s
    # on the quick models here, and every arm needs windows of several lifetimes.
    cfg.prompt_tokens, cfg.output_tokens = 128, (64 if cfg.quick else 128)
    if cfg.quick:
        closed = [1, 8, 64]
        loads = [1.5]
        win = {1: (4000, 1000), 8: (6000, 1500), 64: (15000, 3000)}
        poisson_window, poisson_warmup = 15000, 2000
        max_window_ms, max_poisson_ms = 30000, 15000
        cfg.aiperf_concurrency, cfg.aiperf_requests, cfg.aiperf_window_ms = 8, 24, 8000
        cfg.aiperf_rounds = 1
    else:
        closed = [1, 8, 32, 64]
        loads = [0.5, 1.0, 1.5]
        win = {1: (20000, 5000), 8: (30000, 10000), 32: (60000, 30000), 64: (90000, 60000)}
        poisson_window, poisson_warmup = 60000, 10000
        max_window_ms, max_poisson_ms = 300000, 300000
        cfg.aiperf_concurrency, cfg.aiperf_requests, cfg.aiperf_window_ms = 8, 160, 30000
        cfg.aiperf_rounds = 2
    # At the end of a level the client waits this long for answers in flight, then
    # closes its connections (the engines cancel those requests; wait_idle waits for that).
    cfg.drain_ms = 1000
    cfg.tail_prompts = out / "prompt_lengths.txt"
    cfg.tail_outputs = out / "output_lengths.txt"
    mean_p = long_tailed(cfg.tail_prompts, 4000, 96, 8, 512, 1)
    mean_o = long_tailed(cfg.tail_outputs, 4000, cfg.output_tokens * 3 // 4, 8, 512, 2)
    started = datetime.datetime.now(datetime.timezone.utc)
    log(f"machine: {machine()}")
    log(f"results in {out}")

    # Peers and models, once.
    llama_bin = ensure_llama_server(peers, cfg.python) if "llama.cpp" in arms else None
    aiperf_exe, aiperf_why = (None, "--no-aiperf") if cfg.no_aiperf else ensure_aiperf(peers)
    model_dir = cache / "bench-models" / ("quick" if cfg.quick else "full")
    src = llama_source(peers)
    log(f"models: {model_dir} (tools/generative_bench_models.py; made once)")
    subprocess.run([cfg.python, str(ROOT / "tools/generative_bench_models.py"), str(model_dir)]
                   + (["--quick"] if cfg.quick else [])
                   + (["--llama-cpp", str(src)] if src else []), check=True)

    # Servers: every arm and model stays up for the whole run (idle when not measured).
    servers = {}
    try:
        caf_arms = [a for a in ("caf-serving", "caf-targets") if a in arms]
        if caf_arms:
            port = free_port()
            repo = out / "caf-repo"
            repo.mkdir(exist_ok=True)
            for m in models:
                link = repo / m
                if not link.exists():
                    link.symlink_to(model_dir / "caf" / m)
                if "caf-targets" in arms:
                    # The same files, with the model's latency targets (docs/generative.md).
                    targets = repo / served_name("caf-targets", m)
                    targets.mkdir(exist_ok=True)
                    if not (targets / "1").exists():
                        (targets / "1").symlink_to(model_dir / "caf" / m / "1")
                    config = (model_dir / "caf" / m / "config.pbtxt").read_text()
                    config = config.replace(f'name: "{m}"', f'name: "{targets.name}"')
                    for key, value in (("ttft_target_ms", cfg.ttft_target_ms),
                                       ("tpot_target_ms", cfg.tpot_target_ms)):
                        config += (f'parameters {{ key: "{key}" value: {{ string_value: '
                                   f'"{int(value)}" }} }}\n')
                    (targets / "config.pbtxt").write_text(config)
            s = Server("caf-serving", [str(caf), "--model-repository", str(repo),
                                       "--http-port", str(port), "--metrics-port", "0",
                                       "--allow-grpc", "false",
                                       "--executor-threads", str(cfg.threads),
                                       "--kv-cache-bytes", str(2 << 30)],
                       port, out / "caf-serving.log", "/v2/health/ready")
            for m in models:
                for a in caf_arms:
                    servers[(a, m)] = s
        for m in models:
            if "llama.cpp" in arms:
                port = free_port()
                ctx = 64 * 640  # 64 slots of prompt + output up to 640 tokens
                servers[("llama.cpp", m)] = Server(
                    "llama.cpp", [str(llama_bin), "-m", str(model_dir / "gguf" / f"{m}.gguf"),
                                  "--port", str(port), "--host", "127.0.0.1",
                                  "-t", str(cfg.threads), "-tb", str(cfg.threads),
                                  "--parallel", "64", "--cont-batching", "-c", str(ctx),
                                  "-b", "512", "-ub", "512", "--alias", m, "--no-webui"],
                    port, out / f"llama-server-{m}.log", "/health")
            if "ort-genai" in arms:
                port = free_port()
                servers[("ort-genai", m)] = Server(
                    "ort-genai", [cfg.python, str(HERE / "genai_server.py"),
                                  str(model_dir / "genai" / m), "--port", str(port),
                                  "--name", m, "--max-batch", "32"],
                    port, out / f"genai-{m}.log", "/health")
        for (arm, m), s in servers.items():
            s.wait_ready()
            warm(s.port, served_name(arm, m))
            log(f"{arm} serving {m} on port {s.port}")

        results = {}
        table = ["| model | load | engine | output tokens/s | TTFT P50 / P99 ms | "
                 "ITL P50 / P99 ms | TPOT P50 ms | goodput req/s (good/done) | done | "
                 "shed+failed |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        turn = 0
        for m in models:
            previous = {}  # arm -> (concurrency, mean end-to-end us) of its last level
            for c in closed:
                order = arms[turn % len(arms):] + arms[:turn % len(arms)]
                turn += 1
                for arm in order:
                    # The window must hold several request lifetimes, or a closed loop's
                    # requests (which start and end together) may not end inside it: the
                    # lifetime is predicted from the arm's previous level, as if it grew
                    # with the concurrency (pessimistic: batching makes it grow slower).
                    window, warmup = win[c]
                    if arm in previous:
                        c0, e2e0 = previous[arm]
                        predicted_ms = 1.5 * e2e0 / 1e3 * c / c0
                        window = int(min(max_window_ms, max(window, 1.2 * predicted_ms)))
                        warmup = int(min(max_window_ms / 4, max(warmup, 0.2 * predicted_ms)))
                    level = {"kind": "closed", "c": c, "window_ms": window,
                             "warmup_ms": warmup, "label": f"c{c}"}
                    tag = f"{m}_{level['label']}_{arm}"
                    wait_all_idle(servers)
                    g = perf(cfg, arm, servers[(arm, m)].port, served_name(arm, m), level,
                             out, tag)
                    if g is None or not g["requests"]:
                        # No request ended inside the window: once more with twice the
                        # window (the first try's requests are cancelled meanwhile).
                        window = min(2 * window, 2 * max_window_ms)
                        level = dict(level, window_ms=window)
                        log(f"  {arm} {m} c{c}: nothing ended in the window; again with "
                            f"{window / 1e3:.0f} s")
                        wait_all_idle(servers)
                        g = perf(cfg, arm, servers[(arm, m)].port, served_name(arm, m),
                                 level, out, tag)
                    results[(m, level["label"], arm)] = g
                    if g and g["requests"]:
                        previous[arm] = (c, g["e2e"]["avg"])
                    log(row(m, arm, level, g) + f" (window {window / 1e3:.0f} s)")
            # Poisson at fractions of caf-serving's capacity: its best closed-loop request
            # rate at the fixed lengths (Little's law: c / mean end-to-end), scaled to the
            # long-tailed outputs' mean.
            base = [results.get((m, f"c{c}", "caf-serving")) for c in closed]
            cap = max((c * b["requests"] / max(b["requests"], 1) / (b["e2e"]["avg"] / 1e6)
                       for c, b in zip(closed, base) if b and b["requests"]), default=0)
            cap *= cfg.output_tokens / mean_o  # decoding steps dominate
            log(f"{m}: caf-serving's capacity {cap:.2f} requests/s at the long-tailed lengths "
                f"(means {mean_p:.0f} prompt, {mean_o:.0f} output)")
            for f in loads:
                if cap <= 0:
                    break
                # A window of at least two of caf-serving's request lifetimes at capacity.
                lifetime_ms = max((b["e2e"]["avg"] / 1e3 for b in base if b and b["requests"]),
                                  default=0)
                window = int(min(max_poisson_ms, max(poisson_window, 2 * lifetime_ms)))
                level = {"kind": "poisson", "rate": f * cap, "window_ms": window,
                         "warmup_ms": poisson_warmup,
                         "label": f"Poisson {int(f * 100)}% ({f * cap:.2f}/s)"}
                order = arms[turn % len(arms):] + arms[:turn % len(arms)]
                turn += 1
                for arm in order:
                    tag = f"{m}_poisson{int(f * 100)}_{arm}"
                    wait_all_idle(servers)
                    g = perf(cfg, arm, servers[(arm, m)].port, served_name(arm, m), level,
                             out, tag)
                    results[(m, level["label"], arm)] = g
                    log(row(m, arm, level, g))
        # The table, in a fixed order.
        labels = []
        for (m, label, arm) in results:
            if (m, label) not in labels:
                labels.append((m, label))
        for m, label in labels:
            for arm in arms:
                table.append(row(m, arm, {"label": label}, results.get((m, label, arm))))

        aiperf_lines = []
        if "caf-serving" in arms and not cfg.no_aiperf:
            m = models[0]
            log(f"aiperf check on caf-serving {m}")
            wait_all_idle(servers)
            aiperf_lines = aiperf_check(cfg, servers[("caf-serving", m)], m,
                                        model_dir / "hf" / m, out, aiperf_exe, aiperf_why)
        elif cfg.no_aiperf:
            aiperf_lines = ["aiperf: not run (--no-aiperf)"]
    finally:
        for s in set(servers.values()):
            s.stop()

    summary = []
    for m in models:
        ours = results.get((m, "c64", "caf-serving"))
        peers_ = [(a, results.get((m, "c64", a))) for a in arms if not a.startswith("caf-")]
        peers_ = [(a, g) for a, g in peers_ if g]
        if ours and peers_:
            tp = lambda g: g.get("tokens_per_s_little", g["output_tokens_per_s"])
            best = max(peers_, key=lambda ag: tp(ag[1]))
            summary.append(f"{m}: output tokens/s vs best peer at c64: "
                           f"{tp(ours) / tp(best[1]):.1f}x ({tp(ours):,.0f} vs {best[0]} "
                           f"{tp(best[1]):,.0f})")
    # The latency-target scheduler against the fixed limits, at the highest Poisson load.
    for m in models:
        for f in reversed(loads):
            label = next((lb for (mm, lb, a) in results if mm == m and a == "caf-serving"
                          and lb.startswith(f"Poisson {int(f * 100)}%")), None)
            fixed = results.get((m, label, "caf-serving")) if label else None
            targeted = results.get((m, label, "caf-targets")) if label else None
            if fixed and targeted:
                gf, gt = fixed["goodput"], targeted["goodput"]
                ratio = f"{gt / gf:.1f}x" if gf > 0 else "n/a (fixed limits: 0)"
                summary.append(f"{m}: goodput with latency targets vs fixed limits at "
                               f"{int(f * 100)}% load: {ratio} ({gt:.2f} vs {gf:.2f} req/s)")
                break
    head = [f"# Generative benchmark, {started:%Y-%m-%d %H:%M} UTC",
            "", f"Command: bench/generate/run {' '.join(sys.argv[1:])}",
            f"Machine: {machine()}",
            f"Models: {model_dir} ({'quick: small' if cfg.quick else 'full size'}), fp32 in "
            f"every engine; closed loop prompts {cfg.prompt_tokens} / outputs "
            f"{cfg.output_tokens} tokens (ignore_eos); "
            f"Poisson with log-normal lengths (medians 96 / {cfg.output_tokens * 3 // 4}, "
            "clipped to 8..512; means "
            f"{mean_p:.0f} / {mean_o:.0f}); goodput at TTFT <= {cfg.ttft_target_ms:g} ms and "
            f"TPOT <= {cfg.tpot_target_ms:g} ms; {cfg.threads} compute threads per engine.",
            "Closed-loop output tokens/s by Little's law from caf-serving-perf's JSON "
            "(c x output tokens per request / mean end-to-end); Poisson rows: completed "
            "output tokens / window.", ""]
    took = datetime.datetime.now(datetime.timezone.utc) - started
    head.insert(2, f"Took {took.total_seconds() / 60:.1f} minutes (peers and models already made).")
    text = "\n".join(head + table + [""] + aiperf_lines + [""] + summary) + "\n"
    (out / "summary.md").write_text(text)
    print()
    print(text)


if __name__ == "__main__":
    main()
