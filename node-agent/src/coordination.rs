//! The node's compute coordination as the daemons start it: the one loop of
//! `vgpu_coordination::tick` over every container this node prepared, by the device
//! plugin and by the DRA driver alike. What is the daemons' own is here: which folders,
//! and how problems are logged.
//!
//! Each prepared container has its config (host-written, trusted) and its usage region
//! (tenant-written, read only as a private copy by the coordinator) in its allocation
//! folder. Every tick the loop ticks the coordinator, which writes one view per card
//! into `<state_dir>/cards`; the containers see that folder read-only at
//! [`crate::layout::CONTAINER_CARDS`]. The list of containers is read again every
//! second (a few small files), and the loop runs on the blocking pool, so neither a
//! slow disk nor a hostile tenant holds the daemon's other tasks.
//!
//! The coordinator checks what each container measured against the card's own
//! per-process utilization, from the node's NVML (the card view's charge factor: on a
//! card without MPS a container's events also time its neighbours' time slices). Without
//! NVML every container is charged what it measured.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use vgpu_coordination::coordinator::TickReport;
use vgpu_coordination::tick;

use crate::container::{CONFIG_FILE, REGION_FILE};

/// How often the list of containers is read again.
const REFRESH: Duration = Duration::from_secs(1);
/// A problem the coordinator reports is logged again after this long at the earliest.
const REPEAT_PROBLEM: Duration = Duration::from_secs(60);
/// Distinct problems remembered (and so logged) per [`REPEAT_PROBLEM`] at most; beyond
/// that, one line says how many were not shown.
const MAX_PROBLEMS: usize = 64;

/// The coordinator's problems as logged: each distinct line once per
/// [`REPEAT_PROBLEM`], at most [`MAX_PROBLEMS`] of them per period, whatever the tenants
/// write into their regions (the coordinator's lines are steady, one per container and
/// device at most). Work per tick is a hash lookup per problem.
#[derive(Default)]
struct ProblemLog {
    logged: HashMap<String, Instant>,
    suppressed: usize,
    period: Option<Instant>,
}

impl ProblemLog {
    /// The lines to log now out of `problems`.
    fn admit(&mut self, problems: Vec<String>, now: Instant) -> Vec<String> {
        let mut lines = Vec::new();
        if self
            .period
            .is_none_or(|at| now.duration_since(at) >= REPEAT_PROBLEM)
        {
            self.logged
                .retain(|_, at| now.duration_since(*at) < REPEAT_PROBLEM);
            if self.suppressed > 0 {
                lines.push(format!(
                    "{} more problems in the last {}s were not logged",
                    self.suppressed,
                    REPEAT_PROBLEM.as_secs()
                ));
                self.suppressed = 0;
            }
            self.period = Some(now);
        }
        for problem in problems {
            match self.logged.get(&problem) {
                Some(at) if now.duration_since(*at) < REPEAT_PROBLEM => {}
                _ if self.logged.len() >= MAX_PROBLEMS && !self.logged.contains_key(&problem) => {
                    self.suppressed += 1;
                }
                _ => {
                    lines.push(problem.clone());
                    self.logged.insert(problem, now);
                }
            }
        }
        lines
    }
}

/// `<state_dir>/cards`: the views' folder on the host.
pub fn cards_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("cards")
}

/// The containers to coordinate: the folders (each holding a config and a region) of
/// every container prepared now.
pub type Folders = Arc<dyn Fn() -> Vec<PathBuf> + Send + Sync>;

/// What the daemons say about the loop: its problems through [`ProblemLog`], the rest
/// once, through `tracing`.
#[derive(Default)]
struct Logged {
    problems: ProblemLog,
}

impl tick::Watch for Logged {
    fn cannot_start(&mut self, dir: &Path, error: &std::io::Error) {
        tracing::error!(dir = %dir.display(), error = %error,
            "cannot create the card views' folder: soft-mode containers keep to their limits");
    }

    fn without_meter(&mut self, _nvml: &Path, error: &str) {
        tracing::warn!(error = %error,
            "compute coordination without NVML: containers are charged what they measure");
    }

    fn ticked(&mut self, report: &TickReport) {
        for line in self.problems.admit(report.problems.clone(), Instant::now()) {
            tracing::warn!("compute coordination: {line}");
        }
    }
}

/// Runs the node's coordination loop ([`vgpu_coordination::tick`]) over `folders` until
/// `stop`, checking the containers' figures against the NVML at `nvml_library` (the
/// daemon's own), whose PIDs are the host's (found through `host_proc`, the host's
/// `/proc` as the daemon sees it). The loop runs on the blocking pool, so neither a slow
/// disk nor a hostile tenant holds the daemon's other tasks.
pub async fn run(
    state_dir: PathBuf,
    nvml_library: PathBuf,
    host_proc: PathBuf,
    folders: Folders,
    stop: watch::Receiver<bool>,
) {
    let settings = tick::Settings {
        cards_dir: cards_dir(&state_dir),
        nvml: Some(nvml_library),
        host_proc,
        refresh: REFRESH,
    };
    let ran = tokio::task::spawn_blocking(move || {
        let mut containers = || tick::folder_specs(&folders(), CONFIG_FILE, REGION_FILE);
        let inputs = tick::Loop {
            elect: &mut || true,
            containers: &mut containers,
            // Also once the sender is gone (a handle dropped without `stop`, as a
            // failing test does): the runtime's drop waits for this thread.
            stop: &|| *stop.borrow() || stop.has_changed().is_err(),
        };
        tick::run(&settings, inputs, &mut Logged::default());
    })
    .await;
    if ran.is_err() {
        tracing::error!("the coordinator panicked: soft-mode containers keep to their limits");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_logged_once_per_period_and_at_most_a_bounded_number() {
        let mut log = ProblemLog::default();
        let start = Instant::now();
        let flood: Vec<String> = (0..1000).map(|n| format!("problem {n}")).collect();
        let lines = log.admit(flood.clone(), start);
        assert_eq!(lines.len(), MAX_PROBLEMS);
        assert!(
            log.admit(flood.clone(), start + Duration::from_secs(1))
                .is_empty()
        );
        assert!(log.logged.len() <= MAX_PROBLEMS);
        let later = log.admit(flood, start + REPEAT_PROBLEM);
        assert_eq!(later.len(), MAX_PROBLEMS + 1);
        assert!(later[0].contains("more problems"), "{later:?}");
    }
}
