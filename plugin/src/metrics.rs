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
//!   container-wide counters ([`QuotaFamilies`], totals in [`crate::quota_watch`]):
//!   `vgpu_container_memory_refusals_total`, `vgpu_container_memory_refused_bytes_total`,
//!   `vgpu_container_throttled_seconds_total`, `vgpu_container_memory_over_quota_total`;
//!   the memory limit of a container without one is the card's memory, never 0;
//! * `vgpu_build_info{version, commit}` (always 1) and `vgpu_plugin_events_total{event}`.
//!
//! A scrape copies what it needs from the allocator under its lock and releases it
//! before any file is read; every usage region is read as a private copy (never a
//! mapping of a tenant's file), and copied and folded into the running totals under the
//! totals' lock ([`UsageTotals::observe_region`]). A container's cards are matched to
//! its config's and region's devices by UUID.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper::{Method, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use vgpu_contract::Config;
use vgpu_coordination::backstop::Record;

use crate::container;
use crate::ids::CORES_PER_CARD;
use crate::service::Shared;
use crate::state::Owner;
use crate::usage::UsageTotals;
use vgpu_node_agent::health::ServingStatus;

/// The labels of a series, in order.
pub type Labels = Vec<(String, String)>;

fn gauge_family(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    registry.register(name, help, family.clone());
    family
}

fn counter_family(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    let family = Family::<Labels, Counter>::default();
    registry.register(name, help, family.clone());
    family
}

/// The series of what the quota did to a container on a card, from its region's
/// counter block: one registration, one `record` per container and card. The DRA
/// driver's exporter registers the same families.
pub struct QuotaFamilies {
    refusals: Family<Labels, Counter>,
    refused_bytes: Family<Labels, Counter>,
    throttled: Family<Labels, Counter<f64, AtomicU64>>,
    over_quota: Family<Labels, Counter>,
}

impl QuotaFamilies {
    /// Registers the four families in `registry` (prefix `vgpu` there).
    pub fn register(registry: &mut Registry) -> QuotaFamilies {
        let throttled = Family::<Labels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "container_throttled_seconds",
            "Time the container's kernel launches waited for its compute limit, all its processes so far",
            throttled.clone(),
        );
        QuotaFamilies {
            refusals: counter_family(
                registry,
                "container_memory_refusals",
                "Allocations refused at the container's memory quota (CUDA_ERROR_OUT_OF_MEMORY from the shim)",
            ),
            refused_bytes: counter_family(
                registry,
                "container_memory_refused_bytes",
                "Bytes the refused allocations asked for",
            ),
            throttled,
            over_quota: counter_family(
                registry,
                "container_memory_over_quota",
                "Times the container was found holding more than its memory quota (driver reservations, NVML reconciliation)",
            ),
        }
    }

    /// Sets the series of `labels` to the running totals `totals`.
    pub fn record(&self, labels: &Labels, totals: &vgpu_contract::region::QuotaCounters) {
        self.refusals.get_or_create(labels).inc_by(totals.refusals);
        self.refused_bytes
            .get_or_create(labels)
            .inc_by(totals.refused_bytes);
        self.throttled
            .get_or_create(labels)
            .inc_by(totals.throttled_ns as f64 / 1e9);
        self.over_quota
            .get_or_create(labels)
            .inc_by(totals.over_quota);
    }
}

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
    let over_record =
        Record::read(&crate::coordination::cards_dir(&shared.config.state_dir)).unwrap_or_default();

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
        let observed = usage.observe_region(&row.id, &dir.join("usage.region"), row.cards.len());
        let totals = match &observed {
            Some((_, _, totals)) => totals.clone(),
            None => usage.totals(&row.id),
        };
        let positions = config
            .as_ref()
            .map_or(row.cards.len(), |config| config.devices.len());
        let quota_observed = shared
            .quota
            .observe_region(&row.id, &dir.join("usage.region"), positions)
            .map(|(_, totals)| totals);
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

/// The answer to `GET /metrics` (the exposition, rendered on the blocking pool).
pub async fn metrics_response(
    render: impl FnOnce() -> String + Send + 'static,
) -> Response<String> {
    let body = tokio::task::spawn_blocking(render)
        .await
        .unwrap_or_default();
    Response::builder()
        .header(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
        .body(body)
        .unwrap_or_else(|_| Response::new(String::new()))
}

/// The answer to `GET /healthz`: 200 and the summary, or 503 and the reasons.
pub fn health_response(verdict: Result<String, String>) -> Response<String> {
    let (status, body) = match verdict {
        Ok(summary) => (StatusCode::OK, summary),
        Err(reasons) => (StatusCode::SERVICE_UNAVAILABLE, reasons),
    };
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(format!("{body}\n"))
        .unwrap_or_else(|_| Response::new(String::new()))
}

/// The answer to anything else.
pub fn not_found() -> Response<String> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body("only GET /metrics and GET /healthz are served\n".to_string())
        .unwrap_or_else(|_| Response::new(String::new()))
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
