//! Building an image from a recipe (bundles/images/*.toml) with
//! debootstrap, from the Debian mirror this machine's apt already uses.

use std::fs::{self, Permissions};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use pathrs::flags::OpenFlags;
use pathrs::Root;
use serde::Deserialize;

use super::layer::children;
use super::{progress, ImageConfig};
use crate::error::{ImageError, Result};
use crate::mountinfo::unmount_under;

/// The recipes runsbx can build, by image name.
const RECIPES: &[(&str, &str)] = &[(
    "python",
    include_str!("../../../bundles/images/python.toml"),
)];

/// Where apt keeps its sources and its configuration.
const APT_SOURCES: &str = "/etc/apt/sources.list";
const APT_SOURCES_DIR: &str = "/etc/apt/sources.list.d";
const APT_CONF: &str = "/etc/apt/apt.conf";
const APT_CONF_DIR: &str = "/etc/apt/apt.conf.d";

/// debootstrap's own search path, whatever runsbx was started with.
const BUILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How `runsbx image build` is to build.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The Debian mirror (default: the one apt uses for the recipe's suite).
    pub mirror: Option<String>,
    /// Replace an existing image of the same name.
    pub replace: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Recipe {
    suite: String,
    variant: String,
    include: Vec<String>,
    /// Directories whose contents the image does without.
    #[serde(default)]
    remove_contents: Vec<String>,
    #[serde(default)]
    config: ImageConfig,
}

/// A build, resolved against this host before anything is written.
#[derive(Debug)]
pub(super) struct Plan {
    recipe: Recipe,
    debootstrap: PathBuf,
    mirror: String,
    proxy_env: Vec<(&'static str, String)>,
}

impl Plan {
    /// "debootstrap bookworm http://deb.debian.org/debian", for image.json.
    pub(super) fn source(&self) -> String {
        format!("debootstrap {} {}", self.recipe.suite, self.mirror)
    }
}

/// Checks that recipe `name` can be built here and how.
pub(super) fn plan(name: &str, opts: &BuildOptions, rootless: bool) -> Result<Plan> {
    let recipe = recipe(name)?;
    let what = format!("image build {name}");
    if rootless {
        return Err(ImageError::unsupported(
            what,
            format!(
                "debootstrap needs root: run `sudo runsbx image build {name}`, or import an \
                 image saved by podman or docker: `runsbx image import FILE`"
            ),
        ));
    }
    let debootstrap = find_program("debootstrap").ok_or_else(|| {
        ImageError::unsupported(
            &what,
            "debootstrap is not installed (`apt-get install debootstrap`)",
        )
    })?;
    let mirror = match &opts.mirror {
        Some(mirror) => mirror.clone(),
        None => {
            mirror_in_sources(&read_all(apt_source_files()), &recipe.suite).ok_or_else(|| {
                ImageError::invalid(
                    &what,
                    format!(
                        "no apt source in {APT_SOURCES} or {APT_SOURCES_DIR} lists suite `{}`; \
                         pass the Debian mirror: --mirror URL",
                        recipe.suite
                    ),
                )
            })?
        }
    };
    let conf = read_all(apt_conf_files());
    let mut proxy_env = Vec::new();
    for (scheme, var) in [("http", "http_proxy"), ("https", "https_proxy")] {
        if std::env::var_os(var).is_some() {
            continue;
        }
        if let Some(proxy) = apt_proxy(&conf, scheme) {
            proxy_env.push((var, proxy));
        }
    }
    Ok(Plan {
        recipe,
        debootstrap,
        mirror,
        proxy_env,
    })
}

/// Runs debootstrap into `rootfs` and trims the result; returns the
/// image config of the recipe.
pub(super) fn run(plan: &Plan, rootfs: &Path) -> Result<ImageConfig> {
    let r = &plan.recipe;
    let started = Instant::now();
    let mut cmd = Command::new(&plan.debootstrap);
    cmd.arg(format!("--variant={}", r.variant))
        .arg(format!("--include={}", r.include.join(",")))
        .arg(&r.suite)
        .arg(rootfs)
        .arg(&plan.mirror)
        .env("PATH", BUILD_PATH)
        .envs(plan.proxy_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    // Its progress goes to stderr, with ours; stdout stays for results.
    if let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() {
        cmd.stdout(Stdio::from(fd));
    }
    progress(&format!(
        "debootstrap {} from {} (a few minutes){}",
        r.suite,
        plan.mirror,
        plan.proxy_env
            .iter()
            .map(|(k, v)| format!(", {k}={v}"))
            .collect::<String>()
    ));
    let status = cmd
        .status()
        .map_err(|e| ImageError::io(format!("run {:?}", plan.debootstrap), e));
    // debootstrap mounts /proc and /sys in its target; a failed one may
    // leave them there.
    unmount_under(rootfs)?;
    let status = status?;
    if !status.success() {
        show_log_tail(&rootfs.join("debootstrap/debootstrap.log"));
        return Err(ImageError::io(
            format!("debootstrap {} into {rootfs:?}", r.suite),
            std::io::Error::other(format!(
                "debootstrap failed ({status}); see its output above"
            )),
        ));
    }
    trim(rootfs, &r.remove_contents)?;
    progress(&format!(
        "debootstrap done in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(r.config.clone())
}

fn recipe(name: &str) -> Result<Recipe> {
    let Some((_, text)) = RECIPES.iter().find(|(n, _)| *n == name) else {
        let known: Vec<&str> = RECIPES.iter().map(|(n, _)| *n).collect();
        return Err(ImageError::invalid(
            format!("image recipe `{name}`"),
            format!(
                "runsbx can build {}; import any other image with `runsbx image import FILE`",
                known.join(", ")
            ),
        ));
    };
    toml::from_str(text)
        .map_err(|e| ImageError::invalid(format!("image recipe `{name}`"), e.to_string()))
}

/// What a built tree should not carry: the package cache and lists (tens
/// of MB, and apt cannot run on a read-only rootfs anyway), what the
/// recipe removes, and the build host's resolv.conf and hostname, which
/// debootstrap copies in.
fn trim(rootfs: &Path, remove_contents: &[String]) -> Result<()> {
    let ctx = |what: &str| format!("trim {rootfs:?}: {what}");
    let root =
        Root::open(rootfs).map_err(|e| ImageError::io(ctx("open"), std::io::Error::other(e)))?;
    let io =
        |what: &str, e: pathrs::error::Error| ImageError::io(ctx(what), std::io::Error::other(e));
    let debs = children(&root, Path::new("var/cache/apt/archives"))
        .map_err(|e| ImageError::io(ctx("list var/cache/apt/archives"), e))?;
    for deb in debs
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
    {
        root.remove_file(deb).map_err(|e| io("remove a .deb", e))?;
    }
    let dirs =
        std::iter::once("var/lib/apt/lists").chain(remove_contents.iter().map(String::as_str));
    for dir in dirs {
        let entries = children(&root, Path::new(dir))
            .map_err(|e| ImageError::io(ctx(&format!("list {dir}")), e))?;
        for entry in entries {
            root.remove_all(&entry)
                .map_err(|e| io(&format!("remove {}", entry.display()), e))?;
        }
    }
    for file in ["etc/resolv.conf", "etc/hostname"] {
        match root.remove_file(file) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    pathrs::error::ErrorKind::OsError(Some(libc::ENOENT))
                ) => {}
            Err(e) => return Err(io(file, e)),
        }
        // Empty, but there: an engine bind-mounts its own over them.
        root.create_file(
            file,
            OpenFlags::O_WRONLY | OpenFlags::O_EXCL,
            &Permissions::from_mode(0o644),
        )
        .map_err(|e| io(file, e))?;
    }
    Ok(())
}

fn show_log_tail(log: &Path) {
    if let Ok(text) = fs::read_to_string(log) {
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("runsbx: the end of {log:?}:");
        for line in &lines[lines.len().saturating_sub(20)..] {
            eprintln!("  {line}");
        }
    }
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(BUILD_PATH.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

fn apt_source_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from(APT_SOURCES)];
    files.extend(
        sorted_dir(Path::new(APT_SOURCES_DIR))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "list" || e == "sources")),
    );
    files
}

fn apt_conf_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from(APT_CONF)];
    files.extend(sorted_dir(Path::new(APT_CONF_DIR)));
    files
}

fn sorted_dir(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// The files that exist, as (path, text).
fn read_all(files: Vec<PathBuf>) -> Vec<(PathBuf, String)> {
    files
        .into_iter()
        .filter_map(|p| fs::read_to_string(&p).ok().map(|t| (p, t)))
        .collect()
}

/// The first mirror apt's sources give for `suite`: deb822 `.sources`
/// stanzas (`Types: deb`, `URIs:`, `Suites:`) or one-line
/// `deb [options] URI suite components` entries.
fn mirror_in_sources(files: &[(PathBuf, String)], suite: &str) -> Option<String> {
    files.iter().find_map(|(path, text)| {
        let uris = if path.extension().is_some_and(|e| e == "sources") {
            deb822_uris(text, suite)
        } else {
            one_line_uris(text, suite)
        };
        uris.into_iter().find(|u| usable_by_debootstrap(u))
    })
}

fn usable_by_debootstrap(uri: &str) -> bool {
    ["http://", "https://", "ftp://", "file:/"]
        .iter()
        .any(|scheme| uri.starts_with(scheme))
}

/// The URIs of the enabled `deb` stanzas of a deb822 file that list
/// `suite` (sources.list(5)).
fn deb822_uris(text: &str, suite: &str) -> Vec<String> {
    let mut uris = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut flush = |fields: &mut Vec<(String, String)>| {
        let get = |key: &str| {
            fields
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v.as_str())
                .unwrap_or_default()
        };
        let has = |key: &str, word: &str| get(key).split_whitespace().any(|w| w == word);
        if has("Types", "deb") && has("Suites", suite) && !get("Enabled").eq_ignore_ascii_case("no")
        {
            uris.extend(get("URIs").split_whitespace().map(str::to_owned));
        }
        fields.clear();
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            flush(&mut fields);
        } else if line.starts_with('#') {
            // A comment, also inside a stanza.
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
        } else if let Some((key, value)) = line.split_once(':') {
            fields.push((key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    flush(&mut fields);
    uris
}

/// The URIs of one-line `deb` entries for `suite`.
fn one_line_uris(text: &str, suite: &str) -> Vec<String> {
    let mut uris = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            continue;
        }
        let mut uri = words.next();
        // `[arch=amd64 signed-by=…]`, possibly with spaces inside.
        if uri.is_some_and(|w| w.starts_with('[')) {
            let mut word = uri;
            while let Some(w) = word {
                if w.ends_with(']') {
                    break;
                }
                word = words.next();
            }
            uri = words.next();
        }
        if let (Some(uri), Some(s)) = (uri, words.next()) {
            if s == suite {
                uris.push(uri.to_owned());
            }
        }
    }
    uris
}

/// apt's proxy for `scheme` (`Acquire::http::Proxy "URL";`), the last
/// setting winning as in apt; `DIRECT` or `false` means none. Only the
/// one-line form: the nested `Acquire { http { Proxy …` form is not read.
fn apt_proxy(files: &[(PathBuf, String)], scheme: &str) -> Option<String> {
    let key = format!("acquire::{scheme}::proxy");
    let mut proxy = None;
    for (_, text) in files {
        for line in text.lines() {
            let line = line.trim();
            let Some(prefix) = line.get(..key.len()) else {
                continue;
            };
            let rest = &line[key.len()..];
            if !prefix.eq_ignore_ascii_case(&key) || !rest.starts_with([' ', '\t', '"']) {
                continue;
            }
            let Some(value) = rest.split('"').nth(1) else {
                continue;
            };
            proxy = match value {
                "" | "DIRECT" | "false" => None,
                v => Some(v.to_owned()),
            };
        }
    }
    proxy
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
        list.iter()
            .map(|(p, t)| (PathBuf::from(p), (*t).to_owned()))
            .collect()
    }

    /// This host's file, comments inside stanzas and all.
    const DEB822: &str = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

    #[test]
    fn mirror_from_deb822_sources() {
        let f = files(&[("/etc/apt/sources.list.d/debian.sources", DEB822)]);
        assert_eq!(
            mirror_in_sources(&f, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
        assert_eq!(
            mirror_in_sources(&f, "bookworm-security").as_deref(),
            Some("http://deb.debian.org/debian-security")
        );
        assert_eq!(mirror_in_sources(&f, "trixie"), None);

        let disabled = "Types: deb-src deb\nURIs: https://a.example/debian\n  https://b.example/debian\nSuites: bookworm\nEnabled: no\n\n\
                        Types: deb-src\nURIs: https://src.example/debian\nSuites: bookworm\n\n\
                        types: deb\nuris: cdrom:[Debian]/ https://c.example/debian\nsuites: bookworm\n";
        let f = files(&[("/x.sources", disabled)]);
        assert_eq!(
            mirror_in_sources(&f, "bookworm").as_deref(),
            Some("https://c.example/debian")
        );
    }

    #[test]
    fn mirror_from_one_line_sources() {
        let text = "\
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [ arch=amd64 signed-by=/usr/share/keyrings/x.gpg ] http://opts.example/debian bookworm-updates main
deb [arch=amd64] http://mirror.example/debian bookworm main contrib # trailing
deb http://other.example/debian bookworm main
";
        let f = files(&[
            ("/etc/apt/sources.list", ""),
            ("/etc/apt/sources.list.d/x.list", text),
        ]);
        assert_eq!(
            mirror_in_sources(&f, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            mirror_in_sources(&f, "bookworm-updates").as_deref(),
            Some("http://opts.example/debian")
        );
    }

    #[test]
    fn proxy_from_apt_conf() {
        let f = files(&[
            ("/etc/apt/apt.conf.d/10proxy", "Acquire::http::Proxy \"http://10.0.0.1:3128\";\n"),
            (
                "/etc/apt/apt.conf.d/20other",
                "acquire::HTTP::proxy::deb.example \"DIRECT\";\nAcquire::https::Proxy \"http://p:1\";\n",
            ),
        ]);
        assert_eq!(
            apt_proxy(&f, "http").as_deref(),
            Some("http://10.0.0.1:3128")
        );
        assert_eq!(apt_proxy(&f, "https").as_deref(), Some("http://p:1"));
        let off = files(&[
            ("/a", "Acquire::http::Proxy \"http://x:1\";"),
            ("/b", "Acquire::http::Proxy \"DIRECT\";"),
        ]);
        assert_eq!(apt_proxy(&off, "http"), None);
    }

    #[test]
    fn the_python_recipe_parses() {
        let r = recipe("python").unwrap();
        assert_eq!(r.suite, "bookworm");
        assert!(r.include.iter().any(|p| p == "python3"));
        assert_eq!(r.config.cmd, ["python3"]);
        assert!(r.config.env.iter().any(|e| e.starts_with("PATH=")));
        assert!(recipe("nope").is_err());
    }
}
