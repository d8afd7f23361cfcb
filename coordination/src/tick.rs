//! The node's coordination loop, the one the device plugin, the DRA driver and
//! `vgpu run` each start: every [`TICK_NS`] it ticks the [`Coordinator`] over the
//! containers its caller names, which writes one card view per card.
//!
//! What differs between the callers is a parameter, not another loop:
//! - who may coordinate ([`Loop::elect`]): the daemons always, a `vgpu run` only while it
//!   holds the host's coordinator lock (asked every tick until it does);
//! - which containers ([`Loop::containers`]), read again every [`Settings::refresh`]
//!   (the daemons' allocation folders once a second, `vgpu run`'s registrations every
//!   tick);
//! - what is said about it ([`Watch`]): the daemons log problems (each distinct line
//!   once a minute) through `tracing`, `vgpu run` writes its opt-in trace file.
//!
//! The loop blocks its thread (a daemon runs it on tokio's blocking pool) and ends when
//! `stop` says so, checked every tick. The NVML meter is opened once, when the loop
//! first may coordinate; without it every container is charged what it measured.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_contract::Config;

use crate::coordinator::{ContainerSpec, Coordinator, TICK_NS, TickReport};

/// Where the loop writes and what it reads the card's own figures from.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The card views' folder (created if missing).
    pub cards_dir: PathBuf,
    /// The NVML library to check the containers' figures against (the real one, or
    /// the simulator's); `None` runs without it.
    pub nvml: Option<PathBuf>,
    /// The host's `/proc` as the caller sees it (NVML's PIDs are the host's).
    pub host_proc: PathBuf,
    /// How often the list of containers is read again (zero: every tick).
    pub refresh: Duration,
}

/// What a caller hears from the loop. Every method has a default that says nothing.
pub trait Watch {
    /// The card views' folder cannot be created: the loop ends, and soft-mode
    /// containers keep to their limits (a missing view means "contended").
    fn cannot_start(&mut self, _cards_dir: &Path, _error: &std::io::Error) {}
    /// The NVML at `nvml` cannot be loaded: containers are charged what they measure.
    fn without_meter(&mut self, _nvml: &Path, _error: &str) {}
    /// One tick's report (judgements, problems).
    fn ticked(&mut self, _report: &TickReport) {}
}

/// The loop's inputs from its caller.
pub struct Loop<'a> {
    /// Whether this caller may coordinate now; asked every tick until it says yes.
    pub elect: &'a mut dyn FnMut() -> bool,
    /// The containers to coordinate now.
    pub containers: &'a mut dyn FnMut() -> Vec<ContainerSpec>,
    /// Whether to stop; asked every tick.
    pub stop: &'a dyn Fn() -> bool,
}

/// Runs the coordination loop until `stop` (see the module's header).
pub fn run(settings: &Settings, inputs: Loop<'_>, watch: &mut dyn Watch) {
    let Loop {
        elect,
        containers,
        stop,
    } = inputs;
    let mut coordinator: Option<Coordinator> = None;
    let mut specs: Vec<ContainerSpec> = Vec::new();
    let mut refreshed: Option<Instant> = None;
    while !stop() {
        if coordinator.is_none() && elect() {
            match Coordinator::new(&settings.cards_dir) {
                Ok(fresh) => coordinator = Some(with_meter(fresh, settings, watch)),
                Err(error) => {
                    watch.cannot_start(&settings.cards_dir, &error);
                    return;
                }
            }
        }
        if let Some(coordinator) = coordinator.as_mut() {
            if refreshed.is_none_or(|at| at.elapsed() >= settings.refresh) {
                specs = containers();
                refreshed = Some(Instant::now());
            }
            let report = coordinator.tick(&specs);
            watch.ticked(&report);
        }
        std::thread::sleep(Duration::from_nanos(TICK_NS));
    }
}

/// The coordinator with the card's own figures from the NVML the settings name, where
/// it loads.
fn with_meter(coordinator: Coordinator, settings: &Settings, watch: &mut dyn Watch) -> Coordinator {
    let Some(nvml) = &settings.nvml else {
        return coordinator;
    };
    #[cfg(feature = "nvml")]
    match crate::cardmeter::NvmlMeter::open(nvml) {
        Ok(meter) => coordinator.with_meter(Box::new(meter), &settings.host_proc),
        Err(error) => {
            watch.without_meter(nvml, &error.to_string());
            coordinator
        }
    }
    #[cfg(not(feature = "nvml"))]
    {
        watch.without_meter(nvml, "built without the `nvml` feature");
        coordinator
    }
}

/// The specs of the compute-limited containers in `folders` (each holding the
/// container's config as `config_file` and its region as `region_file`), one per
/// `container_id` (the device plugin's alias folders hold the same files). Configs name
/// cards by UUID here: no index to resolve.
pub fn folder_specs(
    folders: &[PathBuf],
    config_file: &str,
    region_file: &str,
) -> Vec<ContainerSpec> {
    let mut seen = BTreeSet::new();
    folders
        .iter()
        .filter_map(|folder| {
            let config = Config::load(&folder.join(config_file)).ok()?;
            let spec = ContainerSpec::from_config(&config, &folder.join(region_file), |_| None)?;
            let coordinated = !spec.devices.is_empty() || !spec.memory.is_empty();
            (coordinated && seen.insert(spec.id.clone())).then_some(spec)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[derive(Default)]
    struct Heard {
        cannot_start: usize,
        without_meter: Vec<String>,
        ticks: usize,
    }

    impl Watch for Heard {
        fn cannot_start(&mut self, _dir: &Path, _error: &std::io::Error) {
            self.cannot_start += 1;
        }
        fn without_meter(&mut self, _nvml: &Path, error: &str) {
            self.without_meter.push(error.to_string());
        }
        fn ticked(&mut self, _report: &TickReport) {
            self.ticks += 1;
        }
    }

    fn settings(dir: &Path, refresh: Duration) -> Settings {
        Settings {
            cards_dir: dir.join("cards"),
            nvml: None,
            host_proc: PathBuf::from("/proc"),
            refresh,
        }
    }

    /// Runs the loop for `ticks` ticks; returns what it heard, how often it asked to be
    /// elected and how often it read the containers.
    fn run_for(settings: &Settings, ticks: usize, elected_from: usize) -> (Heard, usize, usize) {
        let asked = Cell::new(0);
        let listed = Cell::new(0);
        let stops = Cell::new(0);
        let mut heard = Heard::default();
        let inputs = Loop {
            elect: &mut || {
                asked.set(asked.get() + 1);
                asked.get() > elected_from
            },
            containers: &mut || {
                listed.set(listed.get() + 1);
                Vec::new()
            },
            stop: &|| {
                stops.set(stops.get() + 1);
                stops.get() > ticks
            },
        };
        run(settings, inputs, &mut heard);
        (heard, asked.get(), listed.get())
    }

    #[test]
    fn a_caller_coordinates_only_once_elected_and_is_asked_no_more_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (heard, asked, listed) = run_for(&settings(dir.path(), Duration::ZERO), 6, 2);
        assert_eq!(asked, 3, "asked every tick until elected, then never again");
        assert_eq!(heard.ticks, 4, "ticks only once elected");
        assert_eq!(listed, 4, "a zero refresh reads the list every tick");
        assert!(dir.path().join("cards").is_dir());
    }

    #[test]
    fn the_list_of_containers_is_read_again_only_after_the_refresh_period() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (heard, _, listed) = run_for(&settings(dir.path(), Duration::from_secs(3600)), 5, 0);
        assert_eq!(heard.ticks, 5);
        assert_eq!(listed, 1, "read once, then kept for the period");
    }

    #[test]
    fn a_views_folder_that_cannot_be_made_ends_the_loop_and_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cards"), b"a file where the folder goes").expect("write");
        // Never told to stop: the loop must end on its own.
        let (heard, asked, listed) = run_for(&settings(dir.path(), Duration::ZERO), usize::MAX, 0);
        assert_eq!(heard.cannot_start, 1);
        assert_eq!((asked, listed, heard.ticks), (1, 0, 0));
    }

    #[test]
    fn an_nvml_that_cannot_be_loaded_is_said_once_and_the_loop_goes_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = settings(dir.path(), Duration::ZERO);
        settings.nvml = Some(dir.path().join("no-such-libnvidia-ml.so.1"));
        let (heard, _, _) = run_for(&settings, 3, 0);
        assert_eq!(heard.without_meter.len(), 1, "{:?}", heard.without_meter);
        assert_eq!(heard.ticks, 3);
    }

    #[test]
    fn folders_give_one_spec_per_compute_or_memory_coordinated_container() {
        let dir = tempfile::tempdir().expect("tempdir");
        let folder = |name: &str, config: &str| {
            let at = dir.path().join(name);
            std::fs::create_dir_all(&at).expect("mkdir");
            std::fs::write(at.join("config.yaml"), config).expect("config");
            at
        };
        let limited = "container_id: a\ndevices:\n  - uuid: GPU-1\n    core_limit: 30\n";
        let folders = [
            folder("a", limited),
            folder("alias-of-a", limited),
            folder("broken", "devices: [[["),
            dir.path().join("missing"),
        ];
        let specs = folder_specs(&folders, "config.yaml", "region");
        let ids: Vec<&str> = specs.iter().map(|spec| spec.id.as_str()).collect();
        assert_eq!(
            ids,
            ["a"],
            "one per container id; broken and missing folders skipped"
        );
    }
}
