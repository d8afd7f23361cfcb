//! Opening a region: the shims map it (creating, attaching, updating limits in place,
//! or rebuilding), the host creates and updates it by file I/O without mapping it, and
//! readers open it as it is. Live usage is never erased: a damaged or foreign region is
//! rebuilt only when no live process holds it, and refused ([`RegionError::Held`])
//! while one does.

use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Region;
use super::layout::{
    HEADER_LEN, MAX_SLOTS, REGION_LEN, RegionDevice, aligned_zeroed, bytes_of, device_ranges,
    write_devices, write_header,
};
use super::read::RegionBytes;
use crate::config::MAX_DEVICES;
use crate::mapped::{self, Access, InitLock, MappedFile};
use crate::snapshot::RegionSnapshot;

/// Why a region could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The file could not be opened, sized or mapped.
    #[error("usage region {path}: {source}")]
    Io {
        /// The region file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The file is no usable region (and could not be rebuilt).
    #[error("usage region {path}: {reason}")]
    Invalid {
        /// The region file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The region fails its checks (or belongs to other devices) while live processes
    /// hold it: rebuilding it would erase their usage, so it is left as it is.
    #[error("usage region {path}: {reason}, and live processes still hold it; it is left as it is")]
    Held {
        /// The region file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// More devices than a region records.
    #[error("usage region: {0} devices, at most {MAX_DEVICES}")]
    TooManyDevices(usize),
    /// No process slot is free.
    #[error("usage region {0}: all {MAX_SLOTS} process slots are held by live processes")]
    Full(PathBuf),
}

/// How an open (or the host's creation) treated the file it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenOutcome {
    /// The file was new or empty and was initialised.
    Created,
    /// A valid region for these devices and limits, used as it was.
    Attached,
    /// A valid region for these devices whose limits were rewritten in place (a new
    /// quota for a running container); every process's usage is kept.
    LimitsUpdated,
    /// The file was corrupt, foreign, of another length or for other devices, and no
    /// live process held it, so it was rebuilt; the reason.
    Rebuilt(String),
}

/// How the devices a region records compare with the ones a caller wants.
#[derive(Debug, PartialEq, Eq)]
enum Fit {
    Same,
    /// The same devices in the same order; only limits differ.
    Limits,
    Devices,
}

fn fit(found: &[RegionDevice], wanted: &[RegionDevice]) -> Fit {
    if found == wanted {
        Fit::Same
    } else if found.len() == wanted.len() && found.iter().zip(wanted).all(|(a, b)| a.id == b.id) {
        Fit::Limits
    } else {
        Fit::Devices
    }
}

/// What a found region needs, given what it holds and whether anyone holds it.
fn verdict(
    check: Result<Fit, String>,
    unheld: bool,
    path: &Path,
) -> Result<Option<OpenOutcome>, RegionError> {
    match check {
        Ok(Fit::Same) => Ok(Some(OpenOutcome::Attached)),
        Ok(Fit::Limits) => Ok(Some(OpenOutcome::LimitsUpdated)),
        Ok(Fit::Devices) if unheld => Ok(None),
        Ok(Fit::Devices) => Err(RegionError::Held {
            path: path.to_path_buf(),
            reason: "it records other devices than the config".into(),
        }),
        Err(_) if unheld => Ok(None),
        Err(reason) => Err(RegionError::Held {
            path: path.to_path_buf(),
            reason,
        }),
    }
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> RegionError + '_ {
    move |source| {
        if source.kind() == io::ErrorKind::InvalidInput {
            RegionError::Invalid {
                path: path.to_path_buf(),
                reason: source.to_string(),
            }
        } else {
            RegionError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

/// A region file as an open or a creation found it: under its init lock, with its
/// length and whether any other process holds it (see [`crate::mapped`]).
struct Found {
    file: std::fs::File,
    lock: Option<InitLock>,
    len: u64,
    /// No other holder: we hold the holder lock exclusively.
    unheld: bool,
}

impl Found {
    fn open(
        path: &Path,
        devices: &[RegionDevice],
        follow_links: bool,
        patience: Duration,
    ) -> Result<Found, RegionError> {
        if devices.len() > MAX_DEVICES {
            return Err(RegionError::TooManyDevices(devices.len()));
        }
        let error = io_error(path);
        let access = Access {
            write: true,
            create: true,
            follow_links,
        };
        let file = mapped::open_regular(path, access).map_err(&error)?;
        let lock = InitLock::acquire(&file, patience);
        let len = file.metadata().map_err(&error)?.len();
        let unheld = mapped::hold_exclusive_if_unheld(&file);
        Ok(Found {
            file,
            lock,
            len,
            unheld,
        })
    }

    /// Empties the file into a zeroed one of the region's length (mode 0666, so every
    /// container user can write it) when nobody holds it; else refuses, extending a
    /// short file first so the holders' mappings stay backed (a truncated mapping is
    /// SIGBUS).
    fn reset(&self, path: &Path) -> Result<OpenOutcome, RegionError> {
        let error = io_error(path);
        let reason = format!("length {}, expected {REGION_LEN}", self.len);
        if !self.unheld {
            if self.len < REGION_LEN as u64 {
                let _ = self.file.set_len(REGION_LEN as u64);
            }
            return Err(RegionError::Held {
                path: path.to_path_buf(),
                reason,
            });
        }
        self.file.set_len(0).map_err(&error)?;
        self.file.set_len(REGION_LEN as u64).map_err(&error)?;
        // Best effort: the file may belong to another user.
        let _ = self
            .file
            .set_permissions(std::fs::Permissions::from_mode(0o666));
        Ok(if self.len == 0 {
            OpenOutcome::Created
        } else {
            OpenOutcome::Rebuilt(reason)
        })
    }
}

/// How long a process waits for another's init lock or exclusive check.
const PATIENCE: Duration = Duration::from_secs(2);

impl Region {
    /// Opens the region at `path` for `devices` (the shims): creates a missing or empty
    /// file; attaches to a valid one, rewriting its limits in place when only they
    /// differ; rebuilds a corrupt, foreign or resized one, or one for other devices,
    /// only when no live process holds it, and otherwise refuses ([`RegionError::Held`])
    /// and leaves it untouched, so live usage is never erased. The caller then holds the
    /// file until the value is dropped. A FIFO or other special file is refused without
    /// blocking.
    pub fn open(
        path: &Path,
        devices: &[RegionDevice],
    ) -> Result<(Region, OpenOutcome), RegionError> {
        let found = Found::open(path, devices, true, PATIENCE)?;
        let error = io_error(path);
        let Found {
            file,
            lock,
            len,
            unheld,
        } = found;
        let outcome = if len == REGION_LEN as u64 {
            let region = Region {
                map: MappedFile::map(file, path, REGION_LEN).map_err(&error)?,
            };
            let check = RegionBytes::check(&region).map(|()| fit(&region.devices(), devices));
            let reason = check.as_ref().err().cloned();
            let outcome = match verdict(check, unheld, path)? {
                Some(OpenOutcome::LimitsUpdated) => {
                    // SAFETY: under the init lock; the header is the mapping's first page.
                    unsafe { write_devices(region.map.base(), devices) };
                    OpenOutcome::LimitsUpdated
                }
                Some(outcome) => outcome,
                None => {
                    region.map.zero();
                    // SAFETY: under the init lock, with no other holder (checked).
                    unsafe { write_header(region.map.base(), devices) };
                    OpenOutcome::Rebuilt(
                        reason.unwrap_or_else(|| "devices differ from the config".into()),
                    )
                }
            };
            (region, outcome)
        } else {
            let found = Found {
                file,
                lock: None,
                len,
                unheld,
            };
            let outcome = found.reset(path)?;
            let region = Region {
                map: MappedFile::map(found.file, path, REGION_LEN).map_err(&error)?,
            };
            // SAFETY: under the init lock on a freshly zeroed file nobody else holds.
            unsafe { write_header(region.map.base(), devices) };
            (region, outcome)
        };
        // Converts our exclusive check (if it succeeded) into a shared hold.
        mapped::hold_shared(outcome.0.map.file(), PATIENCE);
        drop(lock);
        Ok(outcome)
    }

    /// Creates or updates the region at `path` for `devices` with file I/O only (the
    /// host: the device plugin at PreStart, the DRA driver, `vgpu run`), never mapping
    /// the tenant-writable file and never following a link. The same rules as
    /// [`Region::open`]: a valid region keeps every process's usage (its limits are
    /// rewritten in place if they differ), a damaged one is rebuilt only when no live
    /// process holds it.
    pub fn create_file(path: &Path, devices: &[RegionDevice]) -> Result<OpenOutcome, RegionError> {
        let found = Found::open(path, devices, false, Duration::from_millis(500))?;
        let error = io_error(path);
        let mut image = aligned_zeroed(HEADER_LEN);
        // SAFETY: a private HEADER_LEN buffer, 64-byte aligned.
        unsafe { write_header(image.as_mut_ptr().cast(), devices) };
        let image = bytes_of(&mut image);
        let result = (|| {
            let mut reason = None;
            if found.len == REGION_LEN as u64 {
                let copy = RegionSnapshot::read_file(&found.file, path)?;
                let check = RegionBytes::check(&copy).map(|()| fit(&copy.devices(), devices));
                reason = check.as_ref().err().cloned();
                match verdict(check, found.unheld, path)? {
                    Some(OpenOutcome::LimitsUpdated) => {
                        for range in device_ranges() {
                            found
                                .file
                                .write_all_at(&image[range.clone()], range.start as u64)
                                .map_err(&error)?;
                        }
                        return Ok(OpenOutcome::LimitsUpdated);
                    }
                    Some(outcome) => return Ok(outcome),
                    None => {}
                }
            }
            let outcome = found.reset(path)?;
            found.file.write_all_at(image, 0).map_err(&error)?;
            Ok(match (outcome, reason) {
                (OpenOutcome::Rebuilt(_), Some(reason)) => OpenOutcome::Rebuilt(reason),
                (outcome, _) => outcome,
            })
        })();
        mapped::release_hold(&found.file);
        result
    }

    /// Opens an existing region without changing it (host daemon, NVML readers).
    pub fn open_existing(path: &Path) -> Result<Region, RegionError> {
        let map = MappedFile::open_existing(path, REGION_LEN).map_err(|error| match error {
            Ok(len) => RegionError::Invalid {
                path: path.to_path_buf(),
                reason: format!("length {len}, expected {REGION_LEN}"),
            },
            Err(source) => io_error(path)(source),
        })?;
        let region = Region { map };
        RegionBytes::check(&region).map_err(|reason| RegionError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(region)
    }

    /// The region's file.
    pub fn path(&self) -> &Path {
        self.map.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process;
    use crate::region::SlotId;
    use crate::region::layout::Header;
    use crate::region::test_devices as devices;

    /// A process holding 600 MiB, its mapping kept, and the path of its region.
    fn holder(dir: &Path) -> (Region, SlotId, PathBuf) {
        let path = dir.join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        let slot = region.attach(&process::current()).expect("attach");
        assert!(region.try_reserve(slot, 0, 600 << 20, 1 << 30));
        (region, slot, path)
    }

    #[test]
    fn corrupt_and_foreign_regions_are_rebuilt_when_nobody_holds_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        drop(Region::open(&path, &devices()).expect("open"));
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[200] ^= 0xff; // inside the device table
        std::fs::write(&path, &bytes).expect("write");
        let (_, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert!(
            matches!(outcome, OpenOutcome::Rebuilt(ref why) if why.contains("checksum")),
            "{outcome:?}"
        );
        std::fs::write(&path, b"not a region").expect("write");
        let (_, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)));
        assert!(Region::open_existing(&path).is_ok());
        std::fs::write(&path, vec![7u8; REGION_LEN]).expect("write");
        assert!(Region::open_existing(&path).is_err());
        let (_, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)));
        let other = vec![RegionDevice {
            id: "GPU-other".into(),
            ..devices()[0].clone()
        }];
        let (_, outcome) = Region::open(&path, &other).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)), "{outcome:?}");
    }

    #[test]
    fn a_damaged_region_under_a_live_holder_is_refused_and_never_zeroed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _slot, path) = holder(dir.path());
        // Damage the checksum through a second descriptor (the holder keeps running).
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.write_all_at(&[0xff; 8], std::mem::offset_of!(Header, checksum) as u64)
            .expect("pwrite");
        let error = Region::open(&path, &devices()).err().expect("refused");
        assert!(
            matches!(error, RegionError::Held { ref reason, .. } if reason.contains("checksum")),
            "{error}"
        );
        assert!(
            error.to_string().contains("live processes still hold it"),
            "{error}"
        );
        assert_eq!(
            region.device_used(0),
            600 << 20,
            "the holder's usage is intact"
        );
        assert!(matches!(
            Region::create_file(&path, &devices()),
            Err(RegionError::Held { .. })
        ));
        // A resize (truncation) under the holder: the length is restored, never zeroed
        // further, and the region is still refused.
        file.set_len(4096).expect("truncate");
        assert!(matches!(
            Region::open(&path, &devices()),
            Err(RegionError::Held { .. })
        ));
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            REGION_LEN as u64
        );
        drop(region);
        // Nobody holds it now: rebuilt.
        let (_, outcome) = Region::open(&path, &devices()).expect("reopen");
        assert!(matches!(outcome, OpenOutcome::Rebuilt(_)), "{outcome:?}");
    }

    #[test]
    fn other_devices_under_a_live_holder_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, _slot, path) = holder(dir.path());
        let other = vec![RegionDevice {
            id: "GPU-other".into(),
            ..devices()[0].clone()
        }];
        let error = Region::open(&path, &other).err().expect("refused");
        assert!(matches!(error, RegionError::Held { .. }), "{error}");
        assert_eq!(region.device_used(0), 600 << 20);
    }

    #[test]
    fn a_new_quota_for_a_running_container_keeps_its_usage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (region, slot, path) = holder(dir.path());
        let mut bigger = devices();
        bigger[0].memory_limit = 2 << 30;
        let (second, outcome) = Region::open(&path, &bigger).expect("reopen");
        assert_eq!(outcome, OpenOutcome::LimitsUpdated);
        assert_eq!(second.devices(), bigger);
        assert_eq!(region.devices(), bigger, "the holder's mapping sees it");
        assert_eq!(second.device_used(0), 600 << 20, "usage kept");
        assert_eq!(region.processes()[0].slot, slot.index());
        // The host's file-I/O creator does the same, and says when nothing changed.
        let mut smaller = devices();
        smaller[0].memory_limit = 512 << 20;
        assert_eq!(
            Region::create_file(&path, &smaller).expect("update"),
            OpenOutcome::LimitsUpdated
        );
        assert_eq!(region.devices(), smaller);
        assert_eq!(region.device_used(0), 600 << 20);
        assert_eq!(
            Region::create_file(&path, &smaller).expect("again"),
            OpenOutcome::Attached
        );
        assert!(
            crate::snapshot::RegionSnapshot::read(&path).is_ok(),
            "checksum right"
        );
    }

    #[test]
    fn the_host_creates_regions_by_file_io_and_refuses_links_and_fifos() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        assert_eq!(
            Region::create_file(&path, &devices()).expect("create"),
            OpenOutcome::Created
        );
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o666, "every container user can write it");
        let (region, outcome) = Region::open(&path, &devices()).expect("shim attaches");
        assert_eq!(outcome, OpenOutcome::Attached);
        assert_eq!(region.devices(), devices());
        drop(region);
        std::fs::File::create(&path).expect("empty it, as the plugin's Allocate does");
        assert_eq!(
            Region::create_file(&path, &devices()).expect("create"),
            OpenOutcome::Created
        );
        std::fs::write(&path, b"junk").expect("junk");
        assert!(matches!(
            Region::create_file(&path, &devices()).expect("rebuild"),
            OpenOutcome::Rebuilt(_)
        ));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        assert!(
            Region::create_file(&link, &devices()).is_err(),
            "no link followed"
        );
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            Region::create_file(&fifo, &devices()),
            Err(RegionError::Invalid { .. })
        ));
        assert!(matches!(
            Region::open(&fifo, &devices()),
            Err(RegionError::Invalid { .. })
        ));
    }
}
