//! The runc verbs, one file each: what `runsbx <verb>` does. Each reads
//! top to bottom as the order of its steps.

pub mod check;
pub mod create;
pub mod delete;
pub mod exec;
pub mod features;
pub mod harden;
pub mod kill;
pub mod pause;
pub mod query;
pub mod run;
pub mod spec;
pub mod start;
pub mod update;

pub use create::{create, CreateOptions};
pub use delete::delete;
pub use harden::harden_bundle;
pub use kill::kill;
pub use pause::{pause, resume};
pub use run::run;
pub use start::start;
