#!/usr/bin/env python3
"""The functions runsbx runs, read off the page cache, listed for the
linker to lay out first (crates/runsbx/hot-functions.txt, which
crates/runsbx/build.rs turns into a linker script).

    hack/hot-functions.py resident FILE             pages of FILE in the page cache
    hack/hot-functions.py evict FILE                drop FILE from the page cache
    hack/hot-functions.py list BINARY MAP OUT GROUP=PAGES...

hack/hot-functions.sh drives it. BINARY is a measuring build in which every
function starts a page of its own (LLVM's -align-all-functions=12), run with
the device's readahead off: a page of it is in the page cache only if some
process of the workload executed code on it, so the cached pages name the
executed functions exactly (all of them: those of the forked intermediate
and init processes too, which a sampling profiler would miss).

The list names them in the order of the groups given (the first
workload's first), each function once, by its v0 symbol with every crate
disambiguator (`Cs<hash>_`) replaced by `*`, so that it survives a
dependency or toolchain change that renames crates' hashes but not the
functions.

The C libraries runsbx links statically (glibc, libseccomp) are not
compiled with a section per function, nor page-aligned in the measuring
build: their code is listed by archive member (`libc.a:malloc.o`), each
member whose code shares a page with code that ran, as the linker's MAP
of the measuring build places it.
"""

import ctypes
import os
import re
import subprocess
import sys

PAGE = 4096


def resident(path):
    """Page numbers of `path` that are in the page cache (mincore(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
    finally:
        os.close(fd)
    pages = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
        raise OSError(ctypes.get_errno(), f"mincore {path}")
    return [i for i in range(pages) if vec[i] & 1]


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def text_section(binary):
    """(address, file offset, size) of BINARY's code: every section named
    .text or .text.*, which the measuring build lays out contiguously."""
    out = subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout
    spans = []
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\.text\S*)\s+PROGBITS\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m:
            spans.append(tuple(int(m.group(i), 16) for i in (2, 3, 4)))
    if not spans:
        sys.exit(f"hot-functions: no .text section in {binary}")
    start = min(s[0] for s in spans)
    end = max(s[0] + s[2] for s in spans)
    offset = min(spans)[1]
    return start, offset, end - start


def functions(binary):
    """BINARY's functions as (file offset, size, symbol), in address order."""
    start, offset, size = text_section(binary)
    out = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in "tTwW":
            addr, length = int(fields[0], 16), int(fields[1], 16)
            if start <= addr < start + size:
                found.append((addr - start + offset, length, fields[3]))
    found.sort()
    return found


def executed(funcs, pages):
    """The functions (or members' code) that have a cached page: in the
    measuring build no two Rust functions share one."""
    pages = set(pages)
    for offset, length, name in funcs:
        first, last = offset // PAGE, (offset + max(length, 1) - 1) // PAGE
        if any(p in pages for p in range(first, last + 1)):
            yield name


def pattern(symbol):
    """The section-name pattern of a v0 symbol, without what a rebuild may
    change: crate disambiguators, the back-references that count bytes
    past them, and ThinLTO's promotion suffix.

    A disambiguator is a hash in base 62, as long as its value needs, and
    this measuring build resolves features for runsbx alone where
    `cargo build` unifies them across the workspace: most dependencies get
    other hashes, some of another length. A back-reference (`B<offset>_`)
    after one then points one byte off, and a pattern that kept it
    matched nothing in the release build (31 of a list's 2300 functions,
    700 KB more of a run's code mapped)."""
    symbol = re.sub(r"\.llvm\.\d+$", "", symbol)
    if symbol == "main":
        return symbol  # rustc's, in a section of its own as a Rust function's
    if not symbol.startswith("_R"):
        return None  # C code's sections are not named per function
    symbol = re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", symbol)
    return re.sub(r"B[0-9A-Za-z]{0,3}_", "B*_", symbol)


# An input section of an archive member in an lld map: VMA, LMA, size,
# alignment, then `/path/libc.a(malloc.o):(.text)`. C code a crate builds
# (libseccomp's, through libseccomp-sys) is a member of that crate's rlib,
# named with the crate's hash: `liblibseccomp_sys-<hash>.rlib(api.o)`.
MEMBER = re.compile(r"^\s*([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\d+\s+\S*?([^/\s]+\.(?:a|rlib))\(([^()\s]+)\):\((\.text[^)]*)\)$")


def members(binary, map_file):
    """The archive members' code in BINARY as (file offset, size,
    `archive:member`), from the linker's map of it."""
    start, offset, size = text_section(binary)
    found = []
    with open(map_file) as lines:
        for line in lines:
            m = MEMBER.match(line)
            if m:
                addr, length = int(m.group(1), 16), int(m.group(2), 16)
                if length and start <= addr < start + size:
                    # The hash differs in the release build, as in pattern().
                    archive = re.sub(r"-[0-9a-f]+\.rlib$", "-*.rlib", m.group(3))
                    found.append((addr - start + offset, length, f"{archive}:{m.group(4)}"))
    found.sort()
    return found


def write_list(binary, map_file, out, groups):
    funcs = functions(binary)
    objects = members(binary, map_file)
    if not objects:
        sys.exit(f"hot-functions: no archive member's code in {map_file}")
    seen = set()
    lines = []
    for name, pages_file in groups:
        with open(pages_file) as f:
            pages = [int(p) for p in f.read().split()]
        added = 0
        for symbol in executed(funcs, pages):
            pat = pattern(symbol)
            if pat is None or pat in seen:
                continue
            seen.add(pat)
            lines.append(pat)
            added += 1
        c_added = 0
        for member in executed(objects, pages):
            if member not in seen:
                seen.add(member)
                lines.append(member)
                c_added += 1
        print(f"hot-functions: {name}: {added} functions, {c_added} C archive members")
    with open(out, "w") as f:
        f.write(
            "# Generated by hack/hot-functions.sh: the functions runsbx runs, laid\n"
            "# out first and together (see crates/runsbx/build.rs). Do not edit.\n"
        )
        f.write("\n".join(lines) + "\n")
    print(f"hot-functions: {len(lines)} functions in {out}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "resident":
        print("\n".join(map(str, resident(sys.argv[2]))))
    elif len(sys.argv) == 3 and sys.argv[1] == "evict":
        evict(sys.argv[2])
    elif len(sys.argv) >= 6 and sys.argv[1] == "list":
        groups = [g.split("=", 1) for g in sys.argv[5:]]
        write_list(sys.argv[2], sys.argv[3], sys.argv[4], groups)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
