//! Request rules: which HTTP requests an allowlist entry lets through.
//!
//! An egress allowlist entry is `[METHODS ]AUTHORITY[/PATH_GLOB]`:
//!
//! - `github.com` lets any request to github.com through (the proxy
//!   tunnels HTTPS without looking inside);
//! - `GET,HEAD github.com/org/**` only GET and HEAD of a path below
//!   `/org/`; `POST pypi.org/simple/*` only POST one level below
//!   `/simple/`; `GET api.example.com` every path, GET only.
//!
//! Methods are a comma-separated list of HTTP method tokens, upper case
//! as methods are written and compared exactly, or `*` for any. In the glob, `*` stands for any run of
//! characters but `/`, `**` for any run at all; everything else is
//! literal. A glob without `?` is matched against the path alone, one
//! with `?` against the path and its query, so that
//! `GET git.example.com/**/info/refs?service=git-upload-pack` names the
//! one query a clone needs.
//!
//! Only what an entry allows passes; there are no deny rules. That keeps
//! the check fail-closed: a request target spelled unusually (percent
//! escapes, dot segments) can only fail to match an allowance, never slip
//! past a denial. Targets that servers may read as another path (`..`
//! segments, encoded `/` or `\`) are refused outright by [`Target::parse`].
//!
//! Host and port are matched by the egress proxy's allowlist; this module
//! is the pure part the proxy asks about method and path.

use std::fmt;

/// The longest glob an entry may carry; matching costs its length times
/// the request target's.
const MAX_GLOB: usize = 512;

/// What one allowlist entry allows of the requests to its hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRule {
    /// Upper-case method tokens; `None` for any method.
    methods: Option<Vec<String>>,
    glob: Glob,
}

/// An allowlist entry split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// `host`, `host:port`, `*.suffix[:port]` or an IP literal, for the
    /// proxy's allowlist to parse.
    pub authority: &'a str,
    /// `None` when the entry names neither methods nor a path: any request.
    pub rule: Option<RequestRule>,
}

impl<'a> Entry<'a> {
    /// Splits `entry` (trimmed) into methods, authority and glob. The
    /// error is the reason alone; the caller names the entry.
    pub fn parse(entry: &'a str) -> Result<Self, String> {
        let entry = entry.trim();
        // A first word in upper case (and commas) is a method list; any
        // other is part of the host, whose parser says what is wrong with
        // it (`exa mple.com` is a typo, not the method `exa`).
        let (methods, rest) = match entry.split_once(char::is_whitespace) {
            Some((methods, rest))
                if methods
                    .bytes()
                    .all(|b| b == b',' || (is_tchar(b) && !b.is_ascii_lowercase())) =>
            {
                (Some(parse_methods(methods)?), rest.trim_start())
            }
            _ => (None, entry),
        };
        // Without methods, a space is the host's to refuse.
        if methods.is_some() && rest.contains(char::is_whitespace) {
            return Err("write `METHODS HOST[:PORT]/PATH`: one space, after the methods".into());
        }
        let (authority, glob) = match rest.find('/') {
            Some(slash) => (&rest[..slash], Some(Glob::parse(&rest[slash..])?)),
            None => (rest, None),
        };
        let rule = match (methods, glob) {
            (None, None) => None,
            (methods, glob) => Some(RequestRule {
                methods: methods.flatten(),
                glob: glob.unwrap_or_else(Glob::any),
            }),
        };
        Ok(Self { authority, rule })
    }
}

impl RequestRule {
    /// Whether a request with `method` and `target` passes. The target is
    /// what [`Target::parse`] made of the request's.
    pub fn allows(&self, method: &str, target: &Target) -> bool {
        let method_ok = match &self.methods {
            None => true,
            Some(methods) => methods.iter().any(|m| m == method),
        };
        method_ok && self.glob.matches(target)
    }
}

impl fmt::Display for RequestRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.methods {
            None => f.write_str("*")?,
            Some(methods) => f.write_str(&methods.join(","))?,
        }
        write!(f, " {}", self.glob.text)
    }
}

fn parse_methods(list: &str) -> Result<Option<Vec<String>>, String> {
    if list == "*" {
        return Ok(None);
    }
    let mut methods = Vec::new();
    for method in list.split(',') {
        if method.is_empty() {
            return Err(format!(
                "`{list}` is not a method list: write methods such as `GET,HEAD` (no spaces), \
                 or `*` for any"
            ));
        }
        if !methods.iter().any(|m| m == method) {
            methods.push(method.to_owned());
        }
    }
    Ok(Some(methods))
}

/// RFC 9110 token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Byte(u8),
    /// `*`: any run of bytes but `/`.
    Star,
    /// `**`: any run of bytes.
    Stars,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Glob {
    text: String,
    tokens: Vec<Token>,
    /// The glob names a query: matched against path and query.
    with_query: bool,
}

impl Glob {
    fn any() -> Self {
        Self {
            text: "/**".to_owned(),
            tokens: vec![Token::Byte(b'/'), Token::Stars],
            with_query: false,
        }
    }

    fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_GLOB {
            return Err(format!("the path is longer than {MAX_GLOB} bytes"));
        }
        if let Some(c) = text
            .chars()
            .find(|c| !c.is_ascii_graphic() || matches!(c, '[' | ']' | '{' | '}' | '\\' | '#'))
        {
            return Err(format!(
                "`{}` in the path: only `*` (within a segment) and `**` (across segments) are \
                 wildcards, and a path is printable ASCII without `#`, `\\`, brackets or braces",
                c.escape_default()
            ));
        }
        if text.contains("***") {
            return Err("`***` in the path: write `*` or `**`".into());
        }
        let (path, _) = text.split_once('?').unwrap_or((text, ""));
        if path.split('/').skip(1).any(|s| s == "." || s == "..") {
            return Err("`.` or `..` segment in the path: a request with one is refused anyway, so the rule would never match".into());
        }
        let mut tokens = Vec::with_capacity(text.len());
        let mut bytes = text.bytes().peekable();
        while let Some(b) = bytes.next() {
            tokens.push(match b {
                b'*' if bytes.peek() == Some(&b'*') => {
                    bytes.next();
                    Token::Stars
                }
                b'*' => Token::Star,
                b => Token::Byte(b),
            });
        }
        Ok(Self {
            text: text.to_owned(),
            tokens,
            with_query: text.contains('?'),
        })
    }

    fn matches(&self, target: &Target) -> bool {
        let subject = if self.with_query {
            target.path_and_query.as_bytes()
        } else {
            target.path()
        };
        glob_match(&self.tokens, subject)
    }
}

/// Whether `tokens` match all of `subject`: the set of glob positions
/// reachable after each byte, so time is glob length times subject length
/// whatever the pattern (no backtracking).
fn glob_match(tokens: &[Token], subject: &[u8]) -> bool {
    let n = tokens.len();
    // live[i]: the first i tokens can match the bytes read so far.
    let mut live = vec![false; n + 1];
    live[0] = true;
    close_stars(tokens, &mut live);
    let mut next = vec![false; n + 1];
    for &b in subject {
        next.iter_mut().for_each(|x| *x = false);
        for i in 0..n {
            if !live[i] {
                continue;
            }
            match tokens[i] {
                Token::Byte(t) if t == b => next[i + 1] = true,
                Token::Byte(_) => {}
                // A star stays where it is while it eats a byte.
                Token::Star if b != b'/' => next[i] = true,
                Token::Star => {}
                Token::Stars => next[i] = true,
            }
        }
        close_stars(tokens, &mut next);
        std::mem::swap(&mut live, &mut next);
        if !live.contains(&true) {
            return false;
        }
    }
    live[n]
}

/// A star may also match nothing: where one is live, so is what follows.
fn close_stars(tokens: &[Token], live: &mut [bool]) {
    for i in 0..tokens.len() {
        if live[i] && matches!(tokens[i], Token::Star | Token::Stars) {
            live[i + 1] = true;
        }
    }
}

/// A request target (origin form, `/path?query`) fit to be matched: its
/// path with the escapes of unreserved characters undone (`%41` is `A`),
/// so that a client spelling a path with escapes still matches the rule
/// that allows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    path_and_query: String,
    path_len: usize,
}

impl Target {
    /// Refuses, with the reason, a target that a server could read as
    /// another path than the one matched: `.` or `..` segments (also
    /// escaped), an escaped `/` or `\`, a `\`, an escaped NUL, a bad escape.
    pub fn parse(target: &str) -> Result<Self, &'static str> {
        if !target.starts_with('/') {
            return Err("the request target is not a path");
        }
        if !target.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the request target is not printable ASCII");
        }
        let (path, query) = match target.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (target, None),
        };
        let mut out = String::with_capacity(target.len());
        let mut bytes = path.bytes();
        while let Some(b) = bytes.next() {
            match b {
                b'\\' => return Err("`\\` in the request path"),
                b'%' => {
                    let hex = [bytes.next(), bytes.next()];
                    let [Some(h), Some(l)] = hex else {
                        return Err("a bad `%` escape in the request path");
                    };
                    let (Some(h), Some(l)) = ((h as char).to_digit(16), (l as char).to_digit(16))
                    else {
                        return Err("a bad `%` escape in the request path");
                    };
                    let c = (h * 16 + l) as u8;
                    if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                        out.push(c as char);
                    } else if matches!(c, b'/' | b'\\' | 0) {
                        return Err("an escaped `/`, `\\` or NUL in the request path");
                    } else {
                        // Reserved and other bytes keep their escape, upper
                        // case, as RFC 3986 normalises it.
                        out.push_str(&format!("%{c:02X}"));
                    }
                }
                b => out.push(b as char),
            }
        }
        if out.split('/').skip(1).any(|s| s == "." || s == "..") {
            return Err("a `.` or `..` segment in the request path");
        }
        let path_len = out.len();
        if let Some(query) = query {
            out.push('?');
            out.push_str(query);
        }
        Ok(Self {
            path_and_query: out,
            path_len,
        })
    }

    fn path(&self) -> &[u8] {
        &self.path_and_query.as_bytes()[..self.path_len]
    }

    /// The path as rules match it: unreserved escapes undone, no query.
    pub fn path_str(&self) -> &str {
        &self.path_and_query[..self.path_len]
    }
}

#[cfg(test)]
#[path = "request_rule_tests.rs"]
mod tests;
