//! The daemon's life: discover cards, refuse to start beside another plugin serving
//! our resource names ([`crate::coexist`]), load the state, serve one socket per
//! resource in the device-plugin folder and Register each (serving before
//! registering), watch that folder (kubelet deletes plugin sockets when it restarts:
//! the socket is re-created and registered again; a new kubelet.sock also triggers
//! re-registration; inotify wakes the watch at once, the tick is the fallback, because
//! kubelet rejects a pod that asks for our resources before we registered again),
//! probe health, collect garbage, follow every usage region once a
//! second (host PIDs, running totals; refusals and Events: [`vgpu_node_agent::quota_watch`]),
//! serve metrics and `/healthz`, and on stop
//! remove the sockets.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::allocator::{Allocator, HolderIndex};
use crate::coexist;
use crate::ids::Kind;
use crate::kubelet;
use crate::metrics;
use crate::service::{ResourceService, Shared, now_unix};
use crate::usage::UsageTotals;
use vgpu_kubelet_api::deviceplugin::device_plugin_server::DevicePluginServer;
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::container;
use vgpu_node_agent::coordination;
use vgpu_node_agent::devices::{DeviceSource, watch_health};
use vgpu_node_agent::folder_watch::FolderWatch;
use vgpu_node_agent::health::ServingStatus;
use vgpu_node_agent::http;
use vgpu_node_agent::persist::{self, Versioned};
use vgpu_node_agent::serve::{ServedSocket, socket_inode, wait_for_sockets};
use vgpu_node_agent::state::PluginState;
use vgpu_node_agent::tasks::Background;

/// A running plugin.
pub struct PluginHandle {
    shared: Arc<Shared>,
    usage: Arc<UsageTotals>,
    status: Arc<ServingStatus>,
    background: Background,
    metrics_address: Option<SocketAddr>,
    sockets: Vec<PathBuf>,
}

impl PluginHandle {
    /// The shared book (tests and metrics read it).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The running totals of the containers' counters.
    pub fn usage(&self) -> &Arc<UsageTotals> {
        &self.usage
    }

    /// What `/healthz` answers.
    pub fn serving_status(&self) -> &Arc<ServingStatus> {
        &self.status
    }

    /// Where metrics are served, once bound (port 0 in the config picks a free one).
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_address
    }

    /// Socket paths of the two resources (core first).
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }

    /// Stops serving, removes the sockets and waits for the background work.
    pub async fn stop(mut self) {
        self.background.stop().await;
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
        if let Err(err) = self.usage.save(true) {
            tracing::warn!(error = %err, "cannot keep the usage totals");
        }
        tracing::info!("stopped");
    }
}

/// Serves the DevicePlugin service of one resource on `path`; its ListAndWatch streams
/// end when the server stops.
fn serve_resource(
    shared: &Arc<Shared>,
    kind: Kind,
    path: &std::path::Path,
) -> anyhow::Result<ServedSocket> {
    ServedSocket::serve(path, |stop| {
        tonic::transport::Server::builder().add_service(DevicePluginServer::new(ResourceService {
            kind,
            shared: shared.clone(),
            stop,
        }))
    })
}

/// The first wait before a failed registration is tried again; it doubles up to the
/// tick.
const RETRY_FIRST: Duration = Duration::from_millis(50);

/// Keeps both resources served and registered until `stop`: a pass each tick, and at
/// once when the device-plugin folder changes ([`FolderWatch`]).
async fn supervise(
    shared: Arc<Shared>,
    resources: Vec<(Kind, String, PathBuf)>,
    status: Arc<ServingStatus>,
    mut stop: watch::Receiver<bool>,
) {
    let config = shared.config.clone();
    let kubelet_socket = config.kubelet_socket_path();
    let tick = Duration::from_millis(config.kubelet_watch_interval_ms);
    // Kubelet.sock and both plugin sockets live in this folder: a restarting kubelet's
    // deletions and its new kubelet.sock wake the loop at once.
    let mut folder = FolderWatch::new(&config.device_plugin_dir);
    let mut retry = RETRY_FIRST;
    let mut servers: Vec<Option<ServedSocket>> = resources.iter().map(|_| None).collect();
    let mut registered = vec![false; resources.len()];
    let mut kubelet_inode = None;
    loop {
        folder.arm();
        let inode_now = socket_inode(&kubelet_socket);
        if inode_now != kubelet_inode {
            if inode_now.is_some() {
                tracing::info!(socket = %kubelet_socket.display(), "kubelet socket appeared or changed; registering");
            }
            registered.iter_mut().for_each(|flag| *flag = false);
            kubelet_inode = inode_now;
        }
        for (slot, (kind, resource, path)) in resources.iter().enumerate() {
            let alive = servers[slot]
                .as_ref()
                .is_some_and(|server| server.is_serving(path));
            if !alive {
                if let Some(old) = servers[slot].take() {
                    tracing::info!(socket = %path.display(), "plugin socket removed (kubelet restart?); serving again");
                    old.stop().await;
                }
                match serve_resource(&shared, *kind, path) {
                    Ok(server) => servers[slot] = Some(server),
                    Err(err) => tracing::error!(error = %err, "cannot serve"),
                }
                registered[slot] = false;
            }
            if servers[slot].is_some() && !registered[slot] && kubelet_inode.is_some() {
                let endpoint = NodeConfig::endpoint_name(resource);
                match kubelet::register(&kubelet_socket, &endpoint, resource).await {
                    Ok(()) => {
                        registered[slot] = true;
                        shared
                            .counters
                            .registrations
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::info!(resource = %resource, endpoint = %endpoint, "registered with kubelet");
                    }
                    Err(err) => {
                        tracing::warn!(resource = %resource, error = %err, "registration failed; will retry")
                    }
                }
            }
        }
        let states: Vec<(bool, bool)> = servers
            .iter()
            .zip(&registered)
            .map(|(server, registered)| {
                (
                    server.as_ref().is_some_and(ServedSocket::is_running),
                    *registered,
                )
            })
            .collect();
        status.record_pass(&states);
        // A registration that failed (kubelet.sock bound but not yet listening, a
        // kubelet still starting) is tried again soon, backing off to the tick.
        let unregistered = kubelet_inode.is_some()
            && servers
                .iter()
                .zip(&registered)
                .any(|(server, registered)| server.is_some() && !registered);
        let wait = if unregistered {
            let wait = retry.min(tick);
            retry = (retry * 2).min(tick);
            wait
        } else {
            retry = RETRY_FIRST;
            tick
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = folder.changed() => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
    for server in servers.into_iter().flatten() {
        server.stop().await;
    }
}

/// One garbage-collection pass; returns how many allocations were collected.
pub async fn collect_garbage(shared: &Shared) -> anyhow::Result<usize> {
    let config = &shared.config;
    let pods = kubelet::list_pod_resources(&config.pod_resources_socket).await?;
    let holders = HolderIndex::from_list(&pods, &config.core_resource, &config.memory_resource);
    let removed = shared.allocator().collect_garbage(&holders, now_unix())?;
    for record in &removed {
        tracing::info!(allocation = %record.id, owner = ?record.owner, "collected allocation of a container that is gone");
        container::remove_allocation(config, record);
    }
    let known: Vec<String> = shared.allocator().state().folder_ids();
    for orphan in container::orphan_dirs(config, &known, Duration::from_secs(config.gc_grace_secs))
    {
        tracing::info!(dir = %orphan.display(), "removing allocation folder unknown to the state");
        let _ = std::fs::remove_dir_all(&orphan);
    }
    container::remove_orphan_specs(config, &known);
    shared
        .counters
        .collected
        .fetch_add(removed.len() as u64, Ordering::Relaxed);
    Ok(removed.len())
}

async fn garbage_loop(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_secs(shared.config.gc_interval_secs);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        if let Err(err) = collect_garbage(&shared).await {
            tracing::warn!(error = %err, "garbage collection skipped");
        }
    }
}

/// Every second, reads every usage region (a private copy each): fills in the host
/// PIDs of container processes (their slots know only the PID inside the container's
/// PID namespace), so that NVML inside the container, which reports host PIDs, can list
/// the container's processes; and folds the processes' counters into the running
/// totals, so a process that exits between two scrapes still counts.
async fn region_loop(
    shared: Arc<Shared>,
    usage: Arc<UsageTotals>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        // Copied under the lock; the files are read after it is released.
        let allocations: Vec<(String, usize)> = shared
            .allocator()
            .state()
            .allocations
            .values()
            .map(|record| (record.id.clone(), record.cards.len()))
            .collect();
        let config = shared.config.clone();
        let usage = usage.clone();
        let filled = tokio::task::spawn_blocking(move || {
            let mut filled = 0;
            for (id, devices) in &allocations {
                let path = container::allocation_dir(&config, id).join("usage.region");
                let Some((snapshot, _, _)) = usage.observe_region(id, &path, *devices) else {
                    continue;
                };
                filled += snapshot.fill_host_pids(&config.host_proc);
            }
            let known: Vec<String> = allocations.into_iter().map(|(id, _)| id).collect();
            usage.retain(&known);
            if let Err(err) = usage.save(false) {
                tracing::warn!(error = %err, "cannot keep the usage totals");
            }
            filled
        })
        .await
        .unwrap_or(0);
        if filled > 0 {
            tracing::debug!(filled, "mapped container PIDs to host PIDs");
        }
    }
}

/// Probes the cards and feeds what it finds to the ListAndWatch streams.
fn health_loop(shared: Arc<Shared>, source: Arc<dyn DeviceSource>, stop: &AtomicBool) {
    let interval = Duration::from_secs(shared.config.health_interval_secs);
    let uuids: Vec<String> = shared
        .allocator()
        .cards()
        .iter()
        .map(|card| card.uuid.clone())
        .collect();
    watch_health(&*source, &uuids, interval, stop, |health| {
        for (uuid, health) in health {
            shared.set_health(&uuid, health);
        }
    });
}

/// The folders of the containers that passed PreStartContainer (their config holds the
/// quota), for the compute coordinator.
fn prepared_folders(shared: Arc<Shared>) -> coordination::Folders {
    Arc::new(move || {
        shared
            .allocator()
            .state()
            .allocations
            .values()
            .filter(|record| record.prepared_unix.is_some())
            .map(|record| container::allocation_dir(&shared.config, &record.id))
            .collect()
    })
}

/// Starts the plugin: returns once both resources are served (registration proceeds
/// in the background and is retried until kubelet accepts it).
pub async fn start(
    config: NodeConfig,
    source: Arc<dyn DeviceSource>,
) -> anyhow::Result<PluginHandle> {
    let cards = source.discover()?;
    if cards.is_empty() {
        tracing::warn!("no GPUs found: advertising no devices");
    }
    // The card views' folder is every container's mount source: it exists before
    // the first Allocate.
    persist::create_folders([
        &config.state_dir,
        &config.allocations_dir(),
        &config.containers_dir(),
        &coordination::cards_dir(&config.state_dir),
        &config.device_plugin_dir,
    ])?;
    if config.check_foreign_plugins {
        let foreign = coexist::foreign_plugins(&config).await;
        if !foreign.is_empty() {
            let lines: Vec<String> = foreign.iter().map(coexist::Foreign::refusal).collect();
            anyhow::bail!("{}", lines.join("; "));
        }
    }
    let state = PluginState::load(&config.state_file())?;
    let (mps, source) = vgpu_node_agent::mps::start_with_source(&config, &cards, source)?;
    tracing::info!(
        cards = cards.len(),
        allocations = state.allocations.len(),
        "starting"
    );
    let allocator = Allocator::new(config.clone(), cards.clone(), state);
    let shared = Shared::new(allocator);
    for card in &cards {
        shared.set_health(&card.uuid, source.probe(&card.uuid));
    }
    let (stop, stop_receiver) = watch::channel(false);
    let resources = vec![
        (
            Kind::Core,
            config.core_resource.clone(),
            config
                .device_plugin_dir
                .join(NodeConfig::endpoint_name(&config.core_resource)),
        ),
        (
            Kind::Memory,
            config.memory_resource.clone(),
            config
                .device_plugin_dir
                .join(NodeConfig::endpoint_name(&config.memory_resource)),
        ),
    ];
    let sockets: Vec<PathBuf> = resources.iter().map(|(_, _, path)| path.clone()).collect();
    let names: Vec<String> = resources.iter().map(|(_, name, _)| name.clone()).collect();
    let status = Arc::new(ServingStatus::new(
        &names,
        Duration::from_millis(config.kubelet_watch_interval_ms),
    ));
    let usage = Arc::new(UsageTotals::load(&config.state_dir));
    let mut background = Background::new(stop);
    if let Some(supervisor) = mps {
        background.push(tokio::spawn(vgpu_node_agent::mps::stop_with(
            supervisor,
            stop_receiver.clone(),
        )));
    }
    let metrics_address = match config.metrics_address {
        Some(address) => {
            let sources = metrics::Sources {
                shared: shared.clone(),
                usage: usage.clone(),
                status: status.clone(),
            };
            let (bound, task) =
                http::bind_and_serve(address, metrics::handler(sources), stop_receiver.clone())
                    .await?;
            background.push(task);
            Some(bound)
        }
        None => None,
    };
    // Serve before anything registers: each supervisor pass binds a socket before it
    // calls Register for it.
    background.push(tokio::spawn(supervise(
        shared.clone(),
        resources,
        status.clone(),
        stop_receiver.clone(),
    )));
    background.push(tokio::spawn(garbage_loop(
        shared.clone(),
        stop_receiver.clone(),
    )));
    background.push(tokio::spawn(region_loop(
        shared.clone(),
        usage.clone(),
        stop_receiver.clone(),
    )));
    {
        let shared_list = shared.clone();
        background.push(tokio::spawn(vgpu_node_agent::quota_watch::run(
            Arc::new(move || plugin_containers(&shared_list)),
            shared.quota.clone(),
            vgpu_node_agent::quota_watch::Settings::of(&config),
            stop_receiver.clone(),
        )));
    }
    background.push(tokio::spawn(coordination::run(
        config.state_dir.clone(),
        config.nvml_library.clone(),
        config.host_proc.clone(),
        prepared_folders(shared.clone()),
        stop_receiver.clone(),
    )));
    {
        let shared = shared.clone();
        background.spawn_thread("vgpu-health", move |stop| {
            health_loop(shared, source, &stop)
        })?;
    }
    wait_for_sockets(&sockets).await;
    Ok(PluginHandle {
        shared,
        usage,
        status,
        background,
        metrics_address,
        sockets,
    })
}

/// The containers of the device plugin that passed PreStart and have an owner.
fn plugin_containers(shared: &Shared) -> Vec<vgpu_node_agent::quota_watch::Watched> {
    let allocator = shared.allocator();
    allocator
        .state()
        .allocations
        .values()
        .filter(|record| record.prepared_unix.is_some())
        .filter_map(|record| {
            let owner = record.owner.as_ref()?;
            Some(vgpu_node_agent::quota_watch::Watched {
                id: record.id.clone(),
                dir: vgpu_node_agent::container::allocation_dir(&shared.config, &record.id),
                namespace: owner.namespace.clone(),
                pod: owner.pod.clone(),
                pod_uid: None,
                container: owner.container.clone(),
                cards: record.cards.clone(),
            })
        })
        .collect()
}
