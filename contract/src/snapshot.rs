//! The host side's view of a usage region: a private copy read with `read(2)`, never a
//! shared mapping.
//!
//! A region is written by the container's own processes, so to the host (the device
//! plugin, the DRA driver, `vgpu run`'s coordinator) it is tenant input. A tenant can
//! truncate a file under a shared mapping, and the next access to the lost pages kills
//! the mapper with SIGBUS; it can replace the file with a FIFO and stall an `open` or a
//! `read`. So the host opens with `O_NONBLOCK | O_NOFOLLOW`, refuses anything but a
//! regular file of exactly the region's length, copies the bytes into a buffer of its
//! own, validates the copy with the same checks the shims apply, and reads counters only
//! from the copy (clamped, as every reader clamps them). The one thing the host writes
//! into a region, a slot's host PID, goes in with `pwrite(2)`, which a truncation can
//! only make fail.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::mapped::{self, Access};
use crate::region::{
    Block, CONTAINER_LIMITER_WORDS, MAX_SLOTS, ProcessUsage, REGION_LEN, RegionBytes, RegionDevice,
    RegionError, SLOT_LIMITER_WORDS, aligned_zeroed, bytes_of, free_slot_by_io, host_pid_offset,
};

/// A validated private copy of a usage region.
pub struct RegionSnapshot {
    blocks: Box<[Block]>,
    path: PathBuf,
}

impl RegionBytes for RegionSnapshot {
    fn base(&self) -> *const u8 {
        self.blocks.as_ptr().cast()
    }
}

/// Opens a tenant-writable file for the host without following a link or blocking on a
/// FIFO, and refuses anything that is not a regular file of `len` bytes.
fn open_regular(path: &Path, write: bool, len: usize) -> Result<File, RegionError> {
    let access = Access {
        write,
        create: false,
        follow_links: false,
    };
    let file = mapped::open_regular(path, access).map_err(|source| {
        if source.kind() == io::ErrorKind::InvalidInput {
            RegionError::Invalid {
                path: path.to_path_buf(),
                reason: "not a regular file".into(),
            }
        } else {
            RegionError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    let actual = file
        .metadata()
        .map_err(|source| RegionError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    if actual != len as u64 {
        return Err(RegionError::Invalid {
            path: path.to_path_buf(),
            reason: format!("length {actual}, expected {len}"),
        });
    }
    Ok(file)
}

impl RegionSnapshot {
    /// Copies the region at `path` and validates the copy.
    pub fn read(path: &Path) -> Result<RegionSnapshot, RegionError> {
        let file = open_regular(path, false, REGION_LEN)?;
        let snapshot = RegionSnapshot::read_file(&file, path)?;
        RegionBytes::check(&snapshot).map_err(|reason| RegionError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(snapshot)
    }

    /// Copies an open region file (not validated yet).
    pub(crate) fn read_file(file: &File, path: &Path) -> Result<RegionSnapshot, RegionError> {
        let mut blocks = aligned_zeroed(REGION_LEN);
        // A file truncated after the length check reads short: that is an error, never
        // a partly zeroed snapshot.
        file.read_exact_at(bytes_of(&mut blocks), 0)
            .map_err(|source| RegionError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(RegionSnapshot {
            blocks,
            path: path.to_path_buf(),
        })
    }

    /// Where the copy came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The devices recorded at creation.
    pub fn devices(&self) -> Vec<RegionDevice> {
        RegionBytes::devices(self)
    }

    /// Bytes held on `device` by all processes, as the copy says.
    pub fn device_used(&self, device: usize) -> u64 {
        RegionBytes::device_used(self, device)
    }

    /// Every live process and its counters, as the copy says.
    pub fn processes(&self) -> Vec<ProcessUsage> {
        RegionBytes::processes(self)
    }

    /// The container's counters on `device` (refusals, bytes refused, throttled time,
    /// times over quota), as the copy says (zeros out of range; each word clamped).
    pub fn counters(&self, device: usize) -> crate::region::QuotaCounters {
        RegionBytes::counters(self, device)
    }

    /// The compute limiter's container-wide words for `device`, as the copy says (zeros
    /// for a device of `MAX_DEVICES` or more).
    pub fn container_limiter(&self, device: usize) -> [u64; CONTAINER_LIMITER_WORDS] {
        RegionBytes::container_limiter_words(self, device)
    }

    /// The limiter's words of slot `slot` (a [`ProcessUsage::slot`]) for `device`, as the
    /// copy says (zeros out of range).
    pub fn slot_limiter(&self, slot: usize, device: usize) -> [u64; SLOT_LIMITER_WORDS] {
        RegionBytes::slot_limiter_words(self, slot, device)
    }

    /// Fills in, with [`write_host_pid`], the host PID of every live process of the copy
    /// that runs in another PID namespace and has none yet (found in `proc_root`, the
    /// host's `/proc`, as `region::find_host_pids` finds it). Returns
    /// how many were written; a file that changed meanwhile only makes a write fail.
    pub fn fill_host_pids(&self, proc_root: &Path) -> usize {
        crate::region::find_host_pids(&crate::region::wanting_host_pids(self), proc_root)
            .into_iter()
            .filter(|&(slot, host_pid)| write_host_pid(&self.path, slot, host_pid).is_ok())
            .count()
    }
}

/// Frees, with `pread`/`pwrite` on the file at `path` (never a mapping), the slots of
/// processes that are gone as this process's PID namespace sees them (the rules of
/// `Region::reclaim_dead`): what the init of a PID namespace does once it has killed
/// and reaped every other process of it, so that their usage comes back even though no
/// process outside can judge them. Not atomic against another reclaimer of the same
/// slots. Returns how many it freed.
pub fn reclaim_dead(path: &Path) -> Result<usize, RegionError> {
    let file = open_regular(path, true, REGION_LEN)?;
    let copy = RegionSnapshot::read_file(&file, path)?;
    RegionBytes::check(&copy).map_err(|reason| RegionError::Invalid {
        path: path.to_path_buf(),
        reason,
    })?;
    let my_ns = crate::process::pid_namespace_in(Path::new("/proc"), "self").unwrap_or(0);
    let mut freed = 0;
    for (index, owner) in crate::region::dead_slots(&copy, my_ns) {
        if free_slot_by_io(&file, index, owner).map_err(|source| RegionError::Io {
            path: path.to_path_buf(),
            source,
        })? {
            freed += 1;
        }
    }
    Ok(freed)
}

/// Writes the host PID of slot `slot` into the region at `path` with `pwrite(2)`. Only
/// for a slot a snapshot of that file showed live.
pub fn write_host_pid(path: &Path, slot: usize, host_pid: i32) -> Result<(), RegionError> {
    if slot >= MAX_SLOTS {
        return Err(RegionError::Invalid {
            path: path.to_path_buf(),
            reason: format!("slot {slot} out of range"),
        });
    }
    let file = open_regular(path, true, REGION_LEN)?;
    file.write_all_at(&host_pid.to_le_bytes(), host_pid_offset(slot) as u64)
        .map_err(|source| RegionError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Counts one finding by the host that the container of the region at `path` holds
/// more than its quota on `device` (the coordinator's reconciliation with NVML): reads
/// and rewrites the host's own counter word ([`crate::region::counter::HOST_OVER_QUOTA`])
/// with `pread`/`pwrite`, never mapping the tenant's file. Returns the new count. Only
/// one host writer per region (the coordinator that owns it), so nothing is lost.
pub fn count_over_quota_by_io(path: &Path, device: usize) -> Result<u64, RegionError> {
    let offset = crate::region::counter_offset(device, crate::region::counter::HOST_OVER_QUOTA)
        .ok_or_else(|| RegionError::Invalid {
            path: path.to_path_buf(),
            reason: format!("device {device} out of range"),
        })?;
    let file = open_regular(path, true, REGION_LEN)?;
    let io = |source| RegionError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, offset).map_err(io)?;
    let next = u64::from_le_bytes(word)
        .min(crate::region::MAX_COUNT)
        .saturating_add(1);
    file.write_all_at(&next.to_le_bytes(), offset).map_err(io)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process;
    use crate::region::Region;

    fn devices() -> Vec<RegionDevice> {
        vec![RegionDevice {
            id: "GPU-test".into(),
            memory_limit: 1 << 30,
            core_limit: 30,
            core_mode: 0,
        }]
    }

    #[test]
    fn the_host_counts_over_quota_by_io_beside_the_shims_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        region.count_over_quota(0);
        assert_eq!(count_over_quota_by_io(&path, 0).expect("bump"), 1);
        assert_eq!(count_over_quota_by_io(&path, 0).expect("bump"), 2);
        assert!(count_over_quota_by_io(&path, crate::config::MAX_DEVICES).is_err());
        assert_eq!(
            region.counters(0).over_quota,
            3,
            "the shim's 1 and the host's 2"
        );
        assert_eq!(
            RegionSnapshot::read(&path)
                .expect("copy")
                .counters(0)
                .over_quota,
            3
        );
        assert!(count_over_quota_by_io(&dir.path().join("missing"), 0).is_err());
    }

    #[test]
    fn a_copy_reads_what_the_mapping_holds_and_host_pids_go_in_by_pwrite() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        let slot = region.attach(&process::current()).expect("attach");
        region.add_used(slot, 0, 12345);
        let copy = RegionSnapshot::read(&path).expect("snapshot");
        assert_eq!(copy.device_used(0), 12345);
        assert_eq!(copy.devices(), devices());
        assert_eq!(copy.processes().len(), 1);
        let before = copy.processes()[0].host_pid;
        assert_ne!(before, 4242);
        write_host_pid(&path, slot.index(), 4242).expect("pwrite");
        assert_eq!(
            region.processes()[0].host_pid,
            4242,
            "the mapping sees the write"
        );
        assert_eq!(copy.processes()[0].host_pid, before, "the copy is private");
        region.container_limiter(1)[2].store(31, std::sync::atomic::Ordering::SeqCst);
        region.slot_limiter(slot, 0)[1].store(42, std::sync::atomic::Ordering::SeqCst);
        let copy = RegionSnapshot::read(&path).expect("snapshot");
        assert_eq!(copy.container_limiter(1)[2], 31);
        assert_eq!(copy.slot_limiter(slot.index(), 0)[1], 42);
        assert_eq!(copy.slot_limiter(crate::region::MAX_SLOTS, 0), [0; 4]);
        assert_eq!(copy.container_limiter(99), [0; 16]);
    }

    #[test]
    fn dead_slots_are_freed_by_file_io() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        let me = process::current();
        let live = region.attach(&me).expect("attach");
        region.add_used(live, 0, 7);
        let ghost = region
            .attach(&process::Identity {
                start_time: me.start_time + 1,
                ..me
            })
            .expect("attach ghost");
        region.add_used(ghost, 0, 1000);
        assert_eq!(reclaim_dead(&path).expect("reclaim"), 1);
        assert_eq!(region.device_used(0), 7, "the ghost's usage came back");
        assert_eq!(region.processes().len(), 1);
        // The freed slot is claimed anew, by CAS, as any free one.
        let again = region
            .attach(&process::Identity {
                start_time: me.start_time + 2,
                ..me
            })
            .expect("claim the freed slot");
        assert_eq!(again.index(), ghost.index());
        assert_eq!(reclaim_dead(&path).expect("reclaim"), 1);
        assert_eq!(reclaim_dead(&path).expect("nothing left"), 0);
    }

    #[test]
    fn limiter_words_are_shared_copied_and_cleared_with_their_slot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let (region, _) = Region::open(&path, &devices()).expect("open");
        let slot = region.attach(&process::current()).expect("attach");
        region.container_limiter(0)[3].store(77, std::sync::atomic::Ordering::SeqCst);
        region.slot_limiter(slot, 0)[1].store(99, std::sync::atomic::Ordering::SeqCst);
        let (other, _) = Region::open(&path, &devices()).expect("second mapping");
        assert_eq!(
            other.container_limiter(0)[3].load(std::sync::atomic::Ordering::SeqCst),
            77
        );
        let copy = RegionSnapshot::read(&path).expect("snapshot");
        assert_eq!(copy.container_limiter(0)[3], 77);
        assert_eq!(copy.slot_limiter(slot.index(), 0)[1], 99);
        assert_eq!(copy.slot_limiter(slot.index(), 1), [0; SLOT_LIMITER_WORDS]);
        // Out-of-range indices are clamped, never out of bounds.
        let _ = copy.container_limiter(usize::MAX);
        let _ = copy.slot_limiter(usize::MAX, usize::MAX);
        region.detach(slot);
        let slot = region.attach(&process::current()).expect("attach again");
        assert_eq!(
            region.slot_limiter(slot, 0)[1].load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }

    #[test]
    fn truncated_foreign_and_special_files_are_refused_without_a_signal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        drop(Region::open(&path, &devices()).expect("open"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.set_len(4096).expect("truncate");
        assert!(matches!(
            RegionSnapshot::read(&path),
            Err(RegionError::Invalid { .. })
        ));
        assert!(write_host_pid(&path, 0, 1).is_err());
        std::fs::write(&path, vec![0x5a; REGION_LEN]).expect("garbage");
        assert!(matches!(
            RegionSnapshot::read(&path),
            Err(RegionError::Invalid { .. })
        ));
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        // A FIFO with no writer would block a plain open forever.
        assert!(matches!(
            RegionSnapshot::read(&fifo),
            Err(RegionError::Invalid { .. })
        ));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        assert!(matches!(
            RegionSnapshot::read(&link),
            Err(RegionError::Io { .. })
        ));
    }
}
