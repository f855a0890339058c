# Sourced. pinned_venv VENV REQS WHO: makes VENV (python3 -m venv) with the pins in REQS
# installed, unless it exists with the same pins and Python (a stamp file says which);
# WHO names the caller in messages. Needs PyPI when it has to install.
pinned_venv() {
  local venv=$1 reqs=$2 who=$3 stamp
  stamp="$(python3 --version 2>&1) $(cksum < "$reqs")"
  if [[ -x "$venv/bin/python" && "$(cat "$venv/.wmo-stamp" 2>/dev/null)" == "$stamp" ]]; then
    return 0
  fi
  echo "$who: creating $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" || { echo "$who: python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 2; }
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
  echo "$stamp" > "$venv/.wmo-stamp"
}
