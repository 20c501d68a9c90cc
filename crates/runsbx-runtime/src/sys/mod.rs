//! Kernel mechanisms, one module each: runsbx's own user namespace, the
//! cgroup shadow, network namespaces and rtnetlink, the fd mount API, the
//! staged rootfs and an engine's overlay rebuilt over idmapped layers,
//! processes (and helpers that share runsbx's memory), signals, and what
//! this process may do on this host.

pub mod beneath;
pub mod cgroup_attach;
pub mod cgroup_limits;
pub mod cgroupless;
pub mod copyup;
pub mod fork;
pub mod layers;
pub mod loopdev;
pub mod netns;
pub mod newmount;
pub mod privilege;
pub mod procs;
pub mod rtnl;
pub mod seccomp;
pub mod signal;
pub mod sock_diag;
pub mod stage;
pub mod userns;
pub mod vm_child;
