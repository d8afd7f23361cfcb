//! The DRA driver's `GET /metrics` and `GET /healthz`, served by the device plugin's
//! hardened HTTP server ([`vgpu_node_agent::http`]: header and connection timeouts, a
//! connection cap, accept back-off) at `metrics_address` (port 9402 in the manifests).
//!
//! Series (the device plugin's names where they mean the same):
//! * per card, labels `UUID`, `gpu` (host index): `vgpu_card_healthy`;
//! * `vgpu_dra_prepared_claims`: the claims prepared on this node now;
//! * per prepared request and card, labels `namespace`, `claim`, `request`, `UUID`:
//!   `vgpu_container_memory_limit_bytes` (the card's memory for a whole card, never 0),
//!   `vgpu_container_core_limit` (percent of the card, 100: not throttled),
//!   `vgpu_container_memory_used_bytes` and `vgpu_container_processes` (from a private
//!   copy of its usage region; the card is matched to the region's device by UUID,
//!   through the request's config), and the device plugin's counters of what the quota
//!   did ([`vgpu_node_agent::exposition::QuotaFamilies`]: `vgpu_container_memory_refusals_total`,
//!   `vgpu_container_memory_refused_bytes_total`, `vgpu_container_throttled_seconds_total`,
//!   `vgpu_container_memory_over_quota_total`), running totals that never step back;
//! * `vgpu_build_info{version, commit}` (always 1).
//!
//! `/healthz` is 200 while the supervisor passes, both sockets (the DRA socket and the
//! registration socket) are served, and kubelet's plugin watcher has accepted the
//! registration socket now served: until then kubelet fails every pod with one of our
//! claims and retries it only after a back-off of about a minute, so the DaemonSet is
//! not Ready before. A registration wakes the supervisor, so readiness follows it at
//! once.

use std::sync::Arc;

use hyper::Method;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use vgpu_contract::Config;
use vgpu_kube::slices::GpuDevice;
use vgpu_node_agent::exposition::{health_response, metrics_response, not_found};
use vgpu_node_agent::health::ServingStatus;

use crate::prepare::Preparer;

type Labels = Vec<(String, String)>;

fn gauge_family(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    registry.register(name, help, family.clone());
    family
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// What the server answers from.
#[derive(Clone)]
pub(crate) struct Sources {
    pub preparer: Arc<Preparer>,
    pub cards: watch::Receiver<Vec<GpuDevice>>,
    pub status: Arc<ServingStatus>,
    /// The running totals of the requests' quota counters.
    pub quota: Arc<vgpu_node_agent::quota_watch::QuotaTotals>,
}

/// The text exposition of the driver's metrics.
pub(crate) fn render(sources: &Sources) -> String {
    let mut registry = Registry::with_prefix("vgpu");
    let build_info = gauge_family(
        &mut registry,
        "build_info",
        "The driver's version and commit (always 1)",
    );
    let card_healthy = gauge_family(&mut registry, "card_healthy", "1 when the card is healthy");
    let claims = gauge_family(
        &mut registry,
        "dra_prepared_claims",
        "Resource claims prepared on this node",
    );
    let memory_limit = gauge_family(
        &mut registry,
        "container_memory_limit_bytes",
        "Memory limit of the request on the card (the card's memory when it has no limit of its own)",
    );
    let core_limit = gauge_family(
        &mut registry,
        "container_core_limit",
        "Core limit of the request on the card, percent of its SMs (100: not throttled)",
    );
    let memory_used = gauge_family(
        &mut registry,
        "container_memory_used_bytes",
        "Device memory the request's processes hold",
    );
    let processes = gauge_family(
        &mut registry,
        "container_processes",
        "Live CUDA processes of the request",
    );
    let quota_families = vgpu_node_agent::exposition::QuotaFamilies::register(&mut registry);
    let card_memory: std::collections::BTreeMap<String, u64> = sources
        .cards
        .borrow()
        .iter()
        .map(|card| (card.uuid.clone(), card.memory_bytes))
        .collect();
    build_info
        .get_or_create(&vec![
            ("version".into(), vgpu_build_info::VERSION.into()),
            ("commit".into(), vgpu_build_info::COMMIT.into()),
        ])
        .set(1);
    for card in sources.cards.borrow().iter() {
        card_healthy
            .get_or_create(&vec![
                ("UUID".into(), card.uuid.clone()),
                ("gpu".into(), card.index.to_string()),
            ])
            .set(i64::from(card.unhealthy.is_none()));
    }
    let prepared = sources.preparer.prepared();
    claims.get_or_create(&Vec::new()).set(prepared.len() as i64);
    for claim in prepared.values() {
        for request in &claim.requests {
            let dir = sources.preparer.allocation_dir(&request.container_id);
            let Ok(config) = Config::load(&dir.join("vgpu.yaml")) else {
                continue;
            };
            // Copied and folded into the running totals under their one lock, so
            // parallel scrapes and the quota watch fold copies in the order taken.
            let observed = sources.quota.observe_region(
                &request.container_id,
                &dir.join("usage.region"),
                config.devices.len(),
            );
            let live = observed.as_ref().map(|(snapshot, _)| snapshot.processes());
            for (position, quota) in config.devices.iter().enumerate() {
                let Some(uuid) = quota.uuid.clone() else {
                    continue;
                };
                let labels: Labels = vec![
                    ("namespace".into(), claim.namespace.clone()),
                    ("claim".into(), claim.name.clone()),
                    ("request".into(), request.request.clone()),
                    ("UUID".into(), uuid.clone()),
                ];
                let whole_card = card_memory.get(&uuid).copied().unwrap_or(0);
                memory_limit.get_or_create(&labels).set(clamp(
                    quota.memory_limit.map_or(whole_card, |limit| limit.bytes()),
                ));
                core_limit
                    .get_or_create(&labels)
                    .set(i64::from(quota.core_limit.unwrap_or(100)));
                let totals = match &observed {
                    Some((_, totals)) => totals.get(position).copied(),
                    None => sources.quota.totals(&request.container_id, position),
                };
                if let Some(totals) = totals {
                    quota_families.record(&labels, &totals);
                }
                if let (Some((snapshot, _)), Some(live)) = (&observed, &live) {
                    memory_used
                        .get_or_create(&labels)
                        .set(clamp(snapshot.device_used(position)));
                    processes.get_or_create(&labels).set(live.len() as i64);
                }
            }
        }
    }
    let known: Vec<String> = prepared
        .values()
        .flat_map(|claim| claim.requests.iter().map(|r| r.container_id.clone()))
        .collect();
    sources.quota.retain(&known);
    let mut text = String::new();
    if encode(&mut text, &registry).is_err() {
        text.clear();
    }
    text
}

/// The driver's answers, for [`vgpu_node_agent::http::serve`].
pub(crate) fn handler(sources: Sources) -> vgpu_node_agent::http::Handler {
    Arc::new(move |method: Method, path: String| {
        let sources = sources.clone();
        Box::pin(async move {
            match (method == Method::GET, path.as_str()) {
                (true, "/metrics") => metrics_response(move || render(&sources)).await,
                (true, "/healthz") => health_response(sources.status.verdict()),
                _ => not_found(),
            }
        })
    })
}
