//! `runsbx image`: the local images `runsbx call` runs on.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use runsbx_runtime::image::{BuildOptions, ImageInfo, ImageStore};

#[derive(Subcommand, Debug)]
pub enum ImageCmd {
    /// Build an image from a recipe: `python` is Debian's python3, made by
    /// debootstrap from the mirror apt uses (needs root; a few minutes)
    Build {
        /// The recipe, and the image's name (only `python`)
        name: String,
        /// The Debian mirror (default: the one in this host's apt sources)
        #[arg(long, env = "RUNSBX_MIRROR", value_name = "URL")]
        mirror: Option<String>,
        /// Replace an image of the same name
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        store: Store,
    },
    /// Import a docker-archive or oci-archive (`podman save`, `docker save`)
    Import {
        /// The archive file
        file: PathBuf,
        /// The image's name (default: the name in the archive, without
        /// registry, path and tag)
        #[arg(long)]
        name: Option<String>,
        /// Replace an image of the same name
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        store: Store,
    },
    /// List the images
    Ls {
        /// Print a JSON array
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: Store,
    },
    /// Remove images
    Rm {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        store: Store,
    },
}

#[derive(Args, Debug)]
pub struct Store {
    /// runsbx's data directory, where images are kept (default:
    /// /var/lib/runsbx as root, ~/.local/share/runsbx otherwise)
    #[arg(long, env = "RUNSBX_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

impl Store {
    fn open(&self) -> Result<ImageStore> {
        Ok(ImageStore::open(
            self.data_dir.as_deref(),
            runsbx_runtime::sys::privilege::rootless(),
        )?)
    }
}

pub fn run(cmd: ImageCmd) -> Result<i32> {
    match cmd {
        ImageCmd::Build {
            name,
            mirror,
            replace,
            store,
        } => {
            let info = store
                .open()?
                .build(&name, &BuildOptions { mirror, replace })?;
            done(&info)?;
        }
        ImageCmd::Import {
            file,
            name,
            replace,
            store,
        } => {
            let info = store.open()?.import(&file, name.as_deref(), replace)?;
            done(&info)?;
        }
        ImageCmd::Ls { json, store } => list(&store.open()?.list()?, json)?,
        ImageCmd::Rm { names, store } => return remove(&store.open()?, &names),
    }
    Ok(0)
}

/// The name on stdout, for scripts; the rest on stderr.
fn done(info: &ImageInfo) -> Result<()> {
    eprintln!(
        "runsbx: image `{}` ready: {} in {}",
        info.name,
        human(info.size),
        info.path.display()
    );
    writeln!(std::io::stdout(), "{}", info.name).context("write to stdout")
}

fn list(images: &[ImageInfo], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, images).context("write JSON to stdout")?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:>9}  {:<20}  SOURCE",
        "NAME", "SIZE", "CREATED"
    )?;
    for i in images {
        writeln!(
            out,
            "{:<24} {:>9}  {:<20}  {}",
            i.name,
            human(i.size),
            i.created.format("%Y-%m-%d %H:%M:%S"),
            i.source
        )?;
    }
    Ok(())
}

/// Removes each image, going on past one that fails (as `rm`); exits
/// with the code of the first failure.
fn remove(store: &ImageStore, names: &[String]) -> Result<i32> {
    let mut code = 0;
    for name in names {
        match store.remove(name) {
            Ok(()) => writeln!(std::io::stdout(), "{name}").context("write to stdout")?,
            Err(e) => {
                if code == 0 {
                    code = runsbx_runtime::ErrorKind::of_image(&e).exit_code();
                }
                eprintln!("runsbx: error: {:#}", anyhow::Error::from(e));
            }
        }
    }
    Ok(code)
}

/// 1536 → "1.5 KB".
fn human(bytes: u64) -> String {
    let mut value = bytes as f64;
    for unit in ["B", "KB", "MB", "GB"] {
        if value < 1000.0 {
            return format!("{value:.1} {unit}");
        }
        value /= 1000.0;
    }
    format!("{value:.1} TB")
}
