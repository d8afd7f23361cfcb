//! The node's compute coordination: the host-side [`Coordinator`] run over every
//! container this node prepared, by the device plugin and by the DRA driver alike.
//!
//! Each prepared container has its config (host-written, trusted) and its usage region
//! (tenant-written, read only as a private copy by the coordinator) in its allocation
//! folder. Every [`TICK_NS`] the loop ticks the coordinator, which writes one view per
//! card into `<state_dir>/cards`; the containers see that folder read-only at
//! [`crate::layout::CONTAINER_CARDS`]. The list of containers is read again every
//! second (a few small files), and the file work runs on the blocking pool, so neither
//! a slow disk nor a hostile tenant holds the daemon's other tasks.
//!
//! The coordinator checks what each container measured against the card's own
//! per-process utilization, from the node's NVML (the card view's charge factor: on a
//! card without MPS a container's events also time its neighbours' time slices). Without
//! NVML every container is charged what it measured.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use vgpu_common::Config;
use vgpu_common::cardmeter::NvmlMeter;
use vgpu_common::coordinator::{ContainerSpec, Coordinator, TICK_NS};

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

/// The specs of the compute-limited containers in `folders`, one per `container_id`
/// (the device plugin's alias folders hold the same files).
fn specs(folders: &[PathBuf]) -> Vec<ContainerSpec> {
    let mut seen = BTreeSet::new();
    folders
        .iter()
        .filter_map(|folder| {
            let config = Config::load(&folder.join(CONFIG_FILE)).ok()?;
            // Plugin configs name cards by UUID: no index to resolve.
            let spec = ContainerSpec::from_config(&config, &folder.join(REGION_FILE), |_| None)?;
            (!spec.devices.is_empty() && seen.insert(spec.id.clone())).then_some(spec)
        })
        .collect()
}

/// Runs the coordinator over `folders` until `stop`, checking the containers' figures
/// against the NVML at `nvml_library` (the daemon's own), whose PIDs are the host's
/// (found through `host_proc`, the host's `/proc` as the daemon sees it). A folder that cannot be
/// created leaves soft-mode containers at their limits (a missing view means
/// "contended"); that is logged once, as is an NVML that cannot be loaded.
pub async fn run(
    state_dir: PathBuf,
    nvml_library: PathBuf,
    host_proc: PathBuf,
    folders: Folders,
    mut stop: watch::Receiver<bool>,
) {
    let dir = cards_dir(&state_dir);
    let mut coordinator = match Coordinator::new(&dir) {
        Ok(coordinator) => coordinator,
        Err(err) => {
            tracing::error!(dir = %dir.display(), error = %err,
                "cannot create the card views' folder: soft-mode containers keep to their limits");
            return;
        }
    };
    match tokio::task::spawn_blocking(move || NvmlMeter::open(&nvml_library)).await {
        Ok(Ok(meter)) => {
            coordinator = coordinator.with_meter(Box::new(meter), &host_proc);
        }
        Ok(Err(err)) => tracing::warn!(error = %err,
            "compute coordination without NVML: containers are charged what they measure"),
        Err(_) => {}
    }
    let mut containers: Vec<ContainerSpec> = Vec::new();
    let mut refreshed: Option<Instant> = None;
    let mut logged = ProblemLog::default();
    loop {
        if refreshed.is_none_or(|at| at.elapsed() >= REFRESH) {
            let list = folders();
            containers = tokio::task::spawn_blocking(move || specs(&list))
                .await
                .unwrap_or_default();
            refreshed = Some(Instant::now());
        }
        let specs = containers.clone();
        let ticked = tokio::task::spawn_blocking(move || {
            let report = coordinator.tick(&specs);
            (coordinator, report)
        })
        .await;
        let Ok((back, report)) = ticked else {
            tracing::error!("the coordinator panicked: soft-mode containers keep to their limits");
            return;
        };
        coordinator = back;
        for line in logged.admit(report.problems, Instant::now()) {
            tracing::warn!("compute coordination: {line}");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_nanos(TICK_NS)) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
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
