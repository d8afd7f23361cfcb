//! Wakes a supervisor the moment a file in a folder is created, deleted or moved
//! (inotify), so that a restarted kubelet's new `kubelet.sock`, or the plugin sockets it
//! deletes, are answered within milliseconds rather than at the supervisor's next tick.
//!
//! Kubelet admits a new pod as soon as it has synced it after its restart; a pod that
//! asks for a plugin's resource before the plugin has registered again is rejected
//! (`UnexpectedAdmissionError: no healthy devices present`). Polling once a second left
//! that window open for up to a second; an event closes it to the time a registration
//! takes.
//!
//! The tick stays: a watch that cannot be set (no inotify, the folder missing, the
//! watch limit reached) leaves [`FolderWatch::changed`] pending forever and the
//! supervisor polls as before, and every pass calls [`FolderWatch::arm`] again, so a
//! folder created or re-created later is watched from then on. What the events say is
//! not read: a wake-up only makes the supervisor look again, and looking again when
//! nothing changed costs a few `stat`s.

use std::path::{Path, PathBuf};

use futures_util::{FutureExt, StreamExt};
use inotify::{EventMask, EventStream, Inotify, WatchMask};

/// The buffer events are read into: room for many events with short names.
const BUFFER: usize = 4096;

/// A watch on one folder's entries.
pub struct FolderWatch {
    folder: PathBuf,
    events: Option<EventStream<[u8; BUFFER]>>,
    armed: bool,
}

impl FolderWatch {
    /// What wakes the supervisor: an entry created, deleted or moved in or out, the
    /// folder itself deleted or moved.
    const EVENTS: WatchMask = WatchMask::CREATE
        .union(WatchMask::DELETE)
        .union(WatchMask::MOVED_FROM)
        .union(WatchMask::MOVED_TO)
        .union(WatchMask::DELETE_SELF)
        .union(WatchMask::MOVE_SELF);

    /// Watches `folder` when it can; must be called inside a tokio runtime.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::time::Duration;
    /// use vgpu_node_agent::folder_watch::FolderWatch;
    ///
    /// let folder = tempfile::tempdir().unwrap();
    /// let mut watch = FolderWatch::new(folder.path());
    /// assert!(watch.is_armed());
    /// std::fs::write(folder.path().join("kubelet.sock"), b"").unwrap();
    /// tokio::time::timeout(Duration::from_secs(5), watch.changed()).await.expect("woken");
    /// # });
    /// ```
    pub fn new(folder: &Path) -> FolderWatch {
        let events = match Inotify::init()
            .and_then(|inotify| inotify.into_event_stream([0; BUFFER]))
        {
            Ok(events) => Some(events),
            Err(err) => {
                tracing::warn!(error = %err, folder = %folder.display(), "no inotify: watching the folder by polling only");
                None
            }
        };
        let mut watch = FolderWatch {
            folder: folder.to_path_buf(),
            events,
            armed: false,
        };
        watch.arm();
        watch
    }

    /// Sets the watch when it is not set (the folder appeared, or was re-created since
    /// its watch went away); cheap when it is.
    pub fn arm(&mut self) {
        if self.armed {
            return;
        }
        if let Some(events) = &self.events {
            self.armed = events.watches().add(&self.folder, Self::EVENTS).is_ok();
        }
    }

    /// Whether events wake [`FolderWatch::changed`] now.
    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// Waits for the next change in the folder and takes every event queued; pending
    /// forever when the folder is not watched (the caller's tick then does the work).
    /// Cancel-safe: an event not taken here wakes the next call.
    pub async fn changed(&mut self) {
        let Some(events) = self.events.as_mut().filter(|_| self.armed) else {
            return std::future::pending().await;
        };
        let mut folder_gone = false;
        match events.next().await {
            Some(Ok(event)) => folder_gone |= event.mask.contains(EventMask::IGNORED),
            // A read error or the stream's end: no more wake-ups from here.
            _ => {
                self.events = None;
                self.armed = false;
                return;
            }
        }
        while let Some(Some(Ok(event))) = events.next().now_or_never() {
            folder_gone |= event.mask.contains(EventMask::IGNORED);
        }
        if folder_gone {
            // The folder went away and its watch with it; `arm` sets a new one once
            // the folder is back.
            self.armed = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const WOKEN_WITHIN: Duration = Duration::from_secs(10);

    async fn woken(watch: &mut FolderWatch) -> bool {
        tokio::time::timeout(WOKEN_WITHIN, watch.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_created_or_deleted_entry_wakes_it_and_queued_events_wake_it_once() {
        let folder = tempfile::tempdir().expect("tempdir");
        let mut watch = FolderWatch::new(folder.path());
        assert!(watch.is_armed());
        let socket = folder.path().join("kubelet.sock");
        std::fs::write(&socket, b"").expect("create");
        std::fs::remove_file(&socket).expect("delete");
        assert!(woken(&mut watch).await, "create and delete wake it");
        assert!(
            tokio::time::timeout(Duration::from_millis(200), watch.changed())
                .await
                .is_err(),
            "the events taken do not wake it again"
        );
        std::fs::write(folder.path().join("vgpu-vcuda-core.sock"), b"").expect("create");
        assert!(woken(&mut watch).await, "a later change wakes it again");
    }

    #[tokio::test]
    async fn a_missing_folder_is_polled_and_watched_once_it_exists() {
        let root = tempfile::tempdir().expect("tempdir");
        let folder = root.path().join("device-plugins");
        let mut watch = FolderWatch::new(&folder);
        assert!(!watch.is_armed(), "nothing to watch yet");
        assert!(
            tokio::time::timeout(Duration::from_millis(100), watch.changed())
                .await
                .is_err(),
            "pending while unwatched: the tick does the work"
        );
        std::fs::create_dir(&folder).expect("mkdir");
        watch.arm();
        assert!(watch.is_armed());
        std::fs::write(folder.join("kubelet.sock"), b"").expect("create");
        assert!(woken(&mut watch).await);
    }

    #[tokio::test]
    async fn a_folder_deleted_and_made_again_is_watched_again() {
        let root = tempfile::tempdir().expect("tempdir");
        let folder = root.path().join("device-plugins");
        std::fs::create_dir(&folder).expect("mkdir");
        let mut watch = FolderWatch::new(&folder);
        std::fs::remove_dir(&folder).expect("rmdir");
        // DELETE_SELF, then IGNORED (possibly read in two batches).
        while watch.is_armed() {
            assert!(woken(&mut watch).await, "the folder's deletion wakes it");
        }
        std::fs::create_dir(&folder).expect("mkdir");
        watch.arm();
        assert!(watch.is_armed(), "the new folder is watched");
        std::fs::write(folder.join("kubelet.sock"), b"").expect("create");
        assert!(woken(&mut watch).await);
    }
}
