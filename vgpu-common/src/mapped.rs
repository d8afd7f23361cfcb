//! Fixed-size, file-backed shared mappings: the common ground of the usage region and
//! the per-card state. Opening creates or resizes the file under a short `flock` (which
//! the kernel drops if its holder dies, so no process can leave it held), and reports
//! what it found, so the caller can initialise, validate or rebuild the contents while
//! it still holds the lock.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
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
    fn acquire(file: &File, patience: Duration) -> Option<InitLock> {
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
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)?;
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
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(Err)?;
        let actual = file.metadata().map_err(Err)?.len();
        if actual != len as u64 {
            return Err(Ok(actual));
        }
        MappedFile::map(file, path, len).map_err(Err)
    }

    fn map(file: File, path: &Path, len: usize) -> io::Result<MappedFile> {
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

    pub fn path(&self) -> &Path {
        &self.path
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
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b"", FNV_OFFSET), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a", FNV_OFFSET), 0xaf63_dc4c_8601_ec8c);
    }
}
