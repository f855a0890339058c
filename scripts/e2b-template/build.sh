#!/usr/bin/env bash
# Builds the wmo-e2b E2B template (e2b.Dockerfile, the pi bundle baked in): copies the pi
# bundle's build inputs (runner/pi/) into pi/ here, the build context, then runs the E2B CLI
# in this directory. Arguments go to `e2b template build` (default: --name wmo-e2b).
set -euo pipefail
cd "$(dirname "$0")"
rm -rf pi
mkdir pi
cp ../../runner/pi/package.json ../../runner/pi/package-lock.json \
   ../../runner/pi/entry.mjs ../../runner/pi/build.mjs pi/
if [ $# -eq 0 ]; then set -- --name wmo-e2b; fi
e2b template build --dockerfile e2b.Dockerfile "$@"
