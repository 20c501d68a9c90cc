#!/usr/bin/env bash
# Times `run` of /bin/true on one busybox bundle for runsbx, runc and crun,
# in the same run, and prints each median and the ratios. As root.
#
#   sudo hack/bench.sh [RUNS]       (default 100 runs each, after 5 warm-ups)
#
# BASELINE=/path/to/runsbx adds another runsbx build to the same run (for
# example one built from an older commit, to measure a change's cost).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib.sh
runs=${1:-100}
[ "$(id -u)" = 0 ] || { echo "bench.sh: run as root (runc and crun need it here)" >&2; exit 1; }
cargo build --release --quiet
runsbx=$PWD/target/release/runsbx
work=$(mktemp -d /tmp/runsbx-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
make_bundle "$runsbx" "$work/bundle" /bin/true

# crun 1.8 refuses to run unless the hugetlb controller is mounted on a
# cgroup v1 host; this host does not mount it.
if [ -d /sys/fs/cgroup/memory ] && ! grep -q ' - cgroup .*hugetlb' /proc/self/mountinfo; then
    mkdir -p /sys/fs/cgroup/hugetlb
    mount -t cgroup -o hugetlb none /sys/fs/cgroup/hugetlb 2>/dev/null || true
fi

# median_ms RUNTIME: runs `RUNTIME run` RUNS times, prints the median in ms.
median_ms() {
    local rt=$1 root="$work/state-$(basename "$1")" i t0 t1
    local -a times=()
    for i in $(seq 1 $((runs + 5))); do
        t0=$(date +%s%N)
        "$rt" --root "$root" run --bundle "$work/bundle" "b$i" >/dev/null
        t1=$(date +%s%N)
        [ "$i" -gt 5 ] && times+=($(( (t1 - t0) / 1000 )))
    done
    printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%.2f\n", m / 1000}'
}

echo "run /bin/true, busybox bundle, $runs runs each (median, ms); $(nproc) cores, kernel $(uname -r)"
declare -A med
runtimes=("$runsbx" "$(command -v runc)" "$(command -v crun)")
if [ -n "${BASELINE:-}" ]; then
    cp "$BASELINE" "$work/baseline"
    runtimes+=("$work/baseline")
fi
for rt in "${runtimes[@]}"; do
    name=$(basename "$rt")
    med[$name]=$(median_ms "$rt")
    printf '  %-9s %8s ms\n' "$name" "${med[$name]}"
done
awk -v s="${med[runsbx]}" -v r="${med[runc]}" -v c="${med[crun]}" \
    'BEGIN { printf "  runsbx/runc = %.2f   runsbx/crun = %.2f\n", s / r, s / c }'
if [ -n "${BASELINE:-}" ]; then
    awk -v s="${med[runsbx]}" -v b="${med[baseline]}" 'BEGIN { printf "  runsbx/baseline = %.2f\n", s / b }'
fi
