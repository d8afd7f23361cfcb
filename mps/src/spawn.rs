//! The crate's one `unsafe` edge: the control daemon starts in a mount namespace of its
//! own where the card's shm folder is its `/dev/shm`. MPS clients and their server share
//! memory through `/dev/shm`; containers get the same folder there (see
//! [`crate::client`]), so a card's clients meet its server and nothing of the host's
//! `/dev/shm` or another card's. The daemon's servers inherit the namespace.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Makes `command`'s child enter a new mount namespace (mounts private) and bind `shm`
/// over `/dev/shm` before it execs. Needs CAP_SYS_ADMIN; the spawn then fails with the
/// OS error.
pub(crate) fn with_private_shm(command: &mut Command, shm: &Path) -> std::io::Result<()> {
    let source = CString::new(shm.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other(format!("{} holds a NUL byte", shm.display())))?;
    let pre_exec = move || -> std::io::Result<()> {
        // SAFETY: unshare with a constant flag, in the single-threaded child.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: constant C strings; makes every mount private so the bind below stays
        // in this namespace.
        let private = unsafe {
            libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        if private != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `source` was made before the fork and lives in this closure; a bind
        // mount takes no data argument.
        let bound = unsafe {
            libc::mount(
                source.as_ptr(),
                c"/dev/shm".as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        if bound != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure runs between fork and exec and only makes the raw syscalls
    // above on memory prepared before the fork: it allocates nothing and takes no lock.
    unsafe { command.pre_exec(pre_exec) };
    Ok(())
}
