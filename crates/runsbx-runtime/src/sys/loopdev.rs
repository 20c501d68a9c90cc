//! Loop devices, for a session's disk: a file holding an ext4 filesystem,
//! attached to a free loop device with `LO_FLAGS_AUTOCLEAR` so that the
//! kernel detaches it by itself once its last mount is gone (the call's
//! private mount namespace dies with the call, the sandbox's with the
//! sandbox), whatever ends runsbx.

use std::fs::{self, File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` of <linux/loop.h>.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of <linux/loop.h> (LOOP_CONFIGURE, Linux 5.8).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Mounts the ext4 filesystem in `image` at `target` (nosuid, nodev),
/// through a loop device that detaches itself when the mount is gone.
pub fn mount_ext4(image: &File, target: &Path) -> std::io::Result<()> {
    let (device, path) = attach(image)?;
    let mounted = mount(
        Some(&path),
        target,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    );
    // Closing the device is what lets autoclear detach it once unmounted
    // (at once, when the mount failed).
    drop(device);
    mounted.map_err(std::io::Error::from)
}

/// A free loop device, configured to read and write `image`.
fn attach(image: &File) -> std::io::Result<(OwnedFd, PathBuf)> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // Another process may take the free device between the two calls:
    // LOOP_CONFIGURE then fails with EBUSY, and the next one is tried.
    for _ in 0..16 {
        // SAFETY: an ioctl without argument on an fd we own.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let device = OpenOptions::new().read(true).write(true).open(&path)?;
        // SAFETY: all-zero is a valid loop_config.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = image.as_raw_fd() as u32;
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: a live, correctly sized loop_config.
        let rc = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_CONFIGURE,
                &config as *const LoopConfig,
            )
        };
        if rc == 0 {
            return Ok((device.into(), path));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EBUSY))
}

/// The loop devices whose backing file is `image` (a path as the kernel
/// shows it): a mount of it that is still alive somewhere.
pub fn attached_to(image: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter(|e| {
            fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|b| Path::new(b.trim_end_matches('\n')) == image)
        })
        .map(|e| Path::new("/dev").join(e.file_name()))
        .collect()
}
