//! A call into a session: the session's settings are its defaults, and
//! the call may only tighten them. Pure: no effect on the host.

use std::time::Duration;

use super::CallRequest;
use crate::error::{Result, RuntimeError};
use crate::session::Settings;

/// `req` with the session's defaults filled in; refused when it asks for
/// more than the session allows.
pub(crate) fn tighten(settings: &Settings, req: &CallRequest) -> Result<CallRequest> {
    let name = &settings.name;
    let wider = |flag: String, what: &str| {
        RuntimeError::invalid(
            flag,
            format!(
                "is {what} session `{name}` allows (a call may only tighten its session's \
                 settings; make a session with more)"
            ),
        )
    };
    let mut out = req.clone();
    if req.rootfs.is_some() {
        return Err(RuntimeError::invalid(
            "--rootfs with --session",
            format!("session `{name}` runs on image `{}`", settings.image),
        ));
    }
    match &req.image {
        Some(image) if *image != settings.image => {
            return Err(RuntimeError::invalid(
                format!("--image {image}"),
                format!(
                    "session `{name}` runs on image `{}`; a call into it cannot change that",
                    settings.image
                ),
            ))
        }
        _ => out.image = Some(settings.image.clone()),
    }
    let limit = Duration::from_millis(settings.timeout_ms);
    match req.timeout {
        Some(t) if t > limit => {
            return Err(wider(
                format!("--timeout {}ms", t.as_millis()),
                &format!("longer than the {}ms", settings.timeout_ms),
            ))
        }
        Some(_) => {}
        None => out.timeout = Some(limit),
    }
    match (&req.memory, settings.memory_bytes) {
        (Some(m), Some(max)) => {
            let bytes = runsbx_policy::profile::parse_size(m)
                .map_err(|e| RuntimeError::invalid(format!("--memory {m:?}"), e))?;
            if bytes > max {
                return Err(wider(
                    format!("--memory {m}"),
                    &format!("more than the {max} bytes"),
                ));
            }
        }
        (None, Some(max)) => out.memory = Some(max.to_string()),
        _ => {}
    }
    match (req.pids, settings.pids) {
        (Some(p), Some(max)) if p > max => {
            return Err(wider(
                format!("--pids {p}"),
                &format!("more than the {max}"),
            ))
        }
        (None, Some(max)) => out.pids = Some(max),
        _ => {}
    }
    match (&req.profile, &settings.profile) {
        (Some(p), Some(q)) if p != q => {
            return Err(RuntimeError::invalid(
                format!("--profile {p}"),
                format!("session `{name}` runs under profile `{q}`"),
            ))
        }
        (None, Some(q)) => out.profile = Some(q.clone()),
        _ => {}
    }
    out.egress = match &req.egress {
        // No --allow-host: the session's way out, if it has one.
        None if settings.allow_hosts.is_empty() => None,
        None => Some(runsbx_policy::EgressPlan {
            allow: settings.allow_hosts.clone(),
            resolve: settings.proxy_resolve.clone(),
            allow_addresses: settings.proxy_allow_addresses.clone(),
            learn: None,
        }),
        Some(plan) => {
            for host in &plan.allow {
                if !settings.allow_hosts.iter().any(|h| same_entry(h, host)) {
                    let flag = if is_host_entry(host) {
                        "--allow-host"
                    } else {
                        "--allow"
                    };
                    return Err(wider(format!("{flag} {host}"), "not among the hosts"));
                }
            }
            for (host, ips) in &plan.resolve {
                if ips.iter().any(|ip| {
                    !settings
                        .proxy_resolve
                        .get(host)
                        .is_some_and(|s| s.contains(ip))
                }) {
                    return Err(wider(
                        format!("--proxy-resolve {host}"),
                        "not among the names and addresses",
                    ));
                }
            }
            for addr in &plan.allow_addresses {
                if !settings.proxy_allow_addresses.contains(addr) {
                    return Err(wider(
                        format!("--proxy-allow-address {addr}"),
                        "not among the addresses",
                    ));
                }
            }
            let mut plan = plan.clone();
            if plan.resolve.is_empty() {
                plan.resolve = settings.proxy_resolve.clone();
            }
            Some(plan)
        }
    };
    Ok(out)
}

/// Whether an entry allows a destination whole (no methods, no path).
fn is_host_entry(entry: &str) -> bool {
    !entry
        .trim()
        .contains(|c: char| c == '/' || c.is_whitespace())
}

/// Whether two allowlist entries are the same: host names compare without
/// case; a request rule's path is case-sensitive, so entries with one
/// compare exactly.
fn same_entry(a: &str, b: &str) -> bool {
    if is_host_entry(a) && is_host_entry(b) {
        a.trim().eq_ignore_ascii_case(b.trim())
    } else {
        a.trim() == b.trim()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::call::{LiveOutput, StdinFrom};
    use crate::session::{DiskBound, SCHEMA};

    fn settings() -> Settings {
        Settings {
            schema: SCHEMA.to_owned(),
            name: "s".to_owned(),
            image: "python".to_owned(),
            image_created: chrono::Utc::now(),
            created: chrono::Utc::now(),
            disk: DiskBound {
                limit_bytes: 1 << 30,
                enforced: true,
                reason: None,
            },
            memory_bytes: Some(256 << 20),
            pids: Some(64),
            timeout_ms: 10_000,
            allow_hosts: vec!["pypi.org".to_owned(), "*.example.com:8443".to_owned()],
            proxy_resolve: Default::default(),
            proxy_allow_addresses: Vec::new(),
            profile: None,
            id_slot: None,
            in_use: false,
        }
    }

    fn request() -> CallRequest {
        CallRequest {
            image: None,
            rootfs: None,
            session: Some("s".to_owned()),
            data_dir: None,
            config: None,
            profile: None,
            timeout: None,
            memory: None,
            pids: None,
            env: Vec::new(),
            stdin: StdinFrom::Null,
            inputs: Vec::new(),
            outputs: Vec::new(),
            output_dir: ".".into(),
            max_output: 1024,
            max_output_file: 1024,
            command: vec!["true".to_owned()],
            live: LiveOutput::Quiet,
            egress: None,
            secrets: Vec::new(),
            learn: false,
        }
    }

    #[test]
    fn the_sessions_settings_are_the_defaults() {
        let out = tighten(&settings(), &request()).unwrap();
        assert_eq!(out.image.as_deref(), Some("python"));
        assert_eq!(out.timeout, Some(Duration::from_secs(10)));
        assert_eq!(out.memory.as_deref(), Some("268435456"));
        assert_eq!(out.pids, Some(64));
        assert_eq!(out.egress.unwrap().allow, settings().allow_hosts);
    }

    #[test]
    fn a_call_may_tighten() {
        let mut req = request();
        req.timeout = Some(Duration::from_secs(1));
        req.memory = Some("64M".to_owned());
        req.pids = Some(8);
        req.image = Some("python".to_owned());
        req.egress = Some(runsbx_policy::EgressPlan {
            allow: vec!["PyPI.org".to_owned()],
            ..Default::default()
        });
        let out = tighten(&settings(), &req).unwrap();
        assert_eq!(out.timeout, Some(Duration::from_secs(1)));
        assert_eq!(out.memory.as_deref(), Some("64M"));
        assert_eq!(out.pids, Some(8));
        assert_eq!(out.egress.unwrap().allow, ["PyPI.org"]);
    }

    #[test]
    fn a_call_may_not_widen() {
        type Widen = Box<dyn Fn(&mut CallRequest)>;
        let cases: Vec<(&str, Widen)> = vec![
            (
                "--timeout",
                Box::new(|r| r.timeout = Some(Duration::from_secs(11))),
            ),
            ("--memory", Box::new(|r| r.memory = Some("1G".to_owned()))),
            ("--pids", Box::new(|r| r.pids = Some(65))),
            ("--image", Box::new(|r| r.image = Some("other".to_owned()))),
            ("--rootfs", Box::new(|r| r.rootfs = Some("/".into()))),
            (
                "--allow-host evil.com",
                Box::new(|r| {
                    r.egress = Some(runsbx_policy::EgressPlan {
                        allow: vec!["evil.com".to_owned()],
                        ..Default::default()
                    })
                }),
            ),
            (
                "--proxy-allow-address",
                Box::new(|r| {
                    r.egress = Some(runsbx_policy::EgressPlan {
                        allow: vec!["pypi.org".to_owned()],
                        allow_addresses: vec!["127.0.0.1:8000".parse().unwrap()],
                        ..Default::default()
                    })
                }),
            ),
        ];
        for (flag, widen) in cases {
            let mut req = request();
            widen(&mut req);
            let e = tighten(&settings(), &req).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains("session `s`"), "{flag}: {e}");
        }
        // A request rule's path is compared with its case: `/ORG` is not
        // `/org`, on a server that tells them apart.
        let mut s = settings();
        s.allow_hosts = vec!["GET pypi.org/org/**".to_owned()];
        let mut req = request();
        req.egress = Some(runsbx_policy::EgressPlan {
            allow: vec!["GET pypi.org/ORG/**".to_owned()],
            ..Default::default()
        });
        let e = tighten(&s, &req).unwrap_err().to_string();
        assert!(e.contains("--allow GET pypi.org/ORG/**"), "{e}");
        req.egress.as_mut().unwrap().allow = vec!["GET pypi.org/org/**".to_owned()];
        assert!(tighten(&s, &req).is_ok());
        // A session without egress lets no call out.
        let mut s = settings();
        s.allow_hosts.clear();
        let mut req = request();
        req.egress = Some(runsbx_policy::EgressPlan {
            allow: vec!["pypi.org".to_owned()],
            ..Default::default()
        });
        assert!(tighten(&s, &req).is_err());
        assert!(tighten(&s, &request()).unwrap().egress.is_none());
    }
}
