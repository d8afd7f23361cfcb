//! The host-owned compute view of one card: `<card_state_dir>/<uuid>.card`.
//!
//! The coordinator (`coordinator.rs`, on the host) writes it; the CUDA shims of every
//! container on the card read it, read-only, to learn what their container may use now.
//! It is the only compute state containers share, and no tenant writes it: the folder is
//! the host's (0755), each file is replaced whole by a rename (0644), and containers get
//! the folder through a read-only mount. A reader opens the file afresh each time (a
//! rename replaces it; a shared mapping would keep the old one) without following links
//! or blocking on a FIFO, and copies at most `MAX_VIEW_LEN` bytes with `pread`;
//! [`ViewReader`] does so only when an `lstat` shows the file was replaced.
//!
//! The format is text, one record a line, so an operator can read it:
//!
//! ```text
//! vgpu-card-view 2
//! card GPU-5e0f0c5a-1111-2222-3333-444455556666
//! written_ns 81234567890
//! container alloc-1 limit 30 mode soft ceiling 60 allowed 30 active 1 busy_permille 412 card_permille 298 charge_permille 723
//! container alloc-2 limit 40 mode hard ceiling 40 allowed 40 active 1 busy_permille 455 card_permille 401 charge_permille 881
//! end
//! ```
//!
//! `allowed` is the percent of the card the container may use now; `busy_permille` is
//! the card's time the container measured itself over about the last second,
//! `card_permille` what the card (NVML) measured of it (`-` where it cannot say), and
//! `charge_permille` the factor, per mille, by which its limiter scales what it charges
//! (the host's correction; see `coordinator.rs`); `written_ns` is `CLOCK_MONOTONIC`. A view older than `STALE_NS`, one that does not parse, one for
//! another card or one without the reader's container means "assume contended": a soft
//! container keeps to its limit, and every container charges what it measured (a factor
//! of 1). Whatever a view says, a reader never goes below its own `core_limit` nor above
//! its own ceiling ([`allowed_percent`]), and takes a factor only within
//! [`CHARGE_MIN_PERMILLE`, `CHARGE_MAX_PERMILLE`] ([`charge_permille`]).

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::{CoreMode, validate_container_id};

/// First line of every view.
pub const MAGIC_LINE: &str = "vgpu-card-view 2";
/// The most bytes a reader copies (far more than `MAX_CONTAINERS` lines).
pub const MAX_VIEW_LEN: usize = 64 * 1024;
/// The most containers one view lists.
pub const MAX_CONTAINERS: usize = 256;
/// A view older than this is stale: the coordinator is gone or stuck.
pub const STALE_NS: u64 = 1_000_000_000;
/// A charge factor of one, per mille.
pub const CHARGE_UNIT: u64 = 1000;
/// The least factor a reader takes: a container may be charged half of what it
/// measured (its events also timed other containers' time slices), never less.
pub const CHARGE_MIN_PERMILLE: u64 = 500;
/// The most factor a reader takes: 16 times what it measured (the card saw more of its
/// work than it counted: launches that escape its limiter, by as much as the card shows,
/// up to this).
pub const CHARGE_MAX_PERMILLE: u64 = 16_000;
/// The most `charge_permille` a view may say and still parse (a reader then takes
/// [`CHARGE_MAX_PERMILLE`] of it).
const MAX_WRITTEN_CHARGE_PERMILLE: u32 = 1_000_000;

/// One container on the card, as the coordinator judged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewEntry {
    /// The container's `container_id`.
    pub id: String,
    /// Its entitlement: percent of the card, 1-100.
    pub limit: u32,
    /// Hard or soft limit.
    pub mode: CoreMode,
    /// What soft mode may take on an idle card (the limit in hard mode).
    pub ceiling: u32,
    /// What it may use now.
    pub allowed: u32,
    /// Whether it had GPU work (or waited to launch) lately.
    pub active: bool,
    /// The card's time it measured itself over about the last second, per mille.
    pub busy_permille: u32,
    /// The card's time the card measured of it over about the last second, per mille
    /// (`None`: the card cannot say).
    pub card_permille: Option<u32>,
    /// The factor its limiter scales its charges by, per mille.
    pub charge_permille: u32,
}

/// A whole view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CardView {
    /// The card.
    pub uuid: String,
    /// When the coordinator wrote it (`clock::monotonic_ns`).
    pub written_ns: u64,
    /// Every container on the card.
    pub containers: Vec<ViewEntry>,
}

/// Why a view could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// The UUID cannot name a file.
    #[error("card view: `{0}` is not a usable card UUID for a file name")]
    BadUuid(String),
    /// The file could not be read or written.
    #[error("card view {path}: {source}")]
    Io {
        /// The view file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The file is not a valid view.
    #[error("card view {path}: {reason}")]
    Invalid {
        /// The view file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Whether `uuid` can name a view file: no separators, no leading dot, printable.
pub fn valid_uuid(uuid: &str) -> bool {
    !uuid.is_empty()
        && uuid.len() < 96
        && !uuid.starts_with('.')
        && uuid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'.'))
}

fn mode_name(mode: CoreMode) -> &'static str {
    match mode {
        CoreMode::Hard => "hard",
        CoreMode::Soft => "soft",
    }
}

impl CardView {
    /// `<dir>/<uuid>.card`.
    pub fn path_for(dir: &Path, uuid: &str) -> Result<PathBuf, ViewError> {
        if !valid_uuid(uuid) {
            return Err(ViewError::BadUuid(uuid.to_string()));
        }
        Ok(dir.join(format!("{uuid}.card")))
    }

    /// The entry of container `id`.
    pub fn entry(&self, id: &str) -> Option<&ViewEntry> {
        self.containers.iter().find(|entry| entry.id == id)
    }

    /// The view as text.
    pub fn render(&self) -> String {
        let mut text = format!(
            "{MAGIC_LINE}\ncard {}\nwritten_ns {}\n",
            self.uuid, self.written_ns
        );
        for entry in self.containers.iter().take(MAX_CONTAINERS) {
            text.push_str(&format!(
                "container {} limit {} mode {} ceiling {} allowed {} active {} busy_permille {} card_permille {} charge_permille {}\n",
                entry.id,
                entry.limit,
                mode_name(entry.mode),
                entry.ceiling,
                entry.allowed,
                entry.active as u8,
                entry.busy_permille,
                entry
                    .card_permille
                    .map_or_else(|| "-".to_string(), |p| p.to_string()),
                entry.charge_permille
            ));
        }
        text.push_str("end\n");
        text
    }

    /// Parses and checks a view's text.
    pub fn parse(text: &str) -> Result<CardView, String> {
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC_LINE) {
            return Err("not a vgpu card view (first line)".into());
        }
        let uuid = lines
            .next()
            .and_then(|line| line.strip_prefix("card "))
            .filter(|uuid| valid_uuid(uuid))
            .ok_or("no card line")?
            .to_string();
        let written_ns = lines
            .next()
            .and_then(|line| line.strip_prefix("written_ns "))
            .and_then(|value| value.parse().ok())
            .ok_or("no written_ns line")?;
        let mut containers = Vec::new();
        for line in lines {
            if line == "end" {
                return Ok(CardView {
                    uuid,
                    written_ns,
                    containers,
                });
            }
            if containers.len() == MAX_CONTAINERS {
                return Err(format!("more than {MAX_CONTAINERS} containers"));
            }
            containers.push(parse_entry(line).ok_or_else(|| format!("bad line `{line}`"))?);
        }
        Err("truncated (no end line)".into())
    }

    /// Replaces `<dir>/<uuid>.card` with this view: a temp file in `dir`, mode 0644,
    /// renamed over the old one, so a reader sees the old view or the new, never a mix.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, ViewError> {
        let path = CardView::path_for(dir, &self.uuid)?;
        let io_err = |source| ViewError::Io {
            path: path.clone(),
            source,
        };
        let staging = dir.join(format!(".{}.card.{}.tmp", self.uuid, std::process::id()));
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&staging)
            .map_err(io_err)?;
        let written = file
            .write_all(self.render().as_bytes())
            .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(0o644)));
        drop(file);
        if let Err(source) = written.and_then(|()| std::fs::rename(&staging, &path)) {
            let _ = std::fs::remove_file(&staging);
            return Err(io_err(source));
        }
        Ok(path)
    }

    /// Reads `<dir>/<uuid>.card`: a fresh open (no link followed, no FIFO waited on), a
    /// regular file of at most `MAX_VIEW_LEN` bytes, copied with `pread`, parsed, and
    /// for card `uuid`.
    pub fn read(dir: &Path, uuid: &str) -> Result<CardView, ViewError> {
        let path = CardView::path_for(dir, uuid)?;
        read_stamped(&path, uuid).map(|(view, _)| view)
    }
}

/// What tells one written view file from the next: the coordinator replaces the file
/// by a rename (a new inode), and a file changed in place changes its time or length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    len: u64,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            len: meta.len(),
        }
    }
}

/// [`CardView::read`] of `path`, with the stamp of the file it read (from the open
/// file, so a rename between a caller's look and the open cannot mix two files up).
fn read_stamped(path: &Path, uuid: &str) -> Result<(CardView, FileStamp), ViewError> {
    let invalid = |reason: String| ViewError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let io_err = |source| ViewError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if !meta.file_type().is_file() {
        return Err(invalid("not a regular file".into()));
    }
    if meta.len() > MAX_VIEW_LEN as u64 {
        return Err(invalid(format!(
            "{} bytes, at most {MAX_VIEW_LEN}",
            meta.len()
        )));
    }
    let mut bytes = vec![0u8; meta.len() as usize];
    let mut filled = 0;
    while filled < bytes.len() {
        match file.read_at(&mut bytes[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(io_err(error)),
        }
    }
    bytes.truncate(filled);
    let text = std::str::from_utf8(&bytes).map_err(|_| invalid("not UTF-8".into()))?;
    let view = CardView::parse(text).map_err(invalid)?;
    if view.uuid != uuid {
        return Err(invalid(format!("written for card {}", view.uuid)));
    }
    Ok((view, FileStamp::of(&meta)))
}

/// Reads one card's view again only when the file was replaced: a process that looks
/// every tick of its own (the shim's publish tick, 20 ms) while the coordinator writes
/// every tick of its own (50 ms) pays one `lstat` for a view it already has, not an
/// open, a `pread`, a parse and a close. What a view means is judged against the time
/// of each look (`STALE_NS`), so a view kept because the coordinator stopped writing
/// goes stale as a view read afresh would.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// use vgpu_contract::cardview::{CardView, ViewReader};
///
/// let uuid = "GPU-5e0f0c5a-1111-2222-3333-444455556666";
/// let view = CardView { uuid: uuid.into(), written_ns: 1, containers: Vec::new() };
/// view.write(dir.path())?;
/// let mut reader = ViewReader::new(dir.path(), uuid)?;
/// assert_eq!(reader.read()?.written_ns, 1);
/// CardView { written_ns: 2, ..view }.write(dir.path())?;
/// assert_eq!(reader.read()?.written_ns, 2);
/// # Ok::<(), vgpu_contract::cardview::ViewError>(())
/// ```
#[derive(Debug)]
pub struct ViewReader {
    path: PathBuf,
    uuid: String,
    /// The view last read, and the stamp of its file.
    last: Option<(FileStamp, CardView)>,
}

impl ViewReader {
    /// A reader of `<dir>/<uuid>.card` ([`CardView::path_for`]).
    pub fn new(dir: &Path, uuid: &str) -> Result<ViewReader, ViewError> {
        Ok(ViewReader {
            path: CardView::path_for(dir, uuid)?,
            uuid: uuid.to_string(),
            last: None,
        })
    }

    /// The view now: the one read last while its file is the same (one `lstat`), else
    /// [`CardView::read`]'s. An error forgets the view read last.
    pub fn read(&mut self) -> Result<&CardView, ViewError> {
        let looked = std::fs::symlink_metadata(&self.path).map_err(|source| ViewError::Io {
            path: self.path.clone(),
            source,
        });
        let stamp = match looked {
            Ok(meta) => FileStamp::of(&meta),
            Err(error) => {
                self.last = None;
                return Err(error);
            }
        };
        let last = self.last.take().filter(|(last, _)| *last == stamp);
        let (stamp, view) = match last {
            Some(kept) => kept,
            None => read_stamped(&self.path, &self.uuid).map(|(view, at)| (at, view))?,
        };
        Ok(&self.last.insert((stamp, view)).1)
    }
}

fn parse_entry(line: &str) -> Option<ViewEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let [
        "container",
        id,
        "limit",
        limit,
        "mode",
        mode,
        "ceiling",
        ceiling,
        "allowed",
        allowed,
        "active",
        active,
        "busy_permille",
        busy,
        "card_permille",
        card,
        "charge_permille",
        charge,
    ] = fields.as_slice()
    else {
        return None;
    };
    let percent = |text: &str| text.parse::<u32>().ok().filter(|p| (1..=100).contains(p));
    Some(ViewEntry {
        id: validate_container_id(id).is_ok().then(|| id.to_string())?,
        limit: percent(limit)?,
        mode: match *mode {
            "hard" => CoreMode::Hard,
            "soft" => CoreMode::Soft,
            _ => return None,
        },
        ceiling: percent(ceiling)?,
        allowed: percent(allowed)?,
        active: match *active {
            "0" => false,
            "1" => true,
            _ => return None,
        },
        busy_permille: busy.parse::<u32>().ok().filter(|b| *b <= 1000)?,
        card_permille: match *card {
            "-" => None,
            card => Some(card.parse::<u32>().ok().filter(|c| *c <= 1000)?),
        },
        charge_permille: charge
            .parse::<u32>()
            .ok()
            .filter(|c| (1..=MAX_WRITTEN_CHARGE_PERMILLE).contains(c))?,
    })
}

/// The factor, per mille, by which container `container_id` scales its charges on the
/// card of `view` (`None`: missing or unreadable): the view's while it is fresh and
/// lists the container, else [`CHARGE_UNIT`]; always within [`CHARGE_MIN_PERMILLE`,
/// `CHARGE_MAX_PERMILLE`].
pub fn charge_permille(view: Option<&CardView>, container_id: Option<&str>, now_ns: u64) -> u64 {
    view.filter(|view| fresh(view, now_ns))
        .and_then(|view| view.entry(container_id?))
        .map_or(CHARGE_UNIT, |entry| entry.charge_permille as u64)
        .clamp(CHARGE_MIN_PERMILLE, CHARGE_MAX_PERMILLE)
}

/// Whether container `container_id` may share the card of `view` (`None`: missing or
/// unreadable) with another container's work now: false only while the view is fresh,
/// lists the container and names no other container active; anything the reader cannot
/// tell counts as a neighbour (as a stale view means "assume contended").
pub fn neighbours_active(view: Option<&CardView>, container_id: Option<&str>, now_ns: u64) -> bool {
    let Some(view) = view.filter(|view| fresh(view, now_ns)) else {
        return true;
    };
    let Some(id) = container_id.filter(|id| view.entry(id).is_some()) else {
        return true;
    };
    view.containers
        .iter()
        .any(|entry| entry.active && entry.id != id)
}

/// Whether `view` was written within `STALE_NS` of `now_ns` (and not from the future).
fn fresh(view: &CardView, now_ns: u64) -> bool {
    now_ns.saturating_sub(view.written_ns) <= STALE_NS
        && view.written_ns <= now_ns.saturating_add(STALE_NS)
}

/// What a soft-mode container with `limit` and `ceiling` may use now, given the view it
/// read (`None`: missing or unreadable) and its own `container_id`: the view's figure
/// while it is fresh and lists the container, else the limit; always within
/// `[limit, ceiling]`, so no view can push a container below what it is entitled to.
pub fn allowed_percent(
    view: Option<&CardView>,
    container_id: Option<&str>,
    now_ns: u64,
    limit: u32,
    ceiling: u32,
) -> u32 {
    let ceiling = ceiling.max(limit);
    let granted = view
        .filter(|view| fresh(view, now_ns))
        .and_then(|view| view.entry(container_id?))
        .map(|entry| entry.allowed);
    granted.unwrap_or(limit).clamp(limit, ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "GPU-5e0f0c5a-1111-2222-3333-444455556666";

    fn view(now: u64) -> CardView {
        CardView {
            uuid: UUID.into(),
            written_ns: now,
            containers: vec![
                ViewEntry {
                    id: "alloc-1".into(),
                    limit: 30,
                    mode: CoreMode::Soft,
                    ceiling: 60,
                    allowed: 60,
                    active: true,
                    busy_permille: 597,
                    card_permille: Some(480),
                    charge_permille: 804,
                },
                ViewEntry {
                    id: "alloc-2".into(),
                    limit: 40,
                    mode: CoreMode::Hard,
                    ceiling: 40,
                    allowed: 40,
                    active: false,
                    busy_permille: 0,
                    card_permille: None,
                    charge_permille: 1000,
                },
            ],
        }
    }

    #[test]
    fn written_views_read_back_and_are_the_hosts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let written = view(5_000_000_000);
        let path = written.write(dir.path()).expect("write");
        assert_eq!(path, dir.path().join(format!("{UUID}.card")));
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert_eq!(CardView::read(dir.path(), UUID).expect("read"), written);
        // A second write replaces it whole; no temp file is left behind.
        let mut next = view(6_000_000_000);
        next.containers.pop();
        next.write(dir.path()).expect("rewrite");
        assert_eq!(CardView::read(dir.path(), UUID).expect("read"), next);
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
    }

    #[test]
    fn broken_foreign_and_special_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = CardView::path_for(dir.path(), UUID).expect("path");
        assert!(matches!(
            CardView::read(dir.path(), UUID),
            Err(ViewError::Io { .. })
        ));
        let text = view(1).render();
        for broken in [
            String::new(),
            "garbage\n".to_string(),
            text.replace("end\n", ""),
            text.replace("limit 30", "limit 0"),
            text.replace("allowed 60", "allowed 1000"),
            text.replace("alloc-1", "../../etc"),
            text.replace("mode soft", "mode greedy"),
            text.replace("charge_permille 804", "charge_permille 0"),
            text.replace("card_permille 480", "card_permille 1001"),
            text.replace(" charge_permille 804", ""),
            text.replace(UUID, "GPU-other"),
        ] {
            std::fs::write(&path, &broken).expect("write");
            assert!(
                matches!(
                    CardView::read(dir.path(), UUID),
                    Err(ViewError::Invalid { .. })
                ),
                "{broken:?}"
            );
        }
        std::fs::write(&path, vec![b'x'; MAX_VIEW_LEN + 1]).expect("write");
        assert!(CardView::read(dir.path(), UUID).is_err());
        std::fs::remove_file(&path).expect("rm");
        let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(
            CardView::read(dir.path(), UUID).is_err(),
            "a FIFO neither blocks nor passes"
        );
        std::fs::remove_file(&path).expect("rm");
        let target = dir.path().join("elsewhere");
        view(1).write(dir.path()).expect("write");
        std::fs::rename(&path, &target).expect("mv");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        assert!(
            CardView::read(dir.path(), UUID).is_err(),
            "links are not followed"
        );
        for bad in ["", "../x", "a/b", ".hidden"] {
            assert!(matches!(
                CardView::read(dir.path(), bad),
                Err(ViewError::BadUuid(_))
            ));
        }
    }

    #[test]
    fn a_reader_reads_each_replaced_view_and_keeps_an_unchanged_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = CardView::path_for(dir.path(), UUID).expect("path");
        let mut reader = ViewReader::new(dir.path(), UUID).expect("reader");
        assert!(
            matches!(reader.read(), Err(ViewError::Io { .. })),
            "no view yet"
        );
        // Every view the coordinator writes (a rename each time) is read, however
        // quickly they follow each other.
        for written_ns in 1..=50 {
            view(written_ns).write(dir.path()).expect("write");
            assert_eq!(reader.read().expect("read").written_ns, written_ns);
        }
        // An unchanged file is not read again: the same text with another time, put in
        // place with the same inode, length and modification time, is not seen.
        let modified = std::fs::metadata(&path)
            .expect("meta")
            .modified()
            .expect("mtime");
        let text = view(50).render().replace("written_ns 50", "written_ns 49");
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        file.write_all_at(text.as_bytes(), 0)
            .expect("write in place");
        file.set_modified(modified).expect("set mtime");
        drop(file);
        assert_eq!(reader.read().expect("kept").written_ns, 50);
        // Any other change is seen: the time...
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        file.set_modified(modified + std::time::Duration::from_millis(1))
            .expect("set mtime");
        drop(file);
        assert_eq!(reader.read().expect("read").written_ns, 49);
        // ...a removal (the view read last is forgotten), and a new file.
        std::fs::remove_file(&path).expect("rm");
        assert!(reader.read().is_err());
        view(7).write(dir.path()).expect("write");
        assert_eq!(reader.read().expect("read").written_ns, 7);
    }

    #[test]
    fn a_reader_refuses_what_a_fresh_read_refuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = CardView::path_for(dir.path(), UUID).expect("path");
        let mut reader = ViewReader::new(dir.path(), UUID).expect("reader");
        view(1).write(dir.path()).expect("write");
        assert!(reader.read().is_ok());
        // Broken in place, then a link where the file was, then a view of another card:
        // each is refused, never the view read before.
        std::fs::write(&path, "garbage\n").expect("write");
        assert!(matches!(reader.read(), Err(ViewError::Invalid { .. })));
        let target = dir.path().join("elsewhere");
        view(2).write(dir.path()).expect("write");
        std::fs::rename(&path, &target).expect("mv");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        assert!(reader.read().is_err(), "links are not followed");
        assert!(reader.read().is_err(), "nor kept");
        std::fs::remove_file(&path).expect("rm");
        std::fs::write(&path, view(3).render().replace(UUID, "GPU-other")).expect("write");
        assert!(matches!(reader.read(), Err(ViewError::Invalid { .. })));
        assert!(matches!(
            ViewReader::new(dir.path(), "../x"),
            Err(ViewError::BadUuid(_))
        ));
    }

    #[test]
    fn a_views_charge_factor_is_taken_within_bounds_and_only_while_fresh() {
        let now = 10_000_000_000;
        let fresh = view(now);
        assert_eq!(charge_permille(Some(&fresh), Some("alloc-1"), now), 804);
        assert_eq!(charge_permille(Some(&fresh), Some("alloc-2"), now), 1000);
        assert_eq!(charge_permille(None, Some("alloc-1"), now), CHARGE_UNIT);
        assert_eq!(
            charge_permille(Some(&fresh), Some("alloc-1"), now + STALE_NS + 1),
            CHARGE_UNIT,
            "stale: what it measured"
        );
        assert_eq!(
            charge_permille(Some(&fresh), Some("alloc-9"), now),
            CHARGE_UNIT
        );
        assert_eq!(charge_permille(Some(&fresh), None, now), CHARGE_UNIT);
        let mut forged = view(now);
        forged.containers[0].charge_permille = 1;
        assert_eq!(
            charge_permille(Some(&forged), Some("alloc-1"), now),
            CHARGE_MIN_PERMILLE
        );
        forged.containers[0].charge_permille = 90_000;
        assert_eq!(
            charge_permille(Some(&forged), Some("alloc-1"), now),
            CHARGE_MAX_PERMILLE
        );
    }

    #[test]
    fn a_neighbour_counts_unless_a_fresh_view_names_none_active() {
        let now = 5_000_000_000;
        // alloc-2 is idle: alloc-1 has the card to itself.
        let alone = view(now);
        assert!(!neighbours_active(Some(&alone), Some("alloc-1"), now));
        // alloc-1's activity is alloc-2's neighbour, not its own.
        assert!(neighbours_active(Some(&alone), Some("alloc-2"), now));
        let mut both = view(now);
        both.containers[1].active = true;
        assert!(neighbours_active(Some(&both), Some("alloc-1"), now));
        // What the reader cannot tell is a neighbour: no view, a stale one, one that
        // does not list it, no id of its own.
        assert!(neighbours_active(None, Some("alloc-1"), now));
        assert!(neighbours_active(
            Some(&alone),
            Some("alloc-1"),
            now + STALE_NS + 1
        ));
        assert!(neighbours_active(Some(&alone), Some("alloc-9"), now));
        assert!(neighbours_active(Some(&alone), None, now));
    }

    #[test]
    fn a_view_grants_within_the_readers_own_limit_and_ceiling() {
        let now = 10_000_000_000;
        let fresh = view(now);
        assert_eq!(
            allowed_percent(Some(&fresh), Some("alloc-1"), now, 30, 60),
            60
        );
        // Missing, stale, from the future, or without this container: the limit.
        assert_eq!(allowed_percent(None, Some("alloc-1"), now, 30, 60), 30);
        assert_eq!(
            allowed_percent(Some(&fresh), Some("alloc-1"), now + STALE_NS + 1, 30, 60),
            30
        );
        assert_eq!(
            allowed_percent(
                Some(&view(now + 2 * STALE_NS)),
                Some("alloc-1"),
                now,
                30,
                60
            ),
            30
        );
        assert_eq!(
            allowed_percent(Some(&fresh), Some("alloc-9"), now, 30, 60),
            30
        );
        assert_eq!(allowed_percent(Some(&fresh), None, now, 30, 60), 30);
        // A view can neither push a reader below its limit nor above its ceiling.
        let mut forged = view(now);
        forged.containers[0].allowed = 1;
        assert_eq!(
            allowed_percent(Some(&forged), Some("alloc-1"), now, 30, 60),
            30
        );
        forged.containers[0].allowed = 100;
        assert_eq!(
            allowed_percent(Some(&forged), Some("alloc-1"), now, 30, 60),
            60
        );
    }
}
