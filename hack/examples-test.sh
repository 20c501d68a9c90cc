#!/usr/bin/env bash
# Runs the example tests (examples/tests) under pytest against a runsbx
# binary: as the current user and, when RUNSBX_TEST_USER is set, as that
# user too (which needs root). The client (clients/python/src) and the
# examples are copied to a directory the test user can read, as
# hack/test.sh does for the client's own tests.
#
#   sudo RUNSBX_TEST_USER=runsbx-test hack/examples-test.sh
#
# RUNSBX_BIN names the binary (default:
# target/x86_64-unknown-linux-gnu/release/runsbx, under CARGO_TARGET_DIR
# when set); the `python` image must exist
# (`runsbx image build python`). With CI=true a test that cannot run
# fails instead of printing SKIP. Prints one closing line,
# `example tests: N passed, M failed`, and exits non-zero on a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${RUNSBX_BIN:-${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/runsbx}
if [ ! -x "$bin" ]; then
    echo "examples-test.sh: no runsbx binary at $bin: build it (cargo build --release -p runsbx) or set RUNSBX_BIN" >&2
    exit 1
fi
user=${RUNSBX_TEST_USER:-}
if [ -n "$user" ] && [ "$(id -u)" != 0 ]; then
    echo "examples-test.sh: RUNSBX_TEST_USER=$user needs root (the tests switch to that user)" >&2
    exit 1
fi

copy=$(mktemp -d)
log=$(mktemp)
xdg=
trap 'rm -rf "$copy" "$log" ${xdg:+"$xdg"}' EXIT
mkdir -p "$copy/clients/python"
cp -r clients/python/src "$copy/clients/python/"
cp -r examples "$copy/"
install -m 0755 "$bin" "$copy/runsbx"
chmod -R a+rX "$copy"

# The environment of a run: only what the tests need, nothing of the
# caller's (its XDG_RUNTIME_DIR, say, belongs to someone else).
run_env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
         CI="${CI:-}" RUNSBX_BIN="$copy/runsbx" PYTHONDONTWRITEBYTECODE=1)
pytest_cmd=(/usr/bin/python3 -m pytest -v -rs -p no:cacheprovider examples/tests)

status=0
me=$(id -un)
echo "== example tests as $me"
(cd "$copy" && env -i "${run_env[@]}" HOME="$(getent passwd "$me" | cut -d: -f6)" USER="$me" \
    ${XDG_RUNTIME_DIR:+XDG_RUNTIME_DIR="$XDG_RUNTIME_DIR"} "${pytest_cmd[@]}") 2>&1 | tee -a "$log" || status=1

if [ -n "$user" ]; then
    home=$(getent passwd "$user" | cut -d: -f6)
    uid=$(id -u "$user")
    # A runtime directory of the user's own: theirs under /run/user when
    # a login made one, else a private one for this run.
    if [ -d "/run/user/$uid" ] && [ "$(stat -c %u "/run/user/$uid")" = "$uid" ]; then
        runtime=/run/user/$uid
    else
        xdg=$(mktemp -d)
        chown "$user:" "$xdg"
        chmod 0700 "$xdg"
        runtime=$xdg
    fi
    echo "== example tests as $user"
    (cd "$copy" && runuser -u "$user" -- env -i "${run_env[@]}" HOME="$home" USER="$user" \
        XDG_RUNTIME_DIR="$runtime" "${pytest_cmd[@]}") 2>&1 | tee -a "$log" || status=1
fi

# pytest's summary lines: "== 14 passed, 1 skipped in 17.2s ==".
awk '/^=+ .* in [0-9.]+s/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed,?$/) p += $(i-1); if ($i ~ /^(failed|errors?),?$/) f += $(i-1) } }
     END { printf "example tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
