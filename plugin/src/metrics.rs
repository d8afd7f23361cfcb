//! Prometheus metrics and the health probe over plain HTTP ([`vgpu_node_agent::http`]):
//! `GET /metrics` and `GET /healthz` ([`vgpu_node_agent::health`]).
//!
//! Series, named to join the dashboards operators have (dcgm-exporter's label names):
//! * per card, labels `UUID`, `gpu` (host index): `vgpu_card_memory_bytes`,
//!   `vgpu_card_healthy`, `vgpu_card_allocated_cores`, `vgpu_card_allocated_memory_bytes`,
//!   `vgpu_card_used_memory_bytes`;
//! * per container and card, labels `namespace`, `pod`, `container`, `UUID`:
//!   `vgpu_container_memory_limit_bytes`, `vgpu_container_core_limit` (percent of the
//!   card), `vgpu_container_memory_used_bytes`, `vgpu_container_processes`,
//!   `vgpu_container_over_quota_bytes` (what the card says its processes hold beyond its
//!   quota, from the backstop's record `vgpu_coordination::backstop`), and the
//!   counters `vgpu_container_kernel_launches_total` and
//!   `vgpu_container_gpu_busy_seconds_total`, running totals that never drop when a
//!   process exits ([`crate::usage`]); and what the quota did, from the region's
//!   container-wide counters ([`QuotaFamilies`], totals in [`vgpu_node_agent::quota_watch`]):
//!   `vgpu_container_memory_refusals_total`, `vgpu_container_memory_refused_bytes_total`,
//!   `vgpu_container_throttled_seconds_total`, `vgpu_container_memory_over_quota_total`;
//!   the memory limit of a container without one is the card's memory, never 0;
//! * `vgpu_build_info{version, commit}` (always 1) and `vgpu_plugin_events_total{event}`.
//!
//! A scrape copies what it needs from the allocator under its lock and releases it
//! before any file is read; every usage region is read as a private copy (never a
//! mapping of a tenant's file), once per scrape, and that one copy is folded into both
//! running totals under their locks ([`UsageTotals::observe_with`], then
//! [`QuotaTotals::observe_with`](vgpu_node_agent::quota_watch::QuotaTotals::observe_with)).
//! A container's cards are matched to its config's and region's devices by UUID.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper::Method;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use vgpu_contract::Config;
use vgpu_contract::snapshot::RegionSnapshot;
use vgpu_coordination::backstop::Record;

use crate::ids::CORES_PER_CARD;
use crate::service::Shared;
use crate::usage::UsageTotals;
use vgpu_node_agent::container;
use vgpu_node_agent::exposition::{
    Labels, QuotaFamilies, counter_family, gauge_family, health_response, metrics_response,
    not_found,
};
use vgpu_node_agent::health::ServingStatus;
use vgpu_node_agent::state::Owner;

/// The labels of a series, in order.
fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// One card, as the allocator books it.
struct CardRow {
    uuid: String,
    index: u32,
    memory_total: u64,
    healthy: bool,
    cores: u64,
    memory: u64,
}

/// One started container (PreStart named its owner), as the allocator books it.
struct ContainerRow {
    id: String,
    owner: Owner,
    cards: Vec<String>,
}

/// What a scrape needs, copied under the allocator's lock: no file is read meanwhile.
fn copy_book(shared: &Shared) -> (Vec<CardRow>, Vec<ContainerRow>, Vec<String>) {
    let unit = shared.config.memory_unit.bytes();
    let allocator = shared.allocator();
    let allocations = &allocator.state().allocations;
    let cards = allocator
        .cards()
        .iter()
        .map(|card| {
            // Device IDs shared by a pod's init container and the container that
            // reuses them count once.
            let (cores, memory_units) = allocator.booked_units(&card.uuid);
            CardRow {
                uuid: card.uuid.clone(),
                index: card.index,
                memory_total: card.memory_total,
                healthy: allocator.unhealthy_reason(&card.uuid).is_none(),
                cores,
                memory: memory_units.saturating_mul(unit),
            }
        })
        .collect();
    let containers = allocations
        .values()
        .filter_map(|record| {
            Some(ContainerRow {
                id: record.id.clone(),
                owner: record.owner.clone()?,
                cards: record.cards.clone(),
            })
        })
        .collect();
    let known = allocations.keys().cloned().collect();
    (cards, containers, known)
}

/// The text exposition of all metrics.
pub fn render(shared: &Shared, usage: &UsageTotals) -> String {
    render_reading(shared, usage, &|region| RegionSnapshot::read(region).ok())
}

/// [`render`] with each container's usage region copied by `read`, once per scrape
/// (tests count the copies through it).
pub fn render_reading(
    shared: &Shared,
    usage: &UsageTotals,
    read: &dyn Fn(&Path) -> Option<RegionSnapshot>,
) -> String {
    let (cards, containers, known) = copy_book(shared);
    usage.retain(&known);

    let mut registry = Registry::with_prefix("vgpu");
    let build_info = gauge_family(
        &mut registry,
        "build_info",
        "The plugin's version and commit (always 1)",
    );
    let card_memory = gauge_family(
        &mut registry,
        "card_memory_bytes",
        "Device memory of the card",
    );
    let card_healthy = gauge_family(&mut registry, "card_healthy", "1 when the card is healthy");
    let card_cores = gauge_family(
        &mut registry,
        "card_allocated_cores",
        "Core units (percent of the card) allocated",
    );
    let card_allocated_memory = gauge_family(
        &mut registry,
        "card_allocated_memory_bytes",
        "Memory units allocated, in bytes",
    );
    let card_used = gauge_family(
        &mut registry,
        "card_used_memory_bytes",
        "Device memory held by containers of this plugin",
    );
    let memory_limit = gauge_family(
        &mut registry,
        "container_memory_limit_bytes",
        "Memory limit of the container on the card (the card's memory when it has no limit of its own)",
    );
    let core_limit = gauge_family(
        &mut registry,
        "container_core_limit",
        "Core limit of the container on the card, percent of its SMs (100: not throttled)",
    );
    let memory_used = gauge_family(
        &mut registry,
        "container_memory_used_bytes",
        "Device memory the container's processes hold",
    );
    let processes = gauge_family(
        &mut registry,
        "container_processes",
        "Live CUDA processes in the container",
    );
    let launches = counter_family(
        &mut registry,
        "container_kernel_launches",
        "Kernel launches the compute limiter saw, all the container's processes so far",
    );
    let busy = Family::<Labels, Counter<f64, AtomicU64>>::default();
    registry.register(
        "container_gpu_busy_seconds",
        "GPU busy time the compute limiter measured, all the container's processes so far",
        busy.clone(),
    );
    let over_quota = gauge_family(
        &mut registry,
        "container_over_quota_bytes",
        "Device memory the card says the container's processes hold beyond its quota (the host's backstop; absent while within it)",
    );
    let plugin = counter_family(&mut registry, "plugin_events", "Plugin events by kind");
    let quota_families = QuotaFamilies::register(&mut registry);
    let card_memory_of: BTreeMap<&str, u64> = cards
        .iter()
        .map(|card| (card.uuid.as_str(), card.memory_total))
        .collect();
    let known_ids = known.clone();
    let over_record = Record::read(&vgpu_node_agent::coordination::cards_dir(
        &shared.config.state_dir,
    ))
    .unwrap_or_default();

    build_info
        .get_or_create(&vec![
            ("version".into(), vgpu_build_info::VERSION.into()),
            ("commit".into(), vgpu_build_info::COMMIT.into()),
        ])
        .set(1);

    let mut used_per_card: BTreeMap<String, u64> = BTreeMap::new();
    for row in &containers {
        let dir = container::allocation_dir(&shared.config, &row.id);
        let config = Config::load(&dir.join("vgpu.yaml")).ok();
        let positions = config
            .as_ref()
            .map_or(row.cards.len(), |config| config.devices.len());
        // One copy of the region feeds both books, each folding it under its lock (the
        // usage totals', then the quota totals').
        let region = dir.join("usage.region");
        let mut quota_observed = None;
        let observed = usage.observe_with(&row.id, row.cards.len(), || {
            let (snapshot, totals) = shared
                .quota
                .observe_with(&row.id, positions, || read(&region))?;
            quota_observed = Some(totals);
            Some(snapshot)
        });
        let totals = match &observed {
            Some((_, _, totals)) => totals.clone(),
            None => usage.totals(&row.id),
        };
        for uuid in &row.cards {
            let labels: Labels = vec![
                ("namespace".into(), row.owner.namespace.clone()),
                ("pod".into(), row.owner.pod.clone()),
                ("container".into(), row.owner.container.clone()),
                ("UUID".into(), uuid.clone()),
            ];
            // The card's place in the container's config is its place in the region
            // (the record lists cards by host index, the config by UUID): matched by
            // UUID, never by position.
            let Some((position, quota)) = config.as_ref().and_then(|config| {
                config
                    .devices
                    .iter()
                    .enumerate()
                    .find(|(_, device)| device.uuid.as_deref() == Some(uuid.as_str()))
            }) else {
                continue;
            };
            // No limit of its own: the whole card (a used/limit ratio never divides by
            // zero).
            let whole_card = card_memory_of.get(uuid.as_str()).copied().unwrap_or(0);
            memory_limit.get_or_create(&labels).set(clamp(
                quota.memory_limit.map_or(whole_card, |limit| limit.bytes()),
            ));
            core_limit
                .get_or_create(&labels)
                .set(i64::from(quota.core_limit.unwrap_or(CORES_PER_CARD)));
            if let Some(over) = over_record.over_quota.iter().find(|over| {
                Some(over.container.as_str())
                    == config.as_ref().and_then(|c| c.container_id.as_deref())
                    && over.uuid == *uuid
            }) {
                over_quota
                    .get_or_create(&labels)
                    .set(clamp(over.used_bytes.saturating_sub(over.limit_bytes)));
            }
            if let Some((snapshot, live, _)) = &observed {
                let used = snapshot.device_used(position);
                memory_used.get_or_create(&labels).set(clamp(used));
                *used_per_card.entry(uuid.clone()).or_default() += used;
                processes.get_or_create(&labels).set(live.len() as i64);
            }
            let quota_totals = match &quota_observed {
                Some(totals) => totals.get(position).copied(),
                None => shared.quota.totals(&row.id, position),
            };
            if let Some(quota_totals) = quota_totals {
                quota_families.record(&labels, &quota_totals);
            }
            if let Some(total) = totals.get(position) {
                launches.get_or_create(&labels).inc_by(total.launches);
                busy.get_or_create(&labels)
                    .inc_by(total.busy_ns as f64 / 1e9);
            }
        }
    }
    shared.quota.retain(&known_ids);
    for card in &cards {
        let labels: Labels = vec![
            ("UUID".into(), card.uuid.clone()),
            ("gpu".into(), card.index.to_string()),
        ];
        card_memory
            .get_or_create(&labels)
            .set(clamp(card.memory_total));
        card_healthy
            .get_or_create(&labels)
            .set(i64::from(card.healthy));
        card_cores.get_or_create(&labels).set(clamp(card.cores));
        card_allocated_memory
            .get_or_create(&labels)
            .set(clamp(card.memory));
        card_used
            .get_or_create(&labels)
            .set(clamp(used_per_card.get(&card.uuid).copied().unwrap_or(0)));
    }
    let counters = &shared.counters;
    for (event, value) in [
        ("allocations", &counters.allocations),
        ("refusals", &counters.refusals),
        ("prestarts", &counters.prestarts),
        ("collected", &counters.collected),
        ("registrations", &counters.registrations),
    ] {
        plugin
            .get_or_create(&vec![("event".into(), event.into())])
            .inc_by(value.load(Ordering::Relaxed));
    }
    let mut text = String::new();
    if encode(&mut text, &registry).is_err() {
        text.clear();
    }
    text
}

/// What the metrics server answers from.
#[derive(Clone)]
pub(crate) struct Sources {
    pub shared: Arc<Shared>,
    pub usage: Arc<UsageTotals>,
    pub status: Arc<ServingStatus>,
}

/// The plugin's answers, for [`vgpu_node_agent::http::serve`].
pub(crate) fn handler(sources: Sources) -> vgpu_node_agent::http::Handler {
    Arc::new(move |method: Method, path: String| {
        let sources = sources.clone();
        Box::pin(async move {
            match (method == Method::GET, path.as_str()) {
                (true, "/metrics") => {
                    metrics_response(move || render(&sources.shared, &sources.usage)).await
                }
                (true, "/healthz") => health_response(sources.status.verdict()),
                _ => not_found(),
            }
        })
    })
}
