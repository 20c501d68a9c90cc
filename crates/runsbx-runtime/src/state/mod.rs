//! What runsbx keeps on disk: the state root and its locks, the effective
//! bundle, whole-or-nothing records, cgroup claims, and a container's
//! state as libcontainer saved it.

pub mod bundle;
pub(crate) mod cgroup_claim;
pub mod container;
pub(crate) mod ids;
pub(crate) mod record;
pub mod root;
