//! The binary's code layout: the functions crates/runsbx/hot-functions.txt
//! lists are laid out first, in its `.text.hot` section (see
//! crates/runsbx/build.rs). The list is made by running the workloads
//! (hack/hot-functions.sh); it decays as functions are renamed, moved,
//! removed or added to what a run executes, and then runsbx's processes
//! map scattered code again. This fails once a tenth of the list names
//! functions the binary no longer has; how much of runsbx's code a run
//! maps is a measurement, which hack/bench.sh prints beside the peak RSS.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

/// The fraction of the list that must still name functions of the binary.
const FRESH: f64 = 0.9;

#[test]
fn hot_functions_come_first() {
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("hot-functions.txt");
    // Rust functions by symbol, and the C libraries' code by archive
    // member (`libc.a:malloc.o`, `liblibseccomp_sys-*.rlib:api.o`).
    let (members, listed): (Vec<&str>, Vec<&str>) = std::fs::read_to_string(&list)
        .unwrap()
        .leak()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .partition(|l| l.contains(".a:") || l.contains(".rlib:"));
    assert!(
        listed.len() > 1000,
        "{}: {} functions",
        list.display(),
        listed.len()
    );
    let binary = std::fs::read(env!("CARGO_BIN_EXE_runsbx")).unwrap();
    let elf = Elf::parse(&binary);
    let hot = elf.section(".text.hot").expect(
        "runsbx has no .text.hot section: crates/runsbx/build.rs gave the linker no script",
    );
    let names: Vec<&str> = elf
        .functions()
        .filter(|(addr, _)| (hot.0..hot.0 + hot.1).contains(addr))
        .map(|(_, name)| name.split(".llvm.").next().unwrap_or(name))
        .collect();
    let missing: Vec<&&str> = listed
        .iter()
        .filter(|p| !names.iter().any(|n| glob(p, n)))
        .collect();
    let found = listed.len() - missing.len();
    assert!(
        found as f64 >= FRESH * listed.len() as f64,
        "{} of the {} functions {} lists are no longer in runsbx (first: {:?}): \
         regenerate it with `sudo hack/hot-functions.sh`",
        missing.len(),
        listed.len(),
        list.display(),
        &missing[..missing.len().min(3)],
    );
    // A member's code has no symbol of the member's name; each defines at
    // least one function, so as many C functions as members are laid out
    // first while the list's members are still in the archives.
    let c_functions = names.iter().filter(|n| !n.starts_with("_R")).count();
    assert!(
        !members.is_empty() && c_functions as f64 >= FRESH * members.len() as f64,
        "{} lists {} C archive members, and runsbx's .text.hot holds {c_functions} C \
         functions: regenerate it with `sudo hack/hot-functions.sh`",
        list.display(),
        members.len(),
    );
}

/// Whether `name` matches `pattern`, whose only wildcard is `*`.
fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// What this test reads of a little-endian ELF64 file: its section
/// headers and its symbol table.
struct Elf<'a> {
    data: &'a [u8],
    sections: Vec<Section>,
}

struct Section {
    name: u32,
    kind: u32,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
}

impl<'a> Elf<'a> {
    fn parse(data: &'a [u8]) -> Self {
        assert_eq!(&data[..4], b"\x7fELF", "runsbx is not an ELF file");
        assert_eq!(data[4], 2, "runsbx is not ELF64");
        let shoff = u64_at(data, 0x28) as usize;
        let shentsize = u16_at(data, 0x3a) as usize;
        let shnum = u16_at(data, 0x3c) as usize;
        let sections = (0..shnum)
            .map(|i| {
                let h = &data[shoff + i * shentsize..];
                Section {
                    name: u32_at(h, 0),
                    kind: u32_at(h, 4),
                    addr: u64_at(h, 0x10),
                    offset: u64_at(h, 0x18),
                    size: u64_at(h, 0x20),
                    link: u32_at(h, 0x28),
                }
            })
            .collect();
        Self { data, sections }
    }

    fn bytes(&self, s: &Section) -> &'a [u8] {
        &self.data[s.offset as usize..(s.offset + s.size) as usize]
    }

    fn string(&self, table: &Section, at: u32) -> &'a str {
        let bytes = &self.bytes(table)[at as usize..];
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        std::str::from_utf8(&bytes[..end]).unwrap_or("")
    }

    /// The address and size of the section called `name`.
    fn section(&self, name: &str) -> Option<(u64, u64)> {
        let strtab = &self.sections[u16_at(self.data, 0x3e) as usize];
        self.sections
            .iter()
            .find(|s| self.string(strtab, s.name) == name)
            .map(|s| (s.addr, s.size))
    }

    /// Every function symbol: its address and name.
    fn functions(&self) -> impl Iterator<Item = (u64, &'a str)> + '_ {
        const SHT_SYMTAB: u32 = 2;
        const STT_FUNC: u8 = 2;
        self.sections
            .iter()
            .filter(|s| s.kind == SHT_SYMTAB)
            .flat_map(move |symtab| {
                let names = &self.sections[symtab.link as usize];
                self.bytes(symtab)
                    .chunks_exact(24)
                    .filter(|e| e[4] & 0xf == STT_FUNC)
                    .map(move |e| (u64_at(e, 8), self.string(names, u32_at(e, 0))))
            })
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(bytes)
}
