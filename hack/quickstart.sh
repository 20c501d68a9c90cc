#!/usr/bin/env bash
# Sets up runsbx on a Debian 12 machine and runs a first sandbox: a busybox
# container, hardened by the default profile, that shows what it can see.
#
#   sudo hack/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib.sh

if [ "$(id -u)" != 0 ]; then
    echo "quickstart.sh: run as root (it installs Debian packages)" >&2
    exit 1
fi
command -v cargo >/dev/null || { echo "quickstart.sh: cargo is needed (https://rustup.rs)" >&2; exit 1; }
hack/install-deps.sh
cargo build --release
install -m 0755 target/release/runsbx /usr/local/bin/runsbx

work=$(mktemp -d /tmp/runsbx-quickstart.XXXXXX)
trap 'rm -rf "$work"' EXIT
make_bundle runsbx "$work/bundle" sh -c '
    echo "hello from a runsbx sandbox: hostname $(hostname), I am pid $$, uid $(id -u)"
    echo "processes I can see: $(ls /proc | grep -c "^[0-9]") (my own only; no /proc/meminfo: $(ls /proc/meminfo 2>&1 | grep -c "No such"))"
    grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status | tr "\t\n" "  "; echo
    touch /bin/x 2>&1 | sed "s/^/the image: /"
    ls /root/.ssh 2>&1 | sed "s/^/the host home: /"
    echo hi | nc 127.0.0.1 22 2>&1 | sed "s/^/the host sshd on 127.0.0.1:22: /"
    exit 7'
set +e
runsbx run --bundle "$work/bundle" "quickstart-$$"
code=$?
set -e
echo "runsbx run returned the sandbox's exit code: $code"
