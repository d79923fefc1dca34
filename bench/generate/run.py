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

import chart

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


def wait_idle(servers, limit_s=120):
    """Until every server has used under 5% of a core for half a second: requests the client
    gave up at the end of a level (each engine cancels them at its own pace) must not run
    into the next arm's measurement, and one server still busy would take cores from the
    arm measured next. All are watched at once (a second per server in turn made the idle
    waits a third of a --quick run)."""
    servers = list({id(s): s for s in servers}.values())
    start = time.time()
    last = [cpu_seconds(s.proc.pid) for s in servers]
    while time.time() < start + limit_s:
        time.sleep(0.5)
        now = [cpu_seconds(s.proc.pid) for s in servers]
        busy = [s for s, a, b in zip(servers, last, now) if b - a >= 0.025]
        if not busy:
            waited = time.time() - start
            if waited > 3:
                log(f"  waited {waited:.0f} s for the servers to be idle")
            return
        last = now
    log(f"  {', '.join(s.arm for s in busy)} still busy after {limit_s} s")


def wait_all_idle(servers):
    wait_idle(servers.values())


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


def perf(cfg, arm, port, model, level, out_dir, tag, pin=None):
    """One caf-serving-perf measurement (pinned to the CPUs `pin` where given); returns the
    JSON's generation summary."""
    json_file = out_dir / f"{tag}.json"
    cmd = taskset(pin) + [str(cfg.perf), "--generate", "openai-completions", "-m", model,
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
                "-p", str(level["window_ms"]), "--warmup-interval", str(level["warmup_ms"])]
    if "seed" in level:
        # caf-serving-perf's prompts (token ids) follow from its seed: a seed of the level's
        # own, the same for every arm, so that no engine meets a prompt it has served at an
        # earlier level (llama.cpp keeps each slot's KV cache and reuses a matching prefix:
        # with one seed for every level its prompts hit that cache, 1 prompt token to
        # evaluate instead of 128).
        cmd += ["--seed", str(level["seed"])]
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


def level_seed(turn):
    """caf-serving-perf's --seed at the level of this turn: prompts seeded seed+2+i for
    request i (up to one per line of the length files, 4000), so levels lie 10007 apart."""
    return 35 + 10007 * turn


def rotated(arms, turn):
    """The arms in the order of this level: the first one rotates from level to level."""
    k = turn % len(arms) if arms else 0
    return arms[k:] + arms[:k]


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

def pinning():
    """(server cpus, load-generator cpus): the first CPU for the server, the rest for the
    load generator; None where fewer than two CPUs are ours."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or not shutil.which("taskset"):
        return None
    return [cpus[0]], cpus[1:]


def taskset(cpus):
    return ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []


def aiperf_run(cfg, exe, port, model, hf_dir, c, n, adir, pin):
    """One aiperf profile at closed-loop concurrency c, n measured requests after c warm-up
    requests; returns aiperf's JSON export or raises with the tail of its output."""
    shutil.rmtree(adir, ignore_errors=True)
    cmd = taskset(pin) + [
        str(exe), "profile", "--model", model, "--url", f"http://127.0.0.1:{port}",
        "--endpoint-type", "completions", "--streaming",
        "--concurrency", str(c), "--request-count", str(n), "--warmup-request-count", str(c),
        "--synthetic-input-tokens-mean", str(cfg.prompt_tokens),
        "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(cfg.output_tokens), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--extra-inputs",
        f"min_tokens:{cfg.output_tokens}", "--extra-inputs", "temperature:0",
        "--tokenizer", str(hf_dir), "--use-server-token-count",
        "--artifact-dir", str(adir), "--ui-type", "none"]
    # (Not HF_HUB_OFFLINE: aiperf 0.13 then looks a local tokenizer folder up as a cached
    # hub snapshot and fails.)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    pathlib.Path(f"{adir}.txt").write_text(" ".join(cmd) + "\n\n" + r.stdout + r.stderr)
    found = adir / "profile_export_aiperf.json"
    if r.returncode != 0 or not found.exists():
        tail = (r.stderr or r.stdout).strip().splitlines()[-6:]
        raise RuntimeError(f"aiperf failed ({r.returncode}): " + " / ".join(tail)[-600:])
    return json.loads(found.read_text())


def aiperf_check(cfg, caf, model_dir, model, out_dir, exe, why):
    """caf-serving-perf and aiperf on the same server and load, alternating, each round
    measuring both at every concurrency of cfg.aiperf_levels.

    Fair by construction: a caf-serving of its own, started for the check alone, serving
    `model` with one compute thread pinned to the first CPU (taskset), and each load
    generator in turn pinned to the other CPU(s), so that aiperf's Python processes take
    nothing from the server (unpinned, they did: at c8 the server's end-to-end time was 1.5x
    longer under aiperf than under caf-serving-perf). aiperf measures as many requests as
    caf-serving-perf completed in its window (at least 4 per client), after one warm-up
    request per client. Both count prompt and output tokens as the server's `usage` says.

    Compared: TTFT avg and P50 (both tools: first streamed token minus request start), and
    output tokens/s by one definition for both, Little's law c x output tokens per request /
    mean end-to-end time (for equal requests in a closed loop this is aiperf's own
    definition, total output tokens / (last response - first request), without the ramp-down
    of the last round); each tool's native figure is shown beside it.

    Pinning our processes does not keep others off the server's CPU: on a shared machine the
    kernel moves runnable processes to the CPU the load generator leaves free, and more so
    under aiperf, whose processes fill theirs. So each measurement also records how long the
    server's threads waited for their CPU per second they ran (schedstat), and the ratios
    are given over every round and over the comparable ones (the server's wait under the
    two tools within 5 points of each other)."""
    if exe is None:
        return [f"aiperf: not run: {why}"]
    pin = pinning()
    server_cpus, load_cpus = pin if pin else ([], [])
    repo = out_dir / "aiperf-repo"
    repo.mkdir(exist_ok=True)
    if not (repo / model).exists():
        (repo / model).symlink_to(model_dir / "caf" / model)
    port = free_port()
    server = Server("caf-serving (aiperf check)", taskset(server_cpus) + [
        str(caf), "--model-repository", str(repo), "--http-port", str(port),
        "--metrics-port", "0", "--allow-grpc", "false", "--executor-threads", "1",
        "--kv-cache-bytes", str(1 << 30)], port, out_dir / "caf-serving-aiperf.log",
        "/v2/health/ready")
    rows, failure = {}, None
    try:
        server.wait_ready()
        warm(port, model)
        for round_ in range(cfg.aiperf_rounds):
            for c in cfg.aiperf_levels:
                tag = f"aiperf_check_c{c}_perf_{round_}"
                level = {"kind": "closed", "c": c, "window_ms": cfg.aiperf_window_ms,
                         "warmup_ms": cfg.aiperf_warmup_ms, "label": f"c{c}"}
                wait_idle([server])
                before = schedstat(server.proc.pid)
                g = perf(cfg, "caf-perf", port, model, level, out_dir, tag, pin=load_cpus)
                if not g or not g["requests"]:
                    failure = f"caf-serving-perf measured nothing at c{c}: see {tag}.txt"
                    break
                e2e_ms = g["e2e"]["avg"] / 1e3
                osl = g["output_tokens"] / g["requests"]
                rows.setdefault(c, []).append({
                    "tool": "caf-serving-perf", "round": round_,
                    "ttft_avg": g["ttft"]["avg"] / 1e3, "ttft_p50": g["ttft"]["p50"] / 1e3,
                    "isl": g["prompt_tokens"] / g["requests"], "osl": osl, "e2e": e2e_ms,
                    "own_tps": g["output_tokens_per_s"], "tps": c * osl / (e2e_ms / 1e3),
                    "wait": waited_share(before, schedstat(server.proc.pid))})
                n = max(4 * c, int(math.ceil(g["requests"] / c)) * c)
                wait_idle([server])
                before = schedstat(server.proc.pid)
                a = aiperf_run(cfg, exe, port, model, model_dir / "hf" / model, c, n,
                               out_dir / f"aiperf_c{c}_{round_}", load_cpus)
                get = lambda k: a.get(k) or {}
                ttft, lat = get("time_to_first_token"), get("request_latency")
                if not (ttft.get("avg") and lat.get("avg")):
                    raise RuntimeError(f"aiperf's JSON at c{c} has no TTFT or request latency")
                osl = get("output_sequence_length").get("avg") or cfg.output_tokens
                rows[c].append({
                    "tool": "aiperf", "round": round_,
                    "ttft_avg": ttft["avg"], "ttft_p50": ttft.get("p50"),
                    "isl": get("input_sequence_length").get("avg"), "osl": osl,
                    "e2e": lat["avg"], "own_tps": get("output_token_throughput").get("avg"),
                    "tps": c * osl / (lat["avg"] / 1e3),
                    "wait": waited_share(before, schedstat(server.proc.pid))})
            if failure:
                break
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        failure = str(e)
    finally:
        server.stop()
    return aiperf_report(cfg, model, pin, rows, failure)


def schedstat(pid):
    """(CPU time, time runnable but waiting for a CPU) of every thread of pid, in seconds:
    /proc/PID/task/*/schedstat."""
    run = delay = 0
    for t in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (t / "schedstat").read_text().split()
        except OSError:
            continue
        run, delay = run + int(fields[0]), delay + int(fields[1])
    return run / 1e9, delay / 1e9


def waited_share(before, after):
    """Time the server waited for its CPU per second it ran, between two schedstat()s."""
    ran = after[0] - before[0]
    return (after[1] - before[1]) / ran if ran > 0 else 0.0


def aiperf_report(cfg, model, pin, rows, failure):
    """The check's table and ratios; ratios over every round, and over the comparable rounds
    (the server's CPU wait under the two tools within 5 points of each other)."""
    server_cpus, load_cpus = pin if pin else ([], [])
    f = lambda v, d=1: "-" if v is None else f"{v:,.{d}f}"
    where = (f"caf-serving pinned to CPU {server_cpus[0]} with 1 compute thread, each load "
             f"generator pinned to CPU {','.join(map(str, load_cpus))} (taskset)" if pin else
             "not pinned (fewer than 2 CPUs or no taskset)")
    lines = [f"aiperf check: {model} on a caf-serving of its own; {where}; closed loop at "
             f"concurrency {', '.join(map(str, cfg.aiperf_levels))}, prompts "
             f"{cfg.prompt_tokens}, outputs {cfg.output_tokens} (ignore_eos); "
             f"{cfg.aiperf_rounds} round(s), the tools alternating; load average "
             f"{os.getloadavg()[0]:.1f} at the end.",
             "Output tokens/s by Little's law for both (c x output tokens per request / mean "
             "end-to-end); each tool's own figure beside it (caf-serving-perf: tokens "
             "completed in the window / window; aiperf: tokens / (last response - first "
             "request)). Server CPU wait: the time the server's threads were runnable but "
             "waited for their CPU, per second they ran (/proc schedstat): other processes "
             "on the server's CPU, which pinning our own does not keep off.", "",
             "| c | tool | round | prompt / output tokens (server's count) | TTFT avg ms | "
             "TTFT P50 ms | E2E avg ms | output tokens/s (Little) | own output tokens/s | "
             "server CPU wait |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for c, vals in rows.items():
        for v in vals:
            lines.append(f"| {c} | {v['tool']} | {v['round'] + 1} | {f(v['isl'], 0)} / "
                         f"{f(v['osl'], 0)} | {f(v['ttft_avg'])} | {f(v['ttft_p50'])} | "
                         f"{f(v['e2e'])} | {f(v['tps'])} | {f(v['own_tps'])} | "
                         f"{100 * v['wait']:.0f}% |")
        waits = {}
        for v in vals:
            waits.setdefault(v["round"], []).append(v["wait"])
        comparable = {r for r, w in waits.items() if len(w) == 2 and abs(w[0] - w[1]) < 0.05}
        for name, keep in (("every round", None), ("comparable rounds", comparable)):
            ours = [v for v in vals if v["tool"] == "caf-serving-perf"
                    and (keep is None or v["round"] in keep)]
            theirs = [v for v in vals if v["tool"] == "aiperf"
                      and (keep is None or v["round"] in keep)]
            if ours and theirs and len(ours) == len(theirs):
                mean = lambda k, xs: sum(x[k] for x in xs) / len(xs)
                r = {k: mean(k, ours) / mean(k, theirs)
                     for k in ("ttft_avg", "ttft_p50", "tps", "own_tps", "e2e")}
                ratios.append((c, name, len(ours), r))
    lines.append("")
    for c, name, n, r in ratios:
        worst = max(abs(r[k] - 1) for k in ("ttft_avg", "ttft_p50", "tps"))
        lines.append(f"aiperf check c{c}, {name} ({n}): caf-serving-perf / aiperf: TTFT avg "
                     f"{r['ttft_avg']:.3f}, TTFT P50 {r['ttft_p50']:.3f}, output tokens/s "
                     f"{r['tps']:.3f} (own definitions {r['own_tps']:.3f}), E2E avg "
                     f"{r['e2e']:.3f}: {'within' if worst <= 0.05 else 'NOT within'} 5%")
    if failure:
        lines.append(f"aiperf check: stopped early: {failure}")
    return lines


# ---------------------------------------------------------------- the SVG

def results_svg(cfg, results, models, arms, closed, loads, started):
    """Per model: output tokens/s by closed-loop concurrency (Little's law, as in the table)
    and goodput by Poisson load, one series per arm."""
    panels = []
    for m in models:
        tps = {a: [] for a in arms}
        for c in closed:
            for a in arms:
                g = results.get((m, f"c{c}", a))
                tps[a].append(g.get("tokens_per_s_little", g["output_tokens_per_s"])
                              if g and g["requests"] else None)
        panels.append({"title": f"{m}: closed loop, prompts {cfg.prompt_tokens} / outputs "
                                f"{cfg.output_tokens}",
                       "x_label": "concurrency", "y_label": "output tokens/s",
                       "x": [str(c) for c in closed],
                       "series": {a: v for a, v in tps.items() if any(x is not None for x in v)}})
        good = {a: [] for a in arms}
        for f in loads:
            for a in arms:
                label = next((lb for (mm, lb, aa) in results if mm == m and aa == a
                              and lb.startswith(f"Poisson {int(f * 100)}%")), None)
                g = results.get((m, label, a)) if label else None
                good[a].append(g["goodput"] if g else None)
        panels.append({"title": f"{m}: Poisson goodput (TTFT <= {cfg.ttft_target_ms:g} ms, "
                                f"TPOT <= {cfg.tpot_target_ms:g} ms)",
                       "x_label": "load (% of caf-serving's capacity)",
                       "y_label": "goodput req/s",
                       "x": [f"{int(f * 100)}%" for f in loads],
                       "series": {a: v for a, v in good.items()
                                  if any(x is not None for x in v)}})
    title = (f"bench/generate/run{' --quick' if cfg.quick else ''}, {started:%Y-%m-%d}, "
             f"{os.cpu_count()} vCPUs, {cfg.threads} compute threads per engine, fp32")
    return chart.svg(panels, title)


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
    ap.add_argument("--arms",
                    default="caf-serving,caf-targets,llama.cpp,ort-genai,transformers",
                    help="caf-targets: caf-serving with the model's ttft_target_ms and "
                         "tpot_target_ms set to --ttft-target-ms and --tpot-target-ms (the "
                         "latency-target scheduler) against caf-serving's fixed limits; "
                         "transformers: transformers' generate with static batches "
                         "(transformers_server.py), the floor")
    ap.add_argument("--threads", type=int, default=2, help="compute threads of every engine")
    ap.add_argument("--ttft-target-ms", type=float, default=1000)
    ap.add_argument("--tpot-target-ms", type=float, default=100)
    ap.add_argument("--no-aiperf", action="store_true")
    ap.add_argument("--aiperf-rounds", type=int, default=None, dest="aiperf_rounds_asked",
                    help="rounds of the aiperf check (default: 1 with --quick, else 3)")
    ap.add_argument("--aiperf-only", action="store_true",
                    help="no arms: only the aiperf check (its own pinned caf-serving)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--svg", default=None,
                    help="also copy the SVG (always written to --out/summary.svg) here, "
                         "e.g. bench/generate-quick.svg")
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
    arms = [] if cfg.aiperf_only else [a for a in cfg.arms.split(",") if a]
    models = cfg.models.split(",")

    # --quick asks for 64 output tokens: at concurrency 64 a request of 128 lives 30-40 s
    # on the quick models here, and every arm needs windows of several lifetimes.
    cfg.prompt_tokens, cfg.output_tokens = 128, (64 if cfg.quick else 128)
    if cfg.quick:
        # Fewer levels (no c32, Poisson at 150% only; the summary's header says so) and
        # windows of 2-3 request lifetimes: closed-loop figures are Little's law over the
        # mean end-to-end time, which settles within a few lifetimes (the window-counted
        # rate does not; it is not reported for closed loops). The servers are warmed once
        # at start, so each level's warm-up only brings the loop to its steady state.
        closed = [1, 8, 64]
        loads = [1.5]
        win = {1: (4000, 500), 8: (4000, 1000), 64: (8000, 2000)}
        poisson_window, poisson_warmup = 10000, 1500
        max_window_ms, max_poisson_ms = 16000, 10000
        cfg.aiperf_window_ms, cfg.aiperf_warmup_ms, cfg.aiperf_rounds = 6000, 1500, 1
    else:
        closed = [1, 8, 32, 64]
        loads = [0.5, 1.0, 1.5]
        win = {1: (20000, 5000), 8: (30000, 10000), 32: (60000, 30000), 64: (90000, 60000)}
        poisson_window, poisson_warmup = 60000, 10000
        max_window_ms, max_poisson_ms = 300000, 300000
        cfg.aiperf_window_ms, cfg.aiperf_warmup_ms, cfg.aiperf_rounds = 20000, 5000, 3
    cfg.aiperf_levels = [1, 4]
    if cfg.aiperf_rounds_asked:
        cfg.aiperf_rounds = cfg.aiperf_rounds_asked
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
            if "transformers" in arms:
                port = free_port()
                servers[("transformers", m)] = Server(
                    "transformers", [cfg.python, str(HERE / "transformers_server.py"),
                                     str(model_dir / "hf" / m), "--port", str(port),
                                     "--name", m, "--max-batch", "64",
                                     "--threads", str(cfg.threads)],
                    port, out / f"transformers-{m}.log", "/health")
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
                order = rotated(arms, turn)
                turn += 1
                for arm in order:
                    if cfg.quick and arm == "caf-targets" and c != closed[-1]:
                        # Below the highest concurrency nothing is late or shed: the
                        # latency-target scheduler runs as the fixed limits do.
                        continue
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
                             "warmup_ms": warmup, "label": f"c{c}",
                             "seed": level_seed(turn)}
                    tag = f"{m}_{level['label']}_{arm}"
                    wait_all_idle(servers)
                    g = perf(cfg, arm, servers[(arm, m)].port, served_name(arm, m), level,
                             out, tag)
                    if g is None or not g["requests"]:
                        # No request ended inside the window: once more with twice the
                        # window (the first try's requests are cancelled meanwhile).
                        window = min(2 * window, 2 * max_window_ms)
                        level = dict(level, window_ms=window, seed=level["seed"] + 5003)
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
                         "warmup_ms": poisson_warmup, "seed": level_seed(turn),
                         "label": f"Poisson {int(f * 100)}% ({f * cap:.2f}/s)"}
                order = rotated(arms, turn)
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
                if (m, label, arm) in results:
                    table.append(row(m, arm, {"label": label}, results[(m, label, arm)]))

    finally:
        for s in set(servers.values()):
            s.stop()

    # After every arm's server is gone: the check starts a pinned caf-serving of its own.
    aiperf_lines = []
    if cfg.no_aiperf:
        aiperf_lines = ["aiperf: not run (--no-aiperf)"]
    else:
        m = models[0]
        log(f"aiperf check on caf-serving {m}")
        aiperf_lines = aiperf_check(cfg, caf, model_dir, m, out, aiperf_exe, aiperf_why)
        for line in aiperf_lines:
            log(line)

    svg_text = results_svg(cfg, results, models, arms, closed, loads, started)
    (out / "summary.svg").write_text(svg_text)
    if cfg.svg:
        pathlib.Path(cfg.svg).write_text(svg_text)
        log(f"SVG copied to {cfg.svg}")

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
    for m in models:
        ours, theirs = results.get((m, "c1", "caf-serving")), results.get((m, "c1", "llama.cpp"))
        if ours and theirs:
            summary.append(f"{m}: ITL P50 at c1: {ours['itl']['p50'] / 1e3:.1f} ms vs llama.cpp "
                           f"{theirs['itl']['p50'] / 1e3:.1f} ms")
    # The latency-target scheduler against the fixed limits, at the highest Poisson load.
    for m in models:
        for f in reversed(loads):
            label = next((lb for (mm, lb, a) in results if mm == m and a == "caf-serving"
                          and lb.startswith(f"Poisson {int(f * 100)}%")), None)
            fixed = results.get((m, label, "caf-serving")) if label else None
            targeted = results.get((m, label, "caf-targets")) if label else None
            peers_ = [(a, results.get((m, label, a))) for a in arms
                      if not a.startswith("caf-")] if label else []
            peers_ = [(a, g) for a, g in peers_ if g]
            ours = [g for g in (fixed, targeted) if g]
            if ours and peers_:
                # The target: the engine's goodput (the better of its two arms, as a
                # user would configure it) against the best peer's, at the highest load.
                best = max(peers_, key=lambda ag: ag[1]["goodput"])
                mine = max(g["goodput"] for g in ours)
                ratio = (f"{mine / best[1]['goodput']:.1f}x" if best[1]["goodput"] > 0
                         else "n/a (best peer: 0)")
                summary.append(f"{m}: goodput vs best peer at {int(f * 100)}% load: {ratio} "
                               f"({mine:.2f} vs {best[0]} {best[1]['goodput']:.2f} req/s)")
            if fixed and targeted:
                gf, gt = fixed["goodput"], targeted["goodput"]
                ratio = f"{gt / gf:.1f}x" if gf > 0 else "n/a (fixed limits: 0)"
                summary.append(f"{m}: goodput with latency targets vs fixed limits at "
                               f"{int(f * 100)}% load: {ratio} ({gt:.2f} vs {gf:.2f} req/s)")
            if label:
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
            *(["--quick leaves out concurrency 32 and Poisson at 50% and 100% (the full run "
               "has them), and measures caf-targets at c64 and under Poisson only (below c64 "
               "nothing is late or shed, so it runs as the fixed limits do)."]
              if cfg.quick else []),
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
