//! The process: no capabilities beyond the profile's, no_new_privileges,
//! and rlimits at or below the profile's.

use std::collections::HashSet;

use oci_spec::runtime::{
    Capability, LinuxCapabilities, PosixRlimit, PosixRlimitBuilder, PosixRlimitType,
};

use super::Cx;
use crate::PolicyError;

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    let allowed = allowed_caps(cx)?;
    let limits = cx.overrides.limits(cx.profile.limits)?;
    let Some(process) = cx.spec.process_mut() else {
        return Err(PolicyError::Invalid {
            field: "process".to_owned(),
            reason: "missing".to_owned(),
        });
    };
    let mut changes = Vec::new();

    let caps = process.capabilities().clone().unwrap_or_default();
    let narrowed = narrow(&caps, &allowed);
    if process.capabilities().as_ref() != Some(&narrowed) {
        let dropped: HashSet<String> = [
            caps.bounding(),
            caps.effective(),
            caps.permitted(),
            caps.inheritable(),
            caps.ambient(),
        ]
        .into_iter()
        .flatten()
        .flatten()
        .filter(|c| !allowed.contains(c))
        .map(|c| c.to_string())
        .collect();
        let mut dropped: Vec<String> = dropped.into_iter().collect();
        dropped.sort();
        process.set_capabilities(Some(narrowed));
        changes.push((
            "process.capabilities",
            if dropped.is_empty() {
                "every set limited to the profile's capabilities".to_owned()
            } else {
                format!("dropped {}", dropped.join(", "))
            },
        ));
    }
    if process.no_new_privileges() != Some(true) {
        process.set_no_new_privileges(Some(true));
        changes.push((
            "process.noNewPrivileges",
            "set: setuid binaries and file capabilities give nothing".to_owned(),
        ));
    }

    let wanted = rlimits_of(&limits);
    let mut rlimits: Vec<PosixRlimit> = process.rlimits().clone().unwrap_or_default();
    let before = rlimits.clone();
    for (typ, max) in wanted {
        let (hard, soft) = match rlimits.iter().find(|r| r.typ() == typ) {
            Some(r) => (r.hard().min(max), r.soft().min(r.hard().min(max))),
            None => (max, max),
        };
        let limit = PosixRlimitBuilder::default()
            .typ(typ)
            .hard(hard)
            .soft(soft)
            .build()
            .map_err(|e| PolicyError::Internal(e.to_string()))?;
        match rlimits.iter_mut().find(|r| r.typ() == typ) {
            Some(r) => *r = limit,
            None => rlimits.push(limit),
        }
    }
    if rlimits != before {
        process.set_rlimits(Some(rlimits));
        changes.push((
            "process.rlimits",
            "NOFILE, NPROC, FSIZE, CPU and CORE at or below the profile's".to_owned(),
        ));
    }
    for (field, reason) in changes {
        cx.change(field, reason);
    }
    cx.attest(
        "no_capabilities",
        allowed.is_empty(),
        if allowed.is_empty() {
            "no capabilities in any set".to_owned()
        } else {
            format!("only the profile's: {}", cx.profile.capabilities.join(", "))
        },
    );
    cx.attest("no_new_privileges", true, "no_new_privs set");
    cx.attest(
        "rlimits",
        true,
        format!(
            "nofile {}, nproc {}, fsize {}, cpu {}s, core {}",
            limits.nofile, limits.nproc, limits.fsize.0, limits.cpu_seconds, limits.core.0
        ),
    );
    Ok(())
}

fn allowed_caps(cx: &Cx) -> Result<HashSet<Capability>, PolicyError> {
    cx.profile
        .capabilities
        .iter()
        .map(|name| {
            name.parse::<Capability>().map_err(|_| PolicyError::Profile {
                origin: format!("`{}`", cx.profile.name),
                reason: format!("capabilities: {name:?} is not a capability (use names such as CAP_NET_BIND_SERVICE)"),
            })
        })
        .collect()
}

/// Each set intersected with `allowed`; a set the spec left out stays empty.
fn narrow(caps: &LinuxCapabilities, allowed: &HashSet<Capability>) -> LinuxCapabilities {
    let keep = |set: &Option<HashSet<Capability>>| -> Option<HashSet<Capability>> {
        Some(
            set.clone()
                .unwrap_or_default()
                .intersection(allowed)
                .copied()
                .collect(),
        )
    };
    let mut out = LinuxCapabilities::default();
    out.set_bounding(keep(caps.bounding()))
        .set_effective(keep(caps.effective()))
        .set_permitted(keep(caps.permitted()))
        .set_inheritable(keep(caps.inheritable()))
        .set_ambient(keep(caps.ambient()));
    out
}

/// The rlimits every sandbox gets, each at most the value `limits` give.
pub(crate) fn rlimits_of(limits: &crate::profile::Limits) -> [(PosixRlimitType, u64); 5] {
    [
        (PosixRlimitType::RlimitNofile, limits.nofile),
        (PosixRlimitType::RlimitNproc, limits.nproc),
        (PosixRlimitType::RlimitFsize, limits.fsize.0),
        (PosixRlimitType::RlimitCpu, limits.cpu_seconds),
        (PosixRlimitType::RlimitCore, limits.core.0),
    ]
}
