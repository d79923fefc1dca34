#!/usr/bin/env bash
# The scaling benchmark of a CPU-bound ONNX model (issue 19): one server with no
# executors of its own, and the model on 1, then 2 workers, each worker pinned to
# a core of its own (taskset) and, when `ip netns` and `tc` work (root), in a
# network namespace of its own behind a veth link with NETEM_US of added delay
# each way. Then 2 workers again, and one is killed (kill -9) halfway: every
# request must still be answered correctly, exactly once (the server's success
# counter equals the client's answers).
#
#   bench/cluster/scaling.sh BUILD_DIR [MODEL_DIR] [REFERENCE_DIR] [SECONDS] [CONCURRENCY]
#
# MODEL_DIR defaults to /work/wt/bench-models/models/resnet50 (symlinked into a
# temporary repository, never copied); REFERENCE_DIR holds manifest.txt and the
# reference input/output (bench-models/reference/<model>). The client
# (scaling_client.py) checks every answer against the reference output.
# Environment: NETEM_US (default 200), NO_NETNS=1 to stay on loopback,
# CORES="0 1" (the cores the workers are pinned to, in turn), WORKER_CPU_PCT=P
# (each worker also in a CPU cgroup of its own with a quota of P% of one core, so
# that on a machine with no core to spare for them the server and the client run
# on the rest of the workers' cores: every worker gets the same compute, and the
# server and client never take it; cgroup v1 or v2, root), REPEAT=N rounds of
# the 1- and 2-worker runs in ABBA order (default 1), with their medians and the
# median of the per-round ratios at the end.
set -euo pipefail
build=${1:?usage: scaling.sh BUILD_DIR [MODEL_DIR] [REFERENCE_DIR] [SECONDS] [CONCURRENCY]}
model_dir=${2:-/work/wt/bench-models/models/resnet50}
ref_dir=${3:-/work/wt/bench-models/reference/$(basename "$model_dir")}
seconds=${4:-20}
concurrency=${5:-4}
netem_us=${NETEM_US:-200}
read -r -a cores <<< "${CORES:-0 1}"
here=$(cd "$(dirname "$0")" && pwd)
server_bin=$(realpath "$build/apps/caf-serving/caf-serving")
worker_bin=$(realpath "$build/apps/caf-serving-worker/caf-serving-worker")
model=$(basename "$model_dir")
work=$(mktemp -d)
pids=()
export CAF_SERVING_CLUSTER_SECRET=bench-secret-$$

cpu_pct=${WORKER_CPU_PCT:-}
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  # Made inside the runs' subshells too: remove whatever exists (once its
  # processes are gone).
  for d in /sys/fs/cgroup/cpu/csb$$-w* /sys/fs/cgroup/csb$$-w*; do
    [ -d "$d" ] || continue
    for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$d" 2>/dev/null && break; sleep 0.1; done
  done
  # Made inside the runs' subshells: remove whatever exists.
  for n in 1 2; do
    ip link del "csbh$n" 2>/dev/null || true
    ip netns del "csb$$-$n" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/repo"
ln -s "$(realpath "$model_dir")" "$work/repo/$model"

use_netns=0
if [ -z "${NO_NETNS:-}" ] && ip netns add "csb$$-probe" 2>/dev/null; then
  ip netns del "csb$$-probe"
  use_netns=1
fi

# Namespace n: veth csbh<n> (here, 10.233.<n>.1) <-> csbw<n> (there, 10.233.<n>.2),
# netem delay on both ends.
make_ns() {
  local n=$1 ns="csb$$-$1"
  ip netns add "$ns"
  ip link add "csbh$n" type veth peer name "csbw$n"
  ip link set "csbw$n" netns "$ns"
  ip addr add "10.233.$n.1/24" dev "csbh$n"
  ip link set "csbh$n" up
  ip netns exec "$ns" ip addr add "10.233.$n.2/24" dev "csbw$n"
  ip netns exec "$ns" ip link set "csbw$n" up
  ip netns exec "$ns" ip link set lo up
  if [ "$netem_us" -gt 0 ]; then
    if ! tc qdisc add dev "csbh$n" root netem delay "${netem_us}us" 2>/dev/null \
       || ! ip netns exec "$ns" tc qdisc add dev "csbw$n" root netem delay "${netem_us}us"; then
      echo "note: tc netem is not available here (no sch_netem module): no added delay" >&2
    fi
  fi
}

wait_line() { # file pattern [tries of 0.1 s]
  for _ in $(seq 1 "${3:-600}"); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}

# The CPU cgroup of worker i with the quota WORKER_CPU_PCT (made once, removed by
# cleanup); prints its cgroup.procs.
worker_cgroup() {
  local i=$1 d quota=$((cpu_pct * 1000))
  if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then      # cgroup v1
    d=/sys/fs/cgroup/cpu/csb$$-w$i
    [ -d "$d" ] || { mkdir "$d" && echo 100000 > "$d/cpu.cfs_period_us" \
                     && echo "$quota" > "$d/cpu.cfs_quota_us"; }
  elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then      # cgroup v2
    d=/sys/fs/cgroup/csb$$-w$i
    [ -d "$d" ] || { mkdir "$d" && echo "$quota 100000" > "$d/cpu.max"; }
  else
    echo "WORKER_CPU_PCT: no CPU cgroup controller here (/sys/fs/cgroup)" >&2; exit 1
  fi
  echo "$d/cgroup.procs"
}

worker_pids=()
worker_addr=
# Starts worker i pinned to its core (in namespace i when available); sets worker_addr.
start_worker() {
  local i=$1 core=${cores[$(( ($1 - 1) % ${#cores[@]} ))]} log=$work/w$1.log
  local prefix=() addr=127.0.0.1 port=$((9300 + $1))
  if [ "$use_netns" = 1 ]; then
    [ -e "/var/run/netns/csb$$-$i" ] || make_ns "$i"
    prefix=(ip netns exec "csb$$-$i")
    addr=10.233.$i.2
  fi
  local cg=()
  if [ -n "$cpu_pct" ]; then
    # The shell joins the cgroup and becomes the worker: every thread it starts is
    # in it. Outside `ip netns exec`, whose own /sys has no cgroup mounts.
    local procs
    procs=$(worker_cgroup "$i")
    cg=(sh -c 'echo $$ > "$0" && exec "$@"' "$procs")
  fi
  "${cg[@]}" "${prefix[@]}" taskset -c "$core" "$worker_bin" --model-repository "$work/repo" \
    --address "$addr" --port "$port" --name "w$i" --executor-threads 1 > "$log" 2>&1 &
  pids+=($!)
  worker_pids[$i]=$!
  wait_line "$log" "listening on"
  worker_addr=$addr:$port
}

run() { # label, workers, kill-halfway (0/1)
  local label=$1 n=$2 kill_one=$3 args=() log
  for i in $(seq 1 "$n"); do start_worker "$i"; args+=(--worker "$worker_addr"); done
  log=$work/s-$label.log
  "$server_bin" --model-repository "$work/repo" --http-address 127.0.0.1 --http-port 0 \
    --metrics-port 0 --local-executors false "${args[@]}" > "$log" 2>&1 &
  pids+=($!)
  wait_line "$log" "HTTP listening"
  for i in $(seq 1 "$n"); do wait_line "$log" "worker w$i at .*: ready"; done
  local port mport
  port=$(grep -o 'HTTP listening on [0-9.]*:[0-9]*' "$log" | sed 's/.*://')
  mport=$(grep -o 'metrics listening on [0-9.]*:[0-9]*' "$log" | sed 's/.*://')
  # Warm-up: every worker has compiled its plan and measured its batches.
  python3 "$here/scaling_client.py" "$port" "$model" "$ref_dir" 4 "$concurrency" > /dev/null
  local before
  before=$(curl -s "127.0.0.1:$mport/metrics" \
           | awk -v m="model=\"$model\"" '/^caf_serving_inference_request_success/ && index($0, m) {s += $2} END {print s + 0}')
  local killer=
  if [ "$kill_one" = 1 ]; then
    ( sleep "$(echo "$seconds / 2" | bc -l)"; kill -9 "${worker_pids[$n]}" ) &
    killer=$!
  fi
  local out
  out=$(python3 "$here/scaling_client.py" "$port" "$model" "$ref_dir" "$seconds" "$concurrency")
  [ -n "$killer" ] && wait "$killer"
  local after
  after=$(curl -s "127.0.0.1:$mport/metrics" \
          | awk -v m="model=\"$model\"" '/^caf_serving_inference_request_success/ && index($0, m) {s += $2} END {print s + 0}')
  echo "$label: $out server_successes=$((after - before))"
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
  sleep 0.5
}

echo "model $model ($model_dir), ${seconds} s per run, ${concurrency} clients," \
     "workers pinned to cores ${cores[*]} with --executor-threads 1$([ -n "$cpu_pct" ] && echo ", each limited to ${cpu_pct}% of its core (cgroup)");" \
     "$([ "$use_netns" = 1 ] && echo "each worker in a netns (netem ${netem_us} us each way where tc has it)" \
                             || echo "loopback (no netns)"); $(nproc) cores"
results=$work/results.txt
: > "$results"
rps_of() { sed 's/.*"rps": \([0-9.]*\).*/\1/'; }
for round in $(seq 1 "${REPEAT:-1}"); do
  order=("1-worker 1" "2-workers 2")
  [ $((round % 2)) = 0 ] && order=("2-workers 2" "1-worker 1")
  for entry in "${order[@]}"; do
    read -r label n <<< "$entry"
    line=$(run "$label" "$n" 0)
    echo "$line"
    echo "$round $n $(echo "$line" | rps_of)" >> "$results"
  done
done
if [ "${REPEAT:-1}" -gt 1 ]; then
  median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
  echo "median req/s: 1 worker $(awk '$2 == 1 {print $3}' "$results" | median)," \
       "2 workers $(awk '$2 == 2 {print $3}' "$results" | median);" \
       "median ratio per round $(awk '{r[$1, $2] = $3} END {for (k = 1; k <= '"${REPEAT:-1}"'; ++k) print r[k, 2] / r[k, 1]}' "$results" | median)"
fi
run 2-workers-kill-1 2 1
