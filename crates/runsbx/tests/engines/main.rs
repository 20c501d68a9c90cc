//! Real container engines drive runsbx, each as its users drive it:
//! podman as root and rootless (`podman`), containerd through `ctr run
//! --runc-binary` (`containerd`), containerd's CRI plugin asked as a
//! kubelet asks (`cri`), and dockerd with runsbx added as a runtime
//! (`docker`). containerd and dockerd are daemons of the test's own
//! ([`runsbx_testkit::Daemon`]); images are built here from busybox, since
//! no registry is reachable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod containerd;
mod cri;
mod docker;
mod podman;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// The busybox test image's name in every engine.
const IMAGE: &str = "localhost/runsbx-busybox:test";
