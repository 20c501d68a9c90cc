#!/usr/bin/env bash
# Sets up runsbx on a Debian 12 machine and runs a first sandbox: a busybox
# container in its own namespaces, with only its own loopback.
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
    echo "hello from a runsbx sandbox: $(uname -n), pid $$"
    echo "network: $(ip -o link | cut -d" " -f2 | tr -d "\n")  (only its own loopback)"
    echo "processes it can see: $(ls /proc | grep -c "^[0-9]")"
    ls /root/.ssh 2>&1 | sed "s/^/host home: /"
    exit 7'
set +e
runsbx run --bundle "$work/bundle" "quickstart-$$"
code=$?
set -e
echo "runsbx run returned the sandbox's exit code: $code"
