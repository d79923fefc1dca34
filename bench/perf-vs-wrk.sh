#!/usr/bin/env bash
# Is caf-serving-perf ever the bottleneck it reports? Runs wrk -t1 and the
# tool (one client thread) in turn against the same bare HTTP route of
# perf-test-endpoint, a few times, and prints each rate and the median ratio.
# The issue asks for tool/wrk >= 0.80.
#
# usage: bench/perf-vs-wrk.sh [BUILD_DIR] [RUNS] [SECONDS] [CONNECTIONS]
#   defaults: build-perf 5 5 32
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-perf}
runs=${2:-5}
seconds=${3:-5}
conns=${4:-32}
tool=$build/apps/caf-serving-perf/caf-serving-perf
endpoint=$build/tests/perf/perf-test-endpoint
for f in "$tool" "$endpoint"; do
  [[ -x $f ]] || { echo "missing $f; build targets caf-serving-perf and perf-test-endpoint" >&2; exit 1; }
done
command -v wrk >/dev/null || { echo "wrk not found (Debian package wrk)" >&2; exit 1; }

out=$(mktemp)
"$endpoint" --port 0 >"$out" &
endpoint_pid=$!
trap 'kill $endpoint_pid 2>/dev/null; wait $endpoint_pid 2>/dev/null; rm -f "$out" "$out.json"' EXIT
for _ in $(seq 50); do
  grep -q "listening" "$out" && break
  sleep 0.1
done
port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out")
[[ -n $port ]] || { echo "perf-test-endpoint did not start" >&2; exit 1; }
url=127.0.0.1:$port

echo "bare route GET / on $url, $conns connections, ${seconds}s per run, $(nproc) cores"
printf "%4s %14s %14s %7s\n" run "wrk -t1 req/s" "tool req/s" ratio
ratios=()
for i in $(seq "$runs"); do
  wrk_rate=$(wrk -t1 -c"$conns" -d"${seconds}s" "http://$url/" \
               | awk '/Requests\/sec/ {print $2}')
  "$tool" --raw-url / -u "$url" --concurrency-range "$conns" \
    --measurement-interval "$((seconds * 1000))" --warmup-interval 500 \
    --max-trials 1 --no-progress --json "$out.json" >/dev/null
  tool_rate=$(grep -o '"throughput":[0-9.e+]*' "$out.json" | head -1 | cut -d: -f2)
  ratio=$(awk -v a="$tool_rate" -v b="$wrk_rate" 'BEGIN {printf "%.3f", a / b}')
  ratios+=("$ratio")
  printf "%4d %14.0f %14.0f %7s\n" "$i" "$wrk_rate" "$tool_rate" "$ratio"
done
median=$(printf "%s\n" "${ratios[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
echo "median tool/wrk ratio: $median (target >= 0.80)"
