//! What runsbx runs or checks beside a live sandbox: its supervisor
//! (egress proxy, deadline), the egress configuration, the network re-check
//! before a process enters, the guard every exec'd process passes, a pod's
//! namespace joins, the engine's own bind sources (init, volumes), its teardown, and the /workspace a call or session
//! works in, and the listener a call's seccomp denials are reported to.

pub mod connects;
pub mod egress;
pub(crate) mod engine_binds;
pub(crate) mod exec_guard;
pub(crate) mod network;
pub(crate) mod pod;
pub(crate) mod seal;
pub mod seccomp_events;
pub(crate) mod stub;
pub mod supervisor;
pub(crate) mod teardown;
pub mod workspace;
