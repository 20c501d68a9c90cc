#!/usr/bin/env bash
# Builds the OCI runtime-tools validation suite (opencontainers/runtime-tools)
# and runs every validation program against runsbx, crun and runc, then prints
# the passed/failed counts of each runtime side by side. As root.
#
#   hack/runtime-tools.sh [RUNSBX_BINARY]     # default: target/x86_64-unknown-linux-gnu/release/runsbx
#
# Environment (all optional):
#   RUNTIMES="runsbx crun runc"  which runtimes to run, in this order
#   TESTS="default hostname"     only these validation programs (default: all)
#   TEST_TIMEOUT=60              seconds each program may run
#   CACHE_DIR=/var/cache/runsbx-runtime-tools   sources, build, logs
#   LOG_DIR=$CACHE_DIR/logs/<UTC time>          this run's TAP output and lists
#   RUNTIME_TOOLS_SRC=PATH       where to take the runtime-tools source from when
#                                $CACHE_DIR has no copy yet (see get_source below):
#                                an upstream checkout, or a git repository holding
#                                commit $PIN
#   LOCK_WAIT=3600               seconds to wait for /tmp/runsbx-itest.lock
#
# docs/runtime-tools.md has the counts measured with it and the reason for each
# runsbx failure.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNSBX_BINARY=${1:-$REPO/target/x86_64-unknown-linux-gnu/release/runsbx}
RUNTIMES=${RUNTIMES:-runsbx crun runc}
TESTS=${TESTS:-}
TEST_TIMEOUT=${TEST_TIMEOUT:-60}
CACHE_DIR=${CACHE_DIR:-/var/cache/runsbx-runtime-tools}
LOG_DIR=${LOG_DIR:-$CACHE_DIR/logs/$(date -u +%Y%m%dT%H%M%SZ)}
LOCK=/tmp/runsbx-itest.lock
LOCK_WAIT=${LOCK_WAIT:-3600}
# State roots of the runtimes under test: separate from their defaults
# (/run/runc, /run/crun, /run/runsbx) so that cleaning up after a failed test
# can never touch a container that podman, containerd or another test owns.
STATE_BASE=/run/runsbx-runtime-tools

# The runtime-tools commit Debian 12 packages (golang-github-opencontainers-
# runtime-tools-dev 0.9.0+git20220423.g0105384-2). It builds with Debian 12's
# Go 1.19 in GOPATH mode out of its own vendor/ (upstream's tip wants Go 1.21).
PIN=0105384f68e16803891d0a17d9067b1def6a2778
IMPORT_PATH=github.com/opencontainers/runtime-tools

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'runtime-tools.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (the suite creates containers as root)"
case " $RUNTIMES " in
    *" runsbx "*) [ -x "$RUNSBX_BINARY" ] || die "no runsbx binary at $RUNSBX_BINARY (build it, or pass its path)" ;;
esac

# --- packages ---------------------------------------------------------------

# Installs the Debian packages that are missing, with one apt-get update.
ensure_packages() {
    local pkg missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
    done
    [ ${#missing[@]} = 0 ] && return 0
    log "installing ${missing[*]}"
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# golang-go builds the suite; busybox-static makes the rootfs; util-linux has
# flock (this script) and unshare (the linux_ns_path* programs); procps pgrep.
ensure_packages golang-go busybox-static crun runc tar gzip util-linux procps

# --- the runtime-tools source -----------------------------------------------
#
# Debian's golang-github-opencontainers-runtime-tools-dev ships only the library
# packages (generate, validate, specerror, ...): neither validation/ nor
# cmd/runtimetest nor the Makefile, and validation/ imports
# github.com/mndrix/tap-go, which Debian does not package. So the suite is built
# from the upstream tree at $PIN with its own vendor/, found in this order:
#   1. the copy a previous run left in $SRC (remove it to take another);
#   2. $RUNTIME_TOOLS_SRC: a git repository (bare or not) that has $PIN, or
#      else a tree holding validation/ and cmd/runtimetest, taken as it is;
#   3. the Debian source package (apt-get source, through a deb-src list of
#      this script's own, so the system's apt configuration is not touched);
#      its orig tarball is the upstream tree at $PIN.
SRC=$CACHE_DIR/src-$PIN

get_source() {
    [ -f "$SRC/.complete" ] && return 0
    rm -rf "$SRC" "$SRC.tmp"
    mkdir -p "$SRC.tmp"
    if [ -n "${RUNTIME_TOOLS_SRC:-}" ]; then
        local git_dir=$RUNTIME_TOOLS_SRC
        [ -d "$RUNTIME_TOOLS_SRC/.git" ] && git_dir=$RUNTIME_TOOLS_SRC/.git
        if [ -f "$git_dir/HEAD" ] && ensure_packages git \
            && git --git-dir="$git_dir" cat-file -e "$PIN^{commit}" 2>/dev/null; then
            log "runtime-tools source: $PIN from the git repository $RUNTIME_TOOLS_SRC"
            git --git-dir="$git_dir" archive "$PIN" | tar -x -C "$SRC.tmp"
        elif [ -d "$RUNTIME_TOOLS_SRC/validation" ] && [ -d "$RUNTIME_TOOLS_SRC/cmd/runtimetest" ]; then
            log "runtime-tools source: the tree $RUNTIME_TOOLS_SRC as it is (no commit $PIN in it)"
            cp -a "$RUNTIME_TOOLS_SRC/." "$SRC.tmp/"
        else
            die "RUNTIME_TOOLS_SRC=$RUNTIME_TOOLS_SRC is neither a git repository with commit $PIN nor a runtime-tools tree"
        fi
    else
        log "runtime-tools source: Debian source package golang-github-opencontainers-runtime-tools"
        ensure_packages dpkg-dev xz-utils
        local apt=$CACHE_DIR/apt-src
        mkdir -p "$apt/lists/partial" "$apt/download"
        printf 'deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main\n' \
            > "$apt/sources.list"
        local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                    -o "Dir::State::Lists=$apt/lists" -o APT::Sandbox::User=root)
        if ! { apt-get "${opts[@]}" update -q \
               && (cd "$apt/download" && apt-get "${opts[@]}" source -q golang-github-opencontainers-runtime-tools); }; then
            rm -rf "$SRC.tmp"
            die "could not get the runtime-tools source: Debian's binary package lacks validation/ and
the Debian source package could not be downloaded. Give an upstream checkout at
commit $PIN: RUNTIME_TOOLS_SRC=/path/to/runtime-tools $0"
        fi
        local dir
        dir=$(find "$apt/download" -mindepth 1 -maxdepth 1 -type d -name 'golang-github-opencontainers-runtime-tools-*' | head -n1)
        [ -d "$dir/validation" ] || die "the Debian source package has no validation/ directory"
        cp -a "$dir/." "$SRC.tmp/"
    fi
    if [ ! -d "$SRC.tmp/validation" ] || [ ! -d "$SRC.tmp/vendor/github.com/mndrix/tap-go" ]; then
        die "the runtime-tools source lacks validation/ or vendor/ (wanted commit $PIN)"
    fi
    touch "$SRC.tmp/.complete"
    mv "$SRC.tmp" "$SRC"
}

# --- build ------------------------------------------------------------------
#
# As upstream's Makefile does (`make runtimetest validation-executables`):
# runtimetest static (it runs inside the container's busybox rootfs), each
# validation/<name>/<name>.go into <name>.t. GOPATH mode with the tree's own
# vendor/, so nothing is fetched; everything goes into $CACHE_DIR.
BUILD=$CACHE_DIR/build
BIN=$CACHE_DIR/bin

build_suite() {
    local stamp want
    want="$PIN $(go version)"
    stamp=$BIN/.stamp
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
    log "building runtimetest and the validation programs (about a minute)"
    local gopath=$BUILD/gopath
    local tree=$gopath/src/$IMPORT_PATH
    rm -rf "$BUILD" "$BIN"
    mkdir -p "$(dirname "$tree")" "$BIN/validation"
    cp -a "$SRC" "$tree"
    (
        cd "$tree"
        export GOPATH=$gopath GO111MODULE=off GOFLAGS="" GOCACHE=$BUILD/gocache CGO_ENABLED=0
        go build -tags "netgo osusergo" -ldflags "-extldflags -static" -o "$BIN/runtimetest" ./cmd/runtimetest
        local go_file name
        for go_file in validation/*/*.go; do
            name=$(basename "$(dirname "$go_file")")
            [ "$name" = util ] && continue
            go build -o "$BIN/validation/$name.t" "$go_file"
        done
    )
    printf '%s\n' "$want" > "$stamp"
}

# The bundle's root filesystem: upstream's rootfs-amd64.tar.gz is a busybox
# rootfs (busybox and its applets in /bin, empty /proc /sys /dev, /etc/passwd
# and /etc/group); this is the same made of Debian's busybox-static. The tests
# untar it into the bundle directory itself (their config says root.path ".")
# and copy runtimetest next to it, so both must be in the working directory.
make_rootfs_tarball() {
    local out=$BIN/rootfs-amd64.tar.gz stamp=$BIN/.rootfs-stamp want
    want=$(dpkg-query -W -f='${Version}' busybox-static)
    if [ -f "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
    local root=$BUILD/rootfs applet
    rm -rf "$root"
    mkdir -p "$root/bin" "$root/proc" "$root/sys" "$root/dev" "$root/etc"
    cp "$(command -v busybox)" "$root/bin/busybox"
    for applet in $("$root/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
    tar --numeric-owner --owner=0 --group=0 -czf "$out" -C "$root" .
    printf '%s\n' "$want" > "$stamp"
}

mkdir -p "$CACHE_DIR"
get_source
build_suite
make_rootfs_tarball

mapfile -t ALL_TESTS < <(find "$BIN/validation" -name '*.t' -printf '%f\n' | sed 's/\.t$//' | sort)
if [ -n "$TESTS" ]; then
    read -r -a SELECTED <<< "$TESTS"
    for t in "${SELECTED[@]}"; do [ -x "$BIN/validation/$t.t" ] || die "no validation program $t"; done
else
    SELECTED=("${ALL_TESTS[@]}")
fi

# --- running ----------------------------------------------------------------

mkdir -p "$LOG_DIR"
WORK=$(mktemp -d /tmp/runsbx-runtime-tools.XXXXXX)

runtime_binary() {
    case $1 in
        runsbx) echo "$WORK/runsbx-under-test" ;;
        *) command -v "$1" || die "$1 not found" ;;
    esac
}

# Every process a test starts inherits this marker in its environment, so
# that what a killed test leaves behind (unshare ... sleep 10000 of the
# linux_ns_path tests, a runtime's helper) can be found and reported.
MARK=RUNSBX_RTT_MARK=$$-$RANDOM

# Prints the pids of live processes whose environment carries $MARK.
marked_pids() {
    local env_file pid
    for env_file in /proc/[0-9]*/environ; do
        pid=${env_file#/proc/}; pid=${pid%/environ}
        [ "$pid" = $$ ] && continue
        if tr '\0' '\n' 2>/dev/null < "$env_file" | grep -qxF "$MARK"; then echo "$pid"; fi
    done
}

# Kills PID and everything below it, the deepest first.
kill_tree() {
    local child
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill -KILL "$1" 2>/dev/null || true
}

# On any exit, an interrupted one too: no test process, container, mount or
# work file left. (After a complete run, run_suite has removed them already.)
SUITE_PID=
final_cleanup() {
    local rt rtbin id mnt pid
    [ -n "$SUITE_PID" ] && kill_tree "$SUITE_PID"
    for pid in $(marked_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    for rt in $RUNTIMES; do
        rtbin=$(runtime_binary "$rt" 2>/dev/null) || continue
        if [ ! -x "$rtbin" ] || [ ! -d "$STATE_BASE/$rt" ]; then continue; fi
        for id in $("$rtbin" --root "$STATE_BASE/$rt" list -q 2>/dev/null); do
            "$rtbin" --root "$STATE_BASE/$rt" delete --force "$id" >/dev/null 2>&1 || true
        done
        find "$STATE_BASE/$rt" -depth -type d -empty -delete 2>/dev/null || true
    done
    rmdir "$STATE_BASE" 2>/dev/null || true
    while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done \
        < <(awk -v p="$WORK/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
    rm -rf --one-file-system "$WORK"
}
trap final_cleanup EXIT
trap 'log "interrupted: cleaning up"; exit 130' INT TERM HUP

# A copy of runsbx, so that a rebuild of target/ during the run changes nothing.
case " $RUNTIMES " in
    *" runsbx "*) cp "$RUNSBX_BINARY" "$WORK/runsbx-under-test" ;;
esac

# After each program: remove what it left, and note it in leftovers.txt (a
# program the timeout killed cannot clean up after itself; anything left after
# a test that finished is worth a look too).
cleanup_after() {
    local name=$1 rtbin=$2 root=$3 tmp=$4 leftovers=$5 id pid mnt
    for id in $("$rtbin" --root "$root" list -q 2>/dev/null || true); do
        echo "$name: container $id left in $root; delete --force" >> "$leftovers"
        "$rtbin" --root "$root" delete --force "$id" >> "$leftovers" 2>&1 \
            || echo "$name: delete --force $id failed" >> "$leftovers"
    done
    for pid in $(marked_pids); do
        echo "$name: process $pid left: $(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" || true); killed" >> "$leftovers"
        kill -KILL "$pid" 2>/dev/null || true
    done
    # Mounts under the test's temporary directory (bundles live there), deepest first.
    while read -r mnt; do
        echo "$name: mount $mnt left; umount -l" >> "$leftovers"
        umount -l "$mnt" 2>/dev/null || true
    done < <(awk -v p="$tmp/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
    if [ -n "$(find "$tmp" -mindepth 1 -maxdepth 1 -printf x)" ]; then
        echo "$name: left in TMPDIR: $(find "$tmp" -mindepth 1 -maxdepth 1 -printf '%f ')" >> "$leftovers"
        find "$tmp" -mindepth 1 -maxdepth 1 -exec rm -rf --one-file-system {} + 2>/dev/null || true
    fi
}

# The cgroups the cgroup tests name (cgroupsPath "/cgrouptest" and
# "testdir/cgrouptest/container", relative ones under the runtime's parent
# cgroup, which is the hierarchy's root here): runtimes remove the container's
# own cgroup but not the parents they made for it. Removed when empty and not
# there before the run.
TEST_CGROUPS=(cgrouptest testdir/cgrouptest/container testdir/cgrouptest testdir)
declare -A CGROUP_BEFORE=()
for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    for cg in "${TEST_CGROUPS[@]}"; do [ -d "$hier$cg" ] && CGROUP_BEFORE["$hier$cg"]=1; done
done
remove_test_cgroups() {
    local hier cg
    for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        for cg in "${TEST_CGROUPS[@]}"; do
            [ -d "$hier$cg" ] && [ -z "${CGROUP_BEFORE[$hier$cg]:-}" ] && { rmdir "$hier$cg" 2>/dev/null || echo "cgroup $hier$cg left (not empty)" >> "$1"; }
        done
    done
    return 0
}

# Parses one program's TAP output: prints "ok notok skip todo plan errors",
# plan being the sum of its plan lines (linux_cgroups_hugetlb prints two TAP
# documents) or -1 without any, errors the count of YAML "error" diagnostics.
# Only lines at the start of a line count: runtime-tools puts the TAP that
# runtimetest printed inside the container into an indented YAML block.
tap_counts() {
    awk '
        /^ok($| )/ { if (tolower($0) ~ /# skip/) skip++; else ok++; next }
        /^not ok($| )/ { if (tolower($0) ~ /# todo/) todo++; else notok++; next }
        /^1\.\.[0-9]+/ { plan += substr($0, 4) + 0; planned = 1; next }
        /^ +"error": / { errors++ }
        END { printf "%d %d %d %d %d %d\n", ok, notok, skip, todo, (planned ? plan : -1), errors }
    ' "$1"
}

# verdict RC OK NOTOK SKIP TODO PLAN ERRORS: a program's status.
verdict() {
    local rc=$1 ok=$2 notok=$3 skip=$4 todo=$5 plan=$6 errors=$7
    local ran=$((ok + notok + skip + todo))
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo timeout
    elif [ "$rc" != 0 ] || [ "$notok" != 0 ]; then echo fail
    # The *_fail programs print no TAP at all: they expect the runtime to
    # refuse the config and exit 1 (util.Fatal) when it does not.
    elif [ "$plan" = -1 ] && [ "$ran" = 0 ]; then echo pass
    elif [ "$ran" != "$plan" ]; then echo fail
    # The hook programs (prestart, poststart, poststop and their _fail forms,
    # hooks) assert nothing ("1..0"): they report a failure only as a YAML
    # diagnostic with an "error" key.
    elif [ "$plan" = 0 ]; then if [ "$errors" = 0 ]; then echo pass; else echo fail; fi
    elif [ "$ok" = 0 ]; then echo skip
    else echo pass
    fi
}

# Prints NAME's failing assertions, one a line: its own "not ok" lines, and
# under each, indented, the "not ok" lines of the TAP that runtimetest printed
# inside the container. runtime-tools puts that TAP in a YAML block (a JSON
# "stdout" string) right *before* the assertion it belongs to.
failures_of() {
    awk -v name="$1" '
        /^ +"stdout": "/ {
            s = $0; sub(/^ +"stdout": "/, "", s); sub(/",?$/, "", s)
            n = split(s, lines, /\\n/); inner = ""
            for (i = 1; i <= n; i++)
                if (lines[i] ~ /^not ok/ && tolower(lines[i]) !~ /# todo/) inner = inner "    inside: " lines[i] "\n"
            next
        }
        /^not ok/ && tolower($0) !~ /# todo/ { printf "%s: %s\n%s", name, $0, inner }
        /^(ok|not ok)/ { inner = "" }
    ' "$2"
}

# Why NAME failed, in one line: the first YAML "error" of NAME.tap, or, when
# that says no more than "exit status N", the runtime's own last words on
# NAME.stderr.
why_failed() {
    local e
    e=$(sed -n 's/^ *"error": "\(.*\)",\{0,1\}$/\1/p' "$1.tap" | head -n1 | sed 's/\\n.*//; s/"$//')
    case $e in
        '' | 'exit status '*)
            e=$(grep -v -e '^[[:space:]]*$' -e '^exit status' -e '^failed to create the container' \
                -e '^Refer to:' "$1.stderr" | tail -n1) ;;
    esac
    printf '%s' "$e" | cut -c1-300
}

# run_suite RUNTIME: runs every selected program against RUNTIME and writes
# $LOG_DIR/RUNTIME/{NAME.tap,NAME.stderr,results.tsv,failures.txt,leftovers.txt}.
run_suite() {
    local rt=$1 rtbin root dir tmp wrapper name rc ok notok skip todo plan errors status tap
    rtbin=$(runtime_binary "$rt")
    root=$STATE_BASE/$rt
    dir=$LOG_DIR/$rt
    tmp=$WORK/$rt/tmp
    mkdir -p "$dir" "$tmp" "$WORK/$rt/bin" "$WORK/$rt/cwd"
    # The bundles go to $tmp, which stands in for /tmp: world-searchable like
    # it, else a container whose root is not host root (linux_uid_mappings,
    # linux_ns_nopath under runc and crun) could not reach its own bundle.
    chmod 0755 "$WORK" "$WORK/$rt"
    chmod 1777 "$tmp"
    mkdir -p "$root"
    chmod 0700 "$STATE_BASE" "$root"
    # The programs run "$RUNTIME create|start|state|kill|delete ..." with no
    # global flag; the wrapper adds --root. Nothing else is added: runsbx runs
    # with its built-in default profile, the one this measures.
    wrapper=$WORK/$rt/bin/$rt
    printf '#!/bin/bash\nexec %q --root %q "$@"\n' "$rtbin" "$root" > "$wrapper"
    chmod +x "$wrapper"
    cp "$BIN/runtimetest" "$BIN/rootfs-amd64.tar.gz" "$WORK/$rt/cwd/"
    : > "$dir/results.tsv"; : > "$dir/failures.txt"; : > "$dir/leftovers.txt"
    "$rtbin" --version 2>&1 | head -n1 > "$dir/version.txt"

    for name in "${SELECTED[@]}"; do
        rc=0
        # timeout makes the program's process group its own and kills it whole.
        (cd "$WORK/$rt/cwd" && env "$MARK" TMPDIR="$tmp" RUNTIME="$wrapper" \
            timeout -k 10 "$TEST_TIMEOUT" "$BIN/validation/$name.t" \
            > "$dir/$name.tap" 2> "$dir/$name.stderr" 9>&-) || rc=$?
        cleanup_after "$name" "$rtbin" "$root" "$tmp" "$dir/leftovers.txt"
        read -r ok notok skip todo plan errors < <(tap_counts "$dir/$name.tap")
        status=$(verdict "$rc" "$ok" "$notok" "$skip" "$todo" "$plan" "$errors")
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$ok" "$notok" "$skip" "$todo" "$plan" >> "$dir/results.tsv"
        failures_of "$name" "$dir/$name.tap" >> "$dir/failures.txt"
        # A program that failed without a "not ok" line: say why in one line.
        if [ "$status" != pass ] && [ "$status" != skip ] && [ "$notok" = 0 ]; then
            if [ "$plan" = -1 ]; then tap="no TAP"; else tap="$((ok + notok + skip + todo)) of $plan assertions"; fi
            printf '%s: program %s (exit %s, %s): %s\n' "$name" "$status" "$rc" "$tap" \
                "$(why_failed "$dir/$name")" >> "$dir/failures.txt"
        fi
        printf '  %-36s %-8s ok %-4s not ok %-4s skip %s\n' "$name" "$status" "$ok" "$notok" "$skip" >&2
    done
    remove_test_cgroups "$dir/leftovers.txt"
    # runsbx keeps empty @bundles and @locks directories in its state root,
    # and its compiled seccomp filters (@seccomp/<hash>.bpf) for later
    # sandboxes; anything else there is left behind.
    find "$root/@seccomp" -maxdepth 1 -type f -regextype posix-extended -regex '.*/[0-9a-f]{16}\.bpf' -delete 2>/dev/null || true
    find "$root" -depth -mindepth 1 -type d -empty -delete
    rmdir "$root" 2>/dev/null \
        || echo "state root $root not empty: $(find "$root" -mindepth 1 -maxdepth 1 -printf '%f ')" >> "$dir/leftovers.txt"
}

START=$(date +%s)
for rt in $RUNTIMES; do
    log "running ${#SELECTED[@]} validation programs against $rt (waiting for $LOCK)"
    # Every run against a runtime holds the lock the integration tests take,
    # so none of them sees this suite's mounts or processes. fd 9 is closed
    # for the programs (9>&- above), so no container or daemon inherits it.
    # In the background, so that a signal to this script ends it at once
    # (bash runs a trap only once the foreground command is over).
    (
        t0=$(date +%s)
        flock -w "$LOCK_WAIT" 9 || die "could not take $LOCK in ${LOCK_WAIT}s"
        t1=$(date +%s)
        run_suite "$rt"
        echo "$(( $(date +%s) - t1 )) s, after waiting $(( t1 - t0 )) s for the lock" > "$LOG_DIR/$rt/seconds"
    ) 9> "$LOCK" &
    SUITE_PID=$!
    wait "$SUITE_PID"
    SUITE_PID=
done
rmdir "$STATE_BASE" 2>/dev/null || true

# --- report -----------------------------------------------------------------

summary() {
    printf '%-8s | %-29s | %s\n' "" "programs" "assertions (TAP lines)"
    printf '%-8s | %6s %6s %7s %6s | %6s %7s %7s %5s\n' runtime passed failed skipped total ok "not ok" skipped todo
    printf '%s\n' "---------+-------------------------------+-------------------------------"
    local rt
    for rt in $RUNTIMES; do
        awk -F'\t' -v rt="$rt" '
            { n++; if ($2 == "pass") p++; else if ($2 == "skip") s++; else f++
              ok += $4; nok += $5; sk += $6; td += $7 }
            END { printf "%-8s | %6d %6d %7d %6d | %6d %7d %7d %5d\n", rt, p, f, s, n, ok, nok, sk, td }
        ' "$LOG_DIR/$rt/results.tsv"
    done
}

# One row per program, one column per runtime: its status and ok/not ok count.
matrix() {
    local rt header=program name
    printf '%-36s' "$header"
    for rt in $RUNTIMES; do printf ' %-22s' "$rt"; done
    printf '\n'
    for name in "${SELECTED[@]}"; do
        printf '%-36s' "$name"
        for rt in $RUNTIMES; do
            awk -F'\t' -v n="$name" '$1 == n { printf " %-22s", $2 " (" $4 "/" $5 ")" }' "$LOG_DIR/$rt/results.tsv"
        done
        printf '\n'
    done
}

{
    echo "runtime-tools $PIN, $(date -u '+%Y-%m-%d %H:%M UTC'), kernel $(uname -r), TEST_TIMEOUT=${TEST_TIMEOUT}s"
    for rt in $RUNTIMES; do echo "$rt: $(cat "$LOG_DIR/$rt/version.txt"): $(cat "$LOG_DIR/$rt/seconds")"; done
    echo
    summary
} > "$LOG_DIR/summary.txt"
matrix > "$LOG_DIR/matrix.txt"

echo
cat "$LOG_DIR/summary.txt"
echo
echo "per program, status (ok/not ok):"
cat "$LOG_DIR/matrix.txt"
echo
for rt in $RUNTIMES; do
    echo "$rt: failing assertions and programs: $LOG_DIR/$rt/failures.txt"
    if [ -s "$LOG_DIR/$rt/leftovers.txt" ]; then
        echo "$rt: what tests left behind (removed): $LOG_DIR/$rt/leftovers.txt"
    fi
done
echo "logs: $LOG_DIR (NAME.tap and NAME.stderr per program and runtime); took $(( $(date +%s) - START )) s"
