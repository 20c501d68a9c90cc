//! Every namespace new, none joined (unless the profile allows joins), and
//! a network namespace that holds only its own loopback.

use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType};

use super::Cx;
use crate::PolicyError;

/// The namespaces every sandbox has.
pub(crate) const REQUIRED: &[LinuxNamespaceType] = &[
    LinuxNamespaceType::User,
    LinuxNamespaceType::Pid,
    LinuxNamespaceType::Mount,
    LinuxNamespaceType::Ipc,
    LinuxNamespaceType::Uts,
    LinuxNamespaceType::Network,
    LinuxNamespaceType::Cgroup,
];

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    let mut namespaces: Vec<LinuxNamespace> = cx
        .spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().clone())
        .unwrap_or_default();
    for ns in &namespaces {
        if let Some(path) = ns.path() {
            if !cx.profile.namespace_join {
                return Err(cx.refused(
                    format!("joining the {:?} namespace at {path:?}", ns.typ()),
                    "namespace_join = true",
                ));
            }
        }
    }
    let mut added = Vec::new();
    for typ in REQUIRED {
        if !namespaces.iter().any(|ns| ns.typ() == *typ) {
            let ns = LinuxNamespaceBuilder::default()
                .typ(*typ)
                .build()
                .map_err(|e| PolicyError::Internal(e.to_string()))?;
            namespaces.push(ns);
            added.push(format!("{typ:?}"));
        }
    }
    if !added.is_empty() {
        cx.linux().set_namespaces(Some(namespaces));
        cx.change(
            "linux.namespaces",
            format!(
                "added new {} namespaces: every sandbox gets all of its own",
                added.join(", ")
            ),
        );
    }
    let joined = cx.profile.namespace_join
        && cx
            .spec
            .linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
            .is_some_and(|n| n.iter().any(|ns| ns.path().is_some()));
    cx.attest(
        "namespaces",
        !joined,
        if joined {
            "some namespaces are joined by path, as the profile allows"
        } else {
            "user, pid, mount, ipc, uts, network and cgroup namespaces of its own"
        },
    );
    cx.attest(
        "network_loopback_only",
        !joined,
        "a new network namespace holding only lo (brought up by the runtime)",
    );
    Ok(())
}
