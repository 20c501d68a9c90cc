//! A sandbox's seccomp filter as BPF: compiled once per distinct filter,
//! kept in the state root, and installed by runsbx's own executor in the
//! sandbox's init (see sandbox/seal.rs).
//!
//! libcontainer compiles the spec's `linux.seccomp` with libseccomp in
//! every init it makes: about 300 rules added one by one, then the BPF
//! generated, a millisecond or more of CPU in every create while its
//! caller waits. runsbx's filters are few (one per profile, with or
//! without a listener), so a create reads its program from
//! `<root>/@seccomp/` instead, compiled by the first create that needed
//! it, with the same libseccomp, rule by rule as libcontainer 0.7's
//! `initialize_seccomp` adds them but each argument comparison as the
//! runtime spec means it (see [`compare`]), laid out as a binary tree (see
//! [`Layout`]).
//!
//! An entry holds the filter it was compiled from, and is used only when
//! that text equals the filter asked for (the file name is a hash that
//! only finds it). The state root is runsbx's own (mode 0700): whoever can
//! write in it can already rewrite every sandbox's config.json.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use libcontainer::oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompFilterFlag, LinuxSeccompOperator,
};
use libseccomp::{ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext};

use crate::error::{Result, RuntimeError};

/// The directory of the compiled filters, in the state root.
pub const CACHE_DIR: &str = "@seccomp";

/// Bumped when what an entry holds, or how it is compiled, changes: 3
/// reads masked comparisons as the runtime spec does (an entry of 2 would
/// let every `clone` through), 4 lays the program out as a tree.
const FORMAT: &str = "runsbx seccomp bpf 4";

/// How libseccomp lays a program out (its `SCMP_FLTATR_CTL_OPTIMIZE`).
///
/// By default it tests the syscall number against each rule in turn. When
/// a filter is installed, the kernel runs the program once for every
/// syscall number, to learn which ones it may then allow without running
/// it (its action cache), holding the process's signal lock with
/// interrupts off; on every later syscall it cannot decide so (the
/// reported ones, those whose arguments are checked), the program runs
/// again. With the rules sorted into a binary tree, each of those runs
/// takes about log2(300) tests instead of up to 300: installing the
/// reporting filter took 0.10 ms instead of 0.36 ms (the median of 100
/// installs in fresh processes on a 2-core VM). The decisions are the
/// same: libseccomp only orders the tests differently, and
/// `a_tree_decides_as_the_linear_program_does` checks every syscall
/// number and each argument the policy's rules compare.
#[derive(Clone, Copy)]
enum Layout {
    #[cfg(test)]
    Linear,
    Tree,
}

// seccomp(2)'s filter flags (linux/seccomp.h).
const FLAG_TSYNC: libc::c_ulong = 1;
const FLAG_LOG: libc::c_ulong = 1 << 1;
const FLAG_SPEC_ALLOW: libc::c_ulong = 1 << 2;
const FLAG_NEW_LISTENER: libc::c_ulong = 1 << 3;
const FLAG_WAIT_KILLABLE_RECV: libc::c_ulong = 1 << 5;

/// One BPF instruction's size (struct sock_filter).
const INSN: usize = 8;

/// A compiled filter, ready for seccomp(2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// The instructions, as libseccomp exports them (native byte order).
    bpf: Vec<u8>,
    /// seccomp(2)'s flags: the spec's, and NEW_LISTENER when a rule
    /// notifies.
    flags: libc::c_ulong,
}

impl Program {
    /// The program of `seccomp`, from the cache in the state root `root`,
    /// compiled and kept there when it is not yet.
    pub fn of(seccomp: &LinuxSeccomp, root: &Path) -> Result<Self> {
        let source = source_text(seccomp)?;
        let dir = root.join(CACHE_DIR);
        let file = dir.join(format!("{:016x}.bpf", hash(&source)));
        if let Some(program) = read_entry(&file, &source) {
            return Ok(program);
        }
        let program = compile(seccomp)?;
        // A cache that cannot be written only costs the next create the
        // compile again.
        if let Err(e) = write_entry(&dir, &file, &source, &program) {
            tracing::debug!("keep the compiled seccomp filter in {file:?}: {e}");
        }
        Ok(program)
    }

    /// Whether the filter hands some syscalls to a listener.
    pub fn notifies(&self) -> bool {
        self.flags & FLAG_NEW_LISTENER != 0
    }

    /// Installs the filter on the calling thread, as libseccomp's load
    /// does (the thread must have no_new_privs, or CAP_SYS_ADMIN in its
    /// user namespace); returns the listener fd when it notifies. Run in
    /// the sandbox's init, single-threaded, right before its command.
    pub fn install(&self) -> std::io::Result<Option<OwnedFd>> {
        let len = u16::try_from(self.bpf.len() / INSN)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::E2BIG))?;
        let prog = libc::sock_fprog {
            len,
            filter: self.bpf.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: `prog` points at `len` instructions that outlive the
        // call; the kernel copies them.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                self.flags,
                &prog as *const libc::sock_fprog,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if !self.notifies() {
            return Ok(None);
        }
        // SAFETY: with NEW_LISTENER the kernel returns a new fd of ours.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(rc as i32) }))
    }
}

/// What identifies a filter's program: the filter without where its
/// notifications go (a call's own socket), and the library and machine
/// that compile it.
fn source_text(seccomp: &LinuxSeccomp) -> Result<String> {
    let mut rules = seccomp.clone();
    rules.set_listener_path(None);
    rules.set_listener_metadata(None);
    let json = serde_json::to_string(&rules)
        .map_err(|e| RuntimeError::invalid("linux.seccomp", e.to_string()))?;
    let lib = libseccomp::ScmpVersion::current()
        .map(|v| format!("{}.{}.{}", v.major, v.minor, v.micro))
        .unwrap_or_default();
    Ok(format!(
        "{FORMAT}\nlibseccomp {lib}\n{}\n{json}\n",
        std::env::consts::ARCH
    ))
}

fn hash(source: &str) -> u64 {
    // Only a name to find the entry by: the entry's own text decides.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    h.finish()
}

/// An entry is the source text, a NUL, the flags and the program's length
/// in bytes as 16 hex digits each, then the program: one that is not
/// whole is not used.
fn read_entry(file: &Path, source: &str) -> Option<Program> {
    let bytes = fs::read(file).ok()?;
    let rest = bytes.strip_prefix(source.as_bytes())?.strip_prefix(b"\0")?;
    let hex = |digits: &[u8]| u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok();
    let (flags, rest) = rest.split_at_checked(16)?;
    let (len, bpf) = rest.split_at_checked(16)?;
    let flags = libc::c_ulong::try_from(hex(flags)?).ok()?;
    let whole = usize::try_from(hex(len)?).ok()? == bpf.len();
    (whole && !bpf.is_empty() && bpf.len().is_multiple_of(INSN)).then(|| Program {
        bpf: bpf.to_vec(),
        flags,
    })
}

/// Writes an entry as a file with no name (O_TMPFILE) and links it in
/// whole: a reader never sees part of one, and a writer killed part way
/// leaves nothing in the cache. An entry already there (another filter's
/// of the same hash, or one this build no longer reads) is replaced.
fn write_entry(dir: &Path, file: &Path, source: &str, program: &Program) -> std::io::Result<()> {
    use nix::fcntl::AtFlags;
    use nix::unistd::linkat;

    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)?;
    f.write_all(source.as_bytes())?;
    f.write_all(b"\0")?;
    write!(f, "{:016x}{:016x}", program.flags, program.bpf.len())?;
    f.write_all(&program.bpf)?;
    // linkat(2) names an unnamed file through its /proc link; AT_EMPTY_PATH
    // would need CAP_DAC_READ_SEARCH.
    let unnamed = std::path::PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
    let link = || {
        linkat(
            None,
            unnamed.as_path(),
            None,
            file,
            AtFlags::AT_SYMLINK_FOLLOW,
        )
    };
    match link() {
        Err(nix::Error::EEXIST) => {
            fs::remove_file(file)?;
            link().map_err(std::io::Error::from)
        }
        linked => linked.map_err(std::io::Error::from),
    }
}

/// Compiles `seccomp` with libseccomp, rule by rule as libcontainer 0.7
/// adds them (each comparison as [`compare`] reads it), and exports the
/// program, laid out as a tree.
pub fn compile(seccomp: &LinuxSeccomp) -> Result<Program> {
    compile_as(seccomp, Layout::Tree)
}

fn compile_as(seccomp: &LinuxSeccomp, layout: Layout) -> Result<Program> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        RuntimeError::invalid("linux.seccomp", format!("{what}: {e}"))
    };
    if seccomp.default_action() == LinuxSeccompAction::ScmpActNotify {
        return Err(fail(
            "defaultAction",
            &"SCMP_ACT_NOTIFY cannot be the default",
        ));
    }
    let default = action(seccomp.default_action(), seccomp.default_errno_ret())?;
    let mut ctx =
        ScmpFilterContext::new(default).map_err(|e| fail("make a libseccomp filter", &e))?;
    let level = match layout {
        #[cfg(test)]
        Layout::Linear => 1,
        Layout::Tree => 2,
    };
    ctx.set_ctl_optimize(level)
        .map_err(|e| fail("lay the program out as a tree", &e))?;
    let mut flags = 0;
    for flag in seccomp.flags().iter().flatten() {
        flags |= match flag {
            LinuxSeccompFilterFlag::SeccompFilterFlagLog => FLAG_LOG,
            LinuxSeccompFilterFlag::SeccompFilterFlagTsync => FLAG_TSYNC,
            LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow => FLAG_SPEC_ALLOW,
            LinuxSeccompFilterFlag::SeccompFilterFlagWaitKillableRecv => FLAG_WAIT_KILLABLE_RECV,
        };
    }
    for &a in seccomp.architectures().iter().flatten() {
        ctx.add_arch(arch(a))
            .map_err(|e| fail(&format!("architecture {a:?}"), &e))?;
    }
    let mut notifies = false;
    for rule in seccomp.syscalls().iter().flatten() {
        let act = action(rule.action(), rule.errno_ret())?;
        // As libcontainer: a rule that does what the default does adds
        // nothing (and libseccomp would refuse it).
        if act == default {
            continue;
        }
        if act == ScmpAction::Notify {
            if rule.names().iter().any(|n| n == "write") {
                return Err(fail(
                    "syscalls",
                    &"SCMP_ACT_NOTIFY cannot be used for write",
                ));
            }
            notifies = true;
        }
        for name in rule.names() {
            // As libcontainer: a name this libseccomp does not know is a
            // syscall this kernel cannot be asked for either.
            let Ok(sc) = libseccomp::ScmpSyscall::from_name(name) else {
                continue;
            };
            let compares: Vec<ScmpArgCompare> = rule.args().iter().flatten().map(compare).collect();
            let mut indexes: Vec<u32> = rule
                .args()
                .iter()
                .flatten()
                .map(|a| a.index() as u32)
                .collect();
            indexes.sort_unstable();
            indexes.dedup();
            let added = if rule.args().is_none() {
                ctx.add_rule(act, sc).map(drop)
            } else if indexes.len() < compares.len() {
                // One comparison per argument in a rule: as runc and
                // libcontainer, each comparison then is a rule of its own.
                compares.iter().try_for_each(|c| {
                    ctx.add_rule_conditional(act, sc, std::slice::from_ref(c))
                        .map(drop)
                })
            } else {
                ctx.add_rule_conditional(act, sc, &compares).map(drop)
            };
            added.map_err(|e| fail(&format!("the rule for {name}"), &e))?;
        }
    }
    if notifies {
        flags |= FLAG_NEW_LISTENER;
    }
    let bpf = export(&ctx).map_err(|e| fail("export the BPF program", &e))?;
    if bpf.is_empty() || !bpf.len().is_multiple_of(INSN) {
        return Err(fail(
            "export the BPF program",
            &format!("{} bytes, not whole instructions", bpf.len()),
        ));
    }
    Ok(Program { bpf, flags })
}

/// libseccomp 2.5 exports to an fd only: a memfd, read back.
fn export(ctx: &ScmpFilterContext) -> std::io::Result<Vec<u8>> {
    let fd = nix::sys::memfd::memfd_create(
        c"runsbx-seccomp",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )?;
    ctx.export_bpf(&fd).map_err(std::io::Error::other)?;
    let mut file = fs::File::from(fd);
    file.rewind()?;
    let mut bpf = Vec::new();
    file.read_to_end(&mut bpf)?;
    Ok(bpf)
}

fn action(action: LinuxSeccompAction, errno: Option<u32>) -> Result<ScmpAction> {
    let errno = errno.map_or(libc::EPERM, |e| e as i32);
    Ok(match action {
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => {
            ScmpAction::KillThread
        }
        LinuxSeccompAction::ScmpActKillProcess => ScmpAction::KillProcess,
        LinuxSeccompAction::ScmpActTrap => ScmpAction::Trap,
        LinuxSeccompAction::ScmpActErrno => ScmpAction::Errno(errno),
        LinuxSeccompAction::ScmpActTrace => ScmpAction::Trace(errno.try_into().map_err(|_| {
            RuntimeError::invalid(
                "linux.seccomp",
                format!("SCMP_ACT_TRACE with errno {errno}"),
            )
        })?),
        LinuxSeccompAction::ScmpActAllow => ScmpAction::Allow,
        LinuxSeccompAction::ScmpActNotify => ScmpAction::Notify,
        LinuxSeccompAction::ScmpActLog => ScmpAction::Log,
    })
}

/// One argument comparison, as the runtime spec defines it (and runc
/// reads it): for `SCMP_CMP_MASKED_EQ`, `value` is the mask and `valueTwo`
/// what the masked argument must equal.
///
/// libcontainer 0.7 gives libseccomp `valueTwo` as the mask and `value` as
/// the datum. libseccomp masks the datum too, so the policy's rule that
/// allows `clone` only without namespace flags (mask: the flags, datum: 0)
/// became "clone & 0 == 0", true for every clone: a sandboxed process could
/// make a user namespace with `clone(CLONE_NEWUSER)` while `unshare` was
/// refused. See [`libcontainer_operands`] for the filters libcontainer
/// still compiles.
fn compare(arg: &LinuxSeccompArg) -> ScmpArgCompare {
    let index = arg.index() as u32;
    let op = match arg.op() {
        LinuxSeccompOperator::ScmpCmpNe => ScmpCompareOp::NotEqual,
        LinuxSeccompOperator::ScmpCmpLt => ScmpCompareOp::Less,
        LinuxSeccompOperator::ScmpCmpLe => ScmpCompareOp::LessOrEqual,
        LinuxSeccompOperator::ScmpCmpEq => ScmpCompareOp::Equal,
        LinuxSeccompOperator::ScmpCmpGe => ScmpCompareOp::GreaterEqual,
        LinuxSeccompOperator::ScmpCmpGt => ScmpCompareOp::Greater,
        LinuxSeccompOperator::ScmpCmpMaskedEq => {
            let datum = arg.value_two().unwrap_or(0);
            return ScmpArgCompare::new(index, ScmpCompareOp::MaskedEqual(arg.value()), datum);
        }
    };
    ScmpArgCompare::new(index, op, arg.value())
}

/// `seccomp` as libcontainer 0.7 must be given it to compile the filter
/// the runtime spec means (where it installs the filter itself: see
/// sandbox/seal.rs): each `SCMP_CMP_MASKED_EQ` comparison with its mask
/// and its datum exchanged (see [`compare`]).
pub fn libcontainer_operands(seccomp: &LinuxSeccomp) -> Result<LinuxSeccomp> {
    let mut rules = seccomp.syscalls().clone().unwrap_or_default();
    for rule in &mut rules {
        let Some(mut args) = rule.args().clone() else {
            continue;
        };
        for arg in &mut args {
            if arg.op() != LinuxSeccompOperator::ScmpCmpMaskedEq {
                continue;
            }
            *arg = LinuxSeccompArgBuilder::default()
                .index(arg.index())
                .op(arg.op())
                .value(arg.value_two().unwrap_or(0))
                .value_two(arg.value())
                .build()
                .map_err(|e| RuntimeError::invalid("linux.seccomp", e.to_string()))?;
        }
        rule.set_args(Some(args));
    }
    let mut swapped = seccomp.clone();
    if seccomp.syscalls().is_some() {
        swapped.set_syscalls(Some(rules));
    }
    Ok(swapped)
}

fn arch(arch: Arch) -> ScmpArch {
    match arch {
        Arch::ScmpArchNative => ScmpArch::Native,
        Arch::ScmpArchX86 => ScmpArch::X86,
        Arch::ScmpArchX86_64 => ScmpArch::X8664,
        Arch::ScmpArchX32 => ScmpArch::X32,
        Arch::ScmpArchArm => ScmpArch::Arm,
        Arch::ScmpArchAarch64 => ScmpArch::Aarch64,
        Arch::ScmpArchMips => ScmpArch::Mips,
        Arch::ScmpArchMips64 => ScmpArch::Mips64,
        Arch::ScmpArchMips64n32 => ScmpArch::Mips64N32,
        Arch::ScmpArchMipsel => ScmpArch::Mipsel,
        Arch::ScmpArchMipsel64 => ScmpArch::Mipsel64,
        Arch::ScmpArchMipsel64n32 => ScmpArch::Mipsel64N32,
        Arch::ScmpArchPpc => ScmpArch::Ppc,
        Arch::ScmpArchPpc64 => ScmpArch::Ppc64,
        Arch::ScmpArchPpc64le => ScmpArch::Ppc64Le,
        Arch::ScmpArchS390 => ScmpArch::S390,
        Arch::ScmpArchS390x => ScmpArch::S390X,
        Arch::ScmpArchRiscv64 => ScmpArch::Riscv64,
        Arch::ScmpArchParisc => ScmpArch::Parisc,
        Arch::ScmpArchParisc64 => ScmpArch::Parisc64,
        Arch::ScmpArchLoongarch64 => ScmpArch::Loongarch64,
        Arch::ScmpArchM68k => ScmpArch::M68k,
        Arch::ScmpArchSh => ScmpArch::Sh,
        Arch::ScmpArchSheb => ScmpArch::Sheb,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use libcontainer::oci_spec::runtime::{LinuxSeccompBuilder, LinuxSyscallBuilder};

    fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
        fs::read_dir(dir.join(CACHE_DIR))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn policy_filters_compile_to_whole_programs() {
        let plain = compile(&runsbx_policy::seccomp::allowlist().unwrap()).unwrap();
        assert!(!plain.bpf.is_empty() && plain.bpf.len().is_multiple_of(INSN));
        assert!(!plain.notifies());
        let reporting =
            compile(&runsbx_policy::seccomp::reporting(Path::new("/run/x.sock")).unwrap()).unwrap();
        assert!(reporting.notifies());
        assert_ne!(plain.bpf, reporting.bpf);
    }

    #[test]
    fn a_kept_program_is_the_compiled_one_and_found_again() {
        let root = tempfile::tempdir().unwrap();
        let filter = runsbx_policy::seccomp::allowlist().unwrap();
        let first = Program::of(&filter, root.path()).unwrap();
        assert_eq!(first, compile(&filter).unwrap());
        let kept = entries(root.path());
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(Program::of(&filter, root.path()).unwrap(), first);
        // The listener's path is not the program's: one entry for any.
        let a = runsbx_policy::seccomp::reporting(Path::new("/run/a.sock")).unwrap();
        let b = runsbx_policy::seccomp::reporting(Path::new("/run/b.sock")).unwrap();
        assert_eq!(
            Program::of(&a, root.path()).unwrap(),
            Program::of(&b, root.path()).unwrap()
        );
        assert_eq!(entries(root.path()).len(), 2);
    }

    #[test]
    fn an_entry_of_another_filter_is_not_used() {
        let root = tempfile::tempdir().unwrap();
        let filter = runsbx_policy::seccomp::allowlist().unwrap();
        let program = Program::of(&filter, root.path()).unwrap();
        let file = entries(root.path()).remove(0);
        // The same name holding another filter's text and a program that
        // allows everything: not this filter's, so compiled again.
        let allow_all = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .build()
            .unwrap();
        let other = compile(&allow_all).unwrap();
        write_entry(file.parent().unwrap(), &file, "another filter", &other).unwrap();
        assert_eq!(read_entry(&file, "another filter"), Some(other));
        assert_eq!(Program::of(&filter, root.path()).unwrap(), program);
        // Each write replaced the entry: nothing else is in the cache.
        assert_eq!(entries(root.path()), std::slice::from_ref(&file));
        // Cut short, even by whole instructions: not used either.
        for cut in [3, INSN] {
            let bytes = fs::read(&file).unwrap();
            fs::write(&file, &bytes[..bytes.len() - cut]).unwrap();
            assert_eq!(Program::of(&filter, root.path()).unwrap(), program);
            assert_eq!(
                read_entry(&file, &source_text(&filter).unwrap()),
                Some(program.clone())
            );
        }
    }

    #[test]
    fn notify_as_default_or_for_write_is_refused() {
        let notify_default = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActNotify)
            .build()
            .unwrap();
        assert!(compile(&notify_default).is_err());
        let notify_write = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .syscalls(vec![LinuxSyscallBuilder::default()
                .names(vec!["write".to_owned()])
                .action(LinuxSeccompAction::ScmpActNotify)
                .build()
                .unwrap()])
            .build()
            .unwrap();
        assert!(compile(&notify_write).is_err());
    }

    /// Runs a classic BPF program on one syscall as seccomp presents it
    /// (`struct seccomp_data`), with the instructions libseccomp emits;
    /// any other panics.
    fn decide(bpf: &[u8], nr: u32, arch: u32, args: &[u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for a in args {
            data.extend_from_slice(&a.to_ne_bytes());
        }
        let insn = |i: usize| {
            let b = &bpf[i * INSN..(i + 1) * INSN];
            let code = u16::from_ne_bytes([b[0], b[1]]);
            (
                code,
                b[2] as usize,
                b[3] as usize,
                u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
            )
        };
        let (mut a, mut x, mut mem, mut pc) = (0u32, 0u32, [0u32; 16], 0usize);
        loop {
            let (code, jt, jf, k) = insn(pc);
            pc += 1;
            let jump = |taken: bool| if taken { jt } else { jf };
            match code {
                0x00 => a = k,
                0x01 => x = k,
                0x20 => {
                    let at = k as usize;
                    a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                0x60 => a = mem[k as usize],
                0x61 => x = mem[k as usize],
                0x02 => mem[k as usize] = a,
                0x03 => mem[k as usize] = x,
                0x54 => a &= k,
                0x07 => x = a,
                0x87 => a = x,
                0x05 => pc += k as usize,
                0x15 => pc += jump(a == k),
                0x25 => pc += jump(a > k),
                0x35 => pc += jump(a >= k),
                0x45 => pc += jump(a & k != 0),
                0x06 => return k,
                0x16 => return a,
                _ => panic!("BPF instruction {code:#06x} at {}", pc - 1),
            }
        }
    }

    const X86_64: u32 = 0xc000_003e;
    const ALLOW: u32 = 0x7fff_0000;

    /// A filter's program laid out as a tree decides every syscall as the
    /// default, linear one does: each syscall number (the x32 ones too,
    /// and another architecture's), with no arguments and with each value
    /// the policy's rules compare an argument to (and its neighbours) in
    /// each place.
    #[test]
    fn a_tree_decides_as_the_linear_program_does() {
        const I386: u32 = 0x4000_0003;
        for (filter, notifies) in [
            (runsbx_policy::seccomp::allowlist().unwrap(), false),
            (
                runsbx_policy::seccomp::reporting(Path::new("/run/x.sock")).unwrap(),
                true,
            ),
        ] {
            let tree = compile_as(&filter, Layout::Tree).unwrap();
            let linear = compile_as(&filter, Layout::Linear).unwrap();
            assert_eq!(tree.flags, linear.flags);
            assert_ne!(tree.bpf, linear.bpf, "the layout was not changed");
            let mut values = vec![0, 1, 2, u64::from(u32::MAX), u64::MAX, 1 << 32];
            for arg in filter
                .syscalls()
                .iter()
                .flatten()
                .flat_map(|r| r.args().iter().flatten())
            {
                for v in [arg.value(), arg.value_two().unwrap_or(0)] {
                    values.extend([v, v.wrapping_sub(1), v.wrapping_add(1), v | 1 << 40]);
                    values.extend([!v, v & u64::from(u32::MAX)]);
                }
            }
            values.sort_unstable();
            values.dedup();
            let mut decided = std::collections::HashSet::new();
            for nr in (0..=600).chain((0..=600).map(|n| 0x4000_0000 | n)) {
                for arch in [X86_64, I386] {
                    let mut same = |args: [u64; 6]| {
                        let t = decide(&tree.bpf, nr, arch, &args);
                        assert_eq!(
                            t,
                            decide(&linear.bpf, nr, arch, &args),
                            "syscall {nr} (arch {arch:#x}) with {args:?}"
                        );
                        decided.insert(t);
                    };
                    same([0; 6]);
                    for &v in &values {
                        for i in 0..6 {
                            let mut args = [0; 6];
                            args[i] = v;
                            same(args);
                        }
                        same([v; 6]);
                    }
                }
            }
            // The comparisons reached every kind of answer: allowed,
            // refused with an errno, killed (another architecture) and,
            // in the reporting filter, notified.
            let kinds: std::collections::BTreeSet<u32> =
                decided.iter().map(|d| d & 0xffff_0000).collect();
            let mut want = vec![0, 0x0005_0000, ALLOW];
            if notifies {
                want.push(0x7fc0_0000);
            }
            assert_eq!(kinds, want.into_iter().collect(), "{decided:x?}");
        }
    }

    /// `SCMP_CMP_MASKED_EQ` as the runtime spec means it (`value` the mask,
    /// `valueTwo` what the masked argument must equal): the policy's rule
    /// for clone(2) lets fork and pthread_create through, and no flag that
    /// makes a namespace, in either filter.
    #[test]
    fn clone_is_allowed_only_without_namespace_flags() {
        let clone = libc::SYS_clone as u32;
        let fork = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD) as u64;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        for filter in [
            runsbx_policy::seccomp::allowlist().unwrap(),
            runsbx_policy::seccomp::reporting(Path::new("/run/x.sock")).unwrap(),
        ] {
            let program = compile(&filter).unwrap();
            let decide = |flags: u64| decide(&program.bpf, clone, X86_64, &[flags, 0, 0, 0, 0, 0]);
            assert_eq!(decide(fork), ALLOW);
            assert_eq!(decide(thread), ALLOW);
            for ns in [
                libc::CLONE_NEWUSER,
                libc::CLONE_NEWNS,
                libc::CLONE_NEWNET,
                libc::CLONE_NEWPID,
                libc::CLONE_NEWIPC,
                libc::CLONE_NEWUTS,
                libc::CLONE_NEWCGROUP,
            ] {
                let ns = ns as u64;
                assert_ne!(decide(fork | ns), ALLOW, "clone with {ns:#x}");
                assert_ne!(decide(ns), ALLOW, "clone with {ns:#x}");
            }
        }
    }

    /// libcontainer is given each masked comparison with its mask and its
    /// datum exchanged, and nothing else changed: exchanged twice, the
    /// filter is the policy's again.
    #[test]
    fn libcontainer_gets_masked_comparisons_exchanged() {
        let filter = runsbx_policy::seccomp::allowlist().unwrap();
        let given = libcontainer_operands(&filter).unwrap();
        assert_ne!(given, filter);
        assert_eq!(libcontainer_operands(&given).unwrap(), filter);
        let masked = |f: &LinuxSeccomp| -> Vec<(u64, Option<u64>)> {
            f.syscalls()
                .iter()
                .flatten()
                .flat_map(|r| r.args().iter().flatten())
                .filter(|a| a.op() == LinuxSeccompOperator::ScmpCmpMaskedEq)
                .map(|a| (a.value(), a.value_two()))
                .collect()
        };
        let meant = masked(&filter);
        assert!(!meant.is_empty());
        let exchanged: Vec<_> = meant
            .iter()
            .map(|&(v, v2)| (v2.unwrap_or(0), Some(v)))
            .collect();
        assert_eq!(masked(&given), exchanged);
    }

    /// The program, installed in a child, denies what the filter denies
    /// with the filter's errno and allows the rest.
    #[test]
    fn an_installed_program_denies_what_its_filter_does() {
        let filter = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .syscalls(vec![LinuxSyscallBuilder::default()
                .names(vec!["getppid".to_owned()])
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(libc::EXDEV as u32)
                .build()
                .unwrap()])
            .build()
            .unwrap();
        let program = compile(&filter).unwrap();
        // SAFETY: the child only makes syscalls and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    nix::sys::prctl::set_no_new_privs().ok()?;
                    program.install().ok()?;
                    // SAFETY: plain syscalls.
                    let denied = unsafe { libc::syscall(libc::SYS_getppid) };
                    let errno = std::io::Error::last_os_error().raw_os_error();
                    let allowed = unsafe { libc::syscall(libc::SYS_getpid) };
                    (denied == -1 && errno == Some(libc::EXDEV) && allowed > 0).then_some(0)
                })()
                .unwrap_or(1);
                // SAFETY: ends the child without running the parent's
                // destructors.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }
}
