#!/usr/bin/env bash
# System packages wmo-e2b uses that a fresh machine may lack: bubblewrap (`bwrap`, which
# confines local sandboxes), slirp4netns (the user-mode network stack of `--network
# internet`; without it sandboxes default to `--network none`) and chromium (the headless browser the HTML report's test opens
# the page in). Run as root it installs them with apt-get; otherwise it says what to install
# and carries on (local sandboxes then run unconfined, with a warning; the HTML report test
# fails naming chromium).
set -euo pipefail

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
# Container images: the CNCF registry the image tests serve on loopback, buildah (the first
# image builder wmo-e2b looks for), skopeo and umoci (tests push with them and the image
# benchmark compares against them), busybox-static (base images made without a network).
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps.sh: installing ${missing[*]}" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "system-deps.sh: missing ${missing[*]}; install them (e.g. sudo apt-get install ${missing[*]})" >&2
fi
