//! What the quota did to each container, seen from the host: the counters the shims
//! bump in the usage region's counter block (allocations refused, bytes refused, time
//! launches waited for the compute limit, times found over quota), folded into running
//! totals that never step back ([`QuotaTotals`], read by the metrics), a line at info
//! level each time a container's refusals grew, and a Kubernetes Event on the pod at
//! its first refusal and first time over quota, then at most one per
//! `quota_event_interval_secs` per container, card and reason ([`run`]). The DRA driver
//! runs the same watch over its prepared requests, each on the pod its claim is
//! reserved for.
//!
//! Every region is read as a private copy ([`RegionSnapshot::read`]); the quota an Event
//! states comes from the container config the host wrote, never from the tenant's
//! region. Refusals counted before the daemon started (or restarted) are reported by
//! the metrics but get no Event: the first pass takes them as already told.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OnceCell, watch};
use vgpu_contract::Config;
use vgpu_contract::region::QuotaCounters;
use vgpu_contract::snapshot::RegionSnapshot;
use vgpu_kube::events::{self, PodEvent, PodRef};

use crate::config::NodeConfig;
use crate::container;

/// How often the regions are read.
pub const TICK: Duration = Duration::from_secs(1);

/// One container on one card: its allocation and device position.
type Key = (String, usize);

/// The running totals of every container's quota counters, per card.
#[derive(Default)]
pub struct QuotaTotals {
    book: Mutex<BTreeMap<Key, (QuotaCounters, QuotaCounters)>>,
}

impl QuotaTotals {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, (QuotaCounters, QuotaCounters)>> {
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Copies the usage region of allocation `id` at `region` and folds the counters of
    /// its first `devices` positions into its totals (see [`QuotaCounters::fold`]), the
    /// copy taken under the totals' one lock: whoever asks (the 1 s watch, any number of
    /// parallel scrapes), copies are folded in the order they were taken. A copy taken
    /// outside the lock and folded after a newer one would read as counters going back,
    /// and count them again. The copy and the totals per position; `None` when the
    /// region cannot be read (the totals stay as they were: [`QuotaTotals::totals`]).
    pub fn observe_region(
        &self,
        id: &str,
        region: &Path,
        devices: usize,
    ) -> Option<(RegionSnapshot, Vec<QuotaCounters>)> {
        self.observe_with(id, devices, || RegionSnapshot::read(region).ok())
    }

    /// [`QuotaTotals::observe_region`] with the copy taken by `read`, called under the
    /// totals' one lock, so that one copy can feed another book as well: the device
    /// plugin's scrape calls this from under its usage totals' lock (the one lock order:
    /// that book's, then this one's), and both fold the same copy, in the order taken.
    /// `read` must not take this lock. `None` when `read` gives no copy.
    pub fn observe_with(
        &self,
        id: &str,
        devices: usize,
        read: impl FnOnce() -> Option<RegionSnapshot>,
    ) -> Option<(RegionSnapshot, Vec<QuotaCounters>)> {
        let mut book = self.lock();
        let snapshot = read()?;
        let totals = (0..devices)
            .map(|position| Self::fold(&mut book, id, position, snapshot.counters(position)))
            .collect();
        Some((snapshot, totals))
    }

    /// Folds a reading of allocation `id`'s device `position`, taken after every reading
    /// folded before, into its totals and returns them.
    fn fold(
        book: &mut BTreeMap<Key, (QuotaCounters, QuotaCounters)>,
        id: &str,
        position: usize,
        reading: QuotaCounters,
    ) -> QuotaCounters {
        let (last, total) = book.entry((id.to_string(), position)).or_default();
        *total = total.fold(*last, reading);
        *last = reading;
        *total
    }

    /// The totals as last observed (the region unreadable now).
    pub fn totals(&self, id: &str, position: usize) -> Option<QuotaCounters> {
        self.lock()
            .get(&(id.to_string(), position))
            .map(|(_, total)| *total)
    }

    /// Forgets allocations that are gone.
    pub fn retain(&self, known: &[String]) {
        self.lock().retain(|(id, _), _| known.contains(id));
    }
}

/// One container the watch follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched {
    /// Its allocation (the region's `container_id`).
    pub id: String,
    /// The host folder of its config (`vgpu.yaml`) and region (`usage.region`).
    pub dir: PathBuf,
    /// Its pod's namespace.
    pub namespace: String,
    /// Its pod; empty while not known (the DRA driver learning an old claim's pods):
    /// then counted and logged, and told in an Event only once it is known, of what
    /// came after.
    pub pod: String,
    /// Its pod's UID, when known (else the Event's writer reads the pod for it).
    pub pod_uid: Option<String>,
    /// Its container name (for the DRA driver, which knows no container: its claim and
    /// request).
    pub container: String,
    /// Its cards' UUIDs (the device plugin's record lists them by host index); which
    /// card a device position is comes from its config, by UUID, and from this list
    /// only while the config cannot be read.
    pub cards: Vec<String>,
}

/// What a pass found worth saying about one container on one card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// [`events::REASON_REFUSED`] or [`events::REASON_OVER_QUOTA`].
    pub reason: &'static str,
    /// The sentence of the Event.
    pub note: String,
}

/// What was last told about one container on one card, per reason.
#[derive(Clone, Copy, Debug, Default)]
struct Told {
    /// Refusals and over-quota findings already logged.
    logged_refusals: u64,
    logged_over_quota: u64,
    refusals: u64,
    over_quota: u64,
    refusal_at: Option<Instant>,
    over_at: Option<Instant>,
}

fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// The device plugin's advice in a refusal's note.
pub const PLUGIN_REMEDY: &str = "Ask for more tencent.com/vcuda-memory or use less.";

/// The Event note of refusals (pure: tested apart); `remedy` ends it.
pub fn refusal_note(
    who: &str,
    uuid: &str,
    quota: Option<u64>,
    totals: &QuotaCounters,
    since_last: u64,
    remedy: &str,
) -> String {
    let quota = quota.map_or_else(|| "the whole card".to_string(), gib);
    format!(
        "{who}: an allocation of {asked} on {uuid} was refused (CUDA_ERROR_OUT_OF_MEMORY) by the container's GPU memory quota of {quota}; the container held {held}. {total} refusal(s) so far, {since_last} since the last Event. The card may have free memory: the quota does not. {remedy}",
        asked = gib(totals.last_asked),
        held = gib(totals.last_held),
        total = totals.refusals,
    )
}

/// The Event note of a container found over its quota (pure).
pub fn over_quota_note(
    who: &str,
    uuid: &str,
    quota: Option<u64>,
    held: u64,
    totals: &QuotaCounters,
) -> String {
    let quota = quota.map_or_else(|| "the whole card".to_string(), gib);
    format!(
        "{who}: holds {held} on {uuid}, over its GPU memory quota of {quota} (memory the driver reserved on its own, or its own figure reconciled past the quota); found {n} time(s) so far. New allocations are refused until it is back under.",
        held = gib(held),
        n = totals.over_quota,
    )
}

/// Decides what to say for one container on one card (pure but for `now`): refusals
/// that grew since the last Event, at once the first time and then no sooner than
/// `interval` after the last; the same for over quota.
fn findings(
    told: &mut Told,
    totals: &QuotaCounters,
    now: Instant,
    interval: Duration,
    mut note: impl FnMut(&'static str, u64) -> String,
) -> Vec<Finding> {
    let due = |at: Option<Instant>| at.is_none_or(|at| now.duration_since(at) >= interval);
    let mut out = Vec::new();
    if totals.refusals > told.refusals && due(told.refusal_at) {
        let since = totals.refusals - told.refusals;
        out.push(Finding {
            reason: events::REASON_REFUSED,
            note: note(events::REASON_REFUSED, since),
        });
        told.refusals = totals.refusals;
        told.refusal_at = Some(now);
    }
    if totals.over_quota > told.over_quota && due(told.over_at) {
        out.push(Finding {
            reason: events::REASON_OVER_QUOTA,
            note: note(
                events::REASON_OVER_QUOTA,
                totals.over_quota - told.over_quota,
            ),
        });
        told.over_quota = totals.over_quota;
        told.over_at = Some(now);
    }
    out
}

/// The watch's settings, from the node config.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Write Events at all.
    pub events: bool,
    /// The least time between two Events of one container, card and reason.
    pub interval: Duration,
    /// The API server.
    pub source: vgpu_kube::ClientSource,
    /// This node.
    pub node: String,
    /// The last sentence of a refusal's note: what to ask for more of.
    pub remedy: &'static str,
    /// The Events' `reportingController`: [`events::PLUGIN_REPORTER`], or the DRA
    /// driver's name.
    pub reporter: String,
}

impl Settings {
    /// From the node config, with the device plugin's remedy and reporter (the DRA
    /// driver sets its own).
    pub fn of(config: &NodeConfig) -> Settings {
        Settings {
            events: config.quota_events,
            interval: Duration::from_secs(config.quota_event_interval_secs),
            source: match &config.api_server_url {
                Some(url) => vgpu_kube::ClientSource::Url(url.clone()),
                None => vgpu_kube::ClientSource::Infer,
            },
            node: config
                .node_name
                .clone()
                .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
                .unwrap_or_else(|| "unknown-node".into()),
            remedy: PLUGIN_REMEDY,
            reporter: events::PLUGIN_REPORTER.into(),
        }
    }
}

/// One pass over the containers (blocking: reads files): folds every reading into
/// `totals`, logs grown refusals at info, and returns the Events due.
fn pass(
    containers: &[Watched],
    totals: &QuotaTotals,
    told: &mut BTreeMap<Key, Told>,
    first: bool,
    interval: Duration,
    remedy: &str,
) -> Vec<PodEvent> {
    let now = Instant::now();
    let mut due = Vec::new();
    for watched in containers {
        let config = Config::load(&watched.dir.join(container::CONFIG_FILE)).ok();
        let Some((snapshot, observed)) = totals.observe_region(
            &watched.id,
            &watched.dir.join(container::REGION_FILE),
            watched.cards.len(),
        ) else {
            continue;
        };
        let who = format!(
            "{}/{}/{}",
            watched.namespace, watched.pod, watched.container
        );
        for (position, now_totals) in observed.into_iter().enumerate() {
            // Position `position` of the region is the config's device `position`: its
            // card is the config's, by UUID (the record may list cards in another order).
            let device = config
                .as_ref()
                .and_then(|config| config.devices.get(position));
            let Some(uuid) = device
                .and_then(|device| device.uuid.as_ref())
                .or_else(|| watched.cards.get(position))
            else {
                continue;
            };
            let quota = device
                .and_then(|device| device.memory_limit)
                .map(|limit| limit.bytes());
            let key = (watched.id.clone(), position);
            let entry = told.entry(key).or_insert_with(|| {
                let mut told = Told::default();
                if first {
                    // Counted before this daemon ran: already told (or never will be).
                    told.logged_refusals = now_totals.refusals;
                    told.logged_over_quota = now_totals.over_quota;
                    told.refusals = now_totals.refusals;
                    told.over_quota = now_totals.over_quota;
                }
                told
            });
            if now_totals.refusals > entry.logged_refusals {
                tracing::info!(
                    container = %who, card = %uuid,
                    refused = now_totals.refusals - entry.logged_refusals,
                    refusals_total = now_totals.refusals,
                    asked_bytes = now_totals.last_asked,
                    held_bytes = now_totals.last_held,
                    quota_bytes = quota.unwrap_or(0),
                    "allocations refused at the memory quota"
                );
                entry.logged_refusals = now_totals.refusals;
            }
            if now_totals.over_quota > entry.logged_over_quota {
                tracing::info!(container = %who, card = %uuid, over_quota_total = now_totals.over_quota, "container found over its memory quota");
                entry.logged_over_quota = now_totals.over_quota;
            }
            if watched.pod.is_empty() {
                continue;
            }
            let held = snapshot.device_used(position);
            for finding in findings(entry, &now_totals, now, interval, |reason, since| {
                if reason == events::REASON_REFUSED {
                    refusal_note(&who, uuid, quota, &now_totals, since, remedy)
                } else {
                    over_quota_note(&who, uuid, quota, held, &now_totals)
                }
            }) {
                due.push(PodEvent {
                    pod: PodRef {
                        namespace: watched.namespace.clone(),
                        name: watched.pod.clone(),
                        uid: watched.pod_uid.clone(),
                    },
                    reason: finding.reason,
                    action: if finding.reason == events::REASON_REFUSED {
                        "Allocate"
                    } else {
                        "Account"
                    },
                    note: finding.note,
                    node: String::new(),
                    reporter: String::new(),
                });
            }
        }
    }
    let known: Vec<String> = containers.iter().map(|w| w.id.clone()).collect();
    told.retain(|(id, _), _| known.contains(id));
    due
}

/// Follows `containers()` every [`TICK`] until `stop`: totals, info lines, Events.
pub async fn run(
    containers: Arc<dyn Fn() -> Vec<Watched> + Send + Sync>,
    totals: Arc<QuotaTotals>,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
) {
    let client: OnceCell<Option<vgpu_kube::kube::Client>> = OnceCell::new();
    let told = Arc::new(Mutex::new(BTreeMap::new()));
    let mut first = true;
    loop {
        let list = containers();
        let (totals_now, told_now, interval, remedy) = (
            totals.clone(),
            told.clone(),
            settings.interval,
            settings.remedy,
        );
        let due = tokio::task::spawn_blocking(move || {
            let mut told = told_now
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            pass(&list, &totals_now, &mut told, first, interval, remedy)
        })
        .await
        .unwrap_or_default();
        first = false;
        if settings.events && !due.is_empty() {
            let client = client
                .get_or_init(|| async {
                    match vgpu_kube::connect(&settings.source).await {
                        Ok(client) => Some(client),
                        Err(err) => {
                            tracing::warn!(error = %format!("{err:#}"), "no API server: quota Events are not written");
                            None
                        }
                    }
                })
                .await;
            if let Some(client) = client {
                for mut event in due {
                    event.node = settings.node.clone();
                    event.reporter = settings.reporter.clone();
                    if let Err(err) = events::post(client, &event).await {
                        tracing::warn!(namespace = %event.pod.namespace, pod = %event.pod.name, reason = event.reason, error = %format!("{err:#}"), "cannot write the quota Event");
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(refusals: u64, over_quota: u64) -> QuotaCounters {
        QuotaCounters {
            refusals,
            refused_bytes: refusals << 30,
            over_quota,
            last_asked: 2 << 30,
            last_held: 3 << 30,
            ..QuotaCounters::default()
        }
    }

    #[test]
    fn the_first_refusal_is_told_at_once_then_at_most_once_an_interval() {
        let interval = Duration::from_secs(300);
        let start = Instant::now();
        let mut told = Told::default();
        let note = |reason: &'static str, since: u64| format!("{reason} {since}");
        assert!(findings(&mut told, &reading(0, 0), start, interval, note).is_empty());
        let first = findings(&mut told, &reading(1, 0), start, interval, note);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].reason, events::REASON_REFUSED);
        assert_eq!(first[0].note, "GPUMemoryQuotaRefused 1");
        // 40 more refusals within the interval: nothing yet.
        let later = start + Duration::from_secs(10);
        assert!(findings(&mut told, &reading(41, 0), later, interval, note).is_empty());
        // After it: one Event that covers the 40.
        let after = start + interval;
        let next = findings(&mut told, &reading(41, 0), after, interval, note);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].note, "GPUMemoryQuotaRefused 40");
        assert!(findings(&mut told, &reading(41, 0), after + interval, interval, note).is_empty());
        // Over quota has its own clock.
        let over = findings(&mut told, &reading(41, 1), after, interval, note);
        assert_eq!(over.len(), 1);
        assert_eq!(over[0].reason, events::REASON_OVER_QUOTA);
    }

    #[test]
    fn notes_state_the_quota_the_size_asked_and_what_the_container_holds() {
        let note = refusal_note(
            "team-a/trainer/main",
            "GPU-1",
            Some(4 << 30),
            &reading(3, 0),
            1,
            PLUGIN_REMEDY,
        );
        assert!(note.contains("an allocation of 2.00 GiB"), "{note}");
        assert!(note.contains("quota of 4.00 GiB"), "{note}");
        assert!(note.contains("held 3.00 GiB"), "{note}");
        assert!(note.contains("3 refusal(s) so far, 1 since"), "{note}");
        assert!(note.ends_with("vcuda-memory or use less."), "{note}");
        assert!(note.len() < events::MAX_NOTE_BYTES);
        let over = over_quota_note("a/b/c", "GPU-1", None, 300 << 20, &reading(0, 2));
        assert!(over.contains("holds 300.0 MiB"), "{over}");
        assert!(over.contains("the whole card"), "{over}");
    }

    #[test]
    fn a_refusal_is_told_under_the_card_the_config_puts_at_its_position() {
        use vgpu_contract::region::{Region, RegionDevice};
        let dir = tempfile::tempdir().expect("tempdir");
        // The config (and so the region) lists card b first; the record, by host index,
        // lists card a first.
        std::fs::write(
            dir.path().join(container::CONFIG_FILE),
            "container_id: c1\ndevices:\n  - uuid: GPU-b\n    memory_limit: 1GiB\n  - uuid: GPU-a\n    memory_limit: 2GiB\n",
        )
        .expect("config");
        let device = |id: &str, limit: u64| RegionDevice {
            id: id.into(),
            memory_limit: limit,
            core_limit: 0,
            core_mode: 0,
        };
        let (region, _) = Region::open(
            &dir.path().join(container::REGION_FILE),
            &[device("GPU-b", 1 << 30), device("GPU-a", 2 << 30)],
        )
        .expect("region");
        let watched = Watched {
            id: "c1".into(),
            dir: dir.path().to_path_buf(),
            namespace: "team".into(),
            pod: "wide".into(),
            pod_uid: None,
            container: "cuda".into(),
            cards: vec!["GPU-a".into(), "GPU-b".into()],
        };
        let totals = QuotaTotals::default();
        let mut told = BTreeMap::new();
        let first = pass(
            std::slice::from_ref(&watched),
            &totals,
            &mut told,
            true,
            TICK,
            PLUGIN_REMEDY,
        );
        assert!(first.is_empty());
        // A refusal on card a: the region's device 1.
        region.count_refusal(1, 3 << 30, 1 << 30);
        let due = pass(&[watched], &totals, &mut told, false, TICK, PLUGIN_REMEDY);
        assert_eq!(due.len(), 1, "{due:?}");
        assert!(due[0].note.contains("GPU-a"), "{}", due[0].note);
        assert!(due[0].note.contains("quota of 2.00 GiB"), "{}", due[0].note);
        assert_eq!(totals.totals("c1", 1).map(|t| t.refusals), Some(1));
    }

    #[test]
    fn totals_fold_per_container_and_card_and_forget_the_gone() {
        let totals = QuotaTotals::default();
        let observe = |id: &str, position: usize, now: QuotaCounters| {
            QuotaTotals::fold(&mut totals.lock(), id, position, now)
        };
        assert_eq!(observe("a", 0, reading(2, 0)).refusals, 2);
        assert_eq!(observe("a", 1, reading(5, 0)).refusals, 5);
        // The tenant zeroes its counters: the total holds, and counts on from there.
        assert_eq!(observe("a", 0, reading(0, 0)).refusals, 2);
        assert_eq!(observe("a", 0, reading(1, 0)).refusals, 3);
        totals.retain(&["b".to_string()]);
        assert_eq!(totals.totals("a", 0), None);
    }
}
