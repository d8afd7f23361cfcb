//! `vgpu top`: the node's view by card and by container, from the host's own state:
//! every container's quota config (`vgpu.yaml`) and usage region (read as a private
//! copy, never mapped), the card views the coordinator writes, and NVML for the cards
//! themselves. Refreshes every `--interval` seconds; `--once` prints one view,
//! `--json` prints it as JSON (one object, or one per refresh).
//!
//! Where it looks, so that it works on a plugin node and beside `vgpu run`:
//! * `<plugin-state-dir>/plugin-state.json` and `allocations/<id>/` (the device
//!   plugin: namespace, pod and container of each allocation), `<dir>/dra/allocations/*/`
//!   (the DRA driver), and the card views in `<dir>/cards`;
//! * the host folder of `vgpu run` (`$VGPU_HOST_DIR`, else `/run/vgpu` for root): the
//!   registrations of runs with a compute limit and their card views;
//! * every `--container DIR` given (a `vgpu run --state-dir DIR`, say).
//!
//! Busy share is what the coordinator's card view says the container measured over the
//! last second; where no view names it, the busy time its region counted between two
//! readings half a second apart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use vgpu_contract::cardview::CardView;
use vgpu_contract::region::{ProcessUsage, QuotaCounters};
use vgpu_contract::snapshot::RegionSnapshot;
use vgpu_contract::{Config, CoreMode};

#[derive(clap::Args)]
pub struct TopArgs {
    /// Print one view and exit.
    #[arg(long)]
    once: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 2.0)]
    interval: f64,
    /// The device plugin's state folder (plugin-state.json, allocations/, cards/).
    #[arg(long, default_value = "/var/lib/vgpu")]
    plugin_state_dir: PathBuf,
    /// A container folder holding vgpu.yaml and usage.region (repeat for several).
    #[arg(long = "container", value_name = "DIR")]
    containers: Vec<PathBuf>,
}

/// One process of a container.
#[derive(Clone, Debug, Serialize)]
pub struct Process {
    pid: i32,
    host_pid: i32,
    used_bytes: u64,
}

/// One container on one card.
#[derive(Clone, Debug, Serialize)]
pub struct ContainerRow {
    id: String,
    /// `plugin`, `dra`, `vgpu-run` or `dir`.
    source: &'static str,
    namespace: Option<String>,
    pod: Option<String>,
    container: Option<String>,
    folder: PathBuf,
    memory_limit_bytes: Option<u64>,
    memory_used_bytes: u64,
    core_limit: Option<u32>,
    core_mode: &'static str,
    busy_percent: Option<f64>,
    allowed_percent: Option<u32>,
    throttled_seconds: f64,
    refusals: u64,
    refused_bytes: u64,
    over_quota: u64,
    processes: Vec<Process>,
}

/// One card and the containers on it.
#[derive(Clone, Debug, Serialize)]
pub struct CardRow {
    uuid: String,
    index: Option<u32>,
    name: Option<String>,
    memory_total_bytes: Option<u64>,
    memory_used_by_containers_bytes: u64,
    containers: Vec<ContainerRow>,
}

/// The whole view.
#[derive(Clone, Debug, Serialize)]
pub struct NodeView {
    cards: Vec<CardRow>,
    /// Folders that could not be read, and why.
    problems: Vec<String>,
}

/// A container folder found, and who it belongs to.
#[derive(Clone, Debug)]
struct Found {
    dir: PathBuf,
    region: PathBuf,
    source: &'static str,
    owner: Option<(String, String, String)>,
    /// Card UUIDs by device position, where the finder knows them.
    uuids: Vec<Option<String>>,
    /// The folder of card views that covers it.
    views: Option<PathBuf>,
}

fn str_at<'a>(value: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(serde_json::Value::as_str)
}

/// The device plugin's and the DRA driver's containers under `state`.
fn plugin_containers(state: &Path) -> Vec<Found> {
    let mut found = Vec::new();
    let text = std::fs::read_to_string(state.join("plugin-state.json")).unwrap_or_default();
    let book: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if let Some(allocations) = book.get("allocations").and_then(|a| a.as_object()) {
        for (id, record) in allocations {
            let dir = state.join("allocations").join(id);
            if !dir.join("usage.region").is_file()
                || record
                    .get("prepared_unix")
                    .is_none_or(serde_json::Value::is_null)
            {
                continue;
            }
            let owner = record.get("owner").and_then(|owner| {
                Some((
                    str_at(owner, "namespace")?.to_string(),
                    str_at(owner, "pod")?.to_string(),
                    str_at(owner, "container")?.to_string(),
                ))
            });
            let uuids = record
                .get("cards")
                .and_then(|cards| cards.as_array())
                .map(|cards| cards.iter().map(|c| c.as_str().map(String::from)).collect())
                .unwrap_or_default();
            found.push(Found {
                region: dir.join("usage.region"),
                dir,
                source: "plugin",
                owner,
                uuids,
                views: Some(state.join("cards")),
            });
        }
    }
    if let Ok(entries) = std::fs::read_dir(state.join("dra").join("allocations")) {
        for entry in entries.flatten() {
            let dir = entry.path();
            if dir.join("usage.region").is_file() && dir.join("vgpu.yaml").is_file() {
                found.push(Found {
                    region: dir.join("usage.region"),
                    dir,
                    source: "dra",
                    owner: None,
                    uuids: Vec::new(),
                    views: Some(state.join("dra").join("cards")),
                });
            }
        }
    }
    found
}

/// The compute-limited `vgpu run`s registered in the host folder.
fn registered_runs(host: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(host.join("containers")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let value: serde_json::Value = serde_json::from_str(&text).ok()?;
            let region = PathBuf::from(str_at(&value, "region")?);
            let mut uuids = Vec::new();
            for device in value.get("devices")?.as_array()? {
                let position = device.get("region_index")?.as_u64()? as usize;
                if uuids.len() <= position {
                    uuids.resize(position + 1, None);
                }
                uuids[position] = str_at(device, "uuid").map(String::from);
            }
            Some(Found {
                dir: region.parent()?.to_path_buf(),
                region,
                source: "vgpu-run",
                owner: None,
                uuids,
                views: Some(crate::coordinate::cards_dir(host)),
            })
        })
        .collect()
}

/// Every container folder to show, once each (by region path).
fn discover(args: &TopArgs) -> Vec<Found> {
    let mut all = plugin_containers(&args.plugin_state_dir);
    all.extend(registered_runs(&crate::coordinate::host_dir()));
    for dir in &args.containers {
        all.push(Found {
            region: dir.join("usage.region"),
            dir: dir.clone(),
            source: "dir",
            owner: None,
            uuids: Vec::new(),
            views: Some(crate::coordinate::cards_dir(&crate::coordinate::host_dir())),
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    all.retain(|found| {
        let key = std::fs::canonicalize(&found.region).unwrap_or_else(|_| found.region.clone());
        seen.insert(key)
    });
    all
}

/// What NVML says of the cards: index, name, memory, by UUID (empty without NVML).
fn nvml_cards() -> BTreeMap<String, (u32, String, u64)> {
    let mut cards = BTreeMap::new();
    let Ok(nvml) = nvml_wrapper::Nvml::init() else {
        return cards;
    };
    let count = nvml.device_count().unwrap_or(0);
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        if let Ok(uuid) = device.uuid() {
            let name = device.name().unwrap_or_default();
            let memory = device.memory_info().map(|m| m.total).unwrap_or(0);
            cards.insert(uuid, (index, name, memory));
        }
    }
    cards
}

/// One reading of every container: its config, a copy of its region.
struct Reading {
    found: Found,
    config: Config,
    region: RegionSnapshot,
}

fn read_all(found: &[Found], problems: &mut Vec<String>) -> Vec<Reading> {
    found
        .iter()
        .filter_map(|found| {
            let config = Config::load(&found.dir.join("vgpu.yaml"))
                .map_err(|err| problems.push(err.to_string()))
                .ok()?;
            let region = RegionSnapshot::read(&found.region)
                .map_err(|err| problems.push(err.to_string()))
                .ok()?;
            Some(Reading {
                found: found.clone(),
                config,
                region,
            })
        })
        .collect()
}

fn busy_ns(processes: &[ProcessUsage], position: usize) -> u64 {
    processes
        .iter()
        .map(|p| p.busy_ns.get(position).copied().unwrap_or(0))
        .fold(0, u64::saturating_add)
}

/// Builds the view: `before` (an earlier reading, `elapsed` ago) gives busy shares
/// where no card view does.
fn view(
    readings: &[Reading],
    before: &BTreeMap<(PathBuf, usize), u64>,
    elapsed: Duration,
    cards: &BTreeMap<String, (u32, String, u64)>,
    problems: Vec<String>,
) -> NodeView {
    let by_index: BTreeMap<u32, String> = cards
        .iter()
        .map(|(uuid, (index, _, _))| (*index, uuid.clone()))
        .collect();
    let mut rows: BTreeMap<String, Vec<ContainerRow>> = BTreeMap::new();
    let mut views: BTreeMap<(PathBuf, String), Option<CardView>> = BTreeMap::new();
    for reading in readings {
        let processes = reading.region.processes();
        for (position, device) in reading.config.devices.iter().enumerate() {
            let uuid = device
                .uuid
                .clone()
                .or_else(|| reading.found.uuids.get(position).cloned().flatten())
                .or_else(|| device.index.and_then(|i| by_index.get(&i).cloned()))
                .unwrap_or_else(|| format!("index:{}", device.index.unwrap_or(0)));
            let id = reading.config.container_id.clone().unwrap_or_default();
            let card_view = reading.found.views.as_ref().and_then(|dir| {
                views
                    .entry((dir.clone(), uuid.clone()))
                    .or_insert_with(|| CardView::read(dir, &uuid).ok())
                    .clone()
            });
            let entry = card_view.as_ref().and_then(|v| v.entry(&id).cloned());
            let busy_now = busy_ns(&processes, position);
            let busy_percent = entry
                .as_ref()
                .map(|e| f64::from(e.busy_permille) / 10.0)
                .or_else(|| {
                    let earlier = before.get(&(reading.found.region.clone(), position))?;
                    let seconds = elapsed.as_secs_f64();
                    (seconds > 0.0).then(|| {
                        (busy_now.saturating_sub(*earlier) as f64 / 1e9 / seconds * 100.0)
                            .min(100.0)
                    })
                });
            let counters: QuotaCounters = reading.region.counters(position);
            let (namespace, pod, container) = match &reading.found.owner {
                Some((n, p, c)) => (Some(n.clone()), Some(p.clone()), Some(c.clone())),
                None => (None, None, None),
            };
            rows.entry(uuid).or_default().push(ContainerRow {
                id,
                source: reading.found.source,
                namespace,
                pod,
                container,
                folder: reading.found.dir.clone(),
                memory_limit_bytes: device.memory_limit.map(|l| l.bytes()),
                memory_used_bytes: reading.region.device_used(position),
                core_limit: device.effective_core_limit(),
                core_mode: match device.core_mode {
                    CoreMode::Hard => "hard",
                    CoreMode::Soft => "soft",
                },
                busy_percent,
                allowed_percent: entry.map(|e| e.allowed),
                throttled_seconds: counters.throttled_ns as f64 / 1e9,
                refusals: counters.refusals,
                refused_bytes: counters.refused_bytes,
                over_quota: counters.over_quota,
                processes: processes
                    .iter()
                    .map(|p| Process {
                        pid: p.pid,
                        host_pid: p.host_pid,
                        used_bytes: p.used.get(position).copied().unwrap_or(0),
                    })
                    .collect(),
            });
        }
    }
    let mut uuids: Vec<String> = cards.keys().cloned().collect();
    for uuid in rows.keys() {
        if !uuids.contains(uuid) {
            uuids.push(uuid.clone());
        }
    }
    let mut out: Vec<CardRow> = uuids
        .into_iter()
        .map(|uuid| {
            let containers = rows.remove(&uuid).unwrap_or_default();
            let card = cards.get(&uuid);
            CardRow {
                index: card.map(|c| c.0),
                name: card.map(|c| c.1.clone()),
                memory_total_bytes: card.map(|c| c.2),
                memory_used_by_containers_bytes: containers
                    .iter()
                    .map(|c| c.memory_used_bytes)
                    .fold(0, u64::saturating_add),
                uuid,
                containers,
            }
        })
        .collect();
    out.sort_by_key(|card| (card.index.unwrap_or(u32::MAX), card.uuid.clone()));
    NodeView {
        cards: out,
        problems,
    }
}

fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1}GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.0}MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// The table (pure: tested apart).
pub fn render(view: &NodeView) -> String {
    let containers: usize = view.cards.iter().map(|c| c.containers.len()).sum();
    let mut out = format!(
        "vgpu top: {} card(s), {containers} container(s)\n",
        view.cards.len()
    );
    for card in &view.cards {
        let index = card.index.map_or("-".to_string(), |i| i.to_string());
        let memory = card.memory_total_bytes.map_or("?".to_string(), size);
        out.push_str(&format!(
            "\nCARD {index}  {}  {}  memory {} / {}\n",
            card.uuid,
            card.name.as_deref().unwrap_or(""),
            size(card.memory_used_by_containers_bytes),
            memory
        ));
        if card.containers.is_empty() {
            out.push_str("  (no container)\n");
            continue;
        }
        out.push_str(&format!(
            "  {:<34} {:>8} {:>8} {:>10} {:>6} {:>7} {:>10} {:>8}  {}\n",
            "CONTAINER",
            "QUOTA",
            "USED",
            "CORES",
            "BUSY",
            "ALLOWED",
            "THROTTLED",
            "REFUSED",
            "PROCESSES"
        ));
        for row in &card.containers {
            let name = match (&row.namespace, &row.pod, &row.container) {
                (Some(n), Some(p), Some(c)) => format!("{n}/{p}/{c}"),
                _ => row.id.clone(),
            };
            let name: String = name.chars().take(34).collect();
            let cores = row
                .core_limit
                .map_or("-".to_string(), |l| format!("{l}% {}", row.core_mode));
            let processes: Vec<String> = row
                .processes
                .iter()
                .map(|p| {
                    let pid = if p.host_pid > 0 { p.host_pid } else { p.pid };
                    format!("{pid}:{}", size(p.used_bytes))
                })
                .collect();
            out.push_str(&format!(
                "  {:<34} {:>8} {:>8} {:>10} {:>6} {:>7} {:>9.1}s {:>8}  {}\n",
                name,
                row.memory_limit_bytes.map_or("card".to_string(), size),
                size(row.memory_used_bytes),
                cores,
                row.busy_percent
                    .map_or("-".to_string(), |b| format!("{b:.0}%")),
                row.allowed_percent
                    .map_or("-".to_string(), |a| format!("{a}%")),
                row.throttled_seconds,
                row.refusals,
                if processes.is_empty() {
                    "-".to_string()
                } else {
                    processes.join(" ")
                }
            ));
        }
    }
    for problem in &view.problems {
        out.push_str(&format!("! {problem}\n"));
    }
    out
}

fn busy_map(readings: &[Reading]) -> BTreeMap<(PathBuf, usize), u64> {
    let mut map = BTreeMap::new();
    for reading in readings {
        let processes = reading.region.processes();
        for position in 0..reading.config.devices.len() {
            map.insert(
                (reading.found.region.clone(), position),
                busy_ns(&processes, position),
            );
        }
    }
    map
}

/// `vgpu top`.
pub fn run(args: &TopArgs) -> Result<()> {
    let interval = Duration::from_secs_f64(args.interval.clamp(0.2, 3600.0));
    let cards = nvml_cards();
    let mut problems = Vec::new();
    let found = discover(args);
    let mut before = busy_map(&read_all(&found, &mut problems));
    let mut elapsed = Duration::from_millis(500);
    std::thread::sleep(elapsed);
    loop {
        let mut problems = Vec::new();
        let found = discover(args);
        let readings = read_all(&found, &mut problems);
        let node = view(&readings, &before, elapsed, &cards, problems);
        if args.json {
            println!("{}", serde_json::to_string(&node)?);
        } else {
            if !args.once {
                print!("\x1b[H\x1b[2J");
            }
            print!("{}", render(&node));
        }
        if args.once {
            return Ok(());
        }
        before = busy_map(&readings);
        elapsed = interval;
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, used: u64) -> ContainerRow {
        ContainerRow {
            id: id.into(),
            source: "dir",
            namespace: None,
            pod: None,
            container: None,
            folder: PathBuf::from("/tmp/x"),
            memory_limit_bytes: Some(2 << 30),
            memory_used_bytes: used,
            core_limit: Some(30),
            core_mode: "hard",
            busy_percent: Some(29.6),
            allowed_percent: Some(30),
            throttled_seconds: 1.25,
            refusals: 2,
            refused_bytes: 1 << 30,
            over_quota: 0,
            processes: vec![Process {
                pid: 1,
                host_pid: 4242,
                used_bytes: used,
            }],
        }
    }

    #[test]
    fn a_plugin_node_shows_each_started_container_with_its_pod() {
        let state = tempfile::tempdir().expect("tempdir");
        let uuid = "GPU-aaaaaaaa-0000-4000-8000-000000000001";
        for id in ["a1", "a2"] {
            let dir = state.path().join("allocations").join(id);
            std::fs::create_dir_all(&dir).expect("dir");
            let config = format!(
                "container_id: {id}\ndevices:\n  - uuid: {uuid}\n    memory_limit: 2Gi\n    core_limit: 25\n"
            );
            std::fs::write(dir.join("vgpu.yaml"), config).expect("config");
            let parsed = Config::load(&dir.join("vgpu.yaml")).expect("valid");
            vgpu_contract::region::Region::create_file(
                &dir.join("usage.region"),
                &parsed.region_devices(),
            )
            .expect("region");
        }
        // The shape of the plugin's plugin-state.json (vgpu_node_agent::state).
        let book = serde_json::json!({
            "version": 1,
            "next_sequence": 3,
            "allocations": {
                "a1": {"id": "a1", "sequence": 1, "cards": [uuid], "core_ids": [], "memory_ids": [],
                       "created_unix": 1, "prepared_unix": 2,
                       "owner": {"namespace": "team-a", "pod": "trainer", "container": "main"}},
                "a2": {"id": "a2", "sequence": 2, "cards": [uuid], "core_ids": [], "memory_ids": [],
                       "created_unix": 1},
            }
        });
        std::fs::write(state.path().join("plugin-state.json"), book.to_string()).expect("book");
        let args = TopArgs {
            once: true,
            json: true,
            interval: 1.0,
            plugin_state_dir: state.path().to_path_buf(),
            containers: Vec::new(),
        };
        let found: Vec<Found> = plugin_containers(&args.plugin_state_dir);
        assert_eq!(found.len(), 1, "only the started allocation: {found:?}");
        let mut problems = Vec::new();
        let readings = read_all(&found, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let node = view(
            &readings,
            &BTreeMap::new(),
            Duration::ZERO,
            &BTreeMap::new(),
            problems,
        );
        assert_eq!(node.cards.len(), 1);
        assert_eq!(node.cards[0].uuid, uuid);
        let row = &node.cards[0].containers[0];
        assert_eq!(row.source, "plugin");
        assert_eq!(row.namespace.as_deref(), Some("team-a"));
        assert_eq!(row.pod.as_deref(), Some("trainer"));
        assert_eq!(row.memory_limit_bytes, Some(2 << 30));
        assert_eq!(row.core_limit, Some(25));
        assert!(render(&node).contains("team-a/trainer/main"));
    }

    #[test]
    fn the_table_shows_each_card_and_its_containers() {
        let view = NodeView {
            cards: vec![CardRow {
                uuid: "GPU-1".into(),
                index: Some(0),
                name: Some("Sim".into()),
                memory_total_bytes: Some(80 << 30),
                memory_used_by_containers_bytes: 3 << 30,
                containers: vec![row("a", 1 << 30), row("b", 2 << 30)],
            }],
            problems: vec!["usage region /x: bad magic".into()],
        };
        let text = render(&view);
        assert!(
            text.starts_with("vgpu top: 1 card(s), 2 container(s)"),
            "{text}"
        );
        assert!(
            text.contains("CARD 0  GPU-1  Sim  memory 3.0GiB / 80.0GiB"),
            "{text}"
        );
        assert!(text.contains("4242:1.0GiB"), "{text}");
        assert!(text.contains("30% hard"), "{text}");
        assert!(text.contains("1.2s") || text.contains("1.3s"), "{text}");
        assert!(text.contains("! usage region /x: bad magic"), "{text}");
    }
}
