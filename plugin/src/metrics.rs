//! Prometheus metrics over plain HTTP (`GET /metrics`, hyper's HTTP/1 server): per card
//! (memory, allocated cores and memory, health) and per container (limits, memory used,
//! processes, kernel launches and GPU busy time read from its usage region), plus the
//! plugin's own counters. The registry is rebuilt on every scrape from the live state.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use vgpu_common::Config;
use vgpu_common::snapshot::RegionSnapshot;

use crate::container;
use crate::ids::CORES_PER_CARD;
use crate::service::Shared;

type Labels = Vec<(String, String)>;

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

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The text exposition of all metrics.
pub fn render(shared: &Shared) -> String {
    let mut registry = Registry::with_prefix("vgpu");
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
        "Memory limit of the container on the card (0: whole card)",
    );
    let core_limit = gauge_family(
        &mut registry,
        "container_core_limit",
        "Core limit of the container on the card (100: not throttled)",
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
        "Kernel launches seen by the compute limiter",
    );
    let busy = counter_family(
        &mut registry,
        "container_gpu_busy_nanoseconds",
        "GPU busy time measured by the compute limiter",
    );
    let plugin = counter_family(&mut registry, "plugin_events", "Plugin events by kind");

    let allocator = shared.allocator();
    let unit = shared.config.memory_unit.bytes();
    let mut used_per_card: std::collections::BTreeMap<String, u64> = Default::default();
    for record in allocator.state().allocations.values() {
        let owner = record.owner.as_ref();
        let dir = container::allocation_dir(&shared.config, &record.id);
        let config = Config::load(&dir.join("vgpu.yaml")).ok();
        // A private copy: a tenant-written file is never mapped here.
        let region = RegionSnapshot::read(&dir.join("usage.region")).ok();
        let live = region
            .as_ref()
            .map(|region| region.processes())
            .unwrap_or_default();
        for (position, uuid) in record.cards.iter().enumerate() {
            let labels: Labels = vec![
                ("allocation".into(), record.id.clone()),
                (
                    "namespace".into(),
                    owner.map(|o| o.namespace.clone()).unwrap_or_default(),
                ),
                (
                    "pod".into(),
                    owner.map(|o| o.pod.clone()).unwrap_or_default(),
                ),
                (
                    "container".into(),
                    owner.map(|o| o.container.clone()).unwrap_or_default(),
                ),
                ("card".into(), uuid.clone()),
            ];
            let quota = config.as_ref().and_then(|config| {
                config
                    .devices
                    .iter()
                    .find(|device| device.uuid.as_deref() == Some(uuid))
            });
            if let Some(quota) = quota {
                memory_limit
                    .get_or_create(&labels)
                    .set(clamp(quota.memory_limit.map_or(0, |limit| limit.bytes())));
                core_limit
                    .get_or_create(&labels)
                    .set(i64::from(quota.core_limit.unwrap_or(CORES_PER_CARD)));
            }
            if let Some(region) = &region {
                let used = region.device_used(position);
                memory_used.get_or_create(&labels).set(clamp(used));
                *used_per_card.entry(uuid.clone()).or_default() += used;
                processes.get_or_create(&labels).set(live.len() as i64);
                let launched: u64 = live
                    .iter()
                    .filter_map(|process| process.launches.get(position))
                    .sum();
                let busy_ns: u64 = live
                    .iter()
                    .filter_map(|process| process.busy_ns.get(position))
                    .sum();
                launches.get_or_create(&labels).inc_by(launched);
                busy.get_or_create(&labels).inc_by(busy_ns);
            }
        }
    }
    for card in allocator.cards() {
        let labels: Labels = vec![
            ("card".into(), card.uuid.clone()),
            ("index".into(), card.index.to_string()),
        ];
        card_memory
            .get_or_create(&labels)
            .set(clamp(card.memory_total));
        card_healthy
            .get_or_create(&labels)
            .set(i64::from(allocator.unhealthy_reason(&card.uuid).is_none()));
        // Device IDs shared by a pod's init container and the container that reuses
        // them count once.
        let (cores, memory_units) = allocator.booked_units(&card.uuid);
        card_cores.get_or_create(&labels).set(clamp(cores));
        card_allocated_memory
            .get_or_create(&labels)
            .set(clamp(memory_units.saturating_mul(unit)));
        card_used
            .get_or_create(&labels)
            .set(clamp(used_per_card.get(&card.uuid).copied().unwrap_or(0)));
    }
    drop(allocator);
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

async fn answer(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<String>, Infallible> {
    let response = if request.method() == Method::GET && request.uri().path() == "/metrics" {
        let body = tokio::task::spawn_blocking(move || render(&shared))
            .await
            .unwrap_or_default();
        Response::builder()
            .header(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(body)
    } else {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body("only GET /metrics is served\n".to_string())
    };
    Ok(response.unwrap_or_else(|_| Response::new(String::new())))
}

/// Serves `GET /metrics` until `stop`.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request| answer(shared.clone(), request));
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %err, "metrics connection ended with an error");
            }
        });
    }
}
