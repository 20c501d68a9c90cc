#!/usr/bin/env bash
# Runs every test: the policy and runtime unit tests, the integration
# tests (crates/runsbx/tests/) that drive the built runsbx as root and as an
# unprivileged user this script creates (runsbx-test), and the engine tests
# (crates/runsbx/tests/engines/: podman, ctr, CRI, docker). What they share
# is crates/runsbx-testkit. Then the Python client's tests, the examples'
# and the MCP server's, as root and as that user.
#
#   hack/test.sh        (as root)
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
# Where .cargo/config.toml's target puts the release build.
bin=target/x86_64-unknown-linux-gnu/release/runsbx
# The default image `runsbx call` runs on, in the system store (built once,
# from Debian's packages; the tests of `runsbx call` on Python use it).
"$bin" image ls | grep -q '^python\b' || "$bin" image build python
log=$(mktemp)
trap 'rm -rf /tmp/runsbx-tests "$log"' EXIT
set +e
cargo test --release --workspace --no-fail-fast --lib --bins --tests -- --test-threads="$(nproc)" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The Python client (clients/python) under pytest, driving the same binary,
# as root and as the test user, with Debian's python3 (python3-pytest), from
# a copy the test user can read.
pylog=$(mktemp)
pycopy=$(mktemp -d)
trap 'rm -rf /tmp/runsbx-tests "$log" "$pylog" "$pycopy"' EXIT
cp -r clients/python "$pycopy/"
install -m 0755 "$bin" "$pycopy/runsbx"
chmod -R a+rX "$pycopy"
pytest_as() {
    local who=$1
    echo "== Python client tests as $who"
    su "$who" -s /bin/sh -c "cd '$pycopy/python' && CI='${CI:-}' RUNSBX_BIN='$pycopy/runsbx' \
        PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m pytest -v -p no:cacheprovider tests"
}
pystatus=0
for who in root "$RUNSBX_TEST_USER"; do
    pytest_as "$who" 2>&1 | tee -a "$pylog"
    [ "${PIPESTATUS[0]}" = 0 ] || pystatus=1
done
# The examples (examples/) and the MCP server (`runsbx mcp` through the
# MCP Python SDK), each as root and as the test user; each script ends
# with its own closing line.
extra=$(mktemp)
trap 'rm -rf /tmp/runsbx-tests "$log" "$pylog" "$pycopy" "$extra"' EXIT
extrastatus=0
for script in hack/examples-test.sh hack/mcp-test.sh; do
    RUNSBX_BIN=$bin "$script" 2>&1 | tee -a "$extra"
    [ "${PIPESTATUS[0]}" = 0 ] || extrastatus=1
done
set -e
# One closing line for the whole run: the sum of every test binary's, and
# one for the Python suite's two runs.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
# pytest's summary lines: "== 49 passed, 1 skipped in 17.2s ==".
awk '/^=+ .* in [0-9.]+s/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed,?$/) p += $(i-1); if ($i ~ /^(failed|errors?),?$/) f += $(i-1) } }
     END { printf "python client tests: %d passed, %d failed\n", p, f }' "$pylog"
grep -E '^(example|mcp) tests: ' "$extra" || true
[ "$status" = 0 ] && [ "$pystatus" = 0 ] && [ "$extrastatus" = 0 ]
