#!/usr/bin/env bash
# Installs the Debian packages runsbx builds and is tested with. As root.
# catatonit is podman's `--init`; protobuf-compiler builds the CRI client of
# the engine tests; containernetworking-plugins and docker.io are what its
# containerd and dockerd tests drive. e2fsprogs makes a session's disk
# (mkfs.ext4). openssl and git make the TLS inspection tests' upstream (a test
# CA, a repository served by `git http-backend`).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends \
    build-essential pkg-config libseccomp-dev \
    busybox-static debootstrap python3 python3-pip python3-venv python3-pytest e2fsprogs procps iproute2 tar passwd \
    openssl git \
    podman conmon containerd runc crun \
    uidmap slirp4netns fuse-overlayfs bubblewrap catatonit \
    protobuf-compiler containernetworking-plugins docker.io
