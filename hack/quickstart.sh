#!/usr/bin/env bash
# Sets up runsbx on a Debian 12 machine and makes a first tool call: Python
# code, run by `runsbx call` in a fresh sandbox on the default image, that
# computes something and then tries to read a secret planted in your home.
#
#   hack/quickstart.sh        (as root; or with sudo, to make the call rootless as you)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "quickstart.sh: run as root (it installs Debian packages and builds the default image)" >&2
    exit 1
fi
command -v cargo >/dev/null || { echo "quickstart.sh: cargo is needed (https://rustup.rs)" >&2; exit 1; }
hack/install-deps.sh
cargo build --release
install -m 0755 target/x86_64-unknown-linux-gnu/release/runsbx /usr/local/bin/runsbx
# The default image: Debian's python3 by debootstrap, once (a minute or two).
runsbx image ls | grep -q '^python\b' || runsbx image build python

# The call runs as the user who ran sudo (rootless), or as root.
user=${SUDO_USER:-root}
home=$(getent passwd "$user" | cut -d: -f6)
secret="$home/.runsbx-quickstart-secret"
echo "OPENAI_API_KEY=sk-planted-by-quickstart" > "$secret"
chown "$user" "$secret"
trap 'rm -f "$secret"' EXIT
echo "+ runsbx call -- python3 -c '…'   (as $user)"
set +e
runuser -u "$user" -- runsbx call -- python3 -c "
import os, platform
print('hello from', platform.node(), 'running Python', platform.python_version())
print('sum of the first million squares:', sum(n * n for n in range(10**6)))
print('processes I can see:', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
try:
    print('read $secret:', open('$secret').read())
except OSError as e:
    print('read $secret:', type(e).__name__, '(your home is not in the sandbox)')
"
code=$?
set -e
echo "runsbx call returned the command's exit code: $code"
