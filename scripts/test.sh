#!/usr/bin/env bash
# The whole test suite: what CI runs, and what a developer runs before a commit.
# Needs cargo (with clippy and rustfmt), Node.js >= 18 and bubblewrap; run as root, it
# installs bubblewrap when it is missing (scripts/system-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/system-deps.sh

need() { command -v "$1" >/dev/null 2>&1 || { echo "test.sh: $1 is not installed: $2" >&2; exit 2; }; }
need cargo "install Rust with rustup (https://rustup.rs)"
need node "install Node.js 18 or newer (the runner runs on it)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' \
  || { echo "test.sh: Node.js $(node --version) is too old; the runner needs >= 18" >&2; exit 2; }
# The tests run local sandboxes under bubblewrap, as users do.
need bwrap "install the bubblewrap package (e.g. apt-get install bubblewrap)"

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

echo "== runner (node --test)"
node --test runner/test/

echo "== rust tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --no-fail-fast
else
  cargo test --locked --no-fail-fast
fi

echo "== e2b sdk conformance"
scripts/conformance.sh

echo "== model endpoint, judged by the OpenAI and Anthropic SDKs"
scripts/endpoint_sdk_check.sh
