//! A daemon's background work, stopped together: its async tasks (they watch one stop
//! channel) and its health thread (it blocks in NVML's event wait, so it is a thread of
//! its own that watches a flag).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long each task may take to notice the stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The running background work of a daemon.
pub struct Background {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    thread_stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// Work that stops when `stop` says so; tasks and the thread are added as they start.
    pub fn new(stop: watch::Sender<bool>) -> Background {
        Background {
            stop,
            tasks: Vec::new(),
            thread_stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// Adds a task (it must end once the stop channel turns true).
    pub fn push(&mut self, task: JoinHandle<()>) {
        self.tasks.push(task);
    }

    /// Starts the thread `body`, which must return once the flag it gets is set.
    pub fn spawn_thread(
        &mut self,
        name: &str,
        body: impl FnOnce(Arc<AtomicBool>) + Send + 'static,
    ) -> std::io::Result<()> {
        let flag = self.thread_stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(flag))?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Signals the stop, then waits for every task (up to 5 s each) and the thread.
    pub async fn stop(&mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            if tokio::time::timeout(STOP_TIMEOUT, task).await.is_err() {
                tracing::warn!("a background task did not stop within 5s");
            }
        }
        self.thread_stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}
