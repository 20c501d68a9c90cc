//! features: what this runtime supports, in the OCI features format.

use serde_json::{json, Value};

pub fn features() -> Value {
    json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": libcontainer::oci_spec::runtime::VERSION,
        "hooks": ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"],
        "mountOptions": [
            "async", "atime", "bind", "defaults", "dev", "diratime", "dirsync", "exec",
            "iversion", "lazytime", "loud", "mand", "noatime", "nodev", "nodiratime",
            "noexec", "noiversion", "nolazytime", "nomand", "norelatime", "nostrictatime",
            "nosuid", "nosymfollow", "private", "rbind", "relatime", "remount", "ro",
            "rprivate", "rshared", "rslave", "runbindable", "rw", "shared", "silent",
            "slave", "strictatime", "suid", "symfollow", "sync", "unbindable", "idmap", "ridmap"
        ],
        "linux": {
            "namespaces": ["cgroup", "ipc", "mount", "network", "pid", "user", "uts", "time"],
            "capabilities": caps::all().iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            "cgroup": { "v1": true, "v2": true, "systemd": false, "systemdUser": false, "rdma": false },
            "seccomp": {
                "enabled": true,
                "actions": [
                    "SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS",
                    "SCMP_ACT_KILL_THREAD", "SCMP_ACT_LOG", "SCMP_ACT_NOTIFY", "SCMP_ACT_TRACE", "SCMP_ACT_TRAP"
                ],
                "operators": [
                    "SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_LE", "SCMP_CMP_LT",
                    "SCMP_CMP_MASKED_EQ", "SCMP_CMP_NE"
                ],
                "archs": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
            },
            "apparmor": { "enabled": false },
            "selinux": { "enabled": false },
            "intelRdt": { "enabled": false },
            "mountExtensions": { "idmap": { "enabled": true } }
        },
        "annotations": {
            "io.github.runsbx.version": env!("CARGO_PKG_VERSION"),
            "io.github.youki.libcontainer.version": crate::LIBCONTAINER_VERSION,
            "io.github.seccomp.libseccomp.version": "2.5"
        }
    })
}
