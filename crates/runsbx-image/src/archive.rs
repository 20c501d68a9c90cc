//! Image archives as `podman save` and `docker save` write them: a tar
//! holding a manifest, a config and the layers.
//!
//! - docker-archive: `manifest.json`, an array of `{Config, RepoTags,
//!   Layers}` naming members of the tar.
//! - oci-archive: an OCI image layout (image-spec/image-layout.md):
//!   `oci-layout`, `index.json` → manifest blob → config and layer blobs,
//!   each at `blobs/<algorithm>/<hex>`.
//!
//! The outer tar is indexed, not extracted: each member is read in place
//! by offset. A gzip-compressed outer tar is first decompressed into an
//! unnamed file (O_TMPFILE) in the store, which disappears with runsbx.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::layer::Unpacker;
use super::{progress, validate_name, ImageConfig};
use crate::error::{ImageError, Result};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// Manifests, indexes and configs are small; anything bigger is not one.
const MAX_JSON: u64 = 64 << 20;
/// Symlinks followed from one member to another (docker's legacy format
/// links repeated layers).
const MAX_LINKS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Docker,
    Oci,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Self::Docker => "docker-archive",
            Self::Oci => "oci-archive",
        }
    }
}

/// Where a member of the outer tar is.
#[derive(Debug, Clone)]
enum Member {
    Data { offset: u64, size: u64 },
    Link(String),
}

#[derive(Debug)]
struct LayerRef {
    member: String,
    media_type: Option<String>,
}

/// An opened and checked archive: what it holds, not yet unpacked.
#[derive(Debug)]
pub(super) struct Archive {
    path: PathBuf,
    file: File,
    members: HashMap<String, Member>,
    format: Format,
    config: ImageConfig,
    architecture: Option<String>,
    layers: Vec<LayerRef>,
    /// The image's name as the archive gives it (`localhost/busybox:latest`).
    reference: Option<String>,
}

impl Archive {
    /// Opens `path` and reads its manifest and config. `scratch` gives a
    /// directory for the decompressed copy of a gzip-compressed archive.
    pub(super) fn open(path: &Path, scratch: impl FnOnce() -> Result<PathBuf>) -> Result<Self> {
        let what = || format!("image archive {path:?}");
        let meta = fs::metadata(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ImageError::invalid(what(), "no such file"),
            _ => ImageError::io(what(), e),
        })?;
        if !meta.is_file() {
            return Err(ImageError::invalid(
                what(),
                "not a file (pass the file `podman save -o FILE` or `docker save -o FILE` wrote)",
            ));
        }
        let mut file = File::open(path).map_err(|e| ImageError::io(what(), e))?;
        let mut magic = [0u8; 2];
        let n = file
            .read_at(&mut magic, 0)
            .map_err(|e| ImageError::io(what(), e))?;
        if n == 2 && magic == GZIP_MAGIC {
            file = decompress(&file, &scratch()?, &what())?;
        }
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let members = index(&file).map_err(|e| {
            ImageError::invalid(
                what(),
                format!("not a docker-archive or oci-archive (not a tar: {e})"),
            )
        })?;
        let mut archive = Self {
            path,
            file,
            members,
            format: Format::Docker,
            config: ImageConfig::default(),
            architecture: None,
            layers: Vec::new(),
            reference: None,
        };
        if archive.members.contains_key("manifest.json") {
            archive.read_docker()?;
        } else if archive.members.contains_key("index.json")
            && archive.members.contains_key("oci-layout")
        {
            archive.format = Format::Oci;
            archive.read_oci()?;
        } else {
            return Err(ImageError::invalid(
                what(),
                "not a docker-archive or oci-archive: it has neither manifest.json nor \
                 oci-layout and index.json (make one with `podman save --format \
                 docker-archive|oci-archive -o FILE IMAGE` or `docker save -o FILE IMAGE`)",
            ));
        }
        if archive.layers.is_empty() {
            return Err(archive.bad("the image has no layers"));
        }
        Ok(archive)
    }

    /// "docker-archive /path/to/file", for image.json.
    pub(super) fn source(&self) -> String {
        format!("{} {}", self.format.name(), self.path.display())
    }

    /// The image name the archive carries, reduced to its last path
    /// component without tag or digest: `localhost/busybox:latest` →
    /// `busybox`.
    pub(super) fn default_name(&self) -> Result<String> {
        let Some(reference) = &self.reference else {
            return Err(ImageError::invalid(
                format!("image archive {:?}", self.path),
                "it does not name its image; pass --name NAME",
            ));
        };
        let name = short_name(reference);
        validate_name(&name).map_err(|e| {
            ImageError::invalid(
                format!("image archive {:?}", self.path),
                format!("its image is called {reference:?}, and {e}; pass --name NAME"),
            )
        })?;
        Ok(name)
    }

    /// Applies the layers in order into `rootfs`; returns the image config.
    pub(super) fn unpack(&self, rootfs: &Path, rootless: bool) -> Result<ImageConfig> {
        if let Some(arch) = self.architecture.as_deref() {
            if !arch.is_empty() && arch != host_arch() {
                progress(&format!(
                    "warning: the image is for {arch}, this host is {}: its programs may not run",
                    host_arch()
                ));
            }
        }
        let mut unpacker = Unpacker::new(rootfs, !rootless)?;
        let total = self.layers.len();
        for (i, layer) in self.layers.iter().enumerate() {
            let what = format!(
                "layer {}/{total} ({}) of {:?}",
                i + 1,
                layer.member,
                self.path
            );
            progress(&format!("unpacking layer {}/{total}", i + 1));
            let reader = self.layer_reader(layer, &what)?;
            unpacker.apply(reader, &what)?;
        }
        if unpacker.skipped > 0 {
            progress(&format!(
                "left out {} device nodes and fifos (a sandbox's /dev is its own)",
                unpacker.skipped
            ));
        }
        unpacker.finish()?;
        Ok(self.config.clone())
    }

    fn layer_reader<'a>(&'a self, layer: &LayerRef, what: &str) -> Result<Box<dyn Read + 'a>> {
        let zstd = || {
            ImageError::unsupported(
                what,
                "zstd-compressed layers are not supported; save the image with gzip or \
                 uncompressed layers (`podman save --format oci-archive` or \
                 `--format docker-archive` does)",
            )
        };
        if layer
            .media_type
            .as_deref()
            .is_some_and(|m| m.contains("zstd"))
        {
            return Err(zstd());
        }
        let mut reader = BufReader::new(self.member(&layer.member)?);
        let head = reader
            .fill_buf()
            .map_err(|e| ImageError::io(format!("read {what}"), e))?;
        if head.starts_with(&ZSTD_MAGIC) {
            return Err(zstd());
        }
        if head.starts_with(&GZIP_MAGIC) {
            return Ok(Box::new(flate2::bufread::MultiGzDecoder::new(reader)));
        }
        Ok(Box::new(reader))
    }

    fn read_docker(&mut self) -> Result<()> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            config: String,
            #[serde(default)]
            repo_tags: Option<Vec<String>>,
            layers: Vec<String>,
        }
        let entries: Vec<Entry> = self.json("manifest.json")?;
        let entry = match <[Entry; 1]>::try_from(entries) {
            Ok([entry]) => entry,
            Err(entries) => return Err(self.count_error(entries.len())),
        };
        self.read_config(&entry.config)?;
        self.reference = entry.repo_tags.and_then(|tags| tags.into_iter().next());
        self.layers = entry
            .layers
            .into_iter()
            .map(|member| LayerRef {
                member,
                media_type: None,
            })
            .collect();
        Ok(())
    }

    fn read_oci(&mut self) -> Result<()> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Layout {
            image_layout_version: String,
        }
        let layout: Layout = self.json("oci-layout")?;
        if !layout.image_layout_version.starts_with("1.") {
            return Err(self.bad(format!(
                "OCI layout version {:?} (runsbx reads 1.x)",
                layout.image_layout_version
            )));
        }
        let index: Index = self.json("index.json")?;
        let top = self.pick(index.manifests)?;
        self.reference = [
            "io.containerd.image.name",
            "org.opencontainers.image.ref.name",
        ]
        .iter()
        .find_map(|k| top.annotations.get(*k).cloned());
        // A multi-platform image: an index inside the index.
        let mut desc = top;
        for _ in 0..MAX_LINKS {
            if !desc.is_index() {
                break;
            }
            let nested: Index = self.json(&blob_member(&desc.digest)?)?;
            desc = self.pick(nested.manifests)?;
        }
        if desc.is_index() {
            return Err(self.bad("image indexes nested too deep"));
        }
        let manifest: Manifest = self.json(&blob_member(&desc.digest)?)?;
        self.read_config(&blob_member(&manifest.config.digest)?)?;
        self.layers = manifest
            .layers
            .into_iter()
            .map(|d| {
                Ok(LayerRef {
                    member: blob_member(&d.digest)?,
                    media_type: d.media_type,
                })
            })
            .collect::<Result<_>>()?;
        Ok(())
    }

    /// The one descriptor of an index for this platform.
    fn pick(&self, manifests: Vec<Descriptor>) -> Result<Descriptor> {
        let total = manifests.len();
        let mut fitting: Vec<Descriptor> = manifests
            .into_iter()
            .filter(|d| {
                d.platform
                    .as_ref()
                    .is_none_or(|p| p.os == "linux" && p.architecture == host_arch())
            })
            .collect();
        match fitting.len() {
            1 => Ok(fitting.remove(0)),
            0 if total > 0 => Err(self.bad(format!("no image for linux/{}", host_arch()))),
            n => Err(self.count_error(n)),
        }
    }

    fn read_config(&mut self, member: &str) -> Result<()> {
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Blob {
            architecture: Option<String>,
            config: Option<Process>,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "PascalCase", default)]
        struct Process {
            env: Option<Vec<String>>,
            entrypoint: Option<Vec<String>>,
            cmd: Option<Vec<String>>,
            working_dir: Option<String>,
            user: Option<String>,
        }
        let blob: Blob = self.json(member)?;
        let p = blob.config.unwrap_or_default();
        self.architecture = blob.architecture;
        self.config = ImageConfig {
            env: p.env.unwrap_or_default(),
            entrypoint: p.entrypoint.unwrap_or_default(),
            cmd: p.cmd.unwrap_or_default(),
            working_dir: p.working_dir.filter(|w| !w.is_empty()),
            user: p.user.filter(|u| !u.is_empty()),
        };
        Ok(())
    }

    fn json<T: DeserializeOwned>(&self, member: &str) -> Result<T> {
        let mut text = Vec::new();
        self.member(member)?
            .take(MAX_JSON)
            .read_to_end(&mut text)
            .map_err(|e| ImageError::io(format!("read {member} of {:?}", self.path), e))?;
        serde_json::from_slice(&text).map_err(|e| self.bad(format!("{member}: {e}")))
    }

    /// The data of member `name`, following links between members.
    fn member(&self, name: &str) -> Result<Section<'_>> {
        let mut key = clean(name);
        for _ in 0..MAX_LINKS {
            match self.members.get(&key) {
                Some(Member::Data { offset, size }) => {
                    return Ok(Section {
                        file: &self.file,
                        pos: *offset,
                        end: offset + size,
                    })
                }
                Some(Member::Link(target)) => key = target.clone(),
                None => break,
            }
        }
        Err(self.bad(format!("{name:?} is named by the manifest but missing")))
    }

    fn bad(&self, reason: impl Into<String>) -> ImageError {
        ImageError::invalid(format!("{} {:?}", self.format.name(), self.path), reason)
    }

    fn count_error(&self, n: usize) -> ImageError {
        self.bad(format!(
            "it holds {n} images; runsbx imports one (save a single image to the file)"
        ))
    }
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: Option<String>,
    digest: String,
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

impl Descriptor {
    fn is_index(&self) -> bool {
        self.media_type
            .as_deref()
            .is_some_and(|m| m.contains("image.index") || m.contains("manifest.list"))
    }
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

/// A member's bytes, read in place in the outer tar.
struct Section<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for Section<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX);
        let n = buf.len().min(left);
        if n == 0 {
            return Ok(0);
        }
        let read = self.file.read_at(&mut buf[..n], self.pos)?;
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the archive ends inside a member",
            ));
        }
        self.pos += read as u64;
        Ok(read)
    }
}

/// Where each member of the outer tar is.
fn index(file: &File) -> io::Result<HashMap<String, Member>> {
    let mut members = HashMap::new();
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries_with_seek()? {
        let entry = entry?;
        let name = clean(&String::from_utf8_lossy(&entry.path_bytes()));
        let link = || {
            entry
                .link_name_bytes()
                .map(|l| String::from_utf8_lossy(&l).into_owned())
                .unwrap_or_default()
        };
        let member = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => Member::Data {
                offset: entry.raw_file_position(),
                size: entry.size(),
            },
            // Relative to the link's directory.
            tar::EntryType::Symlink => {
                let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                Member::Link(clean(&format!("{dir}/{}", link())))
            }
            // Relative to the archive's root.
            tar::EntryType::Link => Member::Link(clean(&link())),
            _ => continue,
        };
        members.insert(name, member);
    }
    Ok(members)
}

/// A member name with `.`, empty and leading `/` components dropped and
/// `..` applied: `./abc/../manifest.json` → `manifest.json`.
fn clean(name: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// `sha256:abc…` → `blobs/sha256/abc…`.
fn blob_member(digest: &str) -> Result<String> {
    let valid = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
    };
    match digest.split_once(':') {
        Some((alg, hex)) if valid(alg, b"+._-") && valid(hex, b"=_-") => {
            Ok(format!("blobs/{alg}/{hex}"))
        }
        _ => Err(ImageError::invalid(
            format!("digest {digest:?}"),
            "not a valid OCI digest (algorithm:hex)",
        )),
    }
}

/// `localhost/busybox:latest` → `busybox`; `python@sha256:…` → `python`.
fn short_name(reference: &str) -> String {
    let without_digest = reference.split('@').next().unwrap_or_default();
    let last = without_digest.rsplit('/').next().unwrap_or_default();
    last.split(':').next().unwrap_or_default().to_owned()
}

/// The GOARCH name of this machine, as image configs spell it.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// Decompresses a gzip-compressed outer archive into an unnamed file in
/// `dir`, gone when it is closed.
fn decompress(file: &File, dir: &Path, what: &str) -> Result<File> {
    let mut out = OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .map_err(|e| ImageError::io(format!("{what}: a scratch file in {dir:?}"), e))?;
    let mut gz = flate2::read::MultiGzDecoder::new(file);
    io::copy(&mut gz, &mut out).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
            ImageError::invalid(what, format!("not a valid gzip stream: {e}"))
        }
        _ => ImageError::io(format!("{what}: decompress"), e),
    })?;
    // The index counts offsets from where the tar is read first.
    out.seek(io::SeekFrom::Start(0))
        .map_err(|e| ImageError::io(format!("{what}: decompress"), e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_from_references() {
        assert_eq!(short_name("localhost/busybox:latest"), "busybox");
        assert_eq!(short_name("docker.io/library/python:3.12-slim"), "python");
        assert_eq!(short_name("registry:5000/team/tool"), "tool");
        assert_eq!(short_name("python@sha256:abc"), "python");
        assert_eq!(short_name("busybox"), "busybox");
    }

    #[test]
    fn member_names() {
        assert_eq!(clean("./manifest.json"), "manifest.json");
        assert_eq!(clean("abc/../def/layer.tar"), "def/layer.tar");
        assert_eq!(clean("/blobs//sha256/x"), "blobs/sha256/x");
        assert_eq!(blob_member("sha256:ab12").unwrap(), "blobs/sha256/ab12");
        for bad in ["sha256", "sha256:../x", "sha256:a/b", ":x"] {
            assert!(blob_member(bad).is_err(), "{bad}");
        }
    }
}
