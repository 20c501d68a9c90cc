//! Kernel mechanisms, one module each: runsbx's own user namespace, the
//! cgroup shadow, network namespaces and rtnetlink, the fd mount API and
//! the staged rootfs, processes, signals, and what this process
//! may do on this host.

pub mod cgroupless;
pub mod fork;
pub mod netns;
pub mod newmount;
pub mod privilege;
pub mod procs;
pub mod rtnl;
pub mod signal;
pub mod stage;
pub mod userns;
