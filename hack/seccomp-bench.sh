#!/usr/bin/env bash
# The cost of reporting seccomp denials: the same runsbx build, in one run,
# times inside the sandbox (python on the `python` image)
#   - 200000 os.getppid() (allowed: the same filter decides, no listener
#     involved), and
#   - 2000 denied syscalls (ptrace via ctypes: each a round trip to runsbx's
#     listener when it reports),
#   - 2000 refused connects to the sandbox's own loopback (allowed, but each
#     observed by the listener, which reads it and lets it continue),
# with the listener and without it (RUNSBX_BENCH_NO_SECCOMP_LISTENER=1, a
# benchmark switch only), and prints the medians and the ratios.
#
#   sudo hack/seccomp-bench.sh [RUNS]     (default 7 calls each way)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-7}
: "${CARGO_TARGET_DIR:=$PWD/target}"
cargo build --release --quiet -p runsbx
runsbx=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/runsbx
root=$(mktemp -d /tmp/runsbx-sbench.XXXXXX)
trap 'rm -rf "$root"' EXIT

script='
import ctypes, os, socket, time
libc = ctypes.CDLL(None, use_errno=True)
t = time.perf_counter()
for _ in range(200000): os.getppid()
allowed = time.perf_counter() - t
t = time.perf_counter()
for _ in range(2000): libc.ptrace(0, 0, None, None)
denied = time.perf_counter() - t
t = time.perf_counter()
for _ in range(2000):
    with socket.socket() as s:
        try: s.connect(("127.0.0.1", 9))
        except OSError: pass
connects = time.perf_counter() - t
print(f"{allowed * 1e3:.2f} {denied * 1e3:.2f} {connects * 1e3:.2f}")
'
declare -A allowed denied connects
for i in $(seq 1 "$runs"); do
    for mode in listener none; do
        if [ $mode = none ]; then export RUNSBX_BENCH_NO_SECCOMP_LISTENER=1; else unset RUNSBX_BENCH_NO_SECCOMP_LISTENER; fi
        read -r a d c < <("$runsbx" --root "$root" call -- python3 -c "$script")
        allowed[$mode]+="$a "; denied[$mode]+="$d "; connects[$mode]+="$c "
    done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf '%-28s %12s %12s %8s\n' "median of $runs calls (ms)" listener none ratio
for what in allowed denied connects; do
    declare -n m=$what
    l=$(echo "${m[listener]}" | median); n=$(echo "${m[none]}" | median)
    case $what in
        allowed) label="200000 getppid (allowed)" ;;
        denied) label="2000 ptrace (denied)" ;;
        connects) label="2000 connect (observed)" ;;
    esac
    printf '%-28s %12s %12s %8s\n' "$label" "$l" "$n" "$(awk -v l="$l" -v n="$n" 'BEGIN {printf "%.2f", l / n}')"
done
