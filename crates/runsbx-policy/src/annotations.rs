//! `runsbx.*` annotations (set by `podman --annotation` or a Kubernetes
//! pod): they may only tighten what the operator's profile allows.

use std::collections::HashMap;

use crate::harden::EgressPlan;
use crate::profile::{parse_duration, parse_size, Limits, OperatorConfig, Profile, Size, Timeout};
use crate::PolicyError;

/// The prefix of every annotation runsbx reads.
pub const PREFIX: &str = "runsbx.";
/// Picks another profile, among the operator's `selectable` ones.
pub const PROFILE: &str = "runsbx.profile";
/// Narrows the profile's egress allowlist: comma-separated entries, each
/// one of the profile's own; or a JSON array of them, for entries that
/// name methods (`["GET,HEAD github.com/org/**", "pypi.org"]`).
pub const EGRESS_ALLOW: &str = "runsbx.egress.allow";
/// A wall-clock deadline (`30s`): at most the profile's.
pub const TIMEOUT: &str = "runsbx.timeout";

/// What a caller may ask of the policy beyond the spec itself, each only to
/// tighten the profile: a selectable profile, limits, a deadline, egress
/// (with one exception, [`EgressOverride::Call`]). Produced
/// from `runsbx.*` annotations ([`Overrides::from_annotations`], for
/// engines) or directly, typed, from a `runsbx call`'s options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// A profile the operator made selectable.
    pub profile: Option<String>,
    /// A deadline, and how the caller wrote it, named, for a refusal
    /// (`annotation runsbx.timeout="2m"`, `--timeout 120000ms`).
    pub timeout: Option<(std::time::Duration, String)>,
    /// The deadline of a caller that asked for none (a call's default):
    /// the profile's when that is shorter, never refused.
    pub default_timeout: Option<std::time::Duration>,
    pub memory: Option<Size>,
    pub fsize: Option<Size>,
    pub nofile: Option<u64>,
    pub nproc: Option<u64>,
    pub cpu_seconds: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub pids: Option<i64>,
    pub egress: Option<EgressOverride>,
}

/// Egress other than the profile's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressOverride {
    /// Only these entries of the profile's allowlist (`runsbx.egress.allow`);
    /// an entry the profile does not have is an error.
    Narrow(Vec<String>),
    /// A `runsbx call`'s own egress (`--allow-host` and its companions), in
    /// place of the profile's, which is what engines' containers get. This
    /// is the one override that may widen, because of who gives it: the
    /// caller of `runsbx call` is the host-side program that runs runsbx
    /// (the agent's tool runner), which decides what each tool call may
    /// reach; the code inside never chooses it. No annotation produces it.
    Call(EgressPlan),
}

impl Overrides {
    /// Reads the `runsbx.*` annotations. An unknown `runsbx.` key or a
    /// malformed value is an error: a typo must not silently leave a limit
    /// wider than its author meant.
    pub fn from_annotations(
        annotations: Option<&HashMap<String, String>>,
    ) -> Result<Self, PolicyError> {
        let mut wanted = Self::default();
        let Some(annotations) = annotations else {
            return Ok(wanted);
        };
        let mut keys: Vec<&String> = annotations
            .keys()
            .filter(|k| k.starts_with(PREFIX))
            .collect();
        keys.sort();
        for key in keys {
            let value = &annotations[key];
            let bad = |reason: &str| PolicyError::Annotation {
                key: key.clone(),
                value: value.clone(),
                reason: reason.to_owned(),
            };
            let number = || {
                value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| bad("not a whole number"))
            };
            let size = || parse_size(value).map(Size).map_err(|e| bad(&e));
            match key.as_str() {
                EGRESS_ALLOW => {
                    let kept: Vec<String> = if value.trim_start().starts_with('[') {
                        serde_json::from_str::<Vec<String>>(value)
                            .map_err(|_| bad("not a JSON array of strings"))?
                    } else {
                        value.split(',').map(str::to_owned).collect()
                    };
                    let kept = kept.iter().map(|e| e.trim()).filter(|e| !e.is_empty());
                    wanted.egress = Some(EgressOverride::Narrow(kept.map(str::to_owned).collect()));
                }
                PROFILE => wanted.profile = Some(value.clone()),
                TIMEOUT => {
                    let timeout = parse_duration(value).map_err(|e| bad(&e))?;
                    wanted.timeout = Some((timeout, format!("annotation {TIMEOUT}={value:?}")));
                }
                "runsbx.limits.memory" => wanted.memory = Some(size()?),
                "runsbx.limits.fsize" => wanted.fsize = Some(size()?),
                "runsbx.limits.nofile" => wanted.nofile = Some(number()?),
                "runsbx.limits.nproc" => wanted.nproc = Some(number()?),
                "runsbx.limits.cpu_seconds" => wanted.cpu_seconds = Some(number()?),
                "runsbx.limits.cpu_millis" => wanted.cpu_millis = Some(number()?),
                "runsbx.limits.pids" => {
                    wanted.pids = Some(i64::try_from(number()?).map_err(|_| bad("too large"))?)
                }
                _ => {
                    return Err(bad(
                        "unknown runsbx annotation (known: runsbx.profile, runsbx.egress.allow, runsbx.timeout, runsbx.limits.{memory,fsize,nofile,nproc,cpu_seconds,cpu_millis,pids})",
                    ))
                }
            }
        }
        Ok(wanted)
    }

    /// The limits that apply: each requested one only if lower than the
    /// profile's. A deadline longer than the profile's is refused rather
    /// than cut: whoever asked for it expects the sandbox to live that
    /// long.
    pub fn limits(&self, base: Limits) -> Result<Limits, PolicyError> {
        let mut wanted = base;
        if let Some((timeout, asked)) = &self.timeout {
            if let Some(Timeout(max)) = base.timeout {
                if *timeout > max {
                    return Err(PolicyError::Invalid {
                        field: asked.clone(),
                        reason: format!(
                            "longer than the profile's deadline of {}ms (a deadline may only be \
                             shortened)",
                            max.as_millis()
                        ),
                    });
                }
            }
            wanted.timeout = Some(Timeout(*timeout));
        } else if let Some(timeout) = self.default_timeout {
            // Cut to the profile's by `min` below.
            wanted.timeout = Some(Timeout(timeout));
        }
        wanted.memory = self.memory.unwrap_or(wanted.memory);
        wanted.fsize = self.fsize.unwrap_or(wanted.fsize);
        wanted.nofile = self.nofile.unwrap_or(wanted.nofile);
        wanted.nproc = self.nproc.unwrap_or(wanted.nproc);
        wanted.cpu_seconds = self.cpu_seconds.unwrap_or(wanted.cpu_seconds);
        wanted.cpu_millis = self.cpu_millis.unwrap_or(wanted.cpu_millis);
        wanted.pids = self.pids.unwrap_or(wanted.pids);
        Ok(wanted.min(base))
    }
}

/// The limits the annotations ask for, each applied only if lower than the
/// profile's (see [`Overrides`]).
pub fn requested_limits(
    annotations: Option<&HashMap<String, String>>,
    base: Limits,
) -> Result<Limits, PolicyError> {
    Overrides::from_annotations(annotations)?.limits(base)
}

/// Where a request for a profile other than the operator's came from, so
/// that its refusal names what the caller wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileAsker {
    /// A spec's `runsbx.profile` annotation (an engine's container).
    Annotation,
    /// `--profile` of `runsbx call` or `runsbx session create`.
    Flag,
}

impl ProfileAsker {
    fn refusal(self, name: &str, reason: String) -> PolicyError {
        match self {
            Self::Annotation => PolicyError::Annotation {
                key: PROFILE.to_owned(),
                value: name.to_owned(),
                reason,
            },
            Self::Flag => PolicyError::Invalid {
                field: format!("--profile {name:?}"),
                reason,
            },
        }
    }
}

/// The profile that applies: the operator's, or the one requested when the
/// operator made it selectable and it is at least as strict. `load` gives
/// the named profile; its error is returned as it is.
pub fn choose_profile<E: From<PolicyError>>(
    requested: Option<&str>,
    asker: ProfileAsker,
    config: &OperatorConfig,
    operator_profile: Profile,
    load: impl FnOnce(&str) -> Result<Profile, E>,
) -> Result<Profile, E> {
    let Some(name) = requested else {
        return Ok(operator_profile);
    };
    if name == operator_profile.name {
        return Ok(operator_profile);
    }
    if !config.selectable.iter().any(|s| s == name) {
        let reason = if config.selectable.is_empty() {
            "the operator made no profile selectable (an operator lists them under `selectable` \
             in the operator config)"
                .to_owned()
        } else {
            format!(
                "not one of the profiles the operator made selectable: {}",
                config.selectable.join(", ")
            )
        };
        return Err(asker.refusal(name, reason).into());
    }
    let chosen = load(name)?;
    if !chosen.at_least_as_strict_as(&operator_profile) {
        let reason = format!(
            "profile `{name}` allows more than the operator's `{}`, and a profile chosen here may \
             only tighten it",
            operator_profile.name
        );
        return Err(asker.refusal(name, reason).into());
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The egress a spec with these annotations gets under `profile`.
    fn egress_of(
        annotations: &[(&str, &str)],
        profile: &Profile,
    ) -> Result<Option<crate::EgressPlan>, PolicyError> {
        let mut spec = oci_spec::runtime::Spec::default();
        spec.set_annotations(Some(ann(annotations)));
        Ok(crate::harden(spec, profile, &crate::harden::tests::as_root())?.egress)
    }

    #[test]
    fn egress_annotation_only_narrows() -> Result<(), PolicyError> {
        let mut profile = Profile::builtin()?;
        profile.egress.allow = vec!["pypi.org".to_owned(), "*.example.org:443".to_owned()];
        let allow = |plan: Option<crate::EgressPlan>| plan.map(|p| p.allow);
        assert_eq!(
            allow(egress_of(&[], &profile)?),
            Some(profile.egress.allow.clone())
        );
        let narrowed = egress_of(&[(EGRESS_ALLOW, " pypi.org ")], &profile)?;
        assert_eq!(allow(narrowed), Some(vec!["pypi.org".to_owned()]));
        // Entries with methods carry commas: a JSON array holds them.
        let mut with_rules = profile.clone();
        with_rules
            .egress
            .allow
            .push("GET,HEAD github.com/org/**".to_owned());
        let narrowed = egress_of(
            &[(
                EGRESS_ALLOW,
                r#"["GET,HEAD github.com/org/**", " pypi.org"]"#,
            )],
            &with_rules,
        )?;
        assert_eq!(
            allow(narrowed),
            Some(vec![
                "GET,HEAD github.com/org/**".to_owned(),
                "pypi.org".to_owned()
            ])
        );
        assert!(egress_of(&[(EGRESS_ALLOW, "[\"pypi.org\"")], &with_rules).is_err());
        // Narrowed to nothing: no egress at all.
        assert_eq!(egress_of(&[(EGRESS_ALLOW, "")], &profile)?, None);
        for wider in ["evil.com", "pypi.org,evil.com", "*.org", "pypi.org:8080"] {
            let r = egress_of(&[(EGRESS_ALLOW, wider)], &profile);
            assert!(
                matches!(&r, Err(PolicyError::Annotation { key, reason, .. })
                    if key == EGRESS_ALLOW && reason.contains("annotations only narrow it")),
                "{wider}: {r:?}"
            );
        }
        // The key is known to the limits parser too.
        assert!(
            requested_limits(Some(&ann(&[(EGRESS_ALLOW, "pypi.org")])), Limits::default()).is_ok()
        );
        Ok(())
    }

    #[test]
    fn annotations_only_lower_limits() -> Result<(), PolicyError> {
        let base = Limits::default();
        let lower = requested_limits(
            Some(&ann(&[
                ("runsbx.limits.memory", "16M"),
                ("runsbx.limits.pids", "8"),
            ])),
            base,
        )?;
        assert_eq!(lower.memory, Size(16 << 20));
        assert_eq!(lower.pids, 8);
        let higher = requested_limits(
            Some(&ann(&[
                ("runsbx.limits.memory", "64G"),
                ("runsbx.limits.nofile", "999999"),
            ])),
            base,
        )?;
        assert_eq!(higher, base);
        // Others' annotations are ignored.
        assert_eq!(
            requested_limits(Some(&ann(&[("io.kubernetes.pod", "x")])), base)?,
            base
        );
        Ok(())
    }

    #[test]
    fn the_timeout_annotation_only_shortens_the_deadline() -> Result<(), PolicyError> {
        use std::time::Duration;
        let none = Limits::default();
        assert_eq!(requested_limits(None, none)?.timeout, None);
        let two = requested_limits(Some(&ann(&[(TIMEOUT, "2s")])), none)?;
        assert_eq!(two.timeout, Some(Timeout(Duration::from_secs(2))));
        let profile = Limits {
            timeout: Some(Timeout(Duration::from_secs(60))),
            ..none
        };
        let shorter = requested_limits(Some(&ann(&[(TIMEOUT, "500ms")])), profile)?;
        assert_eq!(shorter.timeout, Some(Timeout(Duration::from_millis(500))));
        assert_eq!(requested_limits(None, profile)?.timeout, profile.timeout);
        let longer = requested_limits(Some(&ann(&[(TIMEOUT, "2m")])), profile);
        assert!(
            matches!(&longer, Err(PolicyError::Invalid { field, reason })
                if field == "annotation runsbx.timeout=\"2m\""
                    && reason.contains("longer than the profile's deadline")),
            "{longer:?}"
        );
        // A caller's default deadline is cut to the profile's, not refused.
        let default = |d: u64| Overrides {
            default_timeout: Some(Duration::from_secs(d)),
            ..Overrides::default()
        };
        assert_eq!(default(90).limits(profile)?.timeout, profile.timeout);
        let thirty = Some(Timeout(Duration::from_secs(30)));
        assert_eq!(default(30).limits(profile)?.timeout, thirty);
        assert_eq!(default(30).limits(none)?.timeout, thirty);
        for bad in ["soon", "-5s", "0", "1d", "", "9999999h"] {
            assert!(
                matches!(
                    requested_limits(Some(&ann(&[(TIMEOUT, bad)])), none),
                    Err(PolicyError::Annotation { .. })
                ),
                "{bad:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn bad_annotations_are_errors() {
        for (k, v) in [
            ("runsbx.limits.memory", "lots"),
            ("runsbx.limits.pids", "-1"),
            ("runsbx.limit.memory", "1M"),
        ] {
            let r = requested_limits(Some(&ann(&[(k, v)])), Limits::default());
            assert!(
                matches!(r, Err(PolicyError::Annotation { .. })),
                "{k}={v}: {r:?}"
            );
        }
    }

    #[test]
    fn profile_choice_only_tightens() -> Result<(), PolicyError> {
        let default = Profile::builtin()?;
        let strict = Profile {
            name: "strict".into(),
            limits: Limits::default().min(default.limits),
            tmpfs: default.tmpfs.clone(),
            ..default.clone()
        };
        let mut wide = default.clone();
        wide.name = "wide".into();
        wide.hooks = true;
        let config = OperatorConfig {
            selectable: vec!["strict".into(), "wide".into()],
            ..OperatorConfig::default()
        };
        let load = |n: &str| -> Result<Profile, PolicyError> {
            Ok(if n == "strict" {
                strict.clone()
            } else {
                wide.clone()
            })
        };
        let by = ProfileAsker::Annotation;
        assert_eq!(
            choose_profile(None, by, &config, default.clone(), load)?.name,
            "default"
        );
        let picked = choose_profile(Some("strict"), by, &config, default.clone(), load)?;
        assert_eq!(picked.name, "strict");
        assert!(matches!(
            choose_profile(Some("wide"), by, &config, default.clone(), load),
            Err(PolicyError::Annotation { reason, .. }) if reason.contains("may only tighten")
        ));
        // A flag's refusal names the flag, and lists what may be chosen.
        let refused = choose_profile(Some("other"), ProfileAsker::Flag, &config, default, load);
        assert_eq!(
            refused.map_err(|e| e.to_string()).map(|p| p.name),
            Err(
                "--profile \"other\": not one of the profiles the operator made selectable: \
                 strict, wide"
                    .to_owned()
            )
        );
        Ok(())
    }

    #[test]
    fn typed_overrides_harden_as_their_annotations_do() -> Result<(), PolicyError> {
        let profile = Profile::builtin()?;
        let host = crate::harden::tests::as_root();
        let mut spec = oci_spec::runtime::Spec::default();
        let annotated = {
            let mut s = spec.clone();
            s.set_annotations(Some(ann(&[
                ("runsbx.limits.memory", "64M"),
                ("runsbx.limits.pids", "50"),
                (TIMEOUT, "5s"),
            ])));
            crate::harden(s, &profile, &host)?
        };
        spec.set_annotations(None);
        let overrides = Overrides {
            memory: Some(Size(64 << 20)),
            pids: Some(50),
            timeout: Some((std::time::Duration::from_secs(5), "--timeout 5000ms".into())),
            ..Overrides::default()
        };
        let typed = crate::harden_with(spec, &profile, &host, &overrides)?;
        assert_eq!(
            typed
                .spec
                .linux()
                .as_ref()
                .and_then(|l| l.resources().clone()),
            annotated
                .spec
                .linux()
                .as_ref()
                .and_then(|l| l.resources().clone())
        );
        assert_eq!(typed.deadline, Some(std::time::Duration::from_secs(5)));
        assert_eq!(typed.deadline, annotated.deadline);
        assert_eq!(typed.attestation, annotated.attestation);
        Ok(())
    }
}
