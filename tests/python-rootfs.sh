#!/usr/bin/env bash
# python-rootfs.sh BUSYBOX_ROOTFS DIR: a copy of the busybox test rootfs
# plus the host's Python 3 (standard library, pip and Debian's bundled
# wheels), two coreutils, and the shared libraries they load. For the tests
# that check real programs work under the seccomp allowlist; the default
# image of `runsbx call` comes later, from debootstrap.
set -euo pipefail
src=$1 dir=$2
rm -rf "$dir"
cp -a "$src" "$dir"
# The host's merged-/usr layout (/lib -> usr/lib, ...), so that the loader
# and libraries are found at the paths the binaries name.
for l in /lib /lib32 /lib64 /libx32; do
    if [ -L "$l" ]; then
        mkdir -p "$dir/$(readlink "$l")"
        ln -sfn "$(readlink "$l")" "$dir$l"
    fi
done
py=$(readlink -f /usr/bin/python3)
ver=$(basename "$py")
copy() {
    local f
    for f in "$@"; do
        [ -e "$f" ] || continue
        mkdir -p "$dir$(dirname "$f")"
        cp -a "$f" "$dir$f"
    done
}
copy "$py" /usr/bin/python3 /usr/bin/ls /usr/bin/sort "/usr/lib/$ver" /usr/lib/python3/dist-packages \
     /usr/share/python-wheels /etc/ssl/certs/ca-certificates.crt
# Every shared library any of those ELF files needs, and the loader.
find "$dir/usr" -type f \( -name '*.so*' -o -perm -u+x \) -print0 |
    { xargs -0 ldd 2>/dev/null || true; } | awk '/=> \// { print $3 } /^\t\/lib/ { print $1 }' | sort -u |
    while read -r lib; do
        copy "$(readlink -f "$lib")"
        if [ -L "$lib" ]; then copy "$lib"; fi
    done
