//! The user namespace's id mappings: container root is the caller when
//! rootless, and an unprivileged host range of its own as root. Host root
//! is never mapped.

use oci_spec::runtime::{LinuxIdMapping, LinuxIdMappingBuilder};

use super::Cx;
use crate::{IdRange, PolicyError, RootlessIds};

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    if !cx.host.user_namespaces {
        return Err(PolicyError::HostMissing {
            layer: "a user namespace",
            hint: "this kernel does not let runsbx create user namespaces; check \
                   `sysctl user.max_user_namespaces` (must be > 0) and, on Debian \
                   kernels, `sysctl kernel.unprivileged_userns_clone` (must be 1)"
                .to_owned(),
        });
    }
    let (uids, gids, detail) = mappings(cx)?;
    let linux = cx.linux();
    let changed = linux.uid_mappings().as_ref() != Some(&uids)
        || linux.gid_mappings().as_ref() != Some(&gids);
    linux
        .set_uid_mappings(Some(uids.clone()))
        .set_gid_mappings(Some(gids.clone()));
    if changed {
        cx.change("linux.uidMappings, linux.gidMappings", detail.clone());
    }
    check_user_is_mapped(cx, &uids, &gids)?;
    clamp_ping_group_range(cx, &gids);
    cx.attest("user_namespace", true, detail);
    Ok(())
}

const PING_GROUP_RANGE: &str = "net.ipv4.ping_group_range";

/// dockerd asks for `net.ipv4.ping_group_range = "0 2147483647"` (any group
/// may open ICMP echo sockets). The kernel refuses (EINVAL) a range naming
/// gids the sandbox's user namespace does not map, and the container would
/// not start; so the range is cut to the mapped gids, or removed when none
/// of them is in it. It never grows.
fn clamp_ping_group_range(cx: &mut Cx, gids: &[LinuxIdMapping]) {
    let Some(value) = cx
        .spec
        .linux()
        .as_ref()
        .and_then(|l| l.sysctl().as_ref())
        .and_then(|s| s.get(PING_GROUP_RANGE))
        .cloned()
    else {
        return;
    };
    // Container gids 0..=max are mapped (both mappings start at 0).
    let max = gids
        .iter()
        .map(|m| u64::from(m.container_id()) + u64::from(m.size()) - 1)
        .max()
        .unwrap_or(0);
    let mut parts = value.split_whitespace().map(str::parse::<u64>);
    let clamped = match (parts.next(), parts.next(), parts.next()) {
        // lo > hi is the kernel's own "no group" (its default, "1 0").
        (Some(Ok(lo)), Some(Ok(hi)), None) if lo > hi => Some(value.clone()),
        (Some(Ok(lo)), Some(Ok(hi)), None) if lo <= max => Some(format!("{lo} {}", hi.min(max))),
        _ => None,
    };
    if clamped.as_deref() == Some(value.as_str()) {
        return;
    }
    let linux = cx.linux();
    let mut sysctl = linux.sysctl().clone().unwrap_or_default();
    match &clamped {
        Some(v) => sysctl.insert(PING_GROUP_RANGE.to_owned(), v.clone()),
        None => sysctl.remove(PING_GROUP_RANGE),
    };
    linux.set_sysctl(Some(sysctl));
    cx.change(
        format!("linux.sysctl.{PING_GROUP_RANGE}"),
        match clamped {
            Some(v) => format!("{value:?} cut to {v:?}: only those gids are mapped in the sandbox"),
            None => format!("{value:?} removed: it names no gid mapped in the sandbox"),
        },
    );
}

type Maps = (Vec<LinuxIdMapping>, Vec<LinuxIdMapping>, String);

fn mappings(cx: &Cx) -> Result<Maps, PolicyError> {
    let host = cx.host;
    if let Some(pod) = &host.pod {
        // The pod sandbox's user namespace is joined: its mappings.
        return Ok((
            pod.uid_mappings.clone(),
            pod.gid_mappings.clone(),
            format!(
                "the user namespace of pod sandbox `{}`: {}",
                pod.sandbox,
                describe_host(&pod.uid_mappings)
            ),
        ));
    }
    if let Some(range) = host.id_range {
        let m = map(0, range.base, range.size)?;
        return Ok((
            vec![m],
            vec![m],
            format!(
                "container ids 0-{} are host ids {}-{}, this sandbox's own unprivileged range",
                range.size - 1,
                range.base,
                u64::from(range.base) + u64::from(range.size) - 1
            ),
        ));
    }
    if !host.rootless {
        return Err(PolicyError::Internal(
            "as root, the runtime must allocate an id range for the sandbox".to_owned(),
        ));
    }
    if let Some(ids) = &host.rootless_ids {
        if ids.engines {
            if let Some(kept) = engines_mappings(cx, ids) {
                return Ok(kept);
            }
        }
        if let Some(all) = whole_namespace(cx, ids)? {
            return Ok(all);
        }
    }
    // Only the caller's own ids: outside a user namespace (the dry run of
    // `runsbx harden`), or where runsbx's has no subordinate ids.
    Ok((
        vec![map(0, host.uid, 1)?],
        vec![map(0, host.gid, 1)?],
        format!(
            "container root is the caller (uid {}, gid {}); no other id exists",
            host.uid, host.gid
        ),
    ))
}

/// The engine's own mappings (rootless podman's `--userns keep-id`, say),
/// kept when every range of them lies in one range of the engine's user
/// namespace: such ids are all the caller's, and the engine laid out the
/// image's files for them.
fn engines_mappings(cx: &Cx, ids: &RootlessIds) -> Option<Maps> {
    let linux = cx.spec.linux().as_ref()?;
    let uids = linux.uid_mappings().clone().filter(|m| !m.is_empty())?;
    let gids = linux.gid_mappings().clone().filter(|m| !m.is_empty())?;
    let fits = |maps: &[LinuxIdMapping], ranges: &[IdRange]| {
        maps.iter().all(|m| {
            let end = u64::from(m.host_id()) + u64::from(m.size());
            ranges
                .iter()
                .any(|r| m.host_id() >= r.base && end <= u64::from(r.base) + u64::from(r.size))
        })
    };
    if !(fits(&uids, &ids.uids) && fits(&gids, &ids.gids)) {
        return None;
    }
    let detail = format!(
        "the engine's mappings, within its user namespace (the caller's ids): {}",
        describe_host(&uids)
    );
    Some((uids, gids, detail))
}

/// Every id of runsbx's user namespace, as the same id in the sandbox's:
/// container root is the caller, and the caller's subordinate ids are
/// there for an image's other users. `None` unless the caller is root of
/// that namespace, or when it maps nothing but the caller.
fn whole_namespace(cx: &Cx, ids: &RootlessIds) -> Result<Option<Maps>, PolicyError> {
    let host = cx.host;
    let starts_at_root = |ranges: &[IdRange]| ranges.iter().any(|r| r.base == 0 && r.size > 0);
    let only_root = |ranges: &[IdRange]| ranges.iter().map(|r| u64::from(r.size)).sum::<u64>() <= 1;
    if host.uid != 0
        || host.gid != 0
        || !starts_at_root(&ids.uids)
        || !starts_at_root(&ids.gids)
        || (only_root(&ids.uids) && only_root(&ids.gids))
    {
        return Ok(None);
    }
    let identity = |ranges: &[IdRange]| {
        ranges
            .iter()
            .filter(|r| r.size > 0)
            .map(|r| map(r.base, r.base, r.size))
            .collect::<Result<Vec<_>, _>>()
    };
    let uids = identity(&ids.uids)?;
    let detail = format!(
        "container ids {} are the same ids of runsbx's user namespace: container root is \
         the caller, the others its subordinate ids",
        describe(&uids)
    );
    Ok(Some((uids, identity(&ids.gids)?, detail)))
}

fn map(container: u32, host: u32, size: u32) -> Result<LinuxIdMapping, PolicyError> {
    LinuxIdMappingBuilder::default()
        .container_id(container)
        .host_id(host)
        .size(size)
        .build()
        .map_err(|e| PolicyError::Internal(e.to_string()))
}

fn covered(maps: &[LinuxIdMapping], id: u32) -> bool {
    maps.iter().any(|m| {
        id >= m.container_id() && u64::from(id) < u64::from(m.container_id()) + u64::from(m.size())
    })
}

fn check_user_is_mapped(
    cx: &Cx,
    uids: &[LinuxIdMapping],
    gids: &[LinuxIdMapping],
) -> Result<(), PolicyError> {
    let Some(user) = cx.spec.process().as_ref().map(|p| p.user().clone()) else {
        return Ok(());
    };
    let unmapped = |what: &str, id: u32| {
        PolicyError::Invalid {
        field: format!("process.user.{what}"),
        reason: format!(
            "{id} is not mapped in this sandbox's user namespace (mapped: {}); run the process as one of those ids",
            describe(if what == "uid" { uids } else { gids })
        ),
    }
    };
    if !covered(uids, user.uid()) {
        return Err(unmapped("uid", user.uid()));
    }
    if !covered(gids, user.gid()) {
        return Err(unmapped("gid", user.gid()));
    }
    for gid in user.additional_gids().iter().flatten() {
        if !covered(gids, *gid) {
            return Err(unmapped("additionalGids", *gid));
        }
    }
    Ok(())
}

fn describe_host(maps: &[LinuxIdMapping]) -> String {
    maps.iter()
        .map(|m| {
            format!(
                "container ids {}-{} are host ids {}-{}",
                m.container_id(),
                u64::from(m.container_id()) + u64::from(m.size()) - 1,
                m.host_id(),
                u64::from(m.host_id()) + u64::from(m.size()) - 1
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe(maps: &[LinuxIdMapping]) -> String {
    maps.iter()
        .map(|m| {
            format!(
                "{}-{}",
                m.container_id(),
                u64::from(m.container_id()) + u64::from(m.size()) - 1
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks the process's user against the spec's own mappings.
pub(super) fn check_mapped(cx: &Cx) -> Result<(), PolicyError> {
    let linux = cx.spec.linux().clone().unwrap_or_default();
    let uids = linux.uid_mappings().clone().unwrap_or_default();
    let gids = linux.gid_mappings().clone().unwrap_or_default();
    check_user_is_mapped(cx, &uids, &gids)
}

/// Whether `id` (a container gid) is mapped: devpts' `gid=5` needs it.
pub(crate) fn gid_mapped(cx: &Cx, id: u32) -> bool {
    cx.spec
        .linux()
        .as_ref()
        .and_then(|l| l.gid_mappings().as_ref())
        .is_some_and(|m| covered(m, id))
}
