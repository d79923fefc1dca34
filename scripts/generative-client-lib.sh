# Shared by scripts/generative-client-check and scripts/triton-generate-endpoint-test
# (issue 34); sourced, not run. Needs $root (the repository root) set.
#
#   gen_client_venv PACKAGE...   sets $venv: GENERATIVE_CLIENT_VENV (default
#                                ~/.cache/caf-serving/generative-clients-venv),
#                                made or completed from PyPI when a package is
#                                missing; exits 77 where that cannot be done.
#   gen_start_server REPO LOG MODEL
#                                starts $binary on free ports, sets $server_pid
#                                and $http_port, waits until MODEL is ready.
#   gen_stop_server              stops it (safe to call twice).

binary="${CAF_SERVING_BINARY:-${BUILD_DIR:-$root/build}/apps/caf-serving/caf-serving}"
venv="${GENERATIVE_CLIENT_VENV:-$HOME/.cache/caf-serving/generative-clients-venv}"
server_pid=""
http_port=""

gen_skip() { echo "SKIPPED: $*"; exit 77; }

# Python module names of the pip packages this script family installs.
gen_module_of() {
  case "$1" in
    sseclient-py) echo sseclient ;;
    ml_dtypes) echo ml_dtypes ;;
    *) echo "${1//-/_}" ;;
  esac
}

gen_client_venv() {
  [ -x "$binary" ] || { echo "no caf-serving binary at $binary: build it (scripts/build) or set CAF_SERVING_BINARY"; exit 1; }
  case "$venv" in
    "$root"/*) echo "GENERATIVE_CLIENT_VENV=$venv is inside the repository; put it outside"; exit 1 ;;
  esac
  local imports="" p
  for p in "$@"; do imports+="import $(gen_module_of "$p"); "; done
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$imports" 2>/dev/null; then
    return
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "making the venv $venv"
    python3 -m venv "$venv" 2>/dev/null \
      || gen_skip "python3 -m venv failed: install Debian's python3-venv, or point GENERATIVE_CLIENT_VENV at a venv with: $*"
  fi
  echo "installing $* into $venv from PyPI"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" \
    || gen_skip "pip could not install $* into $venv (offline?)"
}

gen_start_server() {
  local repo="$1" log="$2" model="$3"
  "$binary" --model-repository "$repo" --http-port 0 --grpc-port 0 --metrics-port 0 >"$log" 2>&1 &
  server_pid=$!
  local _
  for _ in $(seq 600); do
    http_port="$(sed -n 's/^HTTP listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)"
    [ -n "$http_port" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$log"; echo "the server exited"; exit 1; }
    sleep 0.1
  done
  [ -n "$http_port" ] || { cat "$log"; echo "the server did not start listening"; exit 1; }
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$http_port/v2/models/$model/ready" >/dev/null && return
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$log"
  echo "model $model did not become ready"
  exit 1
}

gen_stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
