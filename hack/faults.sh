#!/usr/bin/env bash
# The fault-injection suite in its long mode: 1,000 SIGKILLs of each kind
# (create, start, delete, call's main process, call's process group), 200
# calls at once, a soak of 10,000 cold calls and one of 10,000 pooled calls
# (runsbx serve, 2 at a time), as root and as the unprivileged test user,
# counting what is left on the host after each.
#
#   sudo hack/faults.sh [KILLS [SOAK [POOL_SOAK]]]
#
# CI runs the same tests with 100 kills and soaks of 300 calls (hack/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib.sh
if [ "$(id -u)" != 0 ]; then
    echo "faults.sh: run as root: the tests switch to an unprivileged user" >&2
    exit 1
fi
export RUNSBX_TEST_USER=${RUNSBX_TEST_USER:-runsbx-test}
ensure_test_user "$RUNSBX_TEST_USER"
export RUNSBX_FAULT_KILLS=${1:-1000} RUNSBX_FAULT_SOAK=${2:-10000} RUNSBX_FAULT_CALLS=200
export RUNSBX_FAULT_POOL_SOAK=${3:-10000}
trap 'rm -rf /tmp/runsbx-tests' EXIT
start=$(date +%s)
cargo test --release -p runsbx --test faults -- --test-threads=1 --nocapture
echo "faults: $RUNSBX_FAULT_KILLS kills of each kind, soaks of $RUNSBX_FAULT_SOAK cold and $RUNSBX_FAULT_POOL_SOAK pooled calls: $(( $(date +%s) - start )) s"
