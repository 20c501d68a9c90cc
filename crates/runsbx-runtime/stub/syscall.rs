//! A raw x86-64 Linux system call: the stub's only way to the kernel (it
//! has no libc), and the one runsbx's helpers that share its memory use
//! (src/sys/vm_child.rs includes this file), since libc's would write
//! errno, the creating thread's.

/// A raw system call; returns the result or `-errno`.
///
/// # Safety
/// The arguments must be what system call `n` takes.
pub unsafe fn syscall(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the caller passes what the call takes; `syscall` clobbers
    // only rcx and r11, and no stack is used.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}
