#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capability, HookBuilder, HooksBuilder, LinuxIdMapping, LinuxIdMappingBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, MountBuilder, Spec,
};
use proptest::prelude::*;

use crate::{
    harden, verify, EngineBind, EngineBindKind, HostFacts, IdRange, PolicyError, Profile,
    RootlessIds, TRUST_BUNDLE,
};

pub(crate) fn as_root() -> HostFacts {
    HostFacts {
        rootless: false,
        uid: 0,
        gid: 0,
        id_range: Some(IdRange {
            base: 1_000_000_000,
            size: 65_536,
        }),
        user_namespaces: true,
        seccomp: true,
        cgroups: true,
        swap_limit: true,
        proc_subset: true,
        call_workspace: None,
        seccomp_listener: None,
        session: false,
        rootfs_container_layer: false,
        pod: None,
        rootless_ids: None,
        engine_binds: Vec::new(),
        trust_bundle: None,
    }
}

fn rootless() -> HostFacts {
    HostFacts {
        rootless: true,
        uid: 1000,
        gid: 1000,
        id_range: None,
        cgroups: false,
        swap_limit: false,
        ..as_root()
    }
}

fn in_podman_userns() -> HostFacts {
    HostFacts {
        uid: 0,
        gid: 0,
        ..rootless()
    }
}

fn profile() -> Profile {
    Profile::builtin().unwrap()
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn load(name: &str) -> Spec {
    serde_json::from_str(&std::fs::read_to_string(golden_dir().join(name)).unwrap()).unwrap()
}

/// Compares with the checked-in expectation; RUNSBX_BLESS=1 rewrites it.
fn assert_golden(name: &str, value: &serde_json::Value) {
    let path = golden_dir().join(name);
    let text = serde_json::to_string_pretty(value).unwrap() + "\n";
    if std::env::var("RUNSBX_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &text).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(expected == text, "{name} differs from harden's output (RUNSBX_BLESS=1 cargo test -p runsbx-policy rewrites it after review):\n{text}");
}

#[test]
fn golden_podman_and_containerd_specs() {
    for engine in ["podman", "containerd"] {
        for (mode, host) in [("root", as_root()), ("rootless", rootless())] {
            let input = load(&format!("{engine}.json"));
            let out = harden(input, &profile(), &host).unwrap();
            verify(&out.spec, &profile(), &host).unwrap();
            let value = serde_json::json!({
                "changes": out.changes,
                "attestation": out.attestation,
                "spec": out.spec,
            });
            assert_golden(&format!("{engine}.{mode}.hardened.json"), &value);
            // Idempotent on real engine specs too.
            let again = harden(out.spec.clone(), &profile(), &host).unwrap();
            assert_eq!(
                again.spec, out.spec,
                "{engine} {mode}: second pass changed the spec"
            );
            assert!(
                again.changes.is_empty(),
                "{engine} {mode}: {:?}",
                again.changes
            );
        }
    }
}

#[test]
fn rootless_maps_only_the_caller() {
    for (host, uid) in [(rootless(), 1000), (in_podman_userns(), 0)] {
        let out = harden(load("podman.json"), &profile(), &host).unwrap();
        let linux = out.spec.linux().as_ref().unwrap();
        for maps in [linux.uid_mappings(), linux.gid_mappings()] {
            let m = maps.as_ref().unwrap();
            assert_eq!(m.len(), 1);
            assert_eq!(
                (m[0].container_id(), m[0].host_id(), m[0].size()),
                (0, uid, 1)
            );
        }
    }
}

/// Inside a user namespace that maps the caller (as 0) and its 65,536
/// subordinate ids, as rootless podman's and runsbx's own do.
fn with_subordinate_ids(engines: bool) -> HostFacts {
    let ranges = vec![
        IdRange { base: 0, size: 1 },
        IdRange {
            base: 1,
            size: 65_536,
        },
    ];
    HostFacts {
        rootless_ids: Some(RootlessIds {
            uids: ranges.clone(),
            gids: ranges,
            engines,
        }),
        ..in_podman_userns()
    }
}

fn triples(maps: &Option<Vec<LinuxIdMapping>>) -> Vec<(u32, u32, u32)> {
    maps.iter()
        .flatten()
        .map(|m| (m.container_id(), m.host_id(), m.size()))
        .collect()
}

fn with_user(mut spec: Spec, uid: u32) -> Spec {
    let mut process = spec.process().clone().unwrap();
    let mut user = process.user().clone();
    user.set_uid(uid);
    user.set_gid(uid);
    process.set_user(user);
    spec.set_process(Some(process));
    spec
}

#[test]
fn rootless_with_subordinate_ids_maps_them_all_so_an_images_user_runs() {
    for engines in [true, false] {
        let spec = with_user(load("podman.json"), 1000);
        let out = harden(spec, &profile(), &with_subordinate_ids(engines)).unwrap();
        let linux = out.spec.linux().as_ref().unwrap();
        for maps in [linux.uid_mappings(), linux.gid_mappings()] {
            // One line per range of the parent namespace: the kernel refuses
            // a line that spans two.
            assert_eq!(triples(maps), [(0, 0, 1), (1, 1, 65_536)]);
        }
        let layer = out
            .attestation
            .iter()
            .find(|l| l.layer == "user_namespace")
            .unwrap();
        assert!(layer.detail.contains("subordinate"), "{layer:?}");
    }
    // Without them, uid 1000 still has nowhere to be.
    let err = harden(
        with_user(load("podman.json"), 1000),
        &profile(),
        &in_podman_userns(),
    );
    assert!(
        matches!(&err, Err(PolicyError::Invalid { field, .. }) if field == "process.user.uid"),
        "{err:?}"
    );
}

#[test]
fn an_engines_mappings_are_kept_only_within_its_namespace() {
    let keep_id = |host_ids: [u32; 3]| {
        let mut spec = load("podman.json");
        let maps: Vec<LinuxIdMapping> = [
            (0, host_ids[0], 1000),
            (1000, host_ids[1], 1),
            (1001, host_ids[2], 64_535),
        ]
        .into_iter()
        .map(|(c, h, n)| {
            LinuxIdMappingBuilder::default()
                .container_id(c as u32)
                .host_id(h)
                .size(n as u32)
                .build()
                .unwrap()
        })
        .collect();
        let mut linux = spec.linux().clone().unwrap();
        linux
            .set_uid_mappings(Some(maps.clone()))
            .set_gid_mappings(Some(maps));
        spec.set_linux(Some(linux));
        spec
    };
    // podman's `--userns keep-id`: the caller (0 in podman's namespace) is
    // container id 1000.
    let engine = with_subordinate_ids(true);
    let out = harden(keep_id([1, 0, 1001]), &profile(), &engine).unwrap();
    let linux = out.spec.linux().as_ref().unwrap();
    assert_eq!(
        triples(linux.uid_mappings()),
        [(0, 1, 1000), (1000, 0, 1), (1001, 1001, 64_535)]
    );
    // A range past the namespace's ids is not the engine's to give: the
    // whole namespace instead, as without mappings.
    let out = harden(keep_id([1, 0, 70_000]), &profile(), &engine).unwrap();
    let linux = out.spec.linux().as_ref().unwrap();
    assert_eq!(triples(linux.uid_mappings()), [(0, 0, 1), (1, 1, 65_536)]);
    // In runsbx's own namespace a spec's mappings name host ids: ignored.
    let out = harden(
        keep_id([1, 0, 1001]),
        &profile(),
        &with_subordinate_ids(false),
    )
    .unwrap();
    let linux = out.spec.linux().as_ref().unwrap();
    assert_eq!(triples(linux.gid_mappings()), [(0, 0, 1), (1, 1, 65_536)]);
}

#[test]
fn verify_refuses_a_mapping_of_ids_that_are_not_the_sandboxs() {
    let host_root = LinuxIdMappingBuilder::default()
        .container_id(0u32)
        .host_id(0u32)
        .size(65_536u32)
        .build()
        .unwrap();
    for host in [as_root(), rootless(), with_subordinate_ids(true)] {
        let mut out = harden(load("podman.json"), &profile(), &host).unwrap();
        assert!(verify(&out.spec, &profile(), &host).is_ok());
        let mut linux = out.spec.linux().clone().unwrap();
        linux.set_uid_mappings(Some(vec![host_root]));
        out.spec.set_linux(Some(linux));
        let err = verify(&out.spec, &profile(), &host).unwrap_err();
        assert!(err.to_string().contains("not this sandbox's"), "{err}");
    }
}

#[test]
fn root_maps_an_unprivileged_range_never_host_root() {
    let out = harden(load("containerd.json"), &profile(), &as_root()).unwrap();
    let linux = out.spec.linux().as_ref().unwrap();
    for m in linux
        .uid_mappings()
        .iter()
        .chain(linux.gid_mappings().iter())
        .flatten()
    {
        assert!(m.host_id() >= 1_000_000_000, "{m:?}");
    }
}

fn with_bind(mut spec: Spec, dest: &str, source: &str, options: &[&str]) -> Spec {
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(
        MountBuilder::default()
            .destination(dest)
            .typ("bind")
            .source(source)
            .options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
            .build()
            .unwrap(),
    );
    spec.set_mounts(Some(mounts));
    spec
}

fn with_engine_bind(host: HostFacts, dest: &str, source: &str, kind: EngineBindKind) -> HostFacts {
    HostFacts {
        engine_binds: vec![EngineBind {
            destination: PathBuf::from(dest),
            source: PathBuf::from(source),
            kind,
        }],
        ..host
    }
}

fn mount_at<'a>(spec: &'a Spec, dest: &str) -> &'a oci_spec::runtime::Mount {
    spec.mounts()
        .iter()
        .flatten()
        .find(|m| m.destination() == Path::new(dest))
        .unwrap()
}

#[test]
fn an_engines_init_is_bound_read_only_where_the_process_runs_it() {
    let init = |args0: &str| {
        let mut spec = with_bind(
            load("podman.json"),
            "/run/podman-init",
            "/usr/libexec/podman/catatonit",
            &["bind", "private", "rw", "suid"],
        );
        let mut process = spec.process().clone().unwrap();
        process.set_args(Some(vec![
            args0.to_owned(),
            "--".to_owned(),
            "sh".to_owned(),
        ]));
        spec.set_process(Some(process));
        spec
    };
    let host = with_engine_bind(
        as_root(),
        "/run/podman-init",
        "/usr/libexec/podman/catatonit",
        EngineBindKind::SystemFile,
    );
    let out = harden(init("/run/podman-init"), &profile(), &host).unwrap();
    let options = mount_at(&out.spec, "/run/podman-init")
        .options()
        .clone()
        .unwrap();
    for o in ["ro", "nosuid", "nodev"] {
        assert!(options.iter().any(|x| x == o), "{options:?}");
    }
    for o in ["rw", "suid", "noexec"] {
        assert!(!options.iter().any(|x| x == o), "{options:?}");
    }
    let l = layer(&out, "no_host_mounts");
    assert!(
        l.in_force && l.detail.contains("/run/podman-init (the engine's init)"),
        "{l:?}"
    );
    verify(&out.spec, &profile(), &host).unwrap();

    // The profile says no: refused, naming the key.
    let mut strict = profile();
    strict.engine_init = false;
    let err = harden(init("/run/podman-init"), &strict, &host).unwrap_err();
    assert!(err.to_string().contains("`engine_init = true`"), "{err}");
    // Not what the process runs, or not a file the runtime vouched for:
    // any other host bind, refused as one.
    for (spec, host) in [
        (init("/bin/sh"), host.clone()),
        (init("/run/podman-init"), as_root()),
    ] {
        let err = harden(spec, &profile(), &host).unwrap_err();
        assert!(
            err.to_string()
                .contains("bind_mounts = [\"/run/podman-init\"]"),
            "{err}"
        );
    }
}

#[test]
fn the_profiles_tmpfs_goes_under_the_specs_mounts_below_it() {
    let mut spec = load("podman.json");
    let mut mounts = spec.mounts().clone().unwrap();
    for dest in ["/tmp/sub", "/dev/shm/sub"] {
        mounts.push(
            MountBuilder::default()
                .destination(dest)
                .typ("tmpfs")
                .source("tmpfs")
                .build()
                .unwrap(),
        );
    }
    spec.set_mounts(Some(mounts));
    let out = harden(spec, &profile(), &as_root()).unwrap();
    let order: Vec<&Path> = out
        .spec
        .mounts()
        .iter()
        .flatten()
        .map(|m| m.destination().as_path())
        .collect();
    let at = |p: &str| order.iter().position(|d| *d == Path::new(p)).unwrap();
    assert!(at("/tmp") < at("/tmp/sub"), "{order:?}");
    assert!(
        at("/dev") < at("/dev/shm") && at("/dev/shm") < at("/dev/shm/sub"),
        "{order:?}"
    );
}

/// A hardened spec's cgroup resources.
fn resources_of(spec: &Spec) -> &oci_spec::runtime::LinuxResources {
    spec.linux().as_ref().unwrap().resources().as_ref().unwrap()
}

#[test]
fn disabling_the_oom_killer_is_undone_and_said() {
    let mut spec = load("podman.json");
    let mut linux = spec.linux().clone().unwrap();
    let mut resources = linux.resources().clone().unwrap_or_default();
    let mut memory = resources.memory().unwrap_or_default();
    memory.set_disable_oom_killer(Some(true));
    resources.set_memory(Some(memory));
    linux.set_resources(Some(resources));
    spec.set_linux(Some(linux));
    let out = harden(spec, &profile(), &as_root()).unwrap();
    let memory = resources_of(&out.spec).memory().unwrap();
    assert_eq!(memory.disable_oom_killer(), Some(false));
    assert!(out
        .changes
        .iter()
        .any(|c| c.field == "linux.resources.memory.disableOOMKiller"));
}

/// A memory limit bounds swap too: memory and swap together at most the
/// limit, whatever total the engine gave (podman's `--memory-swap`, twice
/// the memory by default); where the kernel keeps no swap accounts there
/// is no swap setting, and the attestation says the swap is not limited.
#[test]
fn the_memory_limit_includes_swap() {
    let with_swap = |swap: Option<i64>| {
        let mut spec = load("podman.json");
        let mut linux = spec.linux().clone().unwrap();
        let mut resources = linux.resources().clone().unwrap_or_default();
        let mut memory = resources.memory().unwrap_or_default();
        memory.set_limit(Some(64 << 20));
        memory.set_swap(swap);
        resources.set_memory(Some(memory));
        linux.set_resources(Some(resources));
        spec.set_linux(Some(linux));
        spec
    };
    let detail = |out: &crate::Hardened| {
        let layer = out
            .attestation
            .iter()
            .find(|l| l.layer == "cgroup_limits")
            .unwrap();
        layer.detail.clone()
    };
    for swap in [None, Some(128 << 20), Some(64 << 20), Some(-1)] {
        let out = harden(with_swap(swap), &profile(), &as_root()).unwrap();
        let memory = resources_of(&out.spec).memory().unwrap();
        assert_eq!(memory.limit(), Some(64 << 20), "{swap:?}");
        assert_eq!(memory.swap(), Some(64 << 20), "{swap:?}");
        let said = out
            .changes
            .iter()
            .any(|c| c.field == "linux.resources.memory.swap");
        assert_eq!(said, matches!(swap, Some(s) if s != 64 << 20), "{swap:?}");
        assert!(detail(&out).contains("swap included"), "{}", detail(&out));
        verify(&out.spec, &profile(), &as_root()).unwrap();
    }
    let unaccounted = HostFacts {
        swap_limit: false,
        ..as_root()
    };
    let out = harden(with_swap(Some(128 << 20)), &profile(), &unaccounted).unwrap();
    assert_eq!(resources_of(&out.spec).memory().unwrap().swap(), None);
    assert!(out
        .changes
        .iter()
        .any(|c| c.field == "linux.resources.memory.swap"));
    assert!(
        detail(&out).contains("swap not limited"),
        "{}",
        detail(&out)
    );
    // No limit in the spec: the profile's, swap included.
    let out = harden(load("podman.json"), &profile(), &as_root()).unwrap();
    let memory = resources_of(&out.spec).memory().unwrap();
    assert_eq!(memory.swap(), memory.limit());
}

#[test]
fn every_device_is_denied_whatever_the_spec_allowed() {
    let deny_all = serde_json::json!([{"allow": false, "access": "rwm"}]);
    for devices in [
        serde_json::json!(null),
        serde_json::json!([]),
        serde_json::json!([{"allow": true, "access": "rwm"}]),
        serde_json::json!([{"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "major": 10, "minor": 229, "access": "rwm"}]),
    ] {
        let mut spec = serde_json::to_value(load("podman.json")).unwrap();
        spec["linux"]["resources"]["devices"] = devices.clone();
        let spec: Spec = serde_json::from_value(spec).unwrap();
        let out = harden(spec, &profile(), &as_root()).unwrap();
        assert_eq!(
            serde_json::to_value(resources_of(&out.spec).devices()).unwrap(),
            deny_all,
            "from {devices}"
        );
        assert_eq!(
            out.changes
                .iter()
                .any(|c| c.field == "linux.resources.devices"),
            devices != deny_all,
            "from {devices}: {:?}",
            out.changes
        );
        // Hardening its own output changes nothing.
        let again = harden(out.spec.clone(), &profile(), &as_root()).unwrap();
        assert_eq!(again.spec, out.spec);
    }
}

#[test]
fn a_bind_of_the_hosts_sys_is_dropped_like_a_sysfs() {
    // Rootless buildah's RUN steps ask for it.
    let spec = with_bind(load("podman.json"), "/sys", "/sys", &["rbind", "ro"]);
    for host in [as_root(), rootless()] {
        let out = harden(spec.clone(), &profile(), &host).unwrap();
        assert!(
            !out.spec
                .mounts()
                .iter()
                .flatten()
                .any(|m| m.destination() == Path::new("/sys")),
            "{:?}",
            out.spec.mounts()
        );
    }
    // Another source at /sys is a host bind like any other.
    let spec = with_bind(load("podman.json"), "/sys", "/etc", &["rbind", "ro"]);
    let err = harden(spec, &profile(), &as_root()).unwrap_err();
    assert!(err.to_string().contains("bind_mounts"), "{err}");
}

const VOLUME: &str = "/var/lib/docker/volumes/v/_data";

#[test]
fn an_engines_named_volume_is_writable_never_suid_and_said() {
    let spec = || {
        with_bind(
            load("containerd.json"),
            "/data",
            VOLUME,
            &["rbind", "rw", "suid", "dev"],
        )
    };
    for base in [as_root(), rootless()] {
        let host = with_engine_bind(base, "/data", VOLUME, EngineBindKind::Volume);
        let out = harden(spec(), &profile(), &host).unwrap();
        let options = mount_at(&out.spec, "/data").options().clone().unwrap();
        for o in ["bind", "rw", "nosuid", "nodev"] {
            assert!(options.iter().any(|x| x == o), "{options:?}");
        }
        for o in ["ro", "suid", "dev", "rbind"] {
            assert!(!options.iter().any(|x| x == o), "{options:?}");
        }
        let l = layer(&out, "no_host_mounts");
        assert!(
            !l.in_force && l.detail.contains("named volumes, writable: /data"),
            "{l:?}"
        );
        verify(&out.spec, &profile(), &host).unwrap();
        let mut strict = profile();
        strict.engine_volumes = false;
        let err = harden(spec(), &strict, &host).unwrap_err();
        assert!(err.to_string().contains("`engine_volumes = true`"), "{err}");
    }
    // A volume mount that lost nosuid fails verification.
    let host = with_engine_bind(as_root(), "/data", VOLUME, EngineBindKind::Volume);
    let mut out = harden(spec(), &profile(), &host).unwrap();
    let mut mounts = out.spec.mounts().clone().unwrap();
    for m in mounts
        .iter_mut()
        .filter(|m| m.destination() == Path::new("/data"))
    {
        m.set_options(Some(vec!["bind".to_owned(), "rw".to_owned()]));
    }
    out.spec.set_mounts(Some(mounts));
    assert!(verify(&out.spec, &profile(), &host).is_err());
    // A host path bound at the volume's destination as well is not the
    // volume: refused as any host bind.
    let twice = with_bind(spec(), "/data", "/etc", &["rbind", "rw"]);
    let err = harden(twice, &profile(), &host).unwrap_err();
    assert!(
        err.to_string().contains("host path \"/etc\" at \"/data\""),
        "{err}"
    );
}

#[test]
fn host_bind_mount_is_refused_with_the_key_that_allows_it() {
    let mut spec = load("containerd.json");
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(
        MountBuilder::default()
            .destination("/data")
            .typ("bind")
            .source("/home/agent/.ssh")
            .options(vec!["rbind".to_owned(), "rw".to_owned()])
            .build()
            .unwrap(),
    );
    spec.set_mounts(Some(mounts));
    let err = harden(spec.clone(), &profile(), &as_root()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bind mount of host path \"/home/agent/.ssh\" at \"/data\" is refused by profile `default` (a profile allows it with `bind_mounts = [\"/data\"]`)"
    );
    let mut allowing = profile();
    allowing.bind_mounts.push(PathBuf::from("/data"));
    let out = harden(spec, &allowing, &as_root()).unwrap();
    let data = out
        .spec
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.destination() == Path::new("/data"))
        .unwrap();
    let options = data.options().clone().unwrap();
    for o in ["ro", "nosuid", "nodev", "noexec", "bind"] {
        assert!(options.iter().any(|x| x == o), "{options:?}");
    }
    assert!(
        !options.iter().any(|x| x == "rw" || x == "rbind"),
        "{options:?}"
    );
}

#[test]
fn hooks_and_joins_are_refused() {
    let mut spec = load("containerd.json");
    let hook = HookBuilder::default()
        .path("/usr/bin/evil")
        .build()
        .unwrap();
    spec.set_hooks(Some(
        HooksBuilder::default()
            .create_runtime(vec![hook])
            .build()
            .unwrap(),
    ));
    assert!(
        matches!(harden(spec, &profile(), &as_root()), Err(PolicyError::Refused { key, .. }) if key == "hooks = true")
    );

    let mut spec = load("containerd.json");
    let linux = spec.linux_mut().as_mut().unwrap();
    let mut nss = linux.namespaces().clone().unwrap();
    nss.retain(|n| n.typ() != LinuxNamespaceType::Ipc);
    nss.push(
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Ipc)
            .path("/proc/1/ns/ipc")
            .build()
            .unwrap(),
    );
    linux.set_namespaces(Some(nss));
    assert!(
        matches!(harden(spec, &profile(), &as_root()), Err(PolicyError::Refused { key, .. }) if key == "namespace_join = true")
    );
}

#[test]
fn fails_closed_when_the_host_lacks_a_layer() {
    for host in [
        HostFacts {
            user_namespaces: false,
            ..as_root()
        },
        HostFacts {
            seccomp: false,
            ..as_root()
        },
        HostFacts {
            proc_subset: false,
            ..as_root()
        },
    ] {
        let r = harden(load("podman.json"), &profile(), &host);
        assert!(matches!(r, Err(PolicyError::HostMissing { .. })), "{r:?}");
    }
}

#[test]
fn unmapped_process_user_is_refused() {
    let mut spec = load("containerd.json");
    let mut user = spec.process().as_ref().unwrap().user().clone();
    user.set_uid(1000);
    spec.process_mut().as_mut().unwrap().set_user(user);
    let err = harden(spec.clone(), &profile(), &rootless()).unwrap_err();
    assert!(err.to_string().contains("process.user.uid"), "{err}");
    // As root the sandbox's range covers it.
    harden(spec, &profile(), &as_root()).unwrap();
}

#[test]
fn annotations_only_tighten() {
    let mut spec = load("containerd.json");
    spec.set_annotations(Some(HashMap::from([
        ("runsbx.limits.memory".to_owned(), "32M".to_owned()),
        ("runsbx.limits.nofile".to_owned(), "100000".to_owned()),
    ])));
    let out = harden(spec, &profile(), &as_root()).unwrap();
    let memory = resources_of(&out.spec).memory().as_ref().unwrap().limit();
    assert_eq!(memory, Some(32 << 20));
    let nofile = out
        .spec
        .process()
        .as_ref()
        .unwrap()
        .rlimits()
        .as_ref()
        .unwrap()
        .iter()
        .find(|r| r.typ() == oci_spec::runtime::PosixRlimitType::RlimitNofile)
        .unwrap()
        .hard();
    assert_eq!(nofile, profile().limits.nofile);
}

/// A memory limit too low for any sandbox to start in is refused, naming
/// the setting that asked for it; the least one is taken.
#[test]
fn a_memory_limit_below_the_floor_is_refused_by_its_name() {
    use crate::profile::MIN_MEMORY;
    let with_limit = |bytes: i64| {
        let mut spec = load("containerd.json");
        let mut memory = oci_spec::runtime::LinuxMemory::default();
        memory.set_limit(Some(bytes));
        let mut resources = oci_spec::runtime::LinuxResources::default();
        resources.set_memory(Some(memory));
        spec.linux_mut()
            .as_mut()
            .unwrap()
            .set_resources(Some(resources));
        spec
    };
    let field = |r: Result<crate::Hardened, PolicyError>| match r {
        Err(PolicyError::Invalid { field, reason }) => {
            assert!(reason.contains("below 4194304 (4M)"), "{reason}");
            field
        }
        other => panic!("not refused as invalid: {other:?}"),
    };
    let floor = MIN_MEMORY as i64;
    let r = harden(with_limit(floor - 1), &profile(), &as_root());
    assert_eq!(field(r), "linux.resources.memory.limit");
    harden(with_limit(floor), &profile(), &as_root()).unwrap();
    // Rootless on cgroup v1 the limit is not applied, and still refused:
    // the same spec must not be valid on one host and not on another.
    let r = harden(with_limit(100 << 10), &profile(), &rootless());
    assert_eq!(field(r), "linux.resources.memory.limit");

    let mut spec = load("containerd.json");
    spec.set_annotations(Some(HashMap::from([(
        "runsbx.limits.memory".to_owned(),
        "512".to_owned(),
    )])));
    assert_eq!(
        field(harden(spec, &profile(), &as_root())),
        "runsbx.limits.memory"
    );

    let mut small = profile();
    small.limits.memory = crate::profile::Size(1 << 20);
    let r = harden(load("containerd.json"), &small, &as_root());
    assert_eq!(
        field(r),
        format!("limits.memory of profile `{}`", small.name)
    );
}

const CAPS: &[Capability] = &[
    Capability::SysAdmin,
    Capability::NetAdmin,
    Capability::NetRaw,
    Capability::Chown,
    Capability::DacOverride,
    Capability::SysPtrace,
    Capability::NetBindService,
    Capability::Kill,
];

fn arb_spec() -> impl Strategy<Value = Spec> {
    (
        proptest::sample::subsequence(CAPS.to_vec(), 0..CAPS.len()),
        proptest::collection::vec((0usize..4, 0usize..6), 0..6),
        proptest::option::of(0u64..1_000_000),
        proptest::option::of(0i64..100_000),
        proptest::bool::ANY,
        proptest::bool::ANY,
        // The other limits an engine's spec may bring: swap, pids, a CPU
        // quota and period, devices all allowed.
        (
            proptest::option::of(-1i64..1 << 40),
            proptest::option::of(-1i64..100_000),
            proptest::option::of((-1i64..10_000_000, 0u64..2_000_000)),
            proptest::bool::ANY,
        ),
    )
        .prop_map(
            |(caps, mounts, nofile, mem, drop_ns, readonly, (swap, pids, cpu, devices))| {
                let mut spec = load("containerd.json");
                let process = spec.process_mut().as_mut().unwrap();
                let mut c = process.capabilities().clone().unwrap_or_default();
                let set: std::collections::HashSet<Capability> = caps.into_iter().collect();
                c.set_bounding(Some(set.clone()))
                    .set_effective(Some(set.clone()))
                    .set_permitted(Some(set.clone()))
                    .set_ambient(Some(set));
                process
                    .set_capabilities(Some(c))
                    .set_no_new_privileges(Some(false));
                if let Some(n) = nofile {
                    process.set_rlimits(Some(vec![
                        oci_spec::runtime::PosixRlimitBuilder::default()
                            .typ(oci_spec::runtime::PosixRlimitType::RlimitNofile)
                            .hard(n)
                            .soft(n)
                            .build()
                            .unwrap(),
                    ]));
                }
                let dests = [
                    "/etc/hosts",
                    "/tmp",
                    "/workspace",
                    "/data",
                    "/dev/shm",
                    "/var/run/docker.sock",
                ];
                let types = ["bind", "tmpfs", "sysfs", "proc"];
                let mut ms = spec.mounts().clone().unwrap();
                for (t, d) in mounts {
                    ms.push(
                        MountBuilder::default()
                            .destination(dests[d])
                            .typ(types[t])
                            .source("/host/src")
                            .options(vec!["rw".to_owned()])
                            .build()
                            .unwrap(),
                    );
                }
                spec.set_mounts(Some(ms));
                let linux = spec.linux_mut().as_mut().unwrap();
                let mut r = oci_spec::runtime::LinuxResources::default();
                if mem.is_some() || swap.is_some() {
                    let mut lm = oci_spec::runtime::LinuxMemory::default();
                    lm.set_limit(mem.map(|m| m << 20));
                    lm.set_swap(swap);
                    r.set_memory(Some(lm));
                }
                if let Some(limit) = pids {
                    let mut p = oci_spec::runtime::LinuxPids::default();
                    p.set_limit(limit);
                    r.set_pids(Some(p));
                }
                if let Some((quota, period)) = cpu {
                    let mut c = oci_spec::runtime::LinuxCpu::default();
                    c.set_quota(Some(quota)).set_period(Some(period));
                    r.set_cpu(Some(c));
                }
                if devices {
                    let mut all = oci_spec::runtime::LinuxDeviceCgroup::default();
                    all.set_allow(true).set_access(Some("rwm".to_owned()));
                    r.set_devices(Some(vec![all]));
                }
                linux.set_resources(Some(r));
                if drop_ns {
                    linux.set_namespaces(Some(vec![]));
                }
                if let Some(root) = spec.root_mut() {
                    root.set_readonly(Some(readonly));
                }
                spec
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// harden never widens and is idempotent; whatever it accepts, verify accepts.
    #[test]
    fn never_widens_and_is_idempotent(spec in arb_spec(), root in proptest::bool::ANY) {
        let host = if root { as_root() } else { rootless() };
        let p = profile();
        let asked = spec
            .linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.memory().as_ref())
            .and_then(|m| m.limit())
            .filter(|l| *l > 0);
        match harden(spec, &p, &host) {
            Err(PolicyError::Refused { .. }) => {}
            // A limit no sandbox could start in (see MIN_MEMORY).
            Err(PolicyError::Invalid { field, .. }) if field == "linux.resources.memory.limit" => {
                prop_assert!(asked.is_some_and(|l| (l as u64) < crate::profile::MIN_MEMORY));
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
            Ok(out) => {
                verify(&out.spec, &p, &host).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let process = out.spec.process().as_ref().unwrap();
                let caps = process.capabilities().as_ref().unwrap();
                for set in [caps.bounding(), caps.effective(), caps.permitted(), caps.inheritable(), caps.ambient()] {
                    prop_assert!(set.as_ref().is_none_or(|s| s.is_empty()));
                }
                prop_assert_eq!(process.no_new_privileges(), Some(true));
                for r in process.rlimits().iter().flatten() {
                    if r.typ() == oci_spec::runtime::PosixRlimitType::RlimitNofile {
                        prop_assert!(r.hard() <= p.limits.nofile && r.soft() <= r.hard());
                    }
                }
                let linux = out.spec.linux().as_ref().unwrap();
                let mem = linux.resources().as_ref().unwrap().memory().as_ref().unwrap().limit().unwrap();
                prop_assert!(mem as u64 <= p.limits.memory.0);
                prop_assert!(mem as u64 >= crate::profile::MIN_MEMORY);
                for typ in crate::harden::REQUIRED_NAMESPACES {
                    prop_assert!(linux.namespaces().iter().flatten().any(|n| n.typ() == *typ && n.path().is_none()));
                }
                prop_assert!(linux.seccomp().is_some());
                let again = harden(out.spec.clone(), &p, &host).unwrap();
                prop_assert_eq!(again.spec, out.spec);
            }
        }
    }
}

#[test]
fn seccomp_json_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bundles/seccomp/default.json");
    let json = crate::seccomp::allowlist_json().unwrap();
    if std::env::var("RUNSBX_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &json).unwrap();
    }
    assert!(
        std::fs::read_to_string(&path).unwrap_or_default() == json,
        "bundles/seccomp/default.json is stale: RUNSBX_BLESS=1 cargo test -p runsbx-policy regenerates it"
    );
}

fn with_workspace(host: HostFacts) -> HostFacts {
    HostFacts {
        call_workspace: Some(PathBuf::from("/run/runsbx/@calls/c1/workspace")),
        ..host
    }
}

#[test]
fn a_call_workspace_replaces_the_workspace_tmpfs_and_nothing_else() {
    for host in [with_workspace(as_root()), with_workspace(rootless())] {
        let out = harden(load("podman.json"), &profile(), &host).unwrap();
        verify(&out.spec, &profile(), &host).unwrap();
        let mounts = out.spec.mounts().clone().unwrap();
        let ws: Vec<_> = mounts
            .iter()
            .filter(|m| m.destination() == Path::new("/workspace"))
            .collect();
        assert_eq!(ws.len(), 1, "{ws:?}");
        assert_eq!(ws[0].source(), &host.call_workspace);
        let options = ws[0].options().clone().unwrap();
        for o in ["rw", "nosuid", "nodev"] {
            assert!(options.iter().any(|x| x == o), "{options:?}");
        }
        // /tmp and /dev/shm stay the profile's own tmpfs.
        for dest in ["/tmp", "/dev/shm"] {
            let m = mounts
                .iter()
                .find(|m| m.destination() == Path::new(dest))
                .unwrap();
            assert_eq!(m.typ().as_deref(), Some("tmpfs"), "{dest}");
        }
        let again = harden(out.spec.clone(), &profile(), &host).unwrap();
        assert_eq!(again.spec, out.spec, "idempotent");
    }
}

#[test]
fn verify_refuses_a_workspace_bind_that_is_not_the_calls_own() {
    let host = with_workspace(as_root());
    let mut out = harden(load("podman.json"), &profile(), &host).unwrap();
    let mut mounts = out.spec.mounts().clone().unwrap();
    for m in mounts.iter_mut() {
        if m.destination() == Path::new("/workspace") {
            m.set_source(Some(PathBuf::from("/home/agent")));
        }
    }
    out.spec.set_mounts(Some(mounts));
    assert!(matches!(
        verify(&out.spec, &profile(), &host),
        Err(PolicyError::Verify(_))
    ));
    // Without a call workspace, no writable bind passes at all.
    let ok = harden(load("podman.json"), &profile(), &host).unwrap();
    assert!(verify(&ok.spec, &profile(), &host).is_ok());
    assert!(verify(&ok.spec, &profile(), &as_root()).is_err());
}

#[test]
fn a_spec_cannot_bring_its_own_workspace_bind() {
    // Even with a call workspace in force, a spec's bind at /workspace is
    // replaced by the runtime's, never kept.
    let host = with_workspace(as_root());
    let mut spec = load("podman.json");
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(
        MountBuilder::default()
            .destination("/workspace")
            .typ("bind")
            .source("/home/agent/.ssh")
            .options(vec!["rbind".to_owned(), "rw".to_owned()])
            .build()
            .unwrap(),
    );
    spec.set_mounts(Some(mounts));
    let out = harden(spec, &profile(), &host).unwrap();
    assert!(!serde_json::to_string(&out.spec).unwrap().contains(".ssh"));
}

#[test]
fn dockers_network_hook_is_dropped_and_no_other() {
    let docker_hook = HookBuilder::default()
        .path("/proc/4242/exe")
        .args(vec![
            "libnetwork-setkey".to_owned(),
            "-exec-root=/run/docker".to_owned(),
            "abc".to_owned(),
            "def".to_owned(),
        ])
        .build()
        .unwrap();
    let mut spec = load("containerd.json");
    spec.set_hooks(Some(
        HooksBuilder::default()
            .prestart(vec![docker_hook.clone()])
            .build()
            .unwrap(),
    ));
    let hardened = harden(spec, &profile(), &as_root()).unwrap();
    assert!(!crate::harden::has_hooks(&hardened.spec));
    assert!(hardened.changes.iter().any(|c| c.field == "hooks.prestart"));
    verify(&hardened.spec, &profile(), &as_root()).unwrap();

    // The same argument from another program is still a hook.
    let other = HookBuilder::default()
        .path("/usr/bin/dockerd")
        .args(vec!["libnetwork-setkey".to_owned()])
        .build()
        .unwrap();
    let mut spec = load("containerd.json");
    spec.set_hooks(Some(
        HooksBuilder::default()
            .prestart(vec![docker_hook, other])
            .build()
            .unwrap(),
    ));
    assert!(
        matches!(harden(spec, &profile(), &as_root()), Err(PolicyError::Refused { key, .. }) if key == "hooks = true")
    );
}

#[test]
fn ping_group_range_is_cut_to_mapped_gids() {
    let with = |value: &str, host: &HostFacts| {
        let mut spec = load("containerd.json");
        let linux = spec.linux_mut().as_mut().unwrap();
        linux.set_sysctl(Some(HashMap::from([(
            "net.ipv4.ping_group_range".to_owned(),
            value.to_owned(),
        )])));
        let hardened = harden(spec, &profile(), host).unwrap();
        hardened
            .spec
            .linux()
            .as_ref()
            .unwrap()
            .sysctl()
            .as_ref()
            .unwrap()
            .get("net.ipv4.ping_group_range")
            .cloned()
    };
    assert_eq!(with("0 2147483647", &as_root()).as_deref(), Some("0 65535"));
    assert_eq!(with("0 2147483647", &rootless()).as_deref(), Some("0 0"));
    assert_eq!(with("1 0", &as_root()).as_deref(), Some("1 0"));
    assert_eq!(with("70000 80000", &as_root()), None);
}

fn with_net_path(path: &str, annotations: &[(&str, &str)]) -> Spec {
    let mut spec = load("containerd.json");
    let linux = spec.linux_mut().as_mut().unwrap();
    let mut nss = linux.namespaces().clone().unwrap();
    nss.retain(|n| n.typ() != LinuxNamespaceType::Network);
    nss.push(
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Network)
            .path(path)
            .build()
            .unwrap(),
    );
    linux.set_namespaces(Some(nss));
    let mut a = spec.annotations().clone().unwrap_or_default();
    for (k, v) in annotations {
        a.insert((*k).to_owned(), (*v).to_owned());
    }
    spec.set_annotations(Some(a));
    spec
}

fn in_pod() -> HostFacts {
    let map = |base: u32| {
        oci_spec::runtime::LinuxIdMappingBuilder::default()
            .container_id(0u32)
            .host_id(base)
            .size(65_536u32)
            .build()
            .unwrap()
    };
    HostFacts {
        pod: Some(crate::PodJoin {
            sandbox: "pause".to_owned(),
            namespaces: vec![crate::PodNamespace {
                typ: LinuxNamespaceType::Network,
                path: PathBuf::from("/proc/4242/ns/net"),
                pinned: PathBuf::from("/proc/self/fd/7"),
            }],
            user_namespace: PathBuf::from("/proc/self/fd/6"),
            uid_mappings: vec![map(1_000_065_536)],
            gid_mappings: vec![map(1_000_065_536)],
        }),
        ..as_root()
    }
}

#[test]
fn a_pod_container_joins_only_what_the_runtime_verified() {
    let container = [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.sandbox-id", "pause"),
    ];
    let host = in_pod();
    let hardened = harden(
        with_net_path("/proc/4242/ns/net", &container),
        &profile(),
        &host,
    )
    .unwrap();
    verify(&hardened.spec, &profile(), &host).unwrap();
    let linux = hardened.spec.linux().clone().unwrap();
    let nss = linux.namespaces().clone().unwrap();
    let path_of = |t| {
        nss.iter()
            .find(|n| n.typ() == t)
            .and_then(|n| n.path().clone())
    };
    // The pinned paths, the sandbox's user namespace and its mappings.
    assert_eq!(
        path_of(LinuxNamespaceType::Network),
        Some(PathBuf::from("/proc/self/fd/7"))
    );
    assert_eq!(
        path_of(LinuxNamespaceType::User),
        Some(PathBuf::from("/proc/self/fd/6"))
    );
    assert_eq!(
        linux.uid_mappings().as_ref().unwrap()[0].host_id(),
        1_000_065_536
    );
    // Idempotent.
    let again = harden(hardened.spec.clone(), &profile(), &host).unwrap();
    assert_eq!(again.spec, hardened.spec);

    // Unverified network paths, the host's, a CNI namespace: never joined,
    // with or without a verified pod; the sandbox gets a new network, and
    // the change says why.
    for path in [
        "/proc/4243/ns/net",
        "/proc/1/ns/net",
        "/var/run/netns/cni-1234",
    ] {
        for host in [as_root(), in_pod()] {
            let hardened = harden(with_net_path(path, &container), &profile(), &host)
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            let net = hardened
                .spec
                .linux()
                .as_ref()
                .and_then(|l| l.namespaces().clone())
                .unwrap()
                .into_iter()
                .find(|n| n.typ() == LinuxNamespaceType::Network)
                .unwrap();
            assert_eq!(net.path(), &None, "{path} joined");
            assert!(
                hardened
                    .changes
                    .iter()
                    .any(|c| c.field == "linux.namespaces.network"
                        && c.reason.contains(path)
                        && c.reason.contains("holding only lo")),
                "{path}: {:?}",
                hardened.changes
            );
            verify(&hardened.spec, &profile(), &host).unwrap();
        }
    }
    // verify refuses a join the runtime did not verify, however made.
    let mut spec = hardened.spec.clone();
    let l = spec.linux_mut().as_mut().unwrap();
    let mut nss = l.namespaces().clone().unwrap();
    for n in nss.iter_mut() {
        if n.typ() == LinuxNamespaceType::Network {
            n.set_path(Some(PathBuf::from("/proc/1/ns/net")));
        }
    }
    l.set_namespaces(Some(nss));
    assert!(verify(&spec, &profile(), &host).is_err());
    assert!(verify(&hardened.spec, &profile(), &as_root()).is_err());
}

#[test]
fn a_pod_sandbox_gets_a_new_network_instead_of_cni_s() {
    let sandbox = [("io.kubernetes.cri.container-type", "sandbox")];
    let hardened = harden(
        with_net_path("/var/run/netns/cni-1234", &sandbox),
        &profile(),
        &as_root(),
    )
    .unwrap();
    verify(&hardened.spec, &profile(), &as_root()).unwrap();
    let nss = hardened
        .spec
        .linux()
        .clone()
        .unwrap()
        .namespaces()
        .clone()
        .unwrap();
    assert!(nss.iter().all(|n| n.path().is_none()), "{nss:?}");
    assert!(hardened
        .attestation
        .iter()
        .any(|l| l.layer == "network_loopback_only" && l.in_force));
}

#[test]
fn a_cgroups_path_must_name_a_cgroup_below_the_root() {
    for path in ["/", "", "/..", "/a/../..", "/a/./b", "..", "/runsbx/../../"] {
        let mut spec = load("containerd.json");
        spec.linux_mut()
            .as_mut()
            .unwrap()
            .set_cgroups_path(Some(PathBuf::from(path)));
        let result = harden(spec, &profile(), &as_root());
        assert!(
            matches!(&result, Err(PolicyError::Invalid { field, .. }) if field == "linux.cgroupsPath"),
            "{path:?}: {:?}",
            result.map(|h| h
                .spec
                .linux()
                .clone()
                .and_then(|l| l.cgroups_path().clone()))
        );
    }
    for path in ["/k8s.io/abc", "docker/abc", "/kubepods/besteffort/pod1/abc"] {
        let mut spec = load("containerd.json");
        spec.linux_mut()
            .as_mut()
            .unwrap()
            .set_cgroups_path(Some(PathBuf::from(path)));
        harden(spec, &profile(), &as_root()).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    }
}

/// Any JSON value, a few levels deep.
fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        Just(Value::from("/")),
        Just(Value::from("..")),
        Just(Value::from("runsbx.timeout")),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map("\\PC{0,8}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Replaces the node that `path` picks (an index into the keys or items at
/// each level, modulo their count) with `value`.
fn replace_at(json: &mut serde_json::Value, path: &[usize], value: serde_json::Value) {
    let Some((first, rest)) = path.split_first() else {
        *json = value;
        return;
    };
    let child = match json {
        serde_json::Value::Object(map) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(first % map.len())
                .cloned()
                .unwrap_or_default();
            map.get_mut(&key)
        }
        serde_json::Value::Array(items) if !items.is_empty() => {
            let n = items.len();
            items.get_mut(first % n)
        }
        _ => None,
    };
    match child {
        Some(child) if !rest.is_empty() => replace_at(child, rest, value),
        Some(child) => *child = value,
        None => *json = value,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]
    /// However a spec is mangled, harden returns: a hardened spec or a
    /// refusal, never a panic (a panic in a sandbox runtime is a lost
    /// result, and a crash an attacker can trigger).
    #[test]
    fn harden_never_panics_on_any_json(
        path in proptest::collection::vec(any::<usize>(), 0..5),
        value in arb_json(),
    ) {
        let mut json = serde_json::to_value(load("containerd.json")).unwrap();
        replace_at(&mut json, &path, value);
        if let Ok(spec) = serde_json::from_value::<Spec>(json) {
            for host in [as_root(), rootless()] {
                if let Ok(hardened) = harden(spec.clone(), &profile(), &host) {
                    let _ = verify(&hardened.spec, &profile(), &host);
                }
            }
        }
    }
}

fn with_egress(allow: &[&str]) -> Profile {
    let mut p = profile();
    p.egress.allow = allow.iter().map(|a| (*a).to_owned()).collect();
    p.egress
        .resolve
        .insert("Mirror.Test".to_owned(), "10.0.0.7".to_owned());
    p.egress.allow_addresses = vec!["10.0.0.7:443".to_owned()];
    p
}

fn env_of(spec: &Spec) -> Vec<String> {
    spec.process().as_ref().unwrap().env().clone().unwrap()
}

fn layer<'a>(h: &'a crate::Hardened, name: &str) -> &'a crate::Layer {
    h.attestation
        .iter()
        .find(|l| l.layer == name)
        .unwrap_or_else(|| panic!("no {name} layer: {:?}", h.attestation))
}

#[test]
fn an_inspecting_sandbox_trusts_its_own_bundle_read_only() {
    let profile = with_egress(&["GET,HEAD example.org/docs/**"]);
    let host = HostFacts {
        trust_bundle: Some(PathBuf::from("/run/runsbx/@bundles/c1/trust.pem")),
        ..as_root()
    };
    let mut spec = load("podman.json");
    // The spec's own bind of a host bundle there gives way to the runtime's.
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.push(
        oci_spec::runtime::MountBuilder::default()
            .destination(TRUST_BUNDLE)
            .typ("bind")
            .source("/etc/ssl/certs/ca-certificates.crt")
            .options(vec!["rbind".to_owned(), "rw".to_owned()])
            .build()
            .unwrap(),
    );
    spec.set_mounts(Some(mounts));
    let hardened = harden(spec.clone(), &profile, &host).unwrap();
    let binds: Vec<_> = hardened
        .spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| m.destination() == Path::new(TRUST_BUNDLE))
        .collect();
    assert_eq!(binds.len(), 1, "{binds:?}");
    assert_eq!(binds[0].source(), &host.trust_bundle);
    assert_eq!(
        binds[0].options().clone().unwrap(),
        ["bind", "ro", "nosuid", "nodev", "noexec"]
    );
    let env = env_of(&hardened.spec);
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "NODE_EXTRA_CA_CERTS",
        "PIP_CERT",
    ] {
        assert!(
            env.contains(&format!("{var}={TRUST_BUNDLE}")),
            "{var}: {env:?}"
        );
    }
    let mounts = layer(&hardened, "no_host_mounts");
    assert!(mounts.in_force, "{mounts:?}");
    assert!(mounts.detail.contains("TLS trust"), "{mounts:?}");
    verify(&hardened.spec, &profile, &host).unwrap();
    let again = harden(hardened.spec.clone(), &profile, &host).unwrap();
    assert_eq!(again.spec, hardened.spec);
    // Another source at the trust path is refused by verify, and without
    // the runtime's bundle the spec's bind is a host bind like any other.
    let other = HostFacts {
        trust_bundle: Some(PathBuf::from("/elsewhere.pem")),
        ..as_root()
    };
    assert!(verify(&hardened.spec, &profile, &other).is_err());
    let err = harden(spec, &profile, &as_root()).unwrap_err().to_string();
    assert!(err.contains("ca-certificates.crt"), "{err}");
}

#[test]
fn the_profiles_egress_is_planned_attested_and_put_in_the_environment() {
    let profile = with_egress(&["pypi.org", "*.example.org:443"]);
    let mut spec = load("podman.json");
    // A spec's own proxy variable is replaced, not kept beside runsbx's.
    let process = spec.process_mut().as_mut().unwrap();
    let mut env = process.env().clone().unwrap_or_default();
    env.push("HTTPS_PROXY=http://attacker.example:8080".to_owned());
    process.set_env(Some(env));
    let hardened = harden(spec, &profile, &as_root()).unwrap();
    let plan = hardened.egress.clone().expect("an egress plan");
    assert_eq!(plan.allow, ["pypi.org", "*.example.org:443"]);
    assert_eq!(
        plan.resolve.get("mirror.test"),
        Some(&vec!["10.0.0.7".parse().unwrap()])
    );
    assert_eq!(plan.allow_addresses, ["10.0.0.7:443".parse().unwrap()]);
    let env = env_of(&hardened.spec);
    let proxies: Vec<&String> = env
        .iter()
        .filter(|e| e.to_ascii_uppercase().starts_with("HTTPS_PROXY="))
        .collect();
    assert_eq!(
        proxies,
        [
            "HTTPS_PROXY=http://127.0.0.1:3128",
            "https_proxy=http://127.0.0.1:3128"
        ]
    );
    let egress = layer(&hardened, "egress");
    assert!(egress.in_force);
    assert!(
        egress.detail.contains("pypi.org, *.example.org:443"),
        "{egress:?}"
    );
    assert!(hardened.changes.iter().any(|c| c.field == "process.env"));
    // Idempotent: its own output changes nothing, the plan is the same.
    let again = harden(hardened.spec.clone(), &profile, &as_root()).unwrap();
    assert_eq!(again.spec, hardened.spec);
    assert!(again.changes.is_empty(), "{:?}", again.changes);
    assert_eq!(again.egress, hardened.egress);
}

#[test]
fn without_an_allowlist_there_is_no_egress_and_no_proxy_variables() {
    let hardened = harden(load("podman.json"), &profile(), &as_root()).unwrap();
    assert_eq!(hardened.egress, None);
    assert!(!env_of(&hardened.spec)
        .iter()
        .any(|e| e.to_ascii_uppercase().contains("_PROXY=http")));
    let egress = layer(&hardened, "egress");
    assert!(
        egress.in_force && egress.detail.starts_with("none"),
        "{egress:?}"
    );
}

#[test]
fn a_calls_egress_is_its_callers_in_place_of_the_profiles() {
    use crate::{EgressOverride, EgressPlan, Overrides};
    let profile = with_egress(&["pypi.org"]);
    let call = |plan: EgressPlan| Overrides {
        egress: Some(EgressOverride::Call(plan)),
        ..Overrides::default()
    };
    let own = EgressPlan {
        allow: vec!["api.test:8443".to_owned()],
        ..EgressPlan::default()
    };
    let hardened = crate::harden_with(
        load("podman.json"),
        &profile,
        &as_root(),
        &call(own.clone()),
    )
    .unwrap();
    assert_eq!(hardened.egress, Some(own));
    assert!(layer(&hardened, "egress").detail.contains("api.test:8443"));
    // A call without egress gets none, whatever the profile allows.
    let none = crate::harden_with(
        load("podman.json"),
        &profile,
        &as_root(),
        &call(EgressPlan::default()),
    )
    .unwrap();
    assert_eq!(none.egress, None);
    assert!(!env_of(&none.spec)
        .iter()
        .any(|e| e.starts_with("HTTP_PROXY=")));
    // An annotation cannot give one: it only narrows.
    let mut spec = load("podman.json");
    spec.set_annotations(Some(HashMap::from([(
        crate::annotations::EGRESS_ALLOW.to_owned(),
        "api.test:8443".to_owned(),
    )])));
    assert!(matches!(
        harden(spec, &profile, &as_root()),
        Err(PolicyError::Annotation { .. })
    ));
}

#[test]
fn a_pod_container_reaches_out_through_its_pods_proxy() {
    let container = [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.sandbox-id", "pause"),
    ];
    let hardened = harden(
        with_net_path("/proc/4242/ns/net", &container),
        &with_egress(&["pypi.org"]),
        &in_pod(),
    )
    .unwrap();
    assert!(hardened.egress.is_some());
    let egress = layer(&hardened, "egress");
    assert!(
        egress.in_force && egress.detail.contains("its pod sandbox's proxy"),
        "{egress:?}"
    );
}

#[test]
fn a_malformed_profile_egress_names_the_profile() {
    let mut p = with_egress(&["pypi.org"]);
    p.egress.allow_addresses = vec!["not-an-address".to_owned()];
    let r = harden(load("podman.json"), &p, &as_root());
    assert!(
        matches!(&r, Err(PolicyError::Profile { origin, reason })
            if origin == "`default`" && reason.contains("allow_addresses")),
        "{r:?}"
    );
}

#[test]
fn only_an_engines_container_layer_stays_writable() {
    let mut spec = load("podman.json");
    spec.root_mut().as_mut().unwrap().set_readonly(Some(false));
    let own_layer = HostFacts {
        rootfs_container_layer: true,
        ..as_root()
    };
    let readonly = |h: &crate::Hardened| h.spec.root().as_ref().unwrap().readonly();
    // An engine's own layer, as the spec asks: writable, and said so.
    let hardened = harden(spec.clone(), &profile(), &own_layer).unwrap();
    assert_eq!(readonly(&hardened), Some(false));
    assert!(!layer(&hardened, "rootfs_readonly").in_force);
    verify(&hardened.spec, &profile(), &own_layer).unwrap();
    // Any other rootfs, root or rootless: read-only, and the change says why.
    for host in [as_root(), rootless()] {
        let hardened = harden(spec.clone(), &profile(), &host).unwrap();
        assert_eq!(readonly(&hardened), Some(true));
        assert!(hardened
            .changes
            .iter()
            .any(|c| c.field == "root.readonly" && c.reason.contains("container layer")));
        // verify refuses the writable spec for that host.
        assert!(verify(&spec_after(&own_layer, &spec), &profile(), &host).is_err());
    }
    // The profile's readonly_rootfs forces it, even for a container layer.
    let strict = Profile {
        readonly_rootfs: true,
        ..profile()
    };
    let hardened = harden(spec.clone(), &strict, &own_layer).unwrap();
    assert_eq!(readonly(&hardened), Some(true));
    assert!(layer(&hardened, "rootfs_readonly").in_force);
    assert!(verify(&spec_after(&own_layer, &spec), &strict, &own_layer).is_err());
    assert!(strict.at_least_as_strict_as(&profile()));
    assert!(!profile().at_least_as_strict_as(&strict));
}

/// `spec` hardened for `host` with the default profile.
fn spec_after(host: &HostFacts, spec: &Spec) -> Spec {
    harden(spec.clone(), &profile(), host).unwrap().spec
}

#[test]
fn tmpcopyup_is_taken_out_of_the_options_and_handed_to_the_runtime() {
    let mut spec = load("podman.json");
    let mut mounts = spec.mounts().clone().unwrap();
    mounts.push(
        MountBuilder::default()
            .destination("/data")
            .typ("tmpfs")
            .source("tmpfs")
            .options(vec![
                "rw".to_owned(),
                "tmpcopyup".to_owned(),
                "size=1m".to_owned(),
            ])
            .build()
            .unwrap(),
    );
    spec.set_mounts(Some(mounts));
    let hardened = harden(spec, &profile(), &as_root()).unwrap();
    assert_eq!(hardened.tmpcopyup, [PathBuf::from("/data")]);
    let data = hardened
        .spec
        .mounts()
        .iter()
        .flatten()
        .find(|m| m.destination() == Path::new("/data"))
        .unwrap();
    let options = data.options().clone().unwrap();
    assert!(!options.iter().any(|o| o == "tmpcopyup"), "{options:?}");
    assert!(options.iter().any(|o| o == "nosuid"), "{options:?}");
    verify(&hardened.spec, &profile(), &as_root()).unwrap();
}

/// For a profile under 1% of a CPU, create gives the kernel's least quota
/// (1 ms per period), and an update may give that again, not more.
#[test]
fn an_update_allows_the_quota_a_create_gives() {
    let mut profile = profile();
    profile.limits.cpu_millis = 5;
    let hardened = harden(load("podman.json"), &profile, &as_root()).unwrap();
    let cpu = hardened
        .spec
        .linux()
        .as_ref()
        .unwrap()
        .resources()
        .as_ref()
        .unwrap()
        .cpu()
        .clone();
    let given = cpu.unwrap().quota().unwrap();
    assert_eq!(given, 1000);
    let update = |quota: i64| {
        let requested =
            serde_json::from_value(serde_json::json!({"cpu": {"quota": quota, "period": 100000}}));
        crate::bound_update(requested.unwrap(), &profile.limits, "default", &as_root())
    };
    assert!(update(given).is_ok());
    assert!(
        matches!(update(given + 1), Err(PolicyError::Refused { .. })),
        "{:?}",
        update(given + 1)
    );
}

/// An update is held to the limits its create was: a limit may be lowered
/// or raised back up to the profile's, never past it or to unlimited;
/// swap follows the memory limit; the policy's own settings are refused,
/// each naming its field.
#[test]
fn an_update_is_held_to_the_profiles_limits() {
    let ceiling = profile().limits;
    let max = ceiling.memory.0 as i64;
    let update = |json: serde_json::Value| {
        let requested: oci_spec::runtime::LinuxResources = serde_json::from_value(json).unwrap();
        crate::bound_update(requested, &ceiling, "default", &as_root())
    };
    // The field refused, and the profile key, for a limit past the profile's.
    let field = |r: Result<oci_spec::runtime::LinuxResources, PolicyError>| match r {
        Err(PolicyError::Invalid { field, .. }) => field,
        Err(PolicyError::Refused { what, profile, key }) => {
            assert_eq!(profile, "default");
            assert!(key.starts_with("limits."), "{key}");
            what.split_whitespace().next().unwrap().to_owned()
        }
        other => panic!("{other:?}"),
    };
    // Lowered, and raised back to the profile's: swap with it.
    for limit in [64 << 20, max] {
        let out =
            update(serde_json::json!({"memory": {"limit": limit}, "pids": {"limit": 9}})).unwrap();
        assert_eq!(out.memory().unwrap().limit(), Some(limit));
        assert_eq!(out.memory().unwrap().swap(), Some(limit));
        assert_eq!(out.pids().as_ref().unwrap().limit(), 9);
    }
    let out = update(serde_json::json!({"memory": {"limit": 64 << 20, "swap": -1}})).unwrap();
    assert_eq!(out.memory().unwrap().swap(), Some(64 << 20));
    let unaccounted = HostFacts {
        swap_limit: false,
        ..as_root()
    };
    let requested =
        serde_json::from_value(serde_json::json!({"memory": {"limit": 64 << 20}})).unwrap();
    let out = crate::bound_update(requested, &ceiling, "default", &unaccounted).unwrap();
    assert_eq!(out.memory().unwrap().swap(), None);
    let quota = ceiling.cpu_millis as i64 * 100;
    update(serde_json::json!({"cpu": {"quota": quota, "period": 100000, "shares": 512}})).unwrap();
    update(serde_json::json!({"cpu": {"quota": quota / 2}})).unwrap();
    // 0 leaves a limit as it is (runc's update, and libcontainer's writes).
    let out = update(
        serde_json::json!({"memory": {"limit": 0, "swap": 0}, "cpu": {"quota": 0, "shares": 2}}),
    )
    .unwrap();
    assert_eq!(out.memory().unwrap().limit(), None);
    assert_eq!(out.memory().unwrap().swap(), None);
    assert_eq!(out.cpu().as_ref().unwrap().quota(), None);
    assert_eq!(out.cpu().as_ref().unwrap().shares(), Some(2));
    // Past the profile's, or unlimited.
    for (json, expected) in [
        (
            serde_json::json!({"memory": {"limit": max + 1}}),
            "linux.resources.memory.limit",
        ),
        (
            serde_json::json!({"memory": {"limit": -1}}),
            "linux.resources.memory.limit",
        ),
        (
            serde_json::json!({"memory": {"limit": 1 << 20}}),
            "linux.resources.memory.limit",
        ),
        (
            serde_json::json!({"memory": {"swap": -1}}),
            "linux.resources.memory.swap",
        ),
        (
            serde_json::json!({"memory": {"limit": 64 << 20, "disableOOMKiller": true}}),
            "linux.resources.memory.disableOOMKiller",
        ),
        (
            serde_json::json!({"pids": {"limit": ceiling.pids + 1}}),
            "linux.resources.pids.limit",
        ),
        (
            serde_json::json!({"pids": {"limit": -1}}),
            "linux.resources.pids.limit",
        ),
        (
            serde_json::json!({"cpu": {"quota": -1}}),
            "linux.resources.cpu.quota",
        ),
        (
            serde_json::json!({"cpu": {"quota": quota + 1000}}),
            "linux.resources.cpu.quota",
        ),
        (
            serde_json::json!({"cpu": {"quota": quota, "period": 50000}}),
            "linux.resources.cpu.quota",
        ),
        (
            serde_json::json!({"cpu": {"period": 10000}}),
            "linux.resources.cpu.period",
        ),
        (
            serde_json::json!({"cpu": {"quota": 0, "period": 10000}}),
            "linux.resources.cpu.period",
        ),
        (
            serde_json::json!({"cpu": {"realtimeRuntime": 1000}}),
            "linux.resources.cpu.realtimeRuntime",
        ),
        (
            serde_json::json!({"devices": [{"allow": true, "access": "rwm"}]}),
            "linux.resources.devices",
        ),
        (
            serde_json::json!({"unified": {"memory.max": "max"}}),
            "linux.resources.unified",
        ),
    ] {
        assert_eq!(field(update(json.clone())), expected, "{json}");
    }
}

#[test]
fn verify_refuses_limits_loosened_after_harden() {
    use oci_spec::runtime::{LinuxDeviceCgroup, LinuxPids, PosixRlimitType};
    type Loosen =
        fn(&mut oci_spec::runtime::LinuxResources, &mut Vec<oci_spec::runtime::PosixRlimit>);
    let cases: [(&str, Loosen, &str); 12] = [
        (
            "no memory limit",
            |r, _| {
                r.set_memory(None);
            },
            "memory limit",
        ),
        (
            "memory past the profile",
            |r, _| {
                let mut m = r.memory().unwrap();
                m.set_limit(Some(i64::MAX));
                r.set_memory(Some(m));
            },
            "memory limit",
        ),
        (
            "swap past the limit",
            |r, _| {
                let mut m = r.memory().unwrap();
                m.set_swap(Some(m.limit().unwrap() * 2));
                r.set_memory(Some(m));
            },
            "swap",
        ),
        (
            "OOM killer off",
            |r, _| {
                let mut m = r.memory().unwrap();
                m.set_disable_oom_killer(Some(true));
                r.set_memory(Some(m));
            },
            "OOM killer",
        ),
        (
            "pids unlimited",
            |r, _| {
                let mut p = LinuxPids::default();
                p.set_limit(-1);
                r.set_pids(Some(p));
            },
            "pids limit",
        ),
        (
            "pids past the profile",
            |r, _| {
                let mut p = LinuxPids::default();
                p.set_limit(100_000);
                r.set_pids(Some(p));
            },
            "pids limit",
        ),
        (
            "cpu quota past the profile",
            |r, _| {
                let mut c = r.cpu().clone().unwrap();
                c.set_quota(Some(c.period().unwrap() as i64 * 64));
                r.set_cpu(Some(c));
            },
            "cpu quota",
        ),
        (
            "every device allowed",
            |r, _| {
                let mut rule = LinuxDeviceCgroup::default();
                rule.set_allow(true);
                rule.set_access(Some("rwm".to_owned()));
                r.set_devices(Some(vec![rule]));
            },
            "device rules",
        ),
        (
            "real-time CPU time",
            |r, _| {
                let mut c = r.cpu().clone().unwrap();
                c.set_realtime_runtime(Some(950_000));
                r.set_cpu(Some(c));
            },
            "real-time",
        ),
        (
            "raw cgroup v2 files",
            |r, _| {
                r.set_unified(Some(HashMap::from([(
                    "memory.max".to_owned(),
                    "max".to_owned(),
                )])));
            },
            "unified",
        ),
        (
            "NOFILE dropped",
            |_, rl| rl.retain(|r| r.typ() != PosixRlimitType::RlimitNofile),
            "RlimitNofile",
        ),
        (
            "CORE raised",
            |_, rl| {
                for r in rl
                    .iter_mut()
                    .filter(|r| r.typ() == PosixRlimitType::RlimitCore)
                {
                    *r = oci_spec::runtime::PosixRlimitBuilder::default()
                        .typ(PosixRlimitType::RlimitCore)
                        .hard(u64::MAX)
                        .soft(0u64)
                        .build()
                        .unwrap();
                }
            },
            "RlimitCore",
        ),
    ];
    for host in [as_root(), rootless()] {
        let out = harden(load("podman.json"), &profile(), &host).unwrap();
        verify(&out.spec, &profile(), &host).unwrap();
        for (case, loosen, named) in cases {
            if case == "swap past the limit" && !host.cgroups {
                // Without cgroups the whole cgroup goes: swap is not looked at.
                continue;
            }
            let mut spec = out.spec.clone();
            let mut linux = spec.linux().clone().unwrap();
            let mut resources = linux.resources().clone().unwrap();
            let mut process = spec.process().clone().unwrap();
            let mut rlimits = process.rlimits().clone().unwrap();
            loosen(&mut resources, &mut rlimits);
            linux.set_resources(Some(resources));
            process.set_rlimits(Some(rlimits));
            spec.set_linux(Some(linux));
            spec.set_process(Some(process));
            let err = verify(&spec, &profile(), &host).expect_err(case);
            assert!(err.to_string().contains(named), "{case}: {err}");
        }
    }
}

#[test]
fn a_spec_without_root_is_refused_by_name() {
    let mut spec = load("podman.json");
    spec.set_root(None);
    for host in [as_root(), rootless()] {
        match harden(spec.clone(), &profile(), &host) {
            Err(PolicyError::Invalid { field, reason }) => {
                assert_eq!(field, "root");
                assert!(reason.contains("root.path"), "{reason}");
            }
            other => panic!("a spec without root: {:?}", other.map(|h| h.changes)),
        }
    }
}

#[test]
fn verify_refuses_device_nodes_and_a_cgroup_at_the_root() {
    use oci_spec::runtime::{LinuxDeviceBuilder, LinuxDeviceType};
    let kvm = LinuxDeviceBuilder::default()
        .path("/dev/kvm")
        .typ(LinuxDeviceType::C)
        .major(10)
        .minor(232)
        .build()
        .unwrap();
    for host in [as_root(), rootless()] {
        let out = harden(load("podman.json"), &profile(), &host).unwrap();
        let mut spec = out.spec.clone();
        spec.linux_mut()
            .as_mut()
            .unwrap()
            .set_devices(Some(vec![kvm.clone()]));
        let err = verify(&spec, &profile(), &host).unwrap_err().to_string();
        assert!(err.contains("device nodes"), "{err}");
        for path in ["/", "/runsbx/..", "a/../.."] {
            let mut spec = out.spec.clone();
            spec.linux_mut()
                .as_mut()
                .unwrap()
                .set_cgroups_path(Some(PathBuf::from(path)));
            let err = verify(&spec, &profile(), &host).unwrap_err().to_string();
            assert!(err.contains("cgroups path"), "{path}: {err}");
        }
        let mut spec = out.spec.clone();
        spec.linux_mut()
            .as_mut()
            .unwrap()
            .set_cgroups_path(Some(PathBuf::from("/runsbx/a")));
        verify(&spec, &profile(), &host).unwrap();
    }
}

#[test]
fn raw_cgroup_files_and_real_time_are_left_out_and_said() {
    let mut spec = load("podman.json");
    let linux = spec.linux_mut().as_mut().unwrap();
    let mut r = linux.resources().clone().unwrap_or_default();
    r.set_unified(Some(HashMap::from([
        ("memory.max".to_owned(), "max".to_owned()),
        ("pids.max".to_owned(), "max".to_owned()),
    ])));
    let mut cpu = r.cpu().clone().unwrap_or_default();
    cpu.set_realtime_runtime(Some(950_000))
        .set_realtime_period(Some(1_000_000));
    r.set_cpu(Some(cpu));
    linux.set_resources(Some(r));
    for host in [as_root(), rootless()] {
        let out = harden(spec.clone(), &profile(), &host).unwrap();
        let r = out
            .spec
            .linux()
            .as_ref()
            .unwrap()
            .resources()
            .clone()
            .unwrap();
        assert_eq!(r.unified(), &None);
        let cpu = r.cpu().clone().unwrap();
        assert_eq!(
            (cpu.realtime_runtime(), cpu.realtime_period()),
            (None, None)
        );
        let fields: Vec<&str> = out.changes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"linux.resources.unified"), "{fields:?}");
        assert!(
            fields.contains(&"linux.resources.cpu.realtimeRuntime"),
            "{fields:?}"
        );
        verify(&out.spec, &profile(), &host).unwrap();
    }
}
