# Shared helpers for the hack/ scripts. Source it; do not run it.

# make_busybox_rootfs DIR: a root filesystem of busybox-static and its
# applets (symlinks), with the usual empty mount points.
make_busybox_rootfs() {
    local dir=$1 busybox
    busybox=$(command -v busybox) || { echo "busybox not found (apt-get install busybox-static)" >&2; return 1; }
    mkdir -p "$dir/bin" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/tmp" "$dir/etc" "$dir/root" "$dir/workspace"
    cp "$busybox" "$dir/bin/busybox"
    local applet
    for applet in $("$dir/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$dir/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' > "$dir/etc/passwd"
    printf 'root:x:0:\n' > "$dir/etc/group"
}

# make_bundle RUNSBX DIR ARGS...: DIR/rootfs and DIR/config.json (from
# `runsbx spec`, rootless when not root) running ARGS without a terminal.
make_bundle() {
    local runsbx=$1 dir=$2; shift 2
    mkdir -p "$dir"
    make_busybox_rootfs "$dir/rootfs"
    local rootless=
    [ "$(id -u)" = 0 ] || rootless=--rootless
    "$runsbx" spec --bundle "$dir" $rootless
    python3 - "$dir/config.json" "$@" <<'PY'
import json, sys
path, args = sys.argv[1], sys.argv[2:]
c = json.load(open(path))
c["process"]["terminal"] = False
c["process"]["args"] = args
json.dump(c, open(path, "w"), indent=2)
PY
}

# ensure_test_user NAME: an unprivileged user with subordinate ids, for the
# rootless tests.
ensure_test_user() {
    local name=$1
    id "$name" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$name"
    grep -q "^$name:" /etc/subuid 2>/dev/null || usermod --add-subuids 300000-365535 "$name"
    grep -q "^$name:" /etc/subgid 2>/dev/null || usermod --add-subgids 300000-365535 "$name"
}
