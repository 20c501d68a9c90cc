#![allow(clippy::unwrap_used)]
use super::*;
use crate::request_rule::Target;

fn seen(method: &str, host: &str, port: u16, path: Option<&str>, count: u64) -> Seen {
    Seen {
        method: method.into(),
        host: host.into(),
        port,
        path: path.map(Into::into),
        count,
    }
}

/// Whether `entry` lets `method` on `path` through (a whole host: any).
fn allows(entry: &str, method: &str, path: &str) -> bool {
    let entry = Entry::parse(entry).unwrap();
    let target = Target::parse(path).unwrap();
    entry.rule.is_none_or(|r| r.allows(method, &target))
}

fn entries(seen: &[Seen]) -> Vec<String> {
    allowances(seen).into_iter().map(|a| a.entry).collect()
}

#[test]
fn each_path_gets_the_methods_used_on_it_and_nothing_more() {
    let seen = [
        seen("GET", "api.test", 443, Some("/v1/items"), 2),
        seen("HEAD", "api.test", 443, Some("/v1/items"), 1),
        seen("POST", "api.test", 443, Some("/v1/items/7"), 1),
        seen("GET", "Docs.Test", 80, Some("/"), 1),
    ];
    let got = entries(&seen);
    assert_eq!(
        got,
        [
            "GET,HEAD api.test:443/v1/items",
            "POST api.test:443/v1/items/7",
            "GET docs.test:80/",
        ]
    );
    assert!(allows(&got[0], "GET", "/v1/items"));
    assert!(allows(&got[0], "GET", "/v1/items?page=2"));
    assert!(!allows(&got[0], "POST", "/v1/items"));
    assert!(!allows(&got[0], "GET", "/v1/items/7"));
    assert!(!allows(&got[1], "GET", "/v1/items/7"));
    assert!(!allows(&got[2], "GET", "/x"));
    let reasons: Vec<String> = allowances(&seen).into_iter().map(|a| a.reason).collect();
    assert_eq!(reasons[0], "seen: GET 2 times, HEAD 1 time");
}

#[test]
fn an_unread_tunnel_allows_its_destination_whole_and_alone() {
    let seen = [
        seen("CONNECT", "pypi.test", 443, None, 3),
        seen("GET", "pypi.test", 443, Some("/simple/"), 1),
        seen("GET", "pypi.test", 80, Some("/simple/"), 1),
    ];
    let all = allowances(&seen);
    assert_eq!(all[0].entry, "pypi.test:443");
    assert!(
        all[0]
            .reason
            .starts_with("3 connections whose requests were not read"),
        "{}",
        all[0].reason
    );
    // The rule for port 443 is covered by the whole host; port 80's is not.
    assert_eq!(
        entries(&seen),
        ["pypi.test:443", "GET pypi.test:80/simple/"]
    );
}

#[test]
fn an_ipv6_destination_is_bracketed() {
    let got = entries(&[seen("GET", "2001:db8::1", 8080, Some("/a"), 1)]);
    assert_eq!(got, ["GET [2001:db8::1]:8080/a"]);
}

#[test]
fn paths_a_glob_cannot_spell_still_match_and_stay_in_their_segment() {
    for (path, glob) in [
        ("/a*b/c", "/a*b/c"),
        ("/a**b", "/a*b"),
        ("/x/%5Bv%5D/[y]", "/x/%5Bv%5D/*y*"),
        ("/#frag", "/*frag"),
        ("/{}", "/*"),
    ] {
        assert_eq!(literal_glob(path), glob, "{path}");
        let entry = format!("GET h.test:443{glob}");
        assert!(Entry::parse(&entry).is_ok(), "{entry}");
        if Target::parse(path).is_ok() {
            assert!(allows(&entry, "GET", path), "{entry} {path}");
        }
        // A star never reaches past a `/`.
        assert!(!allows(&entry, "GET", &format!("{path}/deeper")) || glob.ends_with("**"));
    }
}

#[test]
fn a_very_long_path_is_allowed_below_its_last_short_enough_directory() {
    let path = format!("/d/{}/{}", "a".repeat(300), "b".repeat(300));
    let glob = literal_glob(&path);
    assert_eq!(glob, format!("/d/{}/**", "a".repeat(300)));
    let entry = format!("GET h.test:443{glob}");
    assert!(allows(&entry, "GET", &path));
    assert!(!allows(&entry, "GET", "/d/other"));
}

fn observations() -> Observations {
    Observations {
        sources: vec!["call abc".into()],
        seen: vec![
            seen("GET", "files.test", 8443, Some("/one"), 1),
            seen("GET", "files.test", 8443, Some("/two"), 1),
        ],
        resolve: BTreeMap::from([
            ("files.test".to_owned(), vec!["127.0.0.1".parse().unwrap()]),
            ("unused.test".to_owned(), vec!["127.0.0.2".parse().unwrap()]),
        ]),
        allow_addresses: vec![
            "127.0.0.1:8443".parse().unwrap(),
            "127.0.0.2:443".parse().unwrap(),
        ],
        refused: vec!["GET files.test:8443/three: request_not_allowed\nforged".into()],
        syscalls: vec!["mount by python3, 1 time".into()],
    }
}

#[test]
fn the_profile_is_the_base_with_exactly_what_was_seen() {
    let base = Profile::builtin().unwrap();
    let text = render(&base, "learned", &observations()).unwrap();
    let got = Profile::from_toml(&text, "suggested").unwrap();
    assert_eq!(got.name, "learned");
    assert_eq!(
        got.egress.allow,
        ["GET files.test:8443/one", "GET files.test:8443/two"]
    );
    // Only what the names used need.
    assert_eq!(
        got.egress.resolve,
        BTreeMap::from([("files.test".to_owned(), "127.0.0.1".to_owned())])
    );
    assert_eq!(got.egress.allow_addresses, ["127.0.0.1:8443"]);
    assert_eq!(got.egress.learn, None);
    // Everything else is the base's.
    let mut rest = got.clone();
    rest.name = base.name.clone();
    rest.egress = base.egress.clone();
    assert_eq!(rest, base);
    // It is no wider than the base but for its egress.
    assert!(got.limits == base.limits && got.capabilities.is_empty());
    // The reasons and the refusals are comments, one line each.
    assert!(
        text.contains("    # seen: GET 1 time\n    \"GET files.test:8443/one\","),
        "{text}"
    );
    assert!(
        text.contains("#   GET files.test:8443/three: request_not_allowed forged\n"),
        "{text}"
    );
    assert!(text.contains("#   mount by python3, 1 time\n"), "{text}");
    assert!(text.contains("from call abc."), "{text}");
}

#[test]
fn nothing_seen_is_no_egress() {
    let base = Profile::builtin().unwrap();
    let obs = Observations {
        sources: vec!["x".into()],
        ..Observations::default()
    };
    let text = render(&base, "quiet", &obs).unwrap();
    let got = Profile::from_toml(&text, "suggested").unwrap();
    assert!(got.egress.allow.is_empty());
    assert!(text.contains("Nothing went out"), "{text}");
}
