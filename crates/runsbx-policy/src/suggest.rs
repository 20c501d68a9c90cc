//! `runsbx profile suggest`: the narrowest profile that would have let
//! through what learn mode saw. Pure: observations in, a profile's TOML
//! out, every allowance with the reason it is there.
//!
//! Learn mode only reports; it never widens a sandbox. Here, too, nothing
//! is added that was not seen going out, and what was refused while
//! learning (by the proxy or by seccomp) is listed as still refused.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use crate::request_rule::Entry;
use crate::{PolicyError, Profile};

/// One request, or one tunnel, that went out while learning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `GET`, ...; `CONNECT` for a tunnel that was not read.
    pub method: String,
    pub host: String,
    pub port: u16,
    /// The path as rules match it; `None` when the request was not read
    /// (or its target was not a path a rule can name).
    pub path: Option<String>,
    pub count: u64,
}

/// Everything the records say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    /// Where they came from (a call's id, a file), for the header.
    pub sources: Vec<String>,
    pub seen: Vec<Seen>,
    /// The resolver overrides the learning runs had.
    pub resolve: BTreeMap<String, Vec<IpAddr>>,
    /// The destinations they exempted from the address checks.
    pub allow_addresses: Vec<SocketAddr>,
    /// What the proxy refused, one line each (`POST a.test:443/x:
    /// request_not_allowed`).
    pub refused: Vec<String>,
    /// What seccomp denied, one line each (`mount by python3, 1 time`).
    pub syscalls: Vec<String>,
}

/// One allowlist entry and why it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowance {
    pub entry: String,
    pub reason: String,
}

/// The longest path written as it is; a longer one is cut at a `/` and
/// ends in `/**`, within the rules' own bound.
const MAX_LITERAL: usize = 480;

/// The allowlist entries that let through exactly what was seen: each
/// path with the methods used on it, and a destination whose requests
/// were not read allowed whole (nothing narrower would have let it
/// through). Ports are always written: an entry without one would also
/// open the other of 80 and 443.
pub fn allowances(seen: &[Seen]) -> Vec<Allowance> {
    let mut whole: BTreeMap<(String, u16), u64> = BTreeMap::new();
    // (host, port, glob) -> method -> count
    type Methods = BTreeMap<String, u64>;
    let mut rules: BTreeMap<(String, u16, String), Methods> = BTreeMap::new();
    for s in seen {
        let host = s.host.to_ascii_lowercase();
        match &s.path {
            Some(path) => {
                *rules
                    .entry((host, s.port, literal_glob(path)))
                    .or_default()
                    .entry(s.method.clone())
                    .or_default() += s.count;
            }
            None => *whole.entry((host, s.port)).or_default() += s.count,
        }
    }
    let mut out = Vec::new();
    for ((host, port), count) in &whole {
        out.push(Allowance {
            entry: authority(host, *port),
            reason: format!(
                "{count} connection{} whose requests were not read (a tunnel the proxy \
                 could not inspect, or a target no rule can name): allowed whole",
                plural(*count)
            ),
        });
    }
    for ((host, port, glob), methods) in &rules {
        // A destination allowed whole needs no rules beside.
        if whole.contains_key(&(host.clone(), *port)) {
            continue;
        }
        let names: Vec<&str> = methods.keys().map(String::as_str).collect();
        let counts: Vec<String> = methods
            .iter()
            .map(|(m, n)| format!("{m} {n} time{}", plural(*n)))
            .collect();
        out.push(Allowance {
            entry: format!("{} {}{glob}", names.join(","), authority(host, *port)),
            reason: format!("seen: {}", counts.join(", ")),
        });
    }
    out
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `host:port`, an IPv6 address in brackets.
fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A glob that matches `path` (as rules match it). Characters a glob
/// cannot hold as themselves (`*`, brackets, braces, `#`) become `*`,
/// which matches them and a little more within their segment; a path
/// longer than [`MAX_LITERAL`] is cut at a `/` and allows below it.
pub fn literal_glob(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        let plain = c.is_ascii_graphic() && !matches!(c, '*' | '[' | ']' | '{' | '}' | '\\' | '#');
        if plain {
            out.push(c);
        } else if !out.ends_with('*') {
            // Never two stars in a row: `**` would cross segments.
            out.push('*');
        }
    }
    if out.len() > MAX_LITERAL {
        let cut = out[..MAX_LITERAL].rfind('/').unwrap_or(0);
        out.truncate(cut);
        out.push_str("/**");
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// The suggested profile: `base` (its name replaced by `name`) with an
/// egress allowlist of exactly the [`allowances`], the resolver overrides
/// and exempt destinations of the hosts they name, a comment with the
/// reason over each entry, and what was refused listed at the end. The
/// text is parsed back and compared before it is returned.
pub fn render(base: &Profile, name: &str, obs: &Observations) -> Result<String, PolicyError> {
    let allowances = allowances(&obs.seen);
    let mut profile = base.clone();
    profile.name = name.to_owned();
    profile.egress = crate::profile::Egress::default();
    let used: BTreeSet<String> = obs
        .seen
        .iter()
        .map(|s| s.host.to_ascii_lowercase())
        .collect();
    for (host, ips) in &obs.resolve {
        if let (true, Some(ip)) = (used.contains(&host.to_ascii_lowercase()), ips.first()) {
            profile.egress.resolve.insert(host.clone(), ip.to_string());
        }
    }
    let reached: BTreeSet<IpAddr> = profile
        .egress
        .resolve
        .values()
        .filter_map(|ip| ip.parse().ok())
        .chain(
            used.iter()
                .filter_map(|h| h.trim_matches(['[', ']']).parse().ok()),
        )
        .collect();
    profile.egress.allow_addresses = obs
        .allow_addresses
        .iter()
        .filter(|a| reached.contains(&a.ip()))
        .map(ToString::to_string)
        .collect();
    profile.egress.allow = allowances.iter().map(|a| a.entry.clone()).collect();

    let bad = |reason: String| PolicyError::Profile {
        origin: format!("suggested profile `{name}`"),
        reason,
    };
    let mut table = toml::Table::try_from(&profile).map_err(|e| bad(e.to_string()))?;
    table.remove("egress");
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Suggested by `runsbx profile suggest` from {}.\n\
         # The profile `{}` with its egress allowlist replaced by exactly what\n\
         # went out while learning: each entry says why it is there.",
        obs.sources.join(", "),
        base.name
    );
    text.push_str(&toml::to_string(&table).map_err(|e| bad(e.to_string()))?);
    text.push_str("\n[egress]\n");
    if allowances.is_empty() {
        text.push_str("# Nothing went out: no egress at all.\n");
    }
    text.push_str("allow = [\n");
    for a in &allowances {
        let _ = writeln!(text, "    # {}", a.reason);
        let _ = writeln!(text, "    {},", quoted(&a.entry));
    }
    text.push_str("]\n");
    if !profile.egress.resolve.is_empty() {
        text.push_str("# The learning runs' resolver overrides, for the names above.\n");
        text.push_str("resolve = { ");
        let pairs: Vec<String> = profile
            .egress
            .resolve
            .iter()
            .map(|(k, v)| format!("{} = {}", quoted(k), quoted(v)))
            .collect();
        text.push_str(&pairs.join(", "));
        text.push_str(" }\n");
    }
    if !profile.egress.allow_addresses.is_empty() {
        text.push_str("# Exempt from the address checks in the learning runs, and reached.\n");
        let list: Vec<String> = profile
            .egress
            .allow_addresses
            .iter()
            .map(|a| quoted(a))
            .collect();
        let _ = writeln!(text, "allow_addresses = [{}]", list.join(", "));
    }
    let listed = |text: &mut String, head: &str, lines: &[String]| {
        if !lines.is_empty() {
            let _ = writeln!(text, "\n# {head}");
            for line in lines {
                let _ = writeln!(text, "#   {}", one_line(line));
            }
        }
    };
    listed(
        &mut text,
        "Refused by the egress proxy while learning, and still refused here:",
        &obs.refused,
    );
    listed(
        &mut text,
        "Denied by seccomp while learning, and still denied (no profile allows them):",
        &obs.syscalls,
    );
    let back = Profile::from_toml(&text, &format!("suggested profile `{name}`"))?;
    if back != profile {
        return Err(bad(
            "the written profile does not read back as the one suggested".into(),
        ));
    }
    // Each entry parses, and a rule allows what it was made from.
    for a in &allowances {
        Entry::parse(&a.entry).map_err(|e| bad(format!("entry {:?}: {e}", a.entry)))?;
    }
    Ok(text)
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A line fit for a comment: printable, no line breaks.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect()
}

#[cfg(test)]
#[path = "suggest_tests.rs"]
mod tests;
