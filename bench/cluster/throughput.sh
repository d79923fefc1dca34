#!/usr/bin/env bash
# Throughput of one server with its executors on 0 (local), 1 and 2 workers, on
# loopback, under wrk. The model is identity on 16 FP32 with max batch 8 whose
# every batch takes DELAY_US (default 2000) on one executor thread: a stand-in for
# a device-bound model, because these 2-core machines cannot show CPU-bound
# scaling (two workers and the server share the same two cores).
#
#   bench/cluster/throughput.sh BUILD_DIR [DELAY_US] [SECONDS]
set -euo pipefail
build=${1:?usage: throughput.sh BUILD_DIR [DELAY_US] [SECONDS]}
delay=${2:-2000}
seconds=${3:-5}
server_bin=$build/apps/caf-serving/caf-serving
worker_bin=$build/apps/caf-serving-worker/caf-serving-worker
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
export CAF_SERVING_CLUSTER_SECRET=bench-secret

mkdir -p "$work/repo/m/1"
echo builtin > "$work/repo/m/1/model.txt"
cat > "$work/repo/m/config.pbtxt" <<CFG
name: "m"
backend: "builtin"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200 }
parameters { key: "function" value: { string_value: "identity" } }
parameters { key: "delay_us" value: { string_value: "$delay" } }
CFG
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}'
LUA

wait_line() { # file pattern
  for _ in $(seq 1 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}
port_of() { grep -o "$2 listening on [0-9.]*:[0-9]*" "$1" | head -1 | sed 's/.*://'; }

run() { # label, worker count
  local label=$1 n=$2 args=() log
  for i in $(seq 1 "$n"); do
    log=$work/w$label$i.log
    "$worker_bin" --model-repository "$work/repo" --address 127.0.0.1 --port 0 --name "w$i" \
      > "$log" 2>&1 &
    pids+=($!)
    wait_line "$log" "listening on"
    args+=(--worker "127.0.0.1:$(grep -o 'listening on [0-9.]*:[0-9]*' "$log" | sed 's/.*://')")
  done
  [ "$n" -gt 0 ] && args+=(--local-executors false)
  log=$work/s$label.log
  "$server_bin" --model-repository "$work/repo" --http-address 127.0.0.1 --http-port 0 \
    --metrics-port 0 "${args[@]}" > "$log" 2>&1 &
  local spid=$!
  pids+=($spid)
  wait_line "$log" "HTTP listening"
  for i in $(seq 1 "$n"); do wait_line "$log" "worker w$i at .*: ready"; done
  local port
  port=$(port_of "$log" HTTP)
  wrk -t1 -c32 -d1s -s "$work/post.lua" "http://127.0.0.1:$port/v2/models/m/infer" > /dev/null
  local out
  out=$(wrk -t1 -c32 -d"${seconds}s" --latency -s "$work/post.lua" \
        "http://127.0.0.1:$port/v2/models/m/infer")
  printf '%-10s %10s req/s   p50 %8s   p99 %8s\n' "$label" \
    "$(echo "$out" | awk '/Requests\/sec/ {print $2}')" \
    "$(echo "$out" | awk '$1 == "50%" {print $2}')" "$(echo "$out" | awk '$1 == "99%" {print $2}')"
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
  sleep 0.3
}

echo "model: identity 16 fp32, max batch 8, ${delay} us per batch; wrk 32 connections, ${seconds} s"
run local 0
run 1-worker 1
run 2-workers 2
