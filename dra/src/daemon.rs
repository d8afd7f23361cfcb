//! The DRA plugin's life: refuse to run beside the device plugin, discover cards, load
//! the checkpoint, serve the DRA socket (v1 and v1beta1) and then the registration
//! socket, keep both served (a removed socket is served again, so kubelet's plugin
//! watcher finds it again), watch card health, keep the node's ResourceSlices current,
//! serve `/metrics` and `/healthz` (the device plugin's HTTP server), run the node's
//! compute coordination and the quota watch (the device plugin's loops: running totals
//! of each request's quota counters, and Events on the pod its claim is reserved for),
//! and on stop remove the sockets (kubelet then deregisters the driver).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use vgpu_kube::slices::{GpuDevice, SlicePublisher};
use vgpu_node_agent::coordination;
use vgpu_node_agent::devices::watch_health;
use vgpu_node_agent::devices::{CardInfo, DeviceSource};
use vgpu_node_agent::health::ServingStatus;
use vgpu_node_agent::quota_watch::{self, QuotaTotals, Watched};
use vgpu_node_agent::serve::{ServedSocket, wait_for_sockets};
use vgpu_node_agent::tasks::Background;

use crate::cards::{Describe, Details, gpu_devices};
use crate::checkpoint::Checkpoint;
use crate::config::DraConfig;
use crate::prepare::Preparer;
use crate::registration::{RegistrationBook, RegistrationService};
use crate::service::{DraService, DraV1, DraV1beta1};
use vgpu_kubelet_api::dra_v1::dra_plugin_server::DraPluginServer as V1Server;
use vgpu_kubelet_api::dra_v1beta1::dra_plugin_server::DraPluginServer as V1beta1Server;
use vgpu_kubelet_api::registration::registration_server::RegistrationServer;
use vgpu_node_agent::persist::{self, Versioned};

/// A device-plugin socket that answers: the device plugin runs on this node.
pub fn live_device_plugin_socket(config: &DraConfig) -> Option<PathBuf> {
    config
        .device_plugin_sockets
        .iter()
        .map(|name| config.device_plugin_dir.join(name))
        .find(|path| std::os::unix::net::UnixStream::connect(path).is_ok())
}

/// A running DRA plugin.
pub struct DraHandle {
    preparer: Arc<Preparer>,
    registration: Arc<RegistrationBook>,
    cards: watch::Receiver<Vec<GpuDevice>>,
    background: Background,
    sockets: [PathBuf; 2],
    metrics_address: Option<SocketAddr>,
}

impl DraHandle {
    /// The claims' preparer: what is prepared now and where its folders are.
    pub fn preparer(&self) -> &Arc<Preparer> {
        &self.preparer
    }

    /// What kubelet said about registration.
    pub fn registration(&self) -> &Arc<RegistrationBook> {
        &self.registration
    }

    /// The cards as the slices describe them now (health included).
    pub fn devices(&self) -> Vec<GpuDevice> {
        self.cards.borrow().clone()
    }

    /// The DRA socket and the registration socket.
    pub fn sockets(&self) -> &[PathBuf; 2] {
        &self.sockets
    }

    /// Where `/metrics` and `/healthz` are served, once bound (port 0 picks a free one).
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_address
    }

    /// Stops serving, removes the sockets (the checkpoint, folders and CDI specs stay:
    /// the prepared claims belong to running pods) and waits for the background work.
    pub async fn stop(mut self) {
        self.background.stop().await;
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
        tracing::info!("stopped");
    }
}

/// Serves `router` on `path`, creating its folder first.
fn serve(path: &Path, router: tonic::transport::server::Router) -> anyhow::Result<ServedSocket> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", parent.display()))?;
    }
    ServedSocket::serve(path, |_| router)
}

/// Keeps the DRA socket and then the registration socket served until `stop`.
async fn supervise(
    config: DraConfig,
    service: Arc<DraService>,
    registration: Arc<RegistrationBook>,
    status: Arc<ServingStatus>,
    mut stop: watch::Receiver<bool>,
) {
    let tick = Duration::from_millis(config.registration_watch_interval_ms);
    let dra_socket = config.dra_socket();
    let registration_socket = config.registration_socket();
    let mut dra: Option<ServedSocket> = None;
    let mut reg: Option<ServedSocket> = None;
    // Kubelet's acceptances when the registration socket now served was made: the
    // driver is registered once kubelet has accepted it since.
    let mut accepted_before = registration.accepted.load(Ordering::Relaxed);
    loop {
        let alive = |served: &Option<ServedSocket>, path: &Path| {
            served.as_ref().is_some_and(|s| s.is_serving(path))
        };
        if !alive(&dra, &dra_socket) {
            if let Some(old) = dra.take() {
                tracing::info!(socket = %dra_socket.display(), "DRA socket removed; serving again");
                old.stop().await;
            }
            let router = tonic::transport::Server::builder()
                .add_service(V1Server::new(DraV1(service.clone())))
                .add_service(V1beta1Server::new(DraV1beta1(service.clone())));
            match serve(&dra_socket, router) {
                Ok(served) => dra = Some(served),
                Err(err) => {
                    tracing::error!(error = %format!("{err:#}"), "cannot serve the DRA socket")
                }
            }
        }
        // Registration only once the DRA socket answers: kubelet dials it right after GetInfo.
        if dra.is_some() && !alive(&reg, &registration_socket) {
            if let Some(old) = reg.take() {
                tracing::info!(socket = %registration_socket.display(), "registration socket removed; serving again");
                old.stop().await;
            }
            let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(
                RegistrationService {
                    driver: config.driver_name.clone(),
                    endpoint: dra_socket.clone(),
                    book: registration.clone(),
                },
            ));
            accepted_before = registration.accepted.load(Ordering::Relaxed);
            match serve(&registration_socket, router) {
                Ok(served) => {
                    tracing::info!(socket = %registration_socket.display(), "waiting for kubelet's plugin watcher");
                    reg = Some(served)
                }
                Err(err) => {
                    tracing::error!(error = %format!("{err:#}"), "cannot serve the registration socket")
                }
            }
        }
        // Ready once kubelet's plugin watcher has accepted the registration socket now
        // served: until then kubelet fails every pod with a claim of ours ("DRA driver
        // ... is not registered") and retries it only after a back-off of about a minute.
        let [dra_served, reg_served] = [(&dra, &dra_socket), (&reg, &registration_socket)]
            .map(|(served, path)| alive(served, path));
        let registered = registration.accepted.load(Ordering::Relaxed) > accepted_before;
        status.record_pass(&[
            (dra_served, dra_served),
            (reg_served, reg_served && registered),
        ]);
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = registration.changed.notified() => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
    // Registration first, so kubelet stops calling before the DRA socket goes.
    for served in [reg, dra].into_iter().flatten() {
        served.stop().await;
    }
}

/// The allocation folders of every prepared request, for the compute coordinator.
fn prepared_folders(preparer: Arc<Preparer>) -> coordination::Folders {
    Arc::new(move || {
        preparer
            .prepared()
            .values()
            .flat_map(|claim| claim.requests.iter())
            .map(|request| preparer.allocation_dir(&request.container_id))
            .collect()
    })
}

/// The last sentence of a refusal's Event in DRA mode.
pub const DRA_REMEDY: &str =
    "Ask for more memory in the ResourceClaim's request (capacity.requests.memory) or use less.";

/// The prepared requests the quota watch follows, each on the first pod its claim is
/// reserved for (a claim shared by several pods is one quota and one region; its Events
/// go to the first pod). A claim with no recorded pod yet is followed all the same (so
/// what it counted before this driver started stays untold) but gets no Event.
fn watched_requests(preparer: Arc<Preparer>) -> Arc<dyn Fn() -> Vec<Watched> + Send + Sync> {
    Arc::new(move || {
        let mut watched = Vec::new();
        for claim in preparer.prepared().values() {
            let pod = claim.pods.first();
            for request in &claim.requests {
                watched.push(Watched {
                    id: request.container_id.clone(),
                    dir: preparer.allocation_dir(&request.container_id),
                    namespace: claim.namespace.clone(),
                    pod: pod.map(|pod| pod.name.clone()).unwrap_or_default(),
                    pod_uid: pod.map(|pod| pod.uid.clone()),
                    container: format!("claim {}, request {}", claim.name, request.request),
                    cards: request.cards.iter().map(|card| card.0.clone()).collect(),
                });
            }
        }
        watched
    })
}

/// Fills in the pods of claims that a driver before pod recording prepared (read from
/// each claim's `status.reservedFor`), once a minute until none is left or `stop`.
async fn record_missing_pods(
    preparer: Arc<Preparer>,
    client: vgpu_kube::kube::Client,
    driver: String,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let missing: Vec<(String, String, String)> = preparer
            .prepared()
            .into_iter()
            .filter(|(_, claim)| claim.pods.is_empty())
            .map(|(uid, claim)| (uid, claim.namespace, claim.name))
            .collect();
        if missing.is_empty() {
            return;
        }
        for (uid, namespace, name) in missing {
            let read =
                vgpu_kube::claims::read_claim(client.clone(), &driver, &namespace, &name, &uid)
                    .await;
            let recorded = read
                .map_err(|err| anyhow::anyhow!("{err}"))
                .and_then(|allocation| {
                    preparer.record_pods(&uid, crate::prepare::claim_pods(&allocation))
                });
            if let Err(err) = recorded {
                tracing::warn!(%namespace, claim = %name, error = %format!("{err:#}"), "cannot learn the claim's pods: its quota Events wait");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}

/// Every second, fills in the host PIDs of container processes in each prepared
/// request's usage region (from a private copy, written back with pwrite, as the
/// device plugin does), so NVML inside the container can list its processes.
async fn host_pid_loop(
    preparer: Arc<Preparer>,
    proc_root: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        let regions: Vec<PathBuf> = preparer
            .prepared()
            .values()
            .flat_map(|claim| claim.requests.iter())
            .map(|request| {
                preparer
                    .allocation_dir(&request.container_id)
                    .join("usage.region")
            })
            .collect();
        let proc_root = proc_root.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for region in regions {
                if let Ok(copy) = vgpu_contract::snapshot::RegionSnapshot::read(&region) {
                    copy.fill_host_pids(&proc_root);
                }
            }
        })
        .await;
    }
}

/// Probes the cards and publishes the devices (health included) when it changes.
fn health_loop(
    source: Arc<dyn DeviceSource>,
    cards: Vec<CardInfo>,
    details: BTreeMap<String, Details>,
    interval: Duration,
    publish: watch::Sender<Vec<GpuDevice>>,
    stop: &AtomicBool,
) {
    let uuids: Vec<String> = cards.iter().map(|card| card.uuid.clone()).collect();
    watch_health(&*source, &uuids, interval, stop, |health| {
        let unhealthy: BTreeMap<String, String> = health
            .into_iter()
            .filter_map(|(uuid, health)| health.err().map(|reason| (uuid, reason)))
            .collect();
        let devices = gpu_devices(&cards, &details, &unhealthy);
        publish.send_if_modified(|current| {
            if *current == devices {
                return false;
            }
            for (old, new) in current.iter().zip(&devices) {
                match (&old.unhealthy, &new.unhealthy) {
                    (None, Some(reason)) => {
                        tracing::warn!(card = %new.uuid, %reason, "card unhealthy")
                    }
                    (Some(_), None) => tracing::info!(card = %new.uuid, "card healthy again"),
                    _ => {}
                }
            }
            *current = devices;
            true
        });
    });
}

/// Starts the plugin. Returns once the DRA and registration sockets are served; the
/// slices are published in the background (and retried while the API server is away).
pub async fn start(
    config: DraConfig,
    source: Arc<dyn DeviceSource>,
    describe: Arc<dyn Describe>,
) -> anyhow::Result<DraHandle> {
    if let Some(socket) = live_device_plugin_socket(&config) {
        anyhow::bail!(
            "the vgpu device plugin is serving {} on this node: DRA mode and device-plugin mode never run on one node (deploy/README.md); remove the device plugin from this node first (label the node vgpu-shim.io/mode=dra and drop its nvidia-device-enable label)",
            socket.display()
        );
    }
    let cards = source.discover()?;
    if cards.is_empty() {
        tracing::warn!("no GPUs found: publishing an empty pool");
    }
    let node = config.node_config();
    persist::create_folders([
        config.state_dir.clone(),
        node.allocations_dir(),
        coordination::cards_dir(&node.state_dir),
        config.plugin_dir(),
        config.plugins_registry_dir.clone(),
        config.cdi_dir.clone(),
    ])?;
    let checkpoint = Checkpoint::load(&config.state_file())?;
    let (mps, source) = vgpu_node_agent::mps::start_with_source(&node, &cards, source)?;
    tracing::info!(
        cards = cards.len(),
        prepared = checkpoint.claims.len(),
        driver = %config.driver_name,
        node = %config.node(),
        "starting"
    );
    let client = vgpu_kube::connect(&config.api_server()).await?;
    let details: BTreeMap<String, Details> = cards
        .iter()
        .map(|card| (card.uuid.clone(), describe.details(&card.uuid)))
        .collect();
    let unhealthy: BTreeMap<String, String> = cards
        .iter()
        .filter_map(|card| {
            source
                .probe(&card.uuid)
                .err()
                .map(|why| (card.uuid.clone(), why))
        })
        .collect();
    let (publish, devices) = watch::channel(gpu_devices(&cards, &details, &unhealthy));
    let preparer = Arc::new(Preparer::new(config.clone(), cards.clone(), checkpoint)?);
    let swept = preparer.sweep_orphans();
    if swept > 0 {
        tracing::info!(
            swept,
            "removed prepared requests the checkpoint does not know"
        );
    }
    let service = Arc::new(DraService {
        config: config.clone(),
        preparer: preparer.clone(),
        client: Some(client.clone()),
    });
    let registration = Arc::new(RegistrationBook::default());
    let (stop, stop_receiver) = watch::channel(false);
    let mut background = Background::new(stop);
    let quota = Arc::new(QuotaTotals::default());
    let status = Arc::new(ServingStatus::new(
        &["DRA socket".to_string(), "registration socket".to_string()],
        Duration::from_millis(config.registration_watch_interval_ms),
    ));
    let metrics_address = match config.metrics_address {
        Some(address) => {
            let sources = crate::metrics::Sources {
                preparer: preparer.clone(),
                cards: devices.clone(),
                status: status.clone(),
                quota: quota.clone(),
            };
            let (bound, task) = vgpu_node_agent::http::bind_and_serve(
                address,
                crate::metrics::handler(sources),
                stop_receiver.clone(),
            )
            .await?;
            background.push(task);
            Some(bound)
        }
        None => None,
    };
    if let Some(supervisor) = mps {
        background.push(tokio::spawn(vgpu_node_agent::mps::stop_with(
            supervisor,
            stop_receiver.clone(),
        )));
    }
    background.push(tokio::spawn(supervise(
        config.clone(),
        service,
        registration.clone(),
        status,
        stop_receiver.clone(),
    )));
    {
        let publisher = SlicePublisher::new(
            client.clone(),
            &config.driver_name,
            config.node(),
            config.unhealthy,
        );
        let devices = devices.clone();
        let resync = Duration::from_secs(config.slice_resync_secs);
        let stop = stop_receiver.clone();
        background.push(tokio::spawn(async move {
            publisher.run(devices, resync, stop).await
        }));
    }
    background.push(tokio::spawn(record_missing_pods(
        preparer.clone(),
        client.clone(),
        config.driver_name.clone(),
        stop_receiver.clone(),
    )));
    background.push(tokio::spawn(quota_watch::run(
        watched_requests(preparer.clone()),
        quota,
        quota_watch::Settings {
            events: config.quota_events,
            interval: Duration::from_secs(config.quota_event_interval_secs),
            source: config.api_server(),
            node: config.node().to_string(),
            remedy: DRA_REMEDY,
            reporter: config.driver_name.clone(),
        },
        stop_receiver.clone(),
    )));
    background.push(tokio::spawn(host_pid_loop(
        preparer.clone(),
        config.host_proc.clone(),
        stop_receiver.clone(),
    )));
    background.push(tokio::spawn(coordination::run(
        node.state_dir.clone(),
        config.nvml_library.clone(),
        config.host_proc.clone(),
        prepared_folders(preparer.clone()),
        stop_receiver.clone(),
    )));
    let interval = Duration::from_secs(config.health_interval_secs);
    background.spawn_thread("vgpu-dra-health", move |stop| {
        health_loop(source, cards, details, interval, publish, &stop)
    })?;
    let sockets = [config.dra_socket(), config.registration_socket()];
    wait_for_sockets(&sockets).await;
    Ok(DraHandle {
        preparer,
        registration,
        cards: devices,
        background,
        sockets,
        metrics_address,
    })
}
