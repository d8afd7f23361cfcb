//! The device plugin's (and the DRA driver's) hooks for the MPS sharing mode
//! ([`vgpu_mps`]): which cards are in MPS mode, their daemons' supervisor, the health
//! probe that turns a card unhealthy while its daemon is down (a CUDA process that cannot
//! reach the daemon silently runs without MPS, uncapped), the container edits that make
//! a container a client of its card's daemon, and the quota change that leaves compute
//! to MPS unless `mps.compute_limiter` is set.
//!
//! Which containers become clients: one whose allocation is on exactly one MPS card.
//! A multi-card (whole cards) container is not (one MPS daemon serves one card here),
//! and runs time-sliced beside the card's MPS server; docs/mps.md says so.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use vgpu_contract::DeviceQuota;
use vgpu_mps::daemon::{CardStates, DaemonOptions};
use vgpu_mps::{CardDaemon, CardDirs, ClientShare, Sharing, SharingConfig, Supervisor};

use crate::cdi::{ContainerEdits, Mount as CdiMount};
use crate::config::NodeConfig;
use crate::devices::{CardInfo, DeviceSource};

/// The control binary's name.
pub const CONTROL_BINARY: &str = "nvidia-cuda-mps-control";

/// The per-card folders' root: `mps.root`, else `<state_dir>/mps`.
pub fn root(config: &NodeConfig) -> PathBuf {
    config
        .mps
        .root
        .clone()
        .unwrap_or_else(|| config.state_dir.join("mps"))
}

/// Whether `card` is in MPS mode.
pub fn is_mps(sharing: &SharingConfig, card: &CardInfo) -> bool {
    sharing.of(&card.uuid, card.index) == Sharing::Mps
}

/// The control binary: `mps.control`, else the prepared driver's `bin/`, else the first
/// on `PATH`, else the bare name (the start then fails with a clear error).
pub fn control_binary(config: &NodeConfig) -> PathBuf {
    if let Some(control) = &config.mps.control {
        return control.clone();
    }
    let prepared = vgpu_ldconfig::versions::prepared_dir(&config.host_driver_dir)
        .join("bin")
        .join(CONTROL_BINARY);
    if prepared.is_file() {
        return prepared;
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(CONTROL_BINARY))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from(CONTROL_BINARY))
}

/// Starts the daemons of the MPS cards among `cards`; `None` when there are none.
pub fn start_daemons(
    config: &NodeConfig,
    cards: &[CardInfo],
) -> anyhow::Result<Option<Supervisor>> {
    let sharing = &config.sharing_config();
    let present: Vec<(String, u32)> = cards.iter().map(|c| (c.uuid.clone(), c.index)).collect();
    for key in sharing.unknown_cards(&present) {
        tracing::warn!(key, "card_sharing names no card of this node");
    }
    let mps_cards: Vec<&CardInfo> = cards.iter().filter(|c| is_mps(sharing, c)).collect();
    if mps_cards.is_empty() {
        return Ok(None);
    }
    let mut options = DaemonOptions::new(control_binary(config));
    options.multiuser = sharing.mps.multiuser;
    let libraries = vgpu_ldconfig::versions::prepared_dir(&config.host_driver_dir).join("lib64");
    if libraries.is_dir() {
        options.library_path = Some(libraries);
    }
    let root = root(config);
    let daemons = mps_cards
        .iter()
        .map(|card| {
            CardDaemon::new(
                &card.uuid,
                CardDirs::new(&root, &card.uuid),
                options.clone(),
            )
        })
        .collect();
    tracing::info!(cards = mps_cards.len(), control = %options.control.display(), root = %root.display(), "sharing: mps");
    let supervisor = Supervisor::start(
        daemons,
        Duration::from_millis(sharing.mps.health_interval_ms),
    )?;
    Ok(Some(supervisor))
}

/// What both daemons start with: the MPS daemons of `cards` ([`start_daemons`]), and
/// `source` as the daemon then probes it, wrapped in [`MpsAwareSource`] when any MPS
/// daemon runs (a card whose MPS daemon is down probes unhealthy), as it was otherwise.
pub fn start_with_source(
    config: &NodeConfig,
    cards: &[CardInfo],
    source: Arc<dyn DeviceSource>,
) -> anyhow::Result<(Option<Supervisor>, Arc<dyn DeviceSource>)> {
    let supervisor = start_daemons(config, cards)?;
    let source: Arc<dyn DeviceSource> = match &supervisor {
        Some(supervisor) => Arc::new(MpsAwareSource::new(source, supervisor.states())),
        None => source,
    };
    Ok((supervisor, source))
}

/// A device source whose probe also fails while the card's MPS daemon is down.
pub struct MpsAwareSource {
    inner: Arc<dyn DeviceSource>,
    states: CardStates,
}

impl MpsAwareSource {
    /// `inner`, with the daemons' `states` on top.
    pub fn new(inner: Arc<dyn DeviceSource>, states: CardStates) -> MpsAwareSource {
        MpsAwareSource { inner, states }
    }
}

impl DeviceSource for MpsAwareSource {
    fn discover(&self) -> anyhow::Result<Vec<CardInfo>> {
        self.inner.discover()
    }

    fn probe(&self, uuid: &str) -> Result<(), String> {
        self.inner.probe(uuid)?;
        match self.states.lock() {
            Ok(states) => states.get(uuid).cloned().unwrap_or(Ok(())),
            Err(_) => Ok(()),
        }
    }

    fn wait_critical(&self, timeout: Duration) -> Vec<(String, String)> {
        self.inner.wait_critical(timeout)
    }
}

/// The MPS card of an allocation on `cards`: the card, when it is exactly one and in
/// MPS mode.
pub fn client_card<'a>(config: &NodeConfig, cards: &[&'a CardInfo]) -> Option<&'a CardInfo> {
    match cards {
        [card] if is_mps(&config.sharing_config(), card) => Some(card),
        _ => None,
    }
}

/// Adds what connects a container to `card`'s daemon to `edits`: the pipe and shm
/// mounts, `CUDA_MPS_PIPE_DIRECTORY`, and the env of `share` (the thread percentage
/// when `share.cores` is given or `whole` is set, the memory limit when
/// `share.memory` is given). `connect: false` adds the share's env only (the device
/// plugin's memory answer: the container's core answer connects it).
pub fn add_client_edits(
    config: &NodeConfig,
    card: &CardInfo,
    share: ClientShare,
    connect: bool,
    edits: &mut ContainerEdits,
) {
    let dirs = CardDirs::new(&root(config), &card.uuid);
    let mut env = edits.env_map();
    if connect {
        for mount in vgpu_mps::client::mounts(&dirs.pipe, &dirs.shm) {
            edits.mounts.push(CdiMount::bind(
                &mount.host,
                &mount.container,
                mount.read_only,
            ));
        }
        env.extend([vgpu_mps::client::pipe_env(
            vgpu_mps::client::CONTAINER_PIPE_DIR,
        )]);
        env.extend([vgpu_mps::client::thread_percentage_env(
            share.cores.unwrap_or(100),
        )]);
    }
    if let Some(bytes) = share.memory {
        env.extend([vgpu_mps::client::pinned_memory_env(bytes)]);
    }
    edits.set_env(&env);
}

/// Leaves compute to MPS: on MPS cards, unless `mps.compute_limiter` is set, a quota
/// loses its core limit (and soft ceiling), so the shims' limiter stays out of the way;
/// the memory quota and the NVML view stay.
pub fn leave_compute_to_mps(config: &NodeConfig, cards: &[CardInfo], quotas: &mut [DeviceQuota]) {
    if config.mps.compute_limiter {
        return;
    }
    let sharing = config.sharing_config();
    for quota in quotas {
        let card = cards.iter().find(|card| {
            quota.uuid.as_deref() == Some(card.uuid.as_str()) || quota.index == Some(card.index)
        });
        if card.is_some_and(|card| is_mps(&sharing, card)) {
            quota.core_limit = None;
            quota.core_ceiling = None;
            quota.core_mode = vgpu_contract::CoreMode::Hard;
        }
    }
}

/// The pipe folder of `uuid` (tests and docs).
pub fn pipe_dir(config: &NodeConfig, uuid: &str) -> PathBuf {
    CardDirs::new(&root(config), uuid).pipe
}

/// The MPS edits of one Allocate call's `record` on `cards`: its core answer connects the
/// container to the card's daemon at its cores' thread percentage; its memory answer
/// adds the memory limit (kubelet merges both answers' env into the container).
pub fn add_allocation_edits(
    config: &NodeConfig,
    record: &crate::state::AllocationRecord,
    cards: &[&CardInfo],
    edits: &mut ContainerEdits,
) {
    let Some(card) = client_card(config, cards) else {
        return;
    };
    if !record.core_ids.is_empty() {
        let cores = u32::try_from(record.core_ids.len()).unwrap_or(100).min(100);
        let share = ClientShare {
            cores: Some(cores),
            memory: None,
        };
        add_client_edits(config, card, share, true, edits);
    }
    if !record.memory_ids.is_empty() {
        let units = record.memory_ids.len() as u64;
        let share = ClientShare {
            cores: None,
            memory: Some(config.memory_unit.bytes().saturating_mul(units)),
        };
        add_client_edits(config, card, share, false, edits);
    }
}

/// Stops `supervisor` (its daemons) once `stop` turns true.
pub async fn stop_with(mut supervisor: Supervisor, mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
    let _ = tokio::task::spawn_blocking(move || supervisor.stop()).await;
}
