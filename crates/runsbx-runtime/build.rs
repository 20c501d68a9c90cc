//! Builds runsbx-stub (stub/main.rs), the program a warm sandbox waits in,
//! which runsbx embeds (see src/sandbox/stub.rs). It has no standard
//! library and no libc, so the compiler that builds runsbx builds it too,
//! for the same target, with nothing to fetch.
//!
//! Only x86_64 Linux has one (its entry point and system calls are
//! written for it). On any other target the stub is left empty, and a warm
//! sandbox waits in a fork of runsbx instead: the same behaviour, with a
//! slower exec of the command.

use std::path::PathBuf;
use std::process::{exit, Command};

fn main() {
    println!("cargo::rerun-if-changed=stub/main.rs");
    println!("cargo::rerun-if-changed=stub/syscall.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("runsbx-stub");
    let target = std::env::var("TARGET").unwrap_or_default();
    if target != "x86_64-unknown-linux-gnu" && target != "x86_64-unknown-linux-musl" {
        if let Err(e) = std::fs::write(&out, b"") {
            fail(&format!("write {}: {e}", out.display()));
        }
        return;
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let built = Command::new(rustc)
        .args([
            "--edition=2021",
            "--crate-type=bin",
            "--crate-name=runsbx_stub",
        ])
        .args(["--target", &target])
        .args([
            // No unwinding, no libc, no start files: a static executable
            // of its own code only, loaded at a fixed address.
            "-Cpanic=abort",
            "-Copt-level=s",
            "-Cdebuginfo=0",
            "-Cstrip=symbols",
            "-Crelocation-model=static",
            "-Ctarget-feature=+crt-static",
            "-Clink-arg=-nostartfiles",
            "-Clink-arg=-nostdlib",
        ])
        .arg("-o")
        .arg(&out)
        .arg("stub/main.rs")
        .output();
    match built {
        Ok(o) if o.status.success() => {}
        Ok(o) => fail(&format!(
            "rustc failed on stub/main.rs:\n{}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => fail(&format!("run rustc for stub/main.rs: {e}")),
    }
}

fn fail(why: &str) -> ! {
    eprintln!("runsbx-runtime build script: {why}");
    exit(1)
}
