#!/usr/bin/env bash
# Builds (once) the venv whose Harbor models validate ATIF trajectories, and prints its
# python. Harbor wants CPython 3.12: $PY312 when set, else python3.12 on PATH, else pyenv's.
# pydantic is installed normally, harbor (pinned in scripts/atif-requirements.txt) with
# --no-deps: its trajectory models import nothing else. Needs PyPI on the first run; the
# venv lives in target/atif-venv and is reused while the pins and the Python match.
# Exits 2 naming what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

is312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
py=
if [[ -n "${PY312:-}" ]]; then
  is312 "$PY312" || { echo "atif-venv.sh: PY312=$PY312 is not a CPython 3.12" >&2; exit 2; }
  py=$PY312
else
  # A pyenv shim on PATH may name a version that is not selected, so each is tried.
  for c in "$(command -v python3.12 || true)" "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if [[ -n "$c" && -x "$c" ]] && is312 "$c"; then py=$c; break; fi
  done
fi
if [[ -z "$py" ]]; then
  echo "atif-venv.sh: no CPython 3.12 found (set PY312, or install python3.12 with its venv module, e.g. with pyenv)" >&2
  exit 2
fi

venv=target/atif-venv
reqs=scripts/atif-requirements.txt
stamp="$("$py" --version 2>&1) $(cksum < "$reqs")"
mkdir -p target
# Tests run in parallel processes: one builds the venv while the others wait for it.
exec 9> target/atif-venv.lock
flock 9
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.wmo-stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "atif-venv.sh: creating $venv" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv" >&2 || { echo "atif-venv.sh: $py -m venv failed (on Debian/Ubuntu: apt-get install python3.12-venv)" >&2; exit 2; }
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" "$(grep '^pydantic==' "$reqs")" >&2 \
    || { echo "atif-venv.sh: cannot install pydantic from PyPI" >&2; exit 2; }
  "${pip[@]}" --no-deps "$(grep '^harbor==' "$reqs")" >&2 \
    || { echo "atif-venv.sh: cannot install harbor from PyPI" >&2; exit 2; }
  echo "$stamp" > "$venv/.wmo-stamp"
fi
echo "$(pwd)/$venv/bin/python"
