# Sourced (bash): `start_loopback_registry WORK` starts the CNCF distribution registry on a free
# loopback port with its data in WORK, pushes a small base image to it (busybox, with a
# /bin/bash that runs busybox's sh, as E2B's commands start with bash, and `user` as uid
# 1000) as `library/ubuntu:22.04` and `wmo/base:1`, and writes WORK/home/registries.toml
# sending docker.io to it. Sets REGISTRY (host:port) and REGISTRY_PID; the caller stops it.
# Needs docker-registry, buildah and busybox-static (scripts/system-deps.sh installs them).
start_loopback_registry() {
  local work=$1 tool
  for tool in docker-registry buildah; do
    command -v "$tool" >/dev/null 2>&1 || { echo "loopback-registry: $tool is not installed: apt-get install $tool" >&2; return 2; }
  done
  [[ -x /bin/busybox ]] || { echo "loopback-registry: /bin/busybox is missing: apt-get install busybox-static" >&2; return 2; }
  local port config=$work/registry.yml tree=$work/base
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' \
    "$work/registry" "$port" >"$config"
  docker-registry serve "$config" >"$work/registry.log" 2>&1 &
  REGISTRY_PID=$!
  REGISTRY=127.0.0.1:$port
  for _ in $(seq 300); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  mkdir -p "$tree/bin" "$tree/etc" "$tree/tmp" "$tree/root" "$tree/home/user" "$tree/app"
  cp /bin/busybox "$tree/bin/"
  printf '#!/bin/sh\nexec /bin/busybox sh "$@"\n' >"$tree/bin/bash"
  chmod 755 "$tree/bin/bash"
  local applet
  for applet in sh cat echo mkdir test id ls readlink sleep whoami rm cp mv chmod chown env printf grep sed tr true false ln pwd; do
    ln -s busybox "$tree/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n' >"$tree/etc/passwd"
  printf 'root:x:0:\nuser:x:1000:\n' >"$tree/etc/group"
  local b=(buildah --root "$work/buildah/root" --runroot "$work/buildah/run" --storage-driver vfs)
  local c
  c=$("${b[@]}" from scratch)
  "${b[@]}" copy "$c" "$tree" / >/dev/null
  "${b[@]}" config --env PATH=/bin --cmd /bin/sh --workingdir /app "$c"
  "${b[@]}" commit -q "$c" localhost/loopback-base >/dev/null
  local name
  for name in library/ubuntu:22.04 wmo/base:1; do
    "${b[@]}" push -q --tls-verify=false localhost/loopback-base "docker://$REGISTRY/$name"
  done
  mkdir -p "$work/home"
  printf '[registries."docker.io"]\nmirrors = ["%s"]\n' "$REGISTRY" >"$work/home/registries.toml"
}
