# Shell helpers the e2b benchmarks share (sourced by run.sh and eval_latency.sh): stopping
# what they started, and waiting for a server they started to say where it listens.

# stop_pid PID: TERM, a bounded wait, then KILL.
stop_pid() {
  local pid=$1
  [[ -n "$pid" ]] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# url_of OUT PID TRIES: the "url" of the first JSON line the server PID writes to OUT,
# looking every 0.1 s, TRIES times at most; nothing (and status 1) if it died or never said.
url_of() {
  local out=$1 pid=$2 tries=$3
  for _ in $(seq "$tries"); do
    if [[ -s "$out" ]]; then
      python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["url"])' <"$out"
      return
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}
