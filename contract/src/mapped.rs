//! Fixed-size, file-backed shared mappings: the common ground of the usage region and
//! the per-card state. Opening creates or resizes the file under a short `flock` (which
//! the kernel drops if its holder dies, so no process can leave it held), and reports
//! what it found, so the caller can initialise, validate or rebuild the contents while
//! it still holds the lock.
//!
//! Every open here refuses what is not a regular file without blocking on it (a FIFO
//! named as a region must not stall a process), and the holder lock tells whether any
//! live process still uses a file: each user holds a shared open-file-description lock
//! on its first byte for as long as it has the file open (the kernel drops it when the
//! last descriptor closes, at exit or death), so an exclusive lock that succeeds proves
//! nobody holds it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// FNV-1a's offset basis.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes`, continuing from `hash` (start with [`FNV_OFFSET`]).
pub fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for byte in bytes {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// How [`open_regular`] opens a file.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    /// Open it for writing as well.
    pub write: bool,
    /// Create it (mode 0666) when missing.
    pub create: bool,
    /// Follow a symbolic link at the last component (the shims do; the host never).
    pub follow_links: bool,
}

/// Opens `path` without blocking on a FIFO or a device, and refuses anything that is
/// not a regular file (`InvalidInput`, "not a regular file").
pub fn open_regular(path: &Path, access: Access) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if !access.follow_links {
        flags |= libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(access.write)
        .create(access.create && access.write)
        .truncate(false)
        .mode(0o666)
        .custom_flags(flags)
        .open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// The holder lock (see the module doc): byte 0, as an open-file-description lock.
fn holder_lock(file: &File, kind: libc::c_int) -> bool {
    // SAFETY: a zeroed flock is a valid value; we set the fields F_OFD_SETLK reads.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = 0;
    lock.l_len = 1;
    // SAFETY: fcntl on a descriptor we own with a valid flock; l_pid must be 0 for OFD locks.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) == 0 }
}

/// Takes the holder lock exclusively if nobody else holds it: true proves that no other
/// open file description (no live process) holds the file. Drop to shared with
/// [`hold_shared`] afterwards.
pub fn hold_exclusive_if_unheld(file: &File) -> bool {
    holder_lock(file, libc::F_WRLCK)
}

/// Holds the holder lock shared (converting an exclusive one), retrying for `patience`
/// while a creator holds it exclusively; false if it never could.
pub fn hold_shared(file: &File, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        if holder_lock(file, libc::F_RDLCK) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Gives the holder lock back (a creator done with its exclusive check).
pub fn release_hold(file: &File) {
    holder_lock(file, libc::F_UNLCK);
}

/// A shared read-write mapping of a whole file; unmapped on drop.
pub struct MappedFile {
    base: *mut u8,
    len: usize,
    path: PathBuf,
    _file: File,
}

// SAFETY: the mapping is plain shared memory; the types built on it access it through
// atomics, or write it only under the init lock.
unsafe impl Send for MappedFile {}
// SAFETY: as above.
unsafe impl Sync for MappedFile {}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: `base` came from a successful mmap of `len` bytes.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// What an open found in the file before it sized it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// New or empty: initialise it.
    Empty,
    /// Another length (now zeroed and resized): rebuild it.
    WrongLength(u64),
    /// The right length: validate it.
    Sized,
}

/// How an open treated the file it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenOutcome {
    /// The file was new or empty and was initialised.
    Created,
    /// A valid file was attached as it was.
    Attached,
    /// The file was corrupt, foreign or of another length, and was rebuilt; the reason.
    Rebuilt(String),
}

impl Found {
    /// Brings a freshly opened mapping to a valid state (under the init lock): a new
    /// file is initialised, a file of another length or one that fails `check` is
    /// zeroed and initialised again.
    pub fn settle(
        self,
        map: &MappedFile,
        initialise: impl Fn(),
        check: impl FnOnce() -> Result<(), String>,
    ) -> OpenOutcome {
        match self {
            Found::Empty => {
                initialise();
                OpenOutcome::Created
            }
            Found::WrongLength(len) => {
                initialise();
                OpenOutcome::Rebuilt(format!("length {len}, expected {}", map.len))
            }
            Found::Sized => match check() {
                Ok(()) => OpenOutcome::Attached,
                Err(reason) => {
                    map.zero();
                    initialise();
                    OpenOutcome::Rebuilt(reason)
                }
            },
        }
    }
}

/// `flock(LOCK_EX)` on the file, held while the guard lives.
pub struct InitLock(RawFd);

impl InitLock {
    /// Tries for up to `patience`; holders keep it for microseconds, so waiting longer
    /// means something is badly off, and the caller proceeds unlocked.
    pub fn acquire(file: &File, patience: Duration) -> Option<InitLock> {
        let deadline = Instant::now() + patience;
        loop {
            // SAFETY: flock on a valid descriptor.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(InitLock(file.as_raw_fd()));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for InitLock {
    fn drop(&mut self) {
        // SAFETY: unlocking a descriptor we locked; the mapping keeps the file open
        // beyond the guard, and flock on a closed descriptor only fails with EBADF.
        unsafe { libc::flock(self.0, libc::LOCK_UN) };
    }
}

impl MappedFile {
    /// Opens `path` (mode 0666, created if missing) as a file of exactly `len` bytes and
    /// maps it. The returned lock is held until the caller drops it.
    pub fn open_or_create(
        path: &Path,
        len: usize,
    ) -> io::Result<(MappedFile, Found, Option<InitLock>)> {
        let file = open_regular(
            path,
            Access {
                write: true,
                create: true,
                follow_links: true,
            },
        )?;
        let lock = InitLock::acquire(&file, Duration::from_secs(2));
        let old_len = file.metadata()?.len();
        let found = match old_len {
            0 => Found::Empty,
            n if n == len as u64 => Found::Sized,
            n => Found::WrongLength(n),
        };
        if found != Found::Sized {
            file.set_len(0)?;
            file.set_len(len as u64)?;
            // Best effort: every container user must be able to write it.
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
        }
        Ok((MappedFile::map(file, path, len)?, found, lock))
    }

    /// Maps an existing file, which must be exactly `len` bytes (`Err(Ok(actual))` when
    /// it is not).
    pub fn open_existing(path: &Path, len: usize) -> Result<MappedFile, Result<u64, io::Error>> {
        let file = open_regular(
            path,
            Access {
                write: true,
                create: false,
                follow_links: true,
            },
        )
        .map_err(Err)?;
        let actual = file.metadata().map_err(Err)?.len();
        if actual != len as u64 {
            return Err(Ok(actual));
        }
        MappedFile::map(file, path, len).map_err(Err)
    }

    /// Maps `file`, which the caller has made exactly `len` bytes, shared read-write.
    pub fn map(file: File, path: &Path, len: usize) -> io::Result<MappedFile> {
        // SAFETY: mapping a file we hold open, of exactly `len` bytes, shared.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(MappedFile {
            base: base.cast(),
            len,
            path: path.to_path_buf(),
            _file: file,
        })
    }

    /// The first byte of the mapping (page aligned, `len` bytes).
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// The file this maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file behind the mapping.
    pub fn file(&self) -> &File {
        &self._file
    }

    /// Zeroes the whole mapping; only under the init lock, before rebuilding.
    pub fn zero(&self) {
        // SAFETY: the caller holds the init lock; the mapping is `len` bytes.
        unsafe { std::ptr::write_bytes(self.base, 0, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_resizes_and_reports_what_it_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m");
        let (map, found, _lock) = MappedFile::open_or_create(&path, 8192).expect("open");
        assert_eq!(found, Found::Empty);
        // SAFETY: test-only write inside the mapping.
        unsafe { *map.base() = 7 };
        drop(map);
        drop(_lock);
        let (map, found, _lock) = MappedFile::open_or_create(&path, 8192).expect("reopen");
        assert_eq!(found, Found::Sized);
        // SAFETY: test-only read inside the mapping.
        assert_eq!(unsafe { *map.base() }, 7);
        drop(map);
        drop(_lock);
        std::fs::write(&path, b"short").expect("write");
        let (_, found, _lock) = MappedFile::open_or_create(&path, 8192).expect("reopen");
        assert_eq!(found, Found::WrongLength(5));
        assert!(matches!(
            MappedFile::open_existing(&path, 4096),
            Err(Ok(8192))
        ));
        assert!(MappedFile::open_existing(&dir.path().join("none"), 4096).is_err());
    }

    #[test]
    fn fifos_are_refused_without_blocking_and_the_holder_lock_sees_other_holders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let error = MappedFile::open_or_create(&fifo, 4096)
            .err()
            .expect("refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
        let path = dir.path().join("m");
        let access = Access {
            write: true,
            create: true,
            follow_links: false,
        };
        let first = open_regular(&path, access).expect("open");
        let second = open_regular(&path, access).expect("open again");
        assert!(hold_exclusive_if_unheld(&first), "nobody holds it yet");
        assert!(
            !hold_shared(&second, Duration::from_millis(5)),
            "exclusive blocks"
        );
        assert!(hold_shared(&first, Duration::ZERO), "downgrade");
        assert!(hold_shared(&second, Duration::ZERO));
        assert!(
            !hold_exclusive_if_unheld(&second),
            "the first still holds it"
        );
        drop(first);
        // (Another test's fork may share the descriptor for an instant.)
        let deadline = Instant::now() + Duration::from_secs(2);
        while !hold_exclusive_if_unheld(&second) {
            assert!(Instant::now() < deadline, "closing released it");
            std::thread::sleep(Duration::from_millis(1));
        }
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        assert!(open_regular(&link, access).is_err(), "no link followed");
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b"", FNV_OFFSET), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a", FNV_OFFSET), 0xaf63_dc4c_8601_ec8c);
    }
}
