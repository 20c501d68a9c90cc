//! Lays out the functions runsbx runs first and together in its binary.
//!
//! A run, a call or a pool's worker executes about 2 MB of runsbx's 12 MB
//! of code, and the kernel maps a binary's cached pages 64 KB around each
//! page a process faults in (fault-around). Scattered over the binary, those
//! 2 MB have every runsbx process map about 7 MB of code: its peak RSS, its
//! page faults, and the same again in each process it forks (a fork does
//! not copy the mappings of a file's pages). See docs/architecture.md,
//! "Code layout".
//!
//! hot-functions.txt, beside this file, lists those functions (made by
//! running the workloads: hack/hot-functions.sh) by their v0 symbols
//! (`symbol-mangling-version` in .cargo/config.toml), with crate hashes
//! and the back-references that count bytes past them as wildcards, and
//! the code of the C libraries linked in (glibc, libseccomp) by archive
//! member (`libc.a:malloc.o`, or in the rlib of the crate that built it:
//! `liblibseccomp_sys-*.rlib:libseccomp_la-api.o`), since C code has no
//! section per function. This writes it as a linker script that puts their
//! sections, in that order, in a `.text.hot` section inserted before
//! `.text`: an addition to the linker's default layout, which rust-lld (the
//! default linker here) and GNU ld both read.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-changed=hot-functions.txt");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let Ok(list) = std::fs::read_to_string(dir.join("hot-functions.txt")) else {
        return;
    };
    let mut script = String::from("SECTIONS {\n  .text.hot : {\n");
    for name in list
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if let Some((archive, member)) = name.split_once(':') {
            // All of the member's code: glibc's string functions have a
            // section per CPU variant (`.text.avx2`, `.text.evex`).
            let _ = writeln!(script, "    *{archive}:{member}(.text .text.*)");
        } else {
            // A function LLVM marked cold is in `.text.unlikely.NAME`; a
            // local one ThinLTO promoted has a `.llvm.N` suffix. No v0
            // symbol is the start of another's, so the trailing `*`
            // matches only those.
            let _ = writeln!(script, "    *(.text.{name}* .text.unlikely.{name}*)");
        }
    }
    script.push_str("  }\n} INSERT BEFORE .text;\n");
    let out =
        PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("hot-functions.ld");
    if let Err(e) = std::fs::write(&out, script) {
        eprintln!("runsbx build script: write {}: {e}", out.display());
        std::process::exit(1);
    }
    println!("cargo::rustc-link-arg-bin=runsbx=-Wl,-T,{}", out.display());
}
