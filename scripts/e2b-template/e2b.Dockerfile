# E2B template for wmo-e2b: E2B's base image (it ships Node.js 20, which the runner needs)
# plus the pi bundle, baked at /opt/wmo-e2b/pi/pi.mjs, so no sandbox is sent it at bootstrap.
# The runner itself is uploaded by wmo-e2b at bootstrap and needs nothing else.
#
# Build it with build.sh beside this file: it copies the bundle's build inputs (the
# repository's runner/pi/) into pi/ here first. The inputs are those wmo-e2b builds its own
# bundle from, so the bundle baked here has the same sha256, which the bootstrap checks
# (a template baked from other inputs still works: its copy is ignored and the bundle is
# uploaded instead).
FROM e2bdev/base:latest

COPY pi/ /tmp/wmo-pi-build/
RUN node --version \
 && cd /tmp/wmo-pi-build \
 && npm ci --no-audit --no-fund --ignore-scripts --include=optional \
 && mkdir -p /opt/wmo-e2b/pi \
 && node build.mjs /opt/wmo-e2b/pi/pi.mjs \
 && cd / && rm -rf /tmp/wmo-pi-build \
 && chmod -R a+rX /opt/wmo-e2b
