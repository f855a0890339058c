#!/usr/bin/env bash
# E2B SDK conformance: the official E2B Python SDK (pinned in scripts/e2b-requirements.txt)
# drives `wmo-e2b emulator`; scripts/e2b_conformance.py checks every answer.
#
# Needs python3 with the venv module and network access to PyPI on the first run; the venv
# lives in target/e2b-venv and is reused while the pins and the Python version match.
# Starts three emulators on free ports (one plain, one with seeded faults, one building
# templates from a loopback registry), stops them, and fails if any check failed or any
# sandbox outlived its emulator.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1 || { echo "conformance.sh: $1 is not installed: $2" >&2; exit 2; }; }
need python3 "install Python 3.9 or newer with the venv module"
need cargo "install Rust with rustup (https://rustup.rs)"

venv=target/e2b-venv
source scripts/lib/venv.sh
pinned_venv "$venv" scripts/e2b-requirements.txt conformance.sh

cargo build --locked --quiet --bin wmo-e2b
bin="${CARGO_TARGET_DIR:-target}/debug/wmo-e2b"

work=$(mktemp -d "${TMPDIR:-/tmp}/wmo-e2b-conformance.XXXXXX")
key="e2b_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
pids=()

stop_all() {
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    # Stopping kills the emulator's sandboxes; give it a bounded time, then insist.
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT

# Starts an emulator (extra flags in "$@") and sets started_url to its base URL. Not run in
# a $(...) subshell, so the pid lands in this shell's list.
started_url=
start_emulator() {
  local name=$1
  shift
  "$bin" emulator --listen 127.0.0.1:0 --api-key "$key" --json \
    --state-dir "$work/$name-state" "$@" >"$work/$name.out" 2>"$work/$name.err" &
  pids+=($!)
  for _ in $(seq 300); do
    if [[ -s "$work/$name.out" ]]; then
      started_url=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["url"])' <"$work/$name.out")
      return 0
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "conformance.sh: the $name emulator did not start:" >&2
  cat "$work/$name.err" >&2
  return 1
}

# A loopback registry (the CNCF distribution registry) holding a small `ubuntu:22.04`; the
# template checks' emulator pulls `docker.io` through it, as a mirror set in its
# registries.toml, and builds with buildah into an image store of its own.
source scripts/lib/loopback-registry.sh

# A certificate authority of this run alone and a certificate for E2B's sandbox hosts signed
# by it: the plain emulator answers HTTPS to a sandbox's port with it, and the checks
# trust it alone (SSL_CERT_FILE), reaching https://<port>-<id>.e2b.app through the
# emulator as their HTTPS proxy, as the SDK's own tests reach E2B's.
need openssl "install openssl (Debian: apt-get install openssl)"
tls() { openssl "$@" >/dev/null 2>&1; }
tls req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=wmo-e2b conformance CA" -keyout "$work/ca.key" -out "$work/ca.pem"
tls req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=*.e2b.app" -keyout "$work/tls.key" -out "$work/tls.csr"
printf 'subjectAltName=DNS:*.e2b.app\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$work/tls.ext"
tls x509 -req -in "$work/tls.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
  -days 2 -extfile "$work/tls.ext" -out "$work/tls.pem"

start_emulator plain --tls-cert "$work/tls.pem" --tls-key "$work/tls.key"
url=$started_url
# Seeded, so the fault sequence (and so this run) is the same every time.
start_emulator faulty --fault create-429=0.3,create-503=0.2 --seed 7
faulty_url=$started_url

unset E2B_DEBUG E2B_DOMAIN E2B_ACCESS_TOKEN
export E2B_API_KEY=$key E2B_API_URL=$url E2B_SANDBOX_URL=$url WMO_E2B_FAULTY_URL=$faulty_url
export HTTPS_PROXY=$url SSL_CERT_FILE=$work/ca.pem NO_PROXY=127.0.0.1,localhost
unset HTTP_PROXY ALL_PROXY http_proxy https_proxy all_proxy no_proxy

start_loopback_registry "$work" || exit $?
pids+=("$REGISTRY_PID")
WMO_E2B_HOME=$work/home start_emulator templates --max-builds 2
templates_url=$started_url

status=0
timeout 300 "$venv/bin/python" scripts/e2b_conformance.py || status=$?
E2B_API_URL=$templates_url E2B_SANDBOX_URL=$templates_url \
  timeout 300 "$venv/bin/python" scripts/e2b_conformance_templates.py || status=$?

stop_all
for name in plain faulty templates; do
  left=$(find "$work/$name-state/sandboxes" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  if [[ "$left" != 0 ]]; then
    echo "conformance.sh: the $name emulator left $left sandbox(es) behind" >&2
    status=1
  fi
  if ! grep -q '"type":"stopped"' "$work/$name.out"; then
    echo "conformance.sh: the $name emulator did not stop cleanly:" >&2
    cat "$work/$name.err" >&2
    status=1
  fi
done
if [[ $status != 0 ]]; then
  echo "conformance.sh: FAILED (emulator log below)" >&2
  tail -n 50 "$work/plain.err" >&2 || true
fi
exit $status
