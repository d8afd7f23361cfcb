//! The host-side compute coordinator: it tells the containers that share a card what
//! each may use, from what they publish and what the host gave them.
//!
//! Once per tick (the caller's loop, every `TICK_NS` or so) it reads every container's
//! usage region through [`RegionSnapshot`] (a private copy, never a mapping, so a tenant
//! can neither crash nor stall it), takes from each live process's limiter words
//! (`limiter_words::slot`) when the container last had GPU work, checks what it reads,
//! and writes one view per card ([`CardView`], `<dir>/<uuid>.card`, replaced by rename).
//!
//! What a tenant may claim is bounded by design: its entitlement (limit, mode, ceiling)
//! comes from the host ([`ContainerSpec`]), never from the region, and the only thing its
//! words can change is whether it counts as active. Being active makes soft-mode
//! neighbours drop to their limit, which they are always entitled to, so no claim can
//! push a neighbour below its share; hard-mode neighbours do not read the view at all.
//! Claims that cannot be true (activity stamped in the future, busy time faster than the
//! clock) are ignored and reported, and only processes that are alive (by host PID and
//! start time where the host can tell) count.
//!
//! Who runs it: `vgpu run` (one elected per host, over the registered runs), the device
//! plugin and the DRA driver (over their allocations). Each builds the list of
//! [`ContainerSpec`]s from its own records and calls [`Coordinator::tick`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::cardview::{CardView, ViewEntry, valid_uuid};
use crate::clock::monotonic_ns;
use crate::config::{Config, CoreMode, DeviceSelector, validate_container_id};
use crate::limiter_words::slot;
use crate::process;
use crate::snapshot::RegionSnapshot;

/// How often the callers are expected to tick (views go stale after `cardview::STALE_NS`).
pub const TICK_NS: u64 = 50_000_000;
/// A container counts as active when one of its live processes had work this recently.
pub const ACTIVE_WITHIN_NS: u64 = 200_000_000;
/// Activity stamped further than this ahead of the coordinator's clock is not believed.
const FUTURE_SLACK_NS: u64 = 50_000_000;

/// What the host gave a container on one card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entitlement {
    /// The card's UUID (`GPU-...`), as the shims see it.
    pub uuid: String,
    /// The device's index in the container's config and usage region.
    pub region_index: usize,
    /// Percent of the card, 1-99 (100 is not throttled and needs no coordination).
    pub core_limit: u32,
    /// Hard or soft limit.
    pub mode: CoreMode,
    /// Soft mode's ceiling on an idle card; `None` is the whole card.
    pub ceiling: Option<u32>,
}

/// One container, as the host knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSpec {
    /// Its `container_id` (the config key the shims find themselves by in the view).
    pub id: String,
    /// Its usage region, on the host.
    pub region: PathBuf,
    /// Its compute-limited devices.
    pub devices: Vec<Entitlement>,
}

impl ContainerSpec {
    /// The spec of a container from the config the host wrote for it (`config.container_id`
    /// must be set), its region on the host, and `uuid_of` to name cards selected by
    /// host index. Devices without a compute limit are left out.
    pub fn from_config(
        config: &Config,
        region: &Path,
        uuid_of: impl Fn(u32) -> Option<String>,
    ) -> Option<ContainerSpec> {
        let id = config.container_id.clone()?;
        let devices = config
            .devices
            .iter()
            .enumerate()
            .filter_map(|(region_index, device)| {
                let core_limit = device.effective_core_limit()?;
                let uuid = match device.selector() {
                    DeviceSelector::Uuid(uuid) => uuid.trim().to_string(),
                    DeviceSelector::Index(index) => uuid_of(index)?,
                };
                Some(Entitlement {
                    uuid,
                    region_index,
                    core_limit,
                    mode: device.core_mode,
                    ceiling: device.core_ceiling,
                })
            })
            .collect();
        Some(ContainerSpec {
            id,
            region: region.to_path_buf(),
            devices,
        })
    }
}

/// What one tick did.
#[derive(Clone, Debug, Default)]
pub struct TickReport {
    /// The views written, one per card.
    pub views: Vec<CardView>,
    /// What was refused or could not be read, one line each.
    pub problems: Vec<String>,
}

/// What the coordinator concluded about one container on one card.
#[derive(Clone, Copy, Debug, Default)]
struct Judged {
    active: bool,
    busy_permille: u32,
}

/// The busy total last read for a container on a card.
#[derive(Clone, Copy, Debug)]
struct Seen {
    busy_ns: u64,
    at_ns: u64,
}

/// The coordinator of one host's cards; keep one and tick it.
pub struct Coordinator {
    dir: PathBuf,
    seen: HashMap<(String, String), Seen>,
    /// Cards that have a view file of ours.
    written: HashSet<String>,
    my_pid_ns: u64,
}

impl Coordinator {
    /// A coordinator writing views into `dir` (created, mode 0755).
    pub fn new(dir: &Path) -> std::io::Result<Coordinator> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        Ok(Coordinator {
            dir: dir.to_path_buf(),
            seen: HashMap::new(),
            written: HashSet::new(),
            my_pid_ns: process::pid_namespace_in(Path::new("/proc"), "self").unwrap_or(0),
        })
    }

    /// The folder of views.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads every container's region and rewrites every card's view.
    pub fn tick(&mut self, containers: &[ContainerSpec]) -> TickReport {
        self.tick_at(containers, monotonic_ns())
    }

    /// [`Coordinator::tick`] at a given clock (tests).
    pub fn tick_at(&mut self, containers: &[ContainerSpec], now_ns: u64) -> TickReport {
        let mut report = TickReport::default();
        let mut cards: BTreeMap<String, Vec<(ViewEntry, bool)>> = BTreeMap::new();
        let mut ids = HashSet::new();
        let mut seen_now = HashMap::new();
        for spec in containers {
            if validate_container_id(&spec.id).is_err() {
                report
                    .problems
                    .push(format!("container id `{}` is not valid: left out", spec.id));
                continue;
            }
            if !ids.insert(spec.id.as_str()) {
                report.problems.push(format!(
                    "container {} listed twice: the second is left out",
                    spec.id
                ));
                continue;
            }
            let snapshot = RegionSnapshot::read(&spec.region).map_err(|error| {
                report
                    .problems
                    .push(format!("container {}: {error}; counted as idle", spec.id));
            });
            for device in &spec.devices {
                if !valid_uuid(&device.uuid) {
                    report.problems.push(format!(
                        "container {}: card `{}` is not a usable UUID",
                        spec.id, device.uuid
                    ));
                    continue;
                }
                let key = (spec.id.clone(), device.uuid.clone());
                let judged = match &snapshot {
                    Ok(snapshot) => self.judge(
                        snapshot,
                        device.region_index,
                        now_ns,
                        self.seen.get(&key).copied(),
                        &mut seen_now,
                        &key,
                        &mut report.problems,
                    ),
                    Err(()) => Judged::default(),
                };
                let limit = device.core_limit.clamp(1, 100);
                let ceiling = match device.mode {
                    CoreMode::Hard => limit,
                    CoreMode::Soft => device.ceiling.unwrap_or(100).clamp(limit, 100),
                };
                cards.entry(device.uuid.clone()).or_default().push((
                    ViewEntry {
                        id: spec.id.clone(),
                        limit,
                        mode: device.mode,
                        ceiling,
                        allowed: limit,
                        active: judged.active,
                        busy_permille: judged.busy_permille,
                    },
                    judged.active,
                ));
            }
        }
        self.seen = seen_now;
        for (uuid, entries) in cards {
            let containers = entries
                .iter()
                .map(|(entry, _)| {
                    let others_active = entries
                        .iter()
                        .any(|(other, active)| *active && other.id != entry.id);
                    ViewEntry {
                        allowed: allowed_now(entry, others_active),
                        ..entry.clone()
                    }
                })
                .collect();
            let view = CardView {
                uuid: uuid.clone(),
                written_ns: now_ns,
                containers,
            };
            match view.write(&self.dir) {
                Ok(_) => {
                    self.written.insert(uuid.clone());
                }
                Err(error) => report.problems.push(error.to_string()),
            }
            report.views.push(view);
        }
        // Cards nobody limited is on any more: their views go.
        let current: HashSet<&String> = report.views.iter().map(|view| &view.uuid).collect();
        let gone: Vec<String> = self
            .written
            .iter()
            .filter(|uuid| !current.contains(uuid))
            .cloned()
            .collect();
        for uuid in gone {
            if let Ok(path) = CardView::path_for(&self.dir, &uuid) {
                let _ = std::fs::remove_file(path);
            }
            self.written.remove(&uuid);
        }
        report
    }

    /// Whether a container was active on the device at `region_index` lately, from its
    /// live processes' words, and its busy fraction since the previous tick.
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        snapshot: &RegionSnapshot,
        region_index: usize,
        now_ns: u64,
        previous: Option<Seen>,
        seen_now: &mut HashMap<(String, String), Seen>,
        key: &(String, String),
        problems: &mut Vec<String>,
    ) -> Judged {
        if region_index >= snapshot.devices().len() {
            problems.push(format!(
                "container {}: its region has no device {region_index}; counted as idle",
                key.0
            ));
            return Judged::default();
        }
        let mut latest = 0u64;
        let mut busy_ns = 0u64;
        for process in snapshot.processes() {
            if !self.is_alive(&process) {
                continue;
            }
            let words = snapshot.slot_limiter(process.slot, region_index);
            let active_ns = words[slot::ACTIVE_NS];
            if active_ns > now_ns.saturating_add(FUTURE_SLACK_NS) {
                problems.push(format!(
                    "container {}: process {} claims work {} ms in the future; not believed",
                    key.0,
                    process.pid,
                    (active_ns - now_ns) / 1_000_000
                ));
                continue;
            }
            latest = latest.max(active_ns);
            busy_ns =
                busy_ns.saturating_add(process.busy_ns.get(region_index).copied().unwrap_or(0));
        }
        let busy_permille = match previous {
            Some(seen) if now_ns > seen.at_ns => {
                let wall = now_ns - seen.at_ns;
                let busy = busy_ns.saturating_sub(seen.busy_ns);
                if busy > wall.saturating_mul(2) {
                    problems.push(format!(
                        "container {}: {busy} ns busy in {wall} ns of wall time; not believed",
                        key.0
                    ));
                }
                (busy.min(wall) as u128 * 1000 / wall as u128) as u32
            }
            _ => 0,
        };
        seen_now.insert(
            key.clone(),
            Seen {
                busy_ns,
                at_ns: now_ns,
            },
        );
        Judged {
            active: latest != 0 && now_ns.saturating_sub(latest) <= ACTIVE_WITHIN_NS,
            busy_permille,
        }
    }

    /// Whether a slot's owner runs: by its host PID where the host side filled it in, by
    /// its own PID when it lives in our PID namespace; believed where neither tells.
    fn is_alive(&self, usage: &crate::region::ProcessUsage) -> bool {
        if usage.host_pid > 0 {
            process::is_alive(usage.host_pid, usage.start_time)
        } else if usage.pid_ns != 0 && usage.pid_ns == self.my_pid_ns {
            process::is_alive(usage.pid, usage.start_time)
        } else {
            true
        }
    }
}

/// What a container may use now: a hard one its limit; a soft one its ceiling while no
/// other container on the card is active, its limit as soon as one is.
fn allowed_now(entry: &ViewEntry, others_active: bool) -> u32 {
    match entry.mode {
        CoreMode::Soft if !others_active => entry.ceiling,
        _ => entry.limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter_words::slot as words;
    use crate::region::{Region, RegionDevice};
    use std::sync::atomic::Ordering;

    const CARD: &str = "GPU-51d00000-0000-4000-8000-000000000001";

    struct Tenant {
        region: Region,
        spec: ContainerSpec,
        slot: crate::region::SlotId,
    }

    fn tenant(dir: &Path, id: &str, limit: u32, mode: CoreMode, ceiling: Option<u32>) -> Tenant {
        let path = dir.join(format!("{id}.region"));
        let (region, _) = Region::open(
            &path,
            &[RegionDevice {
                id: CARD.into(),
                memory_limit: 1 << 30,
                core_limit: limit,
                core_mode: (mode == CoreMode::Soft) as u32,
            }],
        )
        .expect("region");
        let slot = region.attach(&process::current()).expect("attach");
        Tenant {
            spec: ContainerSpec {
                id: id.into(),
                region: path,
                devices: vec![Entitlement {
                    uuid: CARD.into(),
                    region_index: 0,
                    core_limit: limit,
                    mode,
                    ceiling,
                }],
            },
            region,
            slot,
        }
    }

    impl Tenant {
        fn active_at(&self, ns: u64) {
            self.region.slot_limiter(self.slot, 0)[words::ACTIVE_NS].store(ns, Ordering::SeqCst);
        }
    }

    fn allowed(report: &TickReport, id: &str) -> u32 {
        report.views[0].entry(id).expect("entry").allowed
    }

    #[test]
    fn soft_containers_use_the_idle_card_and_fall_back_when_another_is_busy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cards = dir.path().join("cards");
        let mut coordinator = Coordinator::new(&cards).expect("coordinator");
        let soft = tenant(dir.path(), "soft", 30, CoreMode::Soft, Some(60));
        let hard = tenant(dir.path(), "hard", 40, CoreMode::Hard, None);
        let specs = [soft.spec.clone(), hard.spec.clone()];
        let now = monotonic_ns();
        soft.active_at(now);
        let report = coordinator.tick_at(&specs, now);
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert_eq!(
            (allowed(&report, "soft"), allowed(&report, "hard")),
            (60, 40)
        );
        // The view on disk says the same, and is the host's.
        let on_disk = CardView::read(&cards, CARD).expect("view");
        assert_eq!(on_disk, report.views[0]);
        let mode = std::fs::metadata(&cards).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
        hard.active_at(now + 10_000_000);
        let report = coordinator.tick_at(&specs, now + 20_000_000);
        assert_eq!(
            (allowed(&report, "soft"), allowed(&report, "hard")),
            (30, 40)
        );
        // Activity ages out.
        let later = now + 20_000_000 + ACTIVE_WITHIN_NS + 1;
        let report = coordinator.tick_at(&specs, later);
        assert_eq!(allowed(&report, "soft"), 60);
        // A card nobody is on any more loses its view.
        coordinator.tick_at(&[], later);
        assert!(CardView::read(&cards, CARD).is_err());
    }

    #[test]
    fn hostile_claims_cannot_push_a_neighbour_below_its_share() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut coordinator = Coordinator::new(&dir.path().join("cards")).expect("coordinator");
        let victim = tenant(dir.path(), "victim", 30, CoreMode::Soft, Some(90));
        let hostile = tenant(dir.path(), "hostile", 10, CoreMode::Hard, None);
        let now = monotonic_ns();
        let specs = [victim.spec.clone(), hostile.spec.clone()];
        // Absurd figures in the hostile tenant's own region: activity far in the future,
        // and busy time beyond the wall clock.
        hostile.active_at(u64::MAX);
        coordinator.tick_at(&specs, now);
        hostile.region.add_busy(hostile.slot, 0, u64::MAX / 2, 0);
        let report = coordinator.tick_at(&specs, now + TICK_NS);
        assert_eq!(
            allowed(&report, "victim"),
            90,
            "a claim from the future is not believed"
        );
        assert!(
            report.problems.iter().any(|p| p.contains("future")),
            "{:?}",
            report.problems
        );
        assert!(report.problems.iter().any(|p| p.contains("not believed")));
        let entry = report.views[0].entry("hostile").expect("entry");
        assert!(entry.busy_permille <= 1000 && !entry.active);
        // Claiming to be busy now is believed, and only lowers the victim to its share.
        hostile.active_at(now + TICK_NS);
        let report = coordinator.tick_at(&specs, now + 2 * TICK_NS);
        assert_eq!(allowed(&report, "victim"), 30);
        // Nothing in the hostile region can change what the host entitled anyone to: a
        // region rewritten to claim a huge limit (and an unreadable one) change nothing.
        std::fs::write(&hostile.spec.region, vec![0xff; 4096]).expect("clobber");
        let report = coordinator.tick_at(&specs, now + 3 * TICK_NS);
        let hostile_entry = report.views[0].entry("hostile").expect("entry");
        assert_eq!((hostile_entry.limit, hostile_entry.allowed), (10, 10));
        assert_eq!(
            allowed(&report, "victim"),
            90,
            "an unreadable region counts as idle"
        );
        assert!(report.problems.iter().any(|p| p.contains("hostile")));
        // Ids and card names that could escape the folder are refused.
        let mut bad = victim.spec.clone();
        bad.id = "../victim".into();
        let mut bad_card = hostile.spec.clone();
        bad_card.id = "other".into();
        bad_card.devices[0].uuid = "../../etc/passwd".into();
        let report = coordinator.tick_at(&[bad, bad_card], now + 4 * TICK_NS);
        assert!(report.views.is_empty());
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains("`../victim` is not valid"))
        );
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains("not a usable UUID"))
        );
    }

    #[test]
    fn dead_processes_do_not_keep_a_container_active() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut coordinator = Coordinator::new(&dir.path().join("cards")).expect("coordinator");
        let soft = tenant(dir.path(), "soft", 30, CoreMode::Soft, None);
        let other = tenant(dir.path(), "other", 30, CoreMode::Hard, None);
        // A slot of a process that is gone (our PID namespace, a start time that is not ours).
        let ghost = process::Identity {
            start_time: process::current().start_time + 777,
            ..process::current()
        };
        other.region.detach(other.slot);
        let ghost_slot = other.region.attach(&ghost).expect("attach ghost");
        let now = monotonic_ns();
        other.region.slot_limiter(ghost_slot, 0)[words::ACTIVE_NS].store(now, Ordering::SeqCst);
        let report = coordinator.tick_at(&[soft.spec.clone(), other.spec.clone()], now);
        assert_eq!(
            allowed(&report, "soft"),
            100,
            "a dead process's claim is ignored"
        );
    }

    #[test]
    fn specs_come_from_the_hosts_config() {
        let config = Config::from_yaml(
            "container_id: run-1\ndevices:\n  - index: 0\n    core_limit: 30\n    core_mode: soft\n    core_ceiling: 50\n  - uuid: GPU-2\n    memory_limit: 1GiB\n  - uuid: GPU-3\n    core_limit: 20\n",
            Path::new("t.yaml"),
        )
        .expect("config");
        let spec = ContainerSpec::from_config(&config, Path::new("/r"), |index| {
            (index == 0).then(|| "GPU-1".to_string())
        })
        .expect("spec");
        assert_eq!(spec.id, "run-1");
        assert_eq!(
            spec.devices,
            vec![
                Entitlement {
                    uuid: "GPU-1".into(),
                    region_index: 0,
                    core_limit: 30,
                    mode: CoreMode::Soft,
                    ceiling: Some(50)
                },
                Entitlement {
                    uuid: "GPU-3".into(),
                    region_index: 2,
                    core_limit: 20,
                    mode: CoreMode::Hard,
                    ceiling: None
                },
            ]
        );
        let anonymous = Config::from_yaml("devices: []\n", Path::new("t.yaml")).expect("config");
        assert!(ContainerSpec::from_config(&anonymous, Path::new("/r"), |_| None).is_none());
    }
}
