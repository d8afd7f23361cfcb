//! What both daemons' `/metrics` and `/healthz` share: the label set and family helpers,
//! the quota's counter families ([`QuotaFamilies`], read from a region's counter block),
//! and the three answers (the exposition, the health verdict, not found). Each daemon
//! renders its own series and serves them through [`crate::http`].

use std::sync::atomic::AtomicU64;

use hyper::{Response, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The label set of a series: (name, value) pairs.
pub type Labels = Vec<(String, String)>;

/// Registers a gauge family named `name` in `registry`.
pub fn gauge_family(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    registry.register(name, help, family.clone());
    family
}

/// Registers a counter family named `name` in `registry` (exposed with `_total`).
pub fn counter_family(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
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
