#![allow(clippy::unwrap_used)]
use super::*;

fn rule(entry: &str) -> RequestRule {
    Entry::parse(entry).unwrap().rule.unwrap()
}

fn allows(entry: &str, method: &str, target: &str) -> bool {
    rule(entry).allows(method, &Target::parse(target).unwrap())
}

#[test]
fn an_entry_without_methods_or_path_has_no_rule() {
    let e = Entry::parse(" github.com:443 ").unwrap();
    assert_eq!(e.authority, "github.com:443");
    assert_eq!(e.rule, None);
    let e = Entry::parse("*.example.com").unwrap();
    assert_eq!(e.authority, "*.example.com");
    assert_eq!(e.rule, None);
}

#[test]
fn methods_and_path_split_from_the_authority() {
    let e = Entry::parse("GET,HEAD,GET  github.com:8443/org/**").unwrap();
    assert_eq!(e.authority, "github.com:8443");
    assert_eq!(e.rule.unwrap().to_string(), "GET,HEAD /org/**");
    let e = Entry::parse("GET api.example.com").unwrap();
    assert_eq!(e.authority, "api.example.com");
    assert_eq!(e.rule.unwrap().to_string(), "GET /**");
    let e = Entry::parse("[2001:db8::1]:443/x").unwrap();
    assert_eq!(e.authority, "[2001:db8::1]:443");
    assert_eq!(e.rule.unwrap().to_string(), "* /x");
    let e = Entry::parse("* example.com/a/*").unwrap();
    assert_eq!(e.rule.unwrap().to_string(), "* /a/*");
}

#[test]
fn methods_are_exact_tokens() {
    assert!(allows("GET,HEAD h/**", "GET", "/a"));
    assert!(allows("GET,HEAD h/**", "HEAD", "/a"));
    assert!(!allows("GET,HEAD h/**", "POST", "/a"));
    // Methods are case-sensitive on the wire: `get` is not GET.
    assert!(!allows("GET h/**", "get", "/a"));
    assert!(allows("* h/**", "PROPFIND", "/a"));
    assert!(allows("h/a", "DELETE", "/a"));
}

#[test]
fn a_star_stays_within_a_segment() {
    let e = "GET h/org/*";
    assert!(allows(e, "GET", "/org/repo"));
    assert!(allows(e, "GET", "/org/"));
    assert!(!allows(e, "GET", "/org/repo/info/refs"));
    assert!(!allows(e, "GET", "/org"));
    assert!(!allows(e, "GET", "/other/repo"));
    assert!(!allows(e, "GET", "/organisation/repo"));
    assert!(allows("GET h/a/*.git/info", "GET", "/a/x.git/info"));
    assert!(!allows("GET h/a/*.git/info", "GET", "/a/x/y.git/info"));
}

#[test]
fn two_stars_cross_segments() {
    let e = "GET h/org/**";
    assert!(allows(e, "GET", "/org/repo/info/refs"));
    assert!(allows(e, "GET", "/org/"));
    assert!(!allows(e, "GET", "/org"));
    assert!(!allows(e, "GET", "/orgx/repo"));
    let e = "POST h/**/git-upload-pack";
    assert!(allows(e, "POST", "/org/repo.git/git-upload-pack"));
    assert!(!allows(e, "POST", "/org/repo.git/git-receive-pack"));
    assert!(!allows(e, "POST", "/org/repo.git/git-upload-pack/x"));
}

#[test]
fn the_query_counts_only_when_the_glob_names_one() {
    assert!(allows("GET h/api/items", "GET", "/api/items?page=2"));
    let e = "GET h/**/info/refs?service=git-upload-pack";
    assert!(allows(
        e,
        "GET",
        "/org/r.git/info/refs?service=git-upload-pack"
    ));
    assert!(!allows(
        e,
        "GET",
        "/org/r.git/info/refs?service=git-receive-pack"
    ));
    assert!(!allows(e, "GET", "/org/r.git/info/refs"));
    assert!(allows("GET h/s?q=*", "GET", "/s?q=x"));
}

#[test]
fn escapes_of_unreserved_characters_are_undone() {
    assert!(allows("GET h/org/*", "GET", "/%6Frg/repo"));
    assert!(allows("GET h/org/*", "GET", "/org/r%2Dx"));
    // Other escapes stay escapes (upper case), and never become a `/`.
    assert!(allows("GET h/a/*", "GET", "/a/x%20y"));
    assert!(allows("GET h/a/x%20y", "GET", "/a/x%20y"));
    assert!(allows("GET h/a/x%3Ay", "GET", "/a/x%3ay"));
}

#[test]
fn targets_a_server_may_read_otherwise_are_refused() {
    for target in [
        "/org/../other/repo",
        "/org/./repo",
        "/org/%2e%2e/other",
        "/org/%2E/x",
        "/org%2Fother",
        "/org%2fother",
        "/org%5Cother",
        "/org\\other",
        "/a%00",
        "/a%zz",
        "/a%4",
        "org/repo",
        "*",
        "/a\u{e9}",
    ] {
        assert!(Target::parse(target).is_err(), "{target}");
    }
    // `..` in a query is data, not a path segment.
    assert!(Target::parse("/a?x=../b").is_ok());
    assert!(Target::parse("/a..b/c.d").is_ok());
}

#[test]
fn bad_entries_say_why() {
    for (entry, needle) in [
        ("GET, POST h/x", "no spaces"),
        ("GET h /x", "one space"),
        (",GET h/x", "method list"),
        ("GET h/a[bc]", "wildcards"),
        ("GET h/a{b,c}", "wildcards"),
        ("GET h/a\\b", "wildcards"),
        ("GET h/a#b", "wildcards"),
        ("GET h/a/***", "`***`"),
        ("GET h/a/../b", "`..`"),
        ("GET h/./b", "`..`"),
    ] {
        let err = Entry::parse(entry).unwrap_err();
        assert!(err.contains(needle), "{entry}: {err}");
    }
    let long = format!("GET h/{}", "a".repeat(MAX_GLOB));
    assert!(Entry::parse(&long).unwrap_err().contains("longer"));
}

#[test]
fn matching_costs_no_backtracking() {
    // A pattern that makes a backtracking matcher try every split.
    let glob = format!("GET h/{}b", "**a".repeat(40));
    let target = format!("/{}", "a".repeat(8000));
    let t = Target::parse(&target).unwrap();
    let started = std::time::Instant::now();
    assert!(!rule(&glob).allows("GET", &t));
    // Not a timing assertion of the product: a guard that the matcher is
    // not exponential (a backtracking one takes hours here).
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}
