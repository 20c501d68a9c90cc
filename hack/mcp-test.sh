#!/usr/bin/env bash
# Runs tests/mcp: `runsbx mcp` driven by the real MCP client SDK (PyPI
# `mcp`, pinned below) over stdio, against $RUNSBX_BIN (default
# target/x86_64-unknown-linux-gnu/release/runsbx), as the caller and, when
# RUNSBX_TEST_USER is set, as that unprivileged user too. Ends with one
# line,
#
#   mcp tests: N passed, M failed
#
# and exits non-zero when a test failed or could not run.
#
#   sudo hack/mcp-test.sh
#   sudo RUNSBX_TEST_USER=runsbx-test hack/mcp-test.sh
#
# The SDK needs Python 3.10 or newer (Debian 12's python3 is 3.11); it is
# installed into a virtualenv under a temporary directory, which goes at the
# end. With CI=true a test that cannot run fails instead of printing SKIP.
set -euo pipefail
cd "$(dirname "$0")/.."

MCP_VERSION=2.3.0
PYTEST_VERSION=9.2.0

bin=${RUNSBX_BIN:-target/x86_64-unknown-linux-gnu/release/runsbx}
if [ ! -x "$bin" ]; then
    echo "mcp-test.sh: no runsbx at $bin (cargo build --release -p runsbx, or set RUNSBX_BIN)" >&2
    exit 1
fi

# The virtualenv, the test and a copy of runsbx, readable by the test user.
work=$(mktemp -d /tmp/runsbx-mcp-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check \
    "mcp==$MCP_VERSION" "pytest==$PYTEST_VERSION"
mkdir "$work/tests"
cp tests/mcp/test_mcp.py "$work/tests/"
install -m 0755 "$bin" "$work/runsbx"
chmod -R a+rX "$work"

log="$work/log"
pytest_cmd=(env CI="${CI:-}" RUNSBX_BIN="$work/runsbx" PYTHONDONTWRITEBYTECODE=1
    "$work/venv/bin/python" -m pytest -v -p no:cacheprovider "$work/tests/test_mcp.py")
status=0

echo "== mcp tests as $(id -un)"
(cd "$work/tests" && "${pytest_cmd[@]}") 2>&1 | tee -a "$log" || status=1

if [ -n "${RUNSBX_TEST_USER:-}" ]; then
    user=$RUNSBX_TEST_USER
    # Rootless runsbx keeps its state in $XDG_RUNTIME_DIR: a private one.
    xdg="$work/xdg-$user"
    install -d -m 0700 -o "$user" "$xdg"
    echo "== mcp tests as $user"
    (cd "$work/tests" && runuser -u "$user" -- env XDG_RUNTIME_DIR="$xdg" \
        PATH=/usr/local/bin:/usr/bin:/bin "${pytest_cmd[@]}") 2>&1 | tee -a "$log" || status=1
fi

# pytest's summary lines: "== 9 passed, 1 failed in 17.2s ==".
awk '/^=+ .* in [0-9.]+s/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed,?$/) p += $(i-1); if ($i ~ /^(failed|errors?),?$/) f += $(i-1) } }
     END { printf "mcp tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
