#!/usr/bin/env bash
# Runs every test: the policy and runtime unit tests, the integration
# tests (crates/runsbx/tests/) that drive the built runsbx as root and as an
# unprivileged user this script creates (runsbx-test), and the engine tests
# (crates/runsbx/tests/engines/: podman, ctr, CRI, docker). What they share
# is crates/runsbx-testkit.
#
#   sudo hack/test.sh
#
# With CI=true a test that cannot run fails instead of printing SKIP.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib.sh

if [ "$(id -u)" != 0 ]; then
    echo "test.sh: run as root: the tests switch to an unprivileged user and start containerd" >&2
    exit 1
fi
export RUNSBX_TEST_USER=${RUNSBX_TEST_USER:-runsbx-test}
ensure_test_user "$RUNSBX_TEST_USER"
# The tests keep a copy of runsbx and a busybox rootfs, readable by the
# unprivileged user, under /tmp/runsbx-tests.

cargo build --release --workspace
# The default image `runsbx call` runs on, in the system store (built once,
# from Debian's packages; the tests of `runsbx call` on Python use it).
target/release/runsbx image ls | grep -q '^python\b' || target/release/runsbx image build python
log=$(mktemp)
trap 'rm -rf /tmp/runsbx-tests "$log"' EXIT
set +e
cargo test --release --workspace --no-fail-fast --lib --bins --tests -- --test-threads="$(nproc)" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The Python client (clients/python), driving the same binary.
pylog=$(mktemp)
trap 'rm -rf /tmp/runsbx-tests "$log" "$pylog"' EXIT
RUNSBX_BIN="$PWD/target/release/runsbx" python3 -m unittest discover -s clients/python/tests -v 2>&1 | tee "$pylog"
pystatus=${PIPESTATUS[0]}
set -e
# One closing line for the whole run: the sum of every test binary's, and
# the Python suite's (its "Ran N tests" less its failures and errors).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
awk '/^Ran [0-9]+ tests? in/ { n = $2 }
     /^FAILED \(/ { s = $0; while (match(s, /(failures|errors)=[0-9]+/)) { split(substr(s, RSTART, RLENGTH), kv, "="); f += kv[2]; s = substr(s, RSTART + RLENGTH) } }
     END { printf "python client tests: %d passed, %d failed\n", n - f, f }' "$pylog"
[ "$status" = 0 ] && [ "$pystatus" = 0 ]
