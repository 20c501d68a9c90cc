//! Any bytes as a config.json: whatever parses as a spec is hardened and
//! verified, as root and rootless, and its resources are held to the
//! profile as an update's; none of it may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runsbx_policy::{
    bound_update, harden, verify, EngineBind, EngineBindKind, HostFacts, IdRange, Profile,
    RootlessIds,
};

fn host(rootless: bool) -> HostFacts {
    HostFacts {
        rootless,
        uid: if rootless { 1000 } else { 0 },
        gid: if rootless { 1000 } else { 0 },
        id_range: (!rootless).then_some(IdRange {
            base: 1_000_000_000,
            size: 65_536,
        }),
        user_namespaces: true,
        seccomp: true,
        cgroups: !rootless,
        swap_limit: !rootless,
        proc_subset: true,
        call_workspace: None,
        session: false,
        // Both values get fuzzed: root with an engine layer, rootless without.
        rootfs_container_layer: !rootless,
        pod: None,
        // Rootless in podman's namespace: the engine's mappings are fuzzed.
        rootless_ids: rootless.then(|| RootlessIds {
            uids: vec![IdRange { base: 0, size: 65_537 }],
            gids: vec![IdRange { base: 0, size: 65_537 }],
            engines: true,
        }),
        // What the fuzzed spec binds from these sources at these paths
        // counts as the engine's own.
        engine_binds: vec![
            EngineBind {
                destination: "/sbin/docker-init".into(),
                source: "/usr/bin/docker-init".into(),
                kind: EngineBindKind::SystemFile,
            },
            EngineBind {
                destination: "/data".into(),
                source: "/var/lib/docker/volumes/v/_data".into(),
                kind: EngineBindKind::Volume,
            },
        ],
        // Each provision in one of the two hosts: a trust bundle (TLS
        // inspection) as root, a seccomp listener rootless.
        trust_bundle: (!rootless).then(|| "/run/runsbx/@bundles/f/trust.pem".into()),
        seccomp_listener: rootless.then(|| "/run/user/1000/runsbx/@calls/f/seccomp.sock".into()),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = serde_json::from_slice::<oci_spec::runtime::Spec>(data) else {
        return;
    };
    let Ok(profile) = Profile::builtin() else {
        return;
    };
    for host in [host(false), host(true)] {
        if let Ok(hardened) = harden(spec.clone(), &profile, &host) {
            // Whatever harden makes, verify accepts: they agree.
            if let Err(e) = verify(&hardened.spec, &profile, &host) {
                panic!("verify refuses what harden made: {e}");
            }
        }
        // The spec's resources as an update's.
        if let Some(resources) = spec.linux().as_ref().and_then(|l| l.resources().clone()) {
            let _ = bound_update(resources, &profile.limits, &profile.name, &host);
        }
    }
});
