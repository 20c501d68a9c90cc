//! /proc: a fresh procfs of the sandbox's own pid namespace. "minimal"
//! (the default) mounts it with `subset=pid`: only process directories, no
//! global files (meminfo, kcore, sys, …). Either way, containerd's masked
//! and read-only paths are applied.

use std::path::PathBuf;

use oci_spec::runtime::MountBuilder;

use super::Cx;
use crate::profile::ProcMode;
use crate::PolicyError;

/// containerd's masked paths (oci.WithMaskedPaths defaults).
pub(crate) const MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// containerd's read-only paths.
pub(crate) const READONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    let minimal = cx.profile.proc == ProcMode::Minimal;
    if minimal && !cx.host.proc_subset {
        return Err(PolicyError::HostMissing {
            layer: "a minimal /proc (procfs subset=pid)",
            hint: "procfs `subset=pid` needs Linux 5.8 or later; use a newer kernel, or a \
                   profile with proc = \"full\""
                .to_owned(),
        });
    }
    let mut options = vec!["nosuid".to_owned(), "noexec".to_owned(), "nodev".to_owned()];
    if minimal {
        options.push("subset=pid".to_owned());
    }
    let proc = MountBuilder::default()
        .destination(PathBuf::from("/proc"))
        .typ("proc")
        .source(PathBuf::from("proc"))
        .options(options)
        .build()
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
    let mut mounts = cx.spec.mounts().clone().unwrap_or_default();
    let is_proc = |m: &oci_spec::runtime::Mount| {
        m.destination() == &PathBuf::from("/proc") || m.typ().as_deref() == Some("proc")
    };
    if mounts.first() != Some(&proc) || mounts.iter().filter(|m| is_proc(m)).count() != 1 {
        // Any other procfs goes: one at another path would be a second,
        // unmasked view.
        mounts.retain(|m| !is_proc(m));
        // First, so that nothing mounted under /proc is hidden by it.
        mounts.insert(0, proc);
        cx.spec.set_mounts(Some(mounts));
        cx.change(
            "mounts[/proc]",
            if minimal {
                "a fresh procfs with subset=pid: the sandbox's own processes only"
            } else {
                "a fresh procfs of the sandbox's pid namespace"
            },
        );
    }
    let linux = cx.linux();
    let mut changed = false;
    for (list, wanted) in [
        (linux.masked_paths().clone(), MASKED),
        (linux.readonly_paths().clone(), READONLY),
    ] {
        let mut list = list.unwrap_or_default();
        let before = list.len();
        for p in wanted {
            if !list.iter().any(|x| x == p) {
                list.push((*p).to_owned());
            }
        }
        changed |= list.len() != before;
        if wanted == MASKED {
            linux.set_masked_paths(Some(list));
        } else {
            linux.set_readonly_paths(Some(list));
        }
    }
    if changed {
        cx.change(
            "linux.maskedPaths, linux.readonlyPaths",
            "containerd's masked and read-only paths added",
        );
    }
    cx.attest(
        "proc",
        true,
        if minimal {
            "fresh procfs, subset=pid, of the sandbox's pid namespace"
        } else {
            "fresh procfs of the sandbox's pid namespace, with masked and read-only paths"
        },
    );
    Ok(())
}
