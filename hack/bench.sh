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
runsbx=$PWD/target/x86_64-unknown-linux-gnu/release/runsbx
work=$(mktemp -d /tmp/runsbx-bench.XXXXXX)
# State roots on a tmpfs, for the figures that compare them with /tmp's.
shm=$(mktemp -d /dev/shm/runsbx-bench.XXXXXX)
trap 'rm -rf "$work" "$shm"' EXIT
make_bundle "$runsbx" "$work/bundle" /bin/true

# crun 1.8 refuses to run unless the hugetlb controller is mounted on a
# cgroup v1 host; this host does not mount it.
if [ -d /sys/fs/cgroup/memory ] && ! grep -q ' - cgroup .*hugetlb' /proc/self/mountinfo; then
    mkdir -p /sys/fs/cgroup/hugetlb
    mount -t cgroup -o hugetlb none /sys/fs/cgroup/hugetlb 2>/dev/null || true
fi

# median_ms RUNTIME [GAP [ROOT [BUNDLE]]]: runs `RUNTIME run` of BUNDLE
# (default the busybox one) RUNS times, GAP seconds apart (default none),
# its state in ROOT (default one in $work), prints the median in ms.
median_ms() {
    local rt=$1 gap=${2:-0} root=${3:-"$work/state-$(basename "$1")"} bundle=${4:-"$work/bundle"} i t0 t1
    local -a times=()
    for i in $(seq 1 $((runs + 5))); do
        [ "$gap" = 0 ] || sleep "$gap"
        t0=$(date +%s%N)
        "$rt" --root "$root" run --bundle "$bundle" "b$i" >/dev/null
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
    # The alternating comparisons run copies of this build too, and of
    # each build several, one after the other: how a binary came into the
    # page cache (written by the linker or by cp) changes how its pages
    # fault in, by 3-5% of a run here, and two cp copies of one binary
    # differed by up to 3%.
    copies=6
    for c in $(seq 0 $((copies - 1))); do
        cp "$BASELINE" "$work/baseline-$c"
        cp "$runsbx" "$work/current-$c"
    done
fi
# Which of those copies the next alternating run uses.
copy=0
for rt in "${runtimes[@]}"; do
    name=$(basename "$rt")
    med[$name]=$(median_ms "$rt")
    printf '  %-9s %8s ms\n' "$name" "${med[$name]}"
done
awk -v s="${med[runsbx]}" -v r="${med[runc]}" -v c="${med[crun]}" \
    'BEGIN { printf "  runsbx/runc = %.2f   runsbx/crun = %.2f\n", s / r, s / c }'
# Back to back, every runtime after the first skips most of the RCU grace
# period that attaching a process to a cgroup v1 hierarchy waits for: the
# kernel leaves the lock it takes for an attach on its slow path for a
# grace period or two after the last writer, and the next run comes
# within that window (crun's 11 ms do, runsbx's 30 do not). Tool calls come seconds
# apart; so again with 0.1 s between runs, where each pays it (about 10 ms
# on this host, for every runtime).
echo "the same, 0.1 s between runs (median, ms)"
declare -A spaced
for rt in "$runsbx" "$(command -v runc)" "$(command -v crun)"; do
    name=$(basename "$rt")
    spaced[$name]=$(median_ms "$rt" 0.1)
    printf '  %-9s %8s ms\n' "$name" "${spaced[$name]}"
done
awk -v s="${spaced[runsbx]}" -v r="${spaced[runc]}" -v c="${spaced[crun]}" \
    'BEGIN { printf "  runsbx/runc = %.2f   runsbx/crun = %.2f\n", s / r, s / c }'

# --- The same sandbox in crun: the config `runsbx harden` gives this
# bundle (a user namespace mapping the sandbox's own 65536 ids, the
# seccomp allowlist, the masked /proc, the tmpfs mounts, rlimits, no
# capabilities) run by crun, on a copy of the rootfs owned by those ids
# (what runsbx's idmapped mount of it shows the sandbox). It tells what
# the policy itself costs a runtime from what runsbx's own machinery
# does. Not all of it: crun leaves the loopback down, which runsbx
# brings up, and makes no state of the ids it is given.
hardened=$work/hardened
mkdir -p "$hardened"
cp -a "$work/bundle/rootfs" "$hardened/rootfs"
"$runsbx" harden --bundle "$work/bundle" | python3 -c '
import json, os, sys
config = json.load(sys.stdin)["config"]
config["root"]["path"] = "rootfs"
uids, gids = config["linux"]["uidMappings"], config["linux"]["gidMappings"]
assert len(uids) == len(gids) == 1 and uids[0]["containerID"] == gids[0]["containerID"] == 0, uids
for top, dirs, files in os.walk(sys.argv[1]):
    for path in [top] + [os.path.join(top, n) for n in dirs + files]:
        st = os.lstat(path)
        os.lchown(path, uids[0]["hostID"] + st.st_uid, gids[0]["hostID"] + st.st_gid)
json.dump(config, open(sys.argv[2], "w"))
' "$hardened/rootfs" "$hardened/config.json"
crun_path=$(command -v crun)
hard_b2b=$(median_ms "$crun_path" 0 "$work/state-crun-hardened" "$hardened")
hard_spaced=$(median_ms "$crun_path" 0.1 "$work/state-crun-hardened" "$hardened")
echo "crun on runsbx's hardened config (median, ms)"
printf '  back to back %8s   runsbx/crun-hardened = %.2f\n' "$hard_b2b" \
    "$(awk -v s="${med[runsbx]}" -v c="$hard_b2b" 'BEGIN { print s / c }')"
printf '  0.1 s apart  %8s   runsbx/crun-hardened = %.2f\n' "$hard_spaced" \
    "$(awk -v s="${spaced[runsbx]}" -v c="$hard_spaced" 'BEGIN { print s / c }')"
if [ -n "${BASELINE:-}" ]; then
    awk -v s="${med[runsbx]}" -v b="${med[baseline]}" 'BEGIN { printf "  runsbx/baseline = %.2f\n", s / b }'
    # Again alternating one run of each, so that both see the same moments
    # of a noisy machine.
    ta=() tb=()
    for i in $(seq 1 $((runs + 5))); do
        # Each goes first every other round: the second of a pair runs
        # while the first's teardown is still settling in the kernel.
        order="runsbx baseline"
        [ $((i % 2)) = 0 ] && order="baseline runsbx"
        copy=$((i % copies))
        for which in $order; do
            rt=$work/current-$copy
            [ "$which" = baseline ] && rt=$work/baseline-$copy
            t0=$(date +%s%N)
            "$rt" --root "$work/state-alt-$which" run --bundle "$work/bundle" "a$i" >/dev/null
            t1=$(date +%s%N)
            if [ "$i" -gt 5 ]; then
                if [ "$which" = runsbx ]; then ta+=($(( (t1 - t0) / 1000 ))); else tb+=($(( (t1 - t0) / 1000 ))); fi
            fi
        done
    done
    med_of() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%.2f", m / 1000}'; }
    a=$(med_of "${ta[@]}") b=$(med_of "${tb[@]}")
    printf '  alternating: runsbx %s ms, baseline %s ms, runsbx/baseline = %.2f\n' "$a" "$b" \
        "$(awk -v a="$a" -v b="$b" 'BEGIN{print a/b}')"
fi

# --- Tool calls: `runsbx call` against bwrap on the same rootfs and
# `podman run --rm` on the same image, then calls per second with 2 and 8
# at once. On the default image (built here when missing).
"$runsbx" image ls | grep -q '^python\b' || "$runsbx" image build python
image_rootfs=/var/lib/runsbx/images/python/rootfs
pm=(podman --root "$work/podman" --runroot "$work/podman-run" --storage-driver overlay
    --cgroup-manager cgroupfs --events-backend file)
tar -C "$image_rootfs" -c . | "${pm[@]}" import -q - localhost/runsbx-bench-python >/dev/null
trap '"${pm[@]}" rm -af >/dev/null 2>&1; "${pm[@]}" rmi -af >/dev/null 2>&1; rm -rf "$work" "$shm"' EXIT
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
call_runs=$(( runs < 50 ? runs : 50 ))

# median_cmd_ms CMD...: the median wall time of CMD over call_runs runs,
# $gap seconds apart (none unless set).
gap=0
median_cmd_ms() {
    local i t0 t1
    local -a times=()
    for i in $(seq 1 $((call_runs + 3))); do
        [ "$gap" = 0 ] || sleep "$gap"
        t0=$(date +%s%N)
        "$@" >/dev/null
        t1=$(date +%s%N)
        [ "$i" -gt 3 ] && times+=($(( (t1 - t0) / 1000 )))
    done
    printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%.2f\n", m / 1000}'
}
# median_alternating_ms TOOL_A TOOL_B CMD...: the medians of CMD run by
# `sandbox TOOL_A` and `sandbox TOOL_B`, one after the other, call_runs
# times each; each goes first every other round (the second of a pair
# runs while the first's teardown is still settling in the kernel: RCU
# callbacks, a disk's discards).
median_alternating_ms() {
    local a=$1 b=$2 i t0 t1
    shift 2
    local -a ta=() tb=()
    alt_one() {
        [ "$gap" = 0 ] || sleep "$gap"
        t0=$(date +%s%N); sandbox "$1" "${@:3}" >/dev/null; t1=$(date +%s%N)
        if [ "$i" -gt 3 ]; then
            if [ "$2" = a ]; then ta+=($(( (t1 - t0) / 1000 ))); else tb+=($(( (t1 - t0) / 1000 ))); fi
        fi
    }
    for i in $(seq 1 $((call_runs + 3))); do
        copy=$((i % ${copies:-1}))
        if [ $((i % 2)) = 1 ]; then
            alt_one "$a" a "$@"; alt_one "$b" b "$@"
        else
            alt_one "$b" b "$@"; alt_one "$a" a "$@"
        fi
    done
    local med='{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%.2f", m / 1000}'
    echo "$(printf '%s\n' "${ta[@]}" | sort -n | awk "$med") $(printf '%s\n' "${tb[@]}" | sort -n | awk "$med")"
}
sandbox() {
    case $1 in
    runsbx) shift; "$runsbx" --root "$work/state-call" call --image python -- "$@" ;;
    runsbx-tmpfs) shift; "$runsbx" --root "$shm/state-call" call --image python -- "$@" ;;
    current) shift; "$work/current-$copy" --root "$work/state-call-current" call --image python -- "$@" ;;
    baseline) shift; "$work/baseline-$copy" --root "$work/state-call-baseline" call --image python -- "$@" ;;
    bwrap) shift; bwrap --ro-bind "$image_rootfs" / --proc /proc --dev /dev --tmpfs /tmp \
               --tmpfs /workspace --chdir /workspace --unshare-all --die-with-parent \
               --new-session --clearenv --setenv PATH "$path" -- "$@" ;;
    podman) shift; "${pm[@]}" run --rm --network none --ulimit nofile=1024:1024 \
               --ulimit nproc=1024:1024 localhost/runsbx-bench-python "$@" ;;
    esac
}
echo
echo "tool calls on the python image (median of $call_runs, ms)"
declare -A bwrap_ms=()
for cmd in "/bin/true" "python3 -c pass"; do
    declare -A cm=()
    for tool in runsbx bwrap podman; do
        # shellcheck disable=SC2086
        cm[$tool]=$(median_cmd_ms sandbox $tool $cmd)
    done
    bwrap_ms[$cmd]=${cm[bwrap]}
    printf '  %-16s runsbx %8s   bwrap %8s   podman %8s   runsbx/bwrap = %.2f   runsbx/podman = %.2f\n' \
        "$cmd" "${cm[runsbx]}" "${cm[bwrap]}" "${cm[podman]}" \
        "$(awk -v a="${cm[runsbx]}" -v b="${cm[bwrap]}" 'BEGIN{print a/b}')" \
        "$(awk -v a="${cm[runsbx]}" -v b="${cm[podman]}" 'BEGIN{print a/b}')"
    if [ -n "${BASELINE:-}" ]; then
        # Against the older build, alternating one call of each, so that
        # both see the same moments of a noisy machine.
        # shellcheck disable=SC2086
        read -r now base < <(median_alternating_ms current baseline $cmd)
        printf '  %-16s runsbx %8s   baseline %6s   runsbx/baseline = %.2f (alternating)\n' \
            "$cmd" "$now" "$base" "$(awk -v a="$now" -v b="$base" 'BEGIN{print a/b}')"
    fi
done
# Tool calls come seconds apart (the model thinks between them): so again
# with 0.1 s between calls, where each starts on idle CPUs. On these VMs
# a thread or process woken on an idle CPU waits for it to wake first,
# which back to back it seldom does.
echo "the same, 0.1 s between calls (median of $call_runs, ms)"
gap=0.1
true_runsbx=$(median_cmd_ms sandbox runsbx /bin/true)
true_bwrap=$(median_cmd_ms sandbox bwrap /bin/true)
printf '  %-16s runsbx %8s   bwrap %8s   runsbx/bwrap = %.2f\n' "/bin/true" "$true_runsbx" "$true_bwrap" \
    "$(awk -v a="$true_runsbx" -v b="$true_bwrap" 'BEGIN{print a/b}')"
if [ -n "${BASELINE:-}" ]; then
    read -r now base < <(median_alternating_ms current baseline /bin/true)
    printf '  %-16s runsbx %8s   baseline %6s   runsbx/baseline = %.2f (alternating)\n' \
        "/bin/true" "$now" "$base" "$(awk -v a="$now" -v b="$base" 'BEGIN{print a/b}')"
fi
gap=0

# --- The state roots above are in /tmp, on this host's root filesystem.
# On these VMs that is an ext4 without a journal, mounted with `discard`,
# where making and removing files waits for the disk: a block a file or
# directory frees (a directory removed, a file ext4 wrote out at once) is
# discarded synchronously. A `runsbx call` there issues 10 discards and 3
# writes (block:block_rq_issue), against 3 discards with its state root
# on a tmpfs. A standard host keeps /run, where each runtime's default
# state root is, on a tmpfs. So again with the state roots on a tmpfs:
# `run` back to back for runsbx and crun, and the call alternating with
# the one above.
work_fs=$(findmnt -no FSTYPE -T "$work")
echo
echo "state roots on a tmpfs instead of /tmp's $work_fs (median, ms)"
declare -A on_tmpfs
for rt in "$runsbx" "$(command -v crun)"; do
    name=$(basename "$rt")
    on_tmpfs[$name]=$(median_ms "$rt" 0 "$shm/state-$name")
done
printf '  run /bin/true    runsbx %8s   crun %8s   runsbx/crun = %.2f\n' \
    "${on_tmpfs[runsbx]}" "${on_tmpfs[crun]}" \
    "$(awk -v a="${on_tmpfs[runsbx]}" -v b="${on_tmpfs[crun]}" 'BEGIN{print a/b}')"
read -r tmpfs_ms disk_ms < <(median_alternating_ms runsbx-tmpfs runsbx /bin/true)
printf '  call /bin/true   tmpfs %8s   %s %8s   tmpfs/bwrap = %.2f\n' "$tmpfs_ms" \
    "$work_fs" "$disk_ms" "$(awk -v a="$tmpfs_ms" -v b="${bwrap_ms[/bin/true]}" 'BEGIN{print a/b}')"

# per_second N TOOL: calls of `python3 -c pass` finished per second with N
# running at once (4 * N calls in all).
per_second() {
    local n=$1 tool=$2 total=$(( 4 * $1 )) t0 t1
    t0=$(date +%s%N)
    seq 1 "$total" | xargs -P "$n" -I{} bash -c "$(declare -f sandbox); $(declare -p pm work runsbx image_rootfs path); sandbox $tool python3 -c pass >/dev/null" ||
        { echo "bench.sh: a $tool call failed while timing" >&2; return 1; }
    t1=$(date +%s%N)
    awk -v c="$total" -v ns=$(( t1 - t0 )) 'BEGIN { printf "%.1f", c / (ns / 1e9) }'
}
echo "python3 -c pass, calls per second"
for n in 2 8; do
    printf '  %d at once:  runsbx %6s   bwrap %6s   podman %6s\n' "$n" \
        "$(per_second "$n" runsbx)" "$(per_second "$n" bwrap)" "$(per_second "$n" podman)"
done

# rate N TOTAL CMD...: CMD run TOTAL times with N at once, in calls
# finished per second. xargs execs CMD itself: no shell per call.
rate() {
    local n=$1 total=$2 t0 t1
    shift 2
    t0=$(date +%s%N)
    seq 1 "$total" | xargs -P "$n" -I{} "$@" >/dev/null ||
        { echo "bench.sh: a call failed while timing: $*" >&2; return 1; }
    t1=$(date +%s%N)
    awk -v c="$total" -v ns=$(( t1 - t0 )) 'BEGIN { printf "%.1f", c / (ns / 1e9) }'
}

# --- The peers of the pool's sustained rate below: the same number of
# cold sandboxes of /bin/true, 2 at once, each made and torn down by the
# caller's command (bubblewrap's, and runsbx's own cold call). A pooled
# sandbox costs as much to make as a cold one; the pool only makes it
# before its request comes.
sustained=${SUSTAINED:-2000}
echo
echo "cold sandboxes per second, $sustained calls of /bin/true, 2 at once"
cold_bwrap=$(rate 2 "$sustained" bwrap --ro-bind "$image_rootfs" / --proc /proc --dev /dev \
    --tmpfs /tmp --tmpfs /workspace --chdir /workspace --unshare-all --die-with-parent \
    --new-session --clearenv --setenv PATH "$path" -- /bin/true)
cold_runsbx=$(rate 2 "$sustained" "$runsbx" --root "$work/state-call" call --image python -- /bin/true)
printf '  runsbx call %6s   bwrap %6s   runsbx/bwrap = %.2f\n' "$cold_runsbx" "$cold_bwrap" \
    "$(awk -v a="$cold_runsbx" -v b="$cold_bwrap" 'BEGIN{print a/b}')"

# --- The warm pool: a call that finds a sandbox ready (runsbx.Pool and
# `runsbx serve` directly, the pool left 0.2 s to refill between calls),
# calls per second with 2 and 8 at once, and a sustained run of
# SUSTAINED calls (default 2000) 2 at a time (hack/pool-bench.py), with
# its ratio to bubblewrap's cold rate above.
echo
echo "warm pool on the python image (p50/p99 of $call_runs calls, ms)"
python3 hack/pool-bench.py "$runsbx" "$call_runs" "$sustained" \
    "${bwrap_ms[/bin/true]}" "${bwrap_ms[python3 -c pass]}" "$cold_bwrap"

# --- A session's calls against plain ones: the session's disk mounted,
# its overlay made and its workspace bound, per call.
"$runsbx" session rm runsbx-bench >/dev/null 2>&1 || true
"$runsbx" session create runsbx-bench >/dev/null
trap '"$runsbx" session rm runsbx-bench >/dev/null 2>&1; "${pm[@]}" rm -af >/dev/null 2>&1; "${pm[@]}" rmi -af >/dev/null 2>&1; rm -rf "$work" "$shm"' EXIT
echo
echo "calls into a session against plain calls (median of $call_runs, ms)"
for cmd in "/bin/true" "python3 -c pass"; do
    # shellcheck disable=SC2086
    plain=$(median_cmd_ms sandbox runsbx $cmd)
    # shellcheck disable=SC2086
    sess=$(median_cmd_ms "$runsbx" --root "$work/state-call" call --session runsbx-bench -- $cmd)
    printf '  %-16s session %8s   plain %8s   session/plain = %.2f\n' "$cmd" "$sess" "$plain" \
        "$(awk -v a="$sess" -v b="$plain" 'BEGIN{print a/b}')"
done
"$runsbx" session rm runsbx-bench >/dev/null

# --- Peak RSS of `run` of /bin/true (GNU time's maximum resident set of
# the runtime's process and the children it waited for; median of 20).
# Most of a runtime's peak is its own binary's pages, which a page fault
# maps from the page cache with their neighbours, and how many it maps
# depends on how the file came into the cache: on this host the same
# runsbx binary peaked at 11.1 MB as cargo wrote it and 13.4 MB as `cp`
# copied it. So each binary is first evicted from the page cache, and all
# are read back the same way, by their runs.
peak_kb() {
    local rt=$1 i
    python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$rt"
    for i in $(seq 1 20); do
        /usr/bin/time -f %M "$rt" --root "$work/state-rss-$(basename "$rt")" run --bundle "$work/bundle" "r$i" 2>&1 >/dev/null | tail -1
    done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
echo
echo "peak RSS of run /bin/true (median of 20, KB)"
declare -A rss
for rt in "$runsbx" "$(command -v runc)" "$(command -v crun)"; do
    rss[$(basename "$rt")]=$(peak_kb "$rt")
done
printf '  runsbx %s   runc %s   crun %s   runsbx/crun = %.2f\n' "${rss[runsbx]}" "${rss[runc]}" "${rss[crun]}" \
    "$(awk -v a="${rss[runsbx]}" -v b="${rss[crun]}" 'BEGIN{print a/b}')"
# Of runsbx's peak, its own code: the resident part of the binary's
# executable mapping while a run's container runs (its create and start
# are then done). The functions a run executes are laid out together
# (crates/runsbx/hot-functions.txt); as the code changes the list goes
# stale and this figure grows: regenerate it with hack/hot-functions.sh.
code_kb() {
    local pid kb
    "$runsbx" --root "$work/state-code" run --bundle "$work/sleeper" code >/dev/null &
    pid=$!
    until "$runsbx" --root "$work/state-code" state code 2>/dev/null | grep -q '"status": *"running"'; do
        sleep 0.05
    done
    kb=$(awk -v exe="$(readlink "/proc/$pid/exe")" '
        $1 ~ /-/ { ours = ($2 ~ /x/ && $6 == exe) }
        $1 == "Rss:" && ours { kb += $2 }
        END { print kb }' "/proc/$pid/smaps")
    "$runsbx" --root "$work/state-code" kill code KILL
    wait "$pid" || true
    "$runsbx" --root "$work/state-code" delete --force code
    echo "$kb"
}
make_bundle "$runsbx" "$work/sleeper" sleep 30
printf '  of which runsbx'"'"'s code while its container runs: %s KB\n' "$(code_kb)"

# --- The egress proxy: added latency per connection and throughput, a
# Python client inside a sandbox going through the proxy against the same
# client on the host connecting directly, to one server on the host's
# loopback.
www="$work/www"
mkdir -p "$www"
echo hello > "$www/small"
head -c $((100 << 20)) /dev/zero > "$www/big"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$www" "$port" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; "${pm[@]}" rm -af >/dev/null 2>&1; "${pm[@]}" rmi -af >/dev/null 2>&1; rm -rf "$work" "$shm"' EXIT
for _ in $(seq 50); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null && break; sleep 0.1; done
cat > "$work/client.py" <<'PY'
import statistics, sys, time, urllib.request
base = sys.argv[1]
opener = urllib.request.build_opener()  # the environment's proxy, if any
times = []
for _ in range(200):
    t = time.perf_counter()
    opener.open(base + "/small").read()
    times.append(time.perf_counter() - t)
t = time.perf_counter()
n = len(opener.open(base + "/big").read())
mbps = n / (time.perf_counter() - t) / (1 << 20)
print(f"{statistics.median(times) * 1000:.3f} {mbps:.0f}")
PY
read -r direct_ms direct_mbps < <(env -u http_proxy -u HTTP_PROXY python3 "$work/client.py" "http://127.0.0.1:$port")
read -r proxy_ms proxy_mbps < <("$runsbx" --root "$work/state-call" call --image python --timeout 120s \
    --allow-host "bench.test:$port" --proxy-resolve bench.test=127.0.0.1 \
    --proxy-allow-address "127.0.0.1:$port" --input "$work/client.py" \
    -- python3 client.py "http://bench.test:$port")
echo
echo "egress proxy, HTTP GET on loopback (200 small requests, median; one 100 MiB download)"
printf '  direct (host)        %8s ms per request   %6s MiB/s\n' "$direct_ms" "$direct_mbps"
printf '  through the proxy    %8s ms per request   %6s MiB/s\n' "$proxy_ms" "$proxy_mbps"
awk -v a="$proxy_ms" -v b="$direct_ms" -v c="$proxy_mbps" -v d="$direct_mbps" \
    'BEGIN { printf "  added latency %.3f ms per connection; throughput ratio %.2f\n", a - b, c / d }'

# --- Seccomp denials reported (a call's listener answers each one): the
# same build with and without the listener, a syscall-heavy program inside.
echo
CARGO_TARGET_DIR="$PWD/target" hack/seccomp-bench.sh 7
