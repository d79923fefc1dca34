#!/usr/bin/env python3
"""Checks a bench/gpu/server_vs_standalone run from its files, not from its own sums:

    server_vs_standalone_check.py OUT STDOUT_FILE

- the last line printed is the ratio line, and its number is the lowest ratio;
- results.md has a table row per model and concurrency;
- each row's server rate is caf-serving-perf's measured throughput (its JSON)
  times the rows per request, with answers and no errors; the batch histogram
  read from /metrics adds up to the batches counted, and the mean batch lies
  within 1 and max_batch_size;
- each row's standalone rate is the one the standalone program printed at the
  row's batch size (its log), and the ratio is the quotient of the two.
Exits 1 with what differs."""
import json
import os
import re
import sys


def main(out, stdout_file):
    problems = []

    def expect(ok, what):
        if not ok:
            problems.append(what)

    with open(os.path.join(out, "results.json")) as f:
        doc = json.load(f)
    with open(os.path.join(out, "results.md")) as f:
        md = f.read()
    with open(stdout_file) as f:
        lines = [l for l in f.read().splitlines() if l.strip()]
    expect(bool(doc["models"]), "results.json lists no model")
    ratios = []
    for m in doc["models"]:
        expect(bool(m["rows"]), "%s has no measured row" % m["model"])
        best = max(m["rows"], key=lambda r: r["inferences_per_s"]) if m["rows"] else None
        if best:
            ratios.append(best["ratio"])
        standalone = {}
        with open(os.path.join(out, "standalone-%s.log" % m["model"])) as f:
            for line in f:
                if line.startswith("{") and "inferences_per_s" in line:
                    j = json.loads(line)
                    rate = max(j["inferences_per_s"], j.get("pipelined_inferences_per_s", 0))
                    standalone[int(j["batch"])] = rate
        for r in m["rows"]:
            where = "%s at concurrency %d" % (m["model"], r["concurrency"])
            expect(re.search(r"(?m)^\| %s \| %d \| " % (re.escape(m["model"]), r["concurrency"]), md),
                   "results.md has no table row for " + where)
            with open(os.path.join(out, r["perf_json"])) as f:
                step = json.load(f)["steps"][0]
            expect(step["count"] > 0 and step["count"] == r["answered"],
                   "%s: perf answered %d, results say %d" % (where, step["count"], r["answered"]))
            expect(not step["errors"], "%s: perf saw errors %s" % (where, step["errors"]))
            expect(abs(step["throughput"] * r["request_batch"] - r["inferences_per_s"]) < 1e-6 * r["inferences_per_s"],
                   "%s: server rate %g is not perf's %g x %d" % (where, r["inferences_per_s"], step["throughput"],
                                                                 r["request_batch"]))
            expect(sum(r["batch_histogram"].values()) == r["server_batches"],
                   "%s: the batch histogram adds up to %d, not %d batches"
                   % (where, sum(r["batch_histogram"].values()), r["server_batches"]))
            expect(1 <= r["mean_batch"] <= m["max_batch"],
                   "%s: mean batch %g outside 1..%d" % (where, r["mean_batch"], m["max_batch"]))
            got = standalone.get(r["standalone_batch"])
            expect(got is not None and abs(got - r["standalone_inferences_per_s"]) <= 0.01 * got,
                   "%s: standalone rate %g, its log says %s at batch %d"
                   % (where, r["standalone_inferences_per_s"], got, r["standalone_batch"]))
            if got:
                expect(abs(r["ratio"] - r["inferences_per_s"] / got) < 0.01 * r["ratio"],
                       "%s: ratio %g is not %g / %g" % (where, r["ratio"], r["inferences_per_s"], got))
    last = lines[-1] if lines else ""
    m = re.match(r"server vs standalone: ([0-9.]+) \(target >= 0\.80", last)
    expect(m is not None, "the last line printed is not the ratio line: %r" % last)
    if m and ratios:
        expect(abs(float(m.group(1)) - min(ratios)) < 0.006,
               "the ratio line says %s, the lowest best ratio is %.3f" % (m.group(1), min(ratios)))
    if problems:
        print("server_vs_standalone_check: " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print("server_vs_standalone_check: %d model(s), %d row(s) consistent"
          % (len(doc["models"]), sum(len(x["rows"]) for x in doc["models"])))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
