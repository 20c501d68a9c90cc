#!/usr/bin/env bash
# Fuzzes the policy with cargo-fuzz: the `harden` target takes any bytes
# as a config.json and hardens and verifies whatever parses, as root and
# rootless (verify must accept whatever harden made), and holds its
# resources to the profile as an update's; a panic is a failure. Seeded
# with the golden podman and containerd specs; runs for SECONDS (default
# 60).
#
#   hack/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
# libFuzzer's instrumentation needs unstable compiler flags; the machine's
# one (stable) toolchain is allowed to take them.
export RUSTC_BOOTSTRAP=1
mkdir -p fuzz/corpus/harden
cp crates/runsbx-policy/tests/golden/podman.json crates/runsbx-policy/tests/golden/containerd.json fuzz/corpus/harden/
cd fuzz
cargo fuzz run harden corpus/harden -- -max_total_time="$secs" -rss_limit_mb=2048
