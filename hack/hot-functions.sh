#!/usr/bin/env bash
# Regenerates crates/runsbx/hot-functions.txt, the functions runsbx runs,
# which the linker lays out first and together (see crates/runsbx/build.rs
# and docs/architecture.md, "Code layout"). Run it when the code that a
# run, a call or a pool executes has changed: hack/bench.sh prints how
# much of runsbx's code a run maps (it grows as the list goes stale), and
# crates/runsbx/tests/layout.rs fails once a tenth of the list names
# functions the binary no longer has. As root (it turns the disk's
# readahead off for a minute, and runs the rootless workload as the test
# user); about five minutes, most of it one build.
#
#   sudo hack/hot-functions.sh
#
# How: a measuring build in which every function starts a page of its own
# runs each workload from a fresh copy of itself, evicted from the page
# cache, with readahead off; the pages then in the page cache are exactly
# those the workload's processes executed (hack/hot-functions.py).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib.sh
[ "$(id -u)" = 0 ] || { echo "hot-functions.sh: run as root" >&2; exit 1; }
user=${RUNSBX_TEST_USER:-runsbx-test}
ensure_test_user "$user"

out=target/hot-functions
mkdir -p "$out"
# The measuring build: the release profile, every function page-aligned.
# `cargo rustc` gives the flag to the final crate's compiler, which
# generates the code of every crate (the release profile's ThinLTO). The
# C libraries linked in (glibc, libseccomp) are not compiled here: the
# linker's map says which archive member each of their code's bytes
# came from.
CARGO_TARGET_DIR="$out/build" cargo rustc --release --quiet -p runsbx --bin runsbx -- \
    -C llvm-args=-align-all-functions=12 -C link-arg=-Wl,-Map="$PWD/$out/runsbx.map"
measuring=$out/build/x86_64-unknown-linux-gnu/release/runsbx
"$measuring" image ls | grep -q '^python\b' || "$measuring" image build python

work=$(mktemp -d /tmp/runsbx-hot.XXXXXX)
chmod 0755 "$work"
# The copies the workloads run from live where the build does, on a disk
# whose readahead can be turned off.
copies=$(mktemp -d "$PWD/$out/copies.XXXXXX")
chmod 0755 "$copies" "$out"
dev=$(findmnt -n -o SOURCE --target "$copies" | sed 's#^/dev/##; s#\[.*##')
parent=$(lsblk -no PKNAME "/dev/$dev" 2>/dev/null | head -1)
ra=/sys/class/block/${parent:-$dev}/queue/read_ahead_kb
[ -w "$ra" ] || { echo "hot-functions.sh: $ra not writable: the copies must be on a block device" >&2; exit 1; }
saved=$(cat "$ra")
cleanup() { echo "$saved" > "$ra"; rm -rf "$work" "$copies"; }
trap cleanup EXIT
echo 0 > "$ra"

make_bundle "$measuring" "$work/bundle" /bin/true
make_bundle "$measuring" "$work/sleep" /bin/sleep 5
mkdir -p "$work/rootless" && chown "$user" "$work/rootless"
su "$user" -s /bin/bash -c ". hack/lib.sh; make_bundle '$measuring' '$work/rootless/bundle' /bin/true"

# fresh NAME: a copy of the measuring build that no process has run yet.
fresh() {
    cp "$measuring" "$copies/$1"
    chmod 0755 "$copies/$1"
    python3 hack/hot-functions.py evict "$copies/$1"
}
# pages NAME: the pages of copy NAME the workload executed.
pages() { python3 hack/hot-functions.py resident "$copies/$1" > "$work/$1.pages"; }

# In the order the layout favours them: a `run` (its peak RSS is what
# hack/bench.sh compares with crun's), the other runc verbs, a cold call,
# the warm pool, and the rootless paths of a run and a call.
fresh run
"$copies/run" --root "$work/state" run --bundle "$work/bundle" r1 >/dev/null
"$copies/run" --root "$work/state" run --bundle "$work/bundle" r2 >/dev/null
pages run

fresh runc
r=$copies/runc
"$r" --root "$work/state" create --bundle "$work/sleep" c1
"$r" --root "$work/state" state c1 >/dev/null
"$r" --root "$work/state" start c1
"$r" --root "$work/state" list >/dev/null
"$r" --root "$work/state" exec c1 /bin/true
"$r" --root "$work/state" ps c1 >/dev/null
"$r" --root "$work/state" kill c1 KILL
"$r" --root "$work/state" delete --force c1
pages runc

fresh call
r=$copies/call
echo data > "$work/in.txt"
mkdir "$work/outputs"
"$r" --root "$work/state" call -- /bin/true
"$r" --root "$work/state" call --json -- /bin/sh -c 'echo out; echo err >&2; exit 3' >/dev/null || true
"$r" --root "$work/state" call --json --input "$work/in.txt" --output 'out.txt' --output-dir "$work/outputs" \
    -- /bin/sh -c 'cat in.txt > out.txt' >/dev/null
pages call

fresh serve
printf '%s\n' '{"id":1,"argv":["--json","--","/bin/true"],"stdin":null}' \
    '{"id":2,"argv":["--json","--","/bin/sh","-c","echo x"],"stdin":null}' \
    '{"id":3,"argv":["--json","--","/bin/true"],"stdin":null}' |
    (cat; sleep 3) | "$copies/serve" --root "$work/state" serve --size=2 >/dev/null
pages serve

fresh rootless
su "$user" -s /bin/sh -c "cd '$work/rootless' && '$copies/rootless' --root '$work/rootless/state' run --bundle '$work/rootless/bundle' r1 >/dev/null \
    && '$copies/rootless' call -- /bin/true && '$copies/rootless' call --json -- /bin/true >/dev/null"
pages rootless

python3 hack/hot-functions.py list "$measuring" "$out/runsbx.map" crates/runsbx/hot-functions.txt \
    run="$work/run.pages" runc="$work/runc.pages" call="$work/call.pages" \
    serve="$work/serve.pages" rootless="$work/rootless.pages"
