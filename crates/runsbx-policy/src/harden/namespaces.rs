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
    let pod_sandbox = crate::is_pod_sandbox(&cx.spec);
    let mut joined_pod = false;
    for ns in namespaces.iter_mut() {
        let Some(path) = ns.path().clone() else {
            continue;
        };
        if let Some(pinned) = pod_namespace(cx, ns.typ(), &path) {
            // The runtime verified it: a namespace of this pod's own
            // sandbox container, never the host's.
            ns.set_path(Some(pinned));
            joined_pod = true;
        } else if cx.profile.namespace_join {
            // The operator's profile allows joins (e.g. a pod's CNI network).
        } else if ns.typ() == LinuxNamespaceType::Network {
            // The engine made this namespace for its own network (podman's
            // /run/netns/…, a CNI pod network). A sandbox's network is its
            // own loopback, whoever made the spec: it gets a new one, as
            // docker's and a pod's containers do.
            ns.set_path(None);
            let whose = if pod_sandbox {
                "the pod network namespace (made by the engine for CNI)"
            } else {
                "the engine's network namespace"
            };
            cx.change(
                "linux.namespaces.network",
                format!(
                    "{whose} at {path:?} is not joined: the sandbox gets a new one holding only \
                     lo; engine networking and published ports are not available in a runsbx \
                     sandbox (egress goes through runsbx's proxy)"
                ),
            );
        } else {
            return Err(cx.refused(
                format!("joining the {:?} namespace at {path:?}", ns.typ()),
                "namespace_join = true",
            ));
        }
    }
    if let Some(pod) = cx.host.pod.clone() {
        // Every container of the pod is in its sandbox's user namespace:
        // the sandbox's other namespaces belong to it, and only from inside
        // it may they be joined.
        let user = LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::User)
            .path(pod.user_namespace.clone())
            .build()
            .map_err(|e| PolicyError::Internal(e.to_string()))?;
        match namespaces
            .iter_mut()
            .find(|ns| ns.typ() == LinuxNamespaceType::User)
        {
            Some(ns) => *ns = user,
            None => namespaces.push(user),
        }
        cx.linux().set_namespaces(Some(namespaces.clone()));
        cx.change(
            "linux.namespaces",
            format!(
                "joins the user namespace of pod sandbox `{}` and the namespaces of it the \
                 spec names, as verified by the runtime",
                pod.sandbox
            ),
        );
        joined_pod = true;
    } else {
        cx.linux().set_namespaces(Some(namespaces.clone()));
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
    let joined = cx
        .spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|n| {
            n.iter().any(|ns| {
                ns.path()
                    .as_ref()
                    .is_some_and(|p| pod_namespace(cx, ns.typ(), p).is_none())
            })
        });
    cx.attest(
        "namespaces",
        !joined,
        if joined {
            "some namespaces are joined by path, as the profile allows"
        } else if joined_pod {
            "namespaces of its own, or of its pod's sandbox container (never the host's)"
        } else {
            "user, pid, mount, ipc, uts, network and cgroup namespaces of its own"
        },
    );
    cx.attest(
        "network_loopback_only",
        !joined,
        if joined_pod {
            "the pod's network namespace, made by runsbx for its sandbox, holding only lo"
        } else {
            "a new network namespace holding only lo (brought up by the runtime)"
        },
    );
    Ok(())
}

/// The path at which the runtime holds the pod sandbox's namespace `path`
/// of type `typ` open, when it verified that one.
fn pod_namespace(
    cx: &Cx,
    typ: LinuxNamespaceType,
    path: &std::path::Path,
) -> Option<std::path::PathBuf> {
    let pod = cx.host.pod.as_ref()?;
    if typ == LinuxNamespaceType::User && path == pod.user_namespace {
        return Some(path.to_path_buf());
    }
    pod.namespaces
        .iter()
        .find(|n| n.typ == typ && (n.path == path || n.pinned == path))
        .map(|n| n.pinned.clone())
}
