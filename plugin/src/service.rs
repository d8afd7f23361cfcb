//! The DevicePlugin gRPC service of one resource (cores or memory). Both share one
//! [`Shared`]: the allocator behind a mutex, the health generation and the counters.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::admitting::Admitting;
use crate::allocator::{Allocator, HolderIndex};
use crate::ids::Kind;
use crate::kubelet;
use vgpu_kubelet_api::deviceplugin::device_plugin_server::DevicePlugin;
use vgpu_kubelet_api::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, DevicePluginOptions,
    Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::container;

/// Counters exported as metrics.
#[derive(Default)]
pub(crate) struct Counters {
    pub allocations: AtomicU64,
    pub refusals: AtomicU64,
    pub prestarts: AtomicU64,
    pub collected: AtomicU64,
    pub registrations: AtomicU64,
}

/// State shared by both services, the health watcher, GC and metrics.
pub struct Shared {
    pub(crate) config: NodeConfig,
    allocator: Mutex<Allocator>,
    /// Bumped whenever a card's health changes.
    pub(crate) health: watch::Sender<u64>,
    pub(crate) counters: Counters,
    /// The pods' `tencent.com/vcuda-core-limit`, read at PreStart.
    pub(crate) ceilings: crate::annotations::PodCeilings,
    /// The running totals of the containers' quota counters (refusals, throttling).
    pub quota: Arc<vgpu_node_agent::quota_watch::QuotaTotals>,
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |age| age.as_secs())
}

impl Shared {
    pub(crate) fn new(allocator: Allocator) -> Arc<Shared> {
        let config = allocator.config().clone();
        Arc::new(Shared {
            allocator: Mutex::new(allocator),
            health: watch::Sender::new(0),
            counters: Counters::default(),
            ceilings: crate::annotations::PodCeilings::new(&config),
            quota: Arc::default(),
            config,
        })
    }

    /// The allocator; a poisoned lock is taken over (the book stays consistent because
    /// every change is saved before a call returns).
    pub fn allocator(&self) -> MutexGuard<'_, Allocator> {
        self.allocator
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies a probe result and wakes ListAndWatch streams when health changed.
    pub fn set_health(&self, uuid: &str, health: Result<(), String>) {
        let reason = health.as_ref().err().cloned();
        if self.allocator().set_health(uuid, health) {
            match reason {
                Some(reason) => tracing::warn!(card = uuid, %reason, "card unhealthy"),
                None => tracing::info!(card = uuid, "card healthy again"),
            }
            self.health.send_modify(|generation| *generation += 1);
        }
    }

    /// The container kubelet is admitting (`crate::admitting`), when it can be told.
    async fn admitting(&self, holders: Option<&HolderIndex>) -> Option<Admitting> {
        let holders = holders?;
        let pods = self.ceilings.pods_on_node().await?;
        crate::admitting::admitting(
            &pods,
            holders,
            &self.config.core_resource,
            &self.config.memory_resource,
        )
    }

    /// Releases the records among `records` that no container PodResources lists can
    /// be using and that are not being admitted (a pod that is gone); removes their
    /// folders.
    fn release_gone(&self, records: &[String], holders: &HolderIndex) -> Result<(), Status> {
        let released = {
            let mut allocator = self.allocator();
            allocator
                .release_colliding(records, holders, now_unix())
                .map_err(|err| Status::internal(err.to_string()))?
        };
        for record in &released {
            tracing::info!(allocation = %record.id, "released the allocation of a pod that is gone: kubelet offers its devices again");
            container::remove_allocation(&self.config, record);
        }
        Ok(())
    }

    /// Releases every record kubelet has released (a pod it rejected after an Allocate,
    /// or deleted before it started: [`Allocator::release_released`]); removes their
    /// folders. Called with each fresh PodResources list, before any pick or booking.
    fn release_released(&self, holders: &HolderIndex) -> Result<(), Status> {
        let released = self
            .allocator()
            .release_released(holders)
            .map_err(|err| Status::internal(err.to_string()))?;
        for record in &released {
            tracing::info!(allocation = %record.id, pod = ?record.admitted_for, "released the allocation of a pod kubelet no longer lists (rejected or deleted before it started)");
            container::remove_allocation(&self.config, record);
        }
        Ok(())
    }

    async fn holders(&self) -> Result<HolderIndex, Status> {
        let pods = kubelet::list_pod_resources(&self.config.pod_resources_socket)
            .await
            .map_err(|err| Status::unavailable(err.to_string()))?;
        Ok(HolderIndex::from_list(
            &pods,
            &self.config.core_resource,
            &self.config.memory_resource,
        ))
    }
}

/// The DevicePlugin service of one resource.
pub(crate) struct ResourceService {
    pub kind: Kind,
    pub shared: Arc<Shared>,
    /// Ends ListAndWatch streams when the server stops.
    pub stop: watch::Receiver<bool>,
}

impl ResourceService {
    fn refuse(&self, status: Status) -> Status {
        self.shared
            .counters
            .refusals
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(kind = ?self.kind, code = ?status.code(), message = status.message(), "request refused");
        status
    }

    /// Allocate for one container request: its response and the record made.
    async fn allocate_one(
        &self,
        ids: &[String],
    ) -> Result<
        (
            vgpu_kubelet_api::deviceplugin::ContainerAllocateResponse,
            vgpu_node_agent::state::AllocationRecord,
        ),
        Status,
    > {
        let shared = &self.shared;
        let listed = shared.holders().await;
        if let Ok(listed) = &listed {
            shared.release_released(listed)?;
        }
        // A shape that cannot work is refused before the container is admitted.
        let admitting = match &listed {
            Ok(listed) => shared.admitting(Some(listed)).await,
            Err(_) => None,
        };
        if let Some(container) = &admitting {
            let name = format!(
                "{}/{}/{}",
                container.owner.namespace, container.owner.pod, container.owner.container
            );
            if let Some(refusal) =
                shared
                    .allocator()
                    .unsupported_shape(&name, container.cores, container.memory)
            {
                return Err(Status::invalid_argument(refusal));
            }
        }
        if let Ok(listed) = &listed {
            shared
                .allocator()
                .check_second_half(self.kind, ids, listed, now_unix())?;
        }
        let blockers = shared.allocator().blockers(self.kind, ids, now_unix());
        let mut holders = None;
        if !blockers.is_empty() {
            // Kubelet hands out only IDs it holds free: release our records of them that
            // PodResources no longer lists (a pod that is gone).
            match listed {
                Ok(listed) => {
                    shared.release_gone(&blockers, &listed)?;
                    holders = Some(listed);
                }
                Err(status) => tracing::warn!(
                    error = status.message(),
                    "PodResources unavailable; keeping existing allocations"
                ),
            }
        }
        let now = now_unix();
        let (decision, cards) = {
            let mut allocator = shared.allocator();
            let decision = allocator.allocate_for(
                self.kind,
                ids,
                holders.as_ref(),
                admitting.as_ref().map(|container| &container.owner),
                now,
            )?;
            let cards: Vec<_> = allocator
                .cards()
                .iter()
                .filter(|card| decision.record.cards.contains(&card.uuid))
                .cloned()
                .collect();
            (decision, cards)
        };
        let record = &decision.record;
        let card_refs: Vec<_> = cards.iter().collect();
        let mut edits = container::container_edits(&shared.config, record, &card_refs);
        vgpu_node_agent::mps::add_allocation_edits(&shared.config, record, &card_refs, &mut edits);
        let written = container::create_allocation_dir(&shared.config, record).and_then(|_| {
            if shared.config.device_list_strategy.cdi() {
                container::write_cdi_spec(&shared.config, record, &edits).map(Some)
            } else {
                Ok(None)
            }
        });
        let cdi_name = match written {
            Ok(name) => name,
            Err(err) => {
                shared.allocator().forget(&record.id);
                container::remove_allocation(&shared.config, record);
                return Err(Status::internal(err.to_string()));
            }
        };
        tracing::info!(
            kind = ?self.kind, allocation = %record.id, cards = ?record.cards,
            count = ids.len(), reuses = ?record.reuses, cdi = ?cdi_name, "allocated"
        );
        shared.counters.allocations.fetch_add(1, Ordering::Relaxed);
        Ok((
            crate::response::allocate_response(&shared.config, record, &edits, cdi_name),
            record.clone(),
        ))
    }
}

type DeviceStream =
    Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for ResourceService {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<DeviceStream>, Status> {
        let (sender, receiver) = mpsc::channel(4);
        let shared = self.shared.clone();
        let kind = self.kind;
        let mut health = shared.health.subscribe();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let devices = shared.allocator().devices(kind);
                if sender
                    .send(Ok(ListAndWatchResponse { devices }))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::select! {
                    changed = health.changed() => if changed.is_err() { return },
                    _ = stop.wait_for(|stopped| *stopped) => return,
                    _ = sender.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let request = request.into_inner();
        // Which call's card the second half should follow: PodResources tells (a
        // failure only makes the guess coarser), with this node's pods the container.
        let holders = self.shared.holders().await.ok();
        let admitting = self.shared.admitting(holders.as_ref()).await;
        if let Some(holders) = &holders {
            self.shared.release_released(holders)?;
            // A deleted pod's share is free at once: kubelet offers its IDs again.
            let offered: Vec<String> = request
                .container_requests
                .iter()
                .flat_map(|wanted| wanted.available_device_i_ds.iter().cloned())
                .collect();
            let records = self.shared.allocator().holding_any(&offered);
            self.shared.release_gone(&records, holders)?;
        }
        let now = now_unix();
        let allocator = self.shared.allocator();
        let container_responses = request
            .container_requests
            .iter()
            .map(|wanted| ContainerPreferredAllocationResponse {
                device_i_ds: allocator.preferred_for(
                    self.kind,
                    &wanted.available_device_i_ds,
                    &wanted.must_include_device_i_ds,
                    usize::try_from(wanted.allocation_size).unwrap_or(0),
                    holders.as_ref(),
                    admitting.as_ref(),
                    now,
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        // One call, one answer: when a request fails, the records made for the ones
        // before it in this call are undone (kubelet books none of them).
        let mut container_responses = Vec::new();
        let mut made = Vec::new();
        for wanted in request.into_inner().container_requests {
            match self.allocate_one(&wanted.devices_ids).await {
                Ok((response, record)) => {
                    container_responses.push(response);
                    made.push(record);
                }
                Err(status) => {
                    for record in &made {
                        self.shared.allocator().forget(&record.id);
                        container::remove_allocation(&self.shared.config, record);
                        tracing::info!(allocation = %record.id, "undone: a later request of the same Allocate call failed");
                    }
                    return Err(self.refuse(status));
                }
            }
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        let ids = request.into_inner().devices_ids;
        let holders = self
            .shared
            .holders()
            .await
            .map_err(|status| self.refuse(status))?;
        let (released, planned) = {
            let mut allocator = self.shared.allocator();
            let released = allocator
                .release_leftovers(self.kind, &ids, &holders)
                .map_err(|err| self.refuse(Status::internal(err.to_string())))?;
            (released, allocator.plan_prestart(self.kind, &ids, &holders))
        };
        for record in &released {
            tracing::info!(allocation = %record.id, "released the leftover of a pod kubelet rejected: its devices are this container's now");
            container::remove_allocation(&self.shared.config, record);
        }
        let mut plans = planned.map_err(|status| self.refuse(status))?;
        self.shared.ceilings.apply(&mut plans).await;
        let cards = self.shared.allocator().cards().to_vec();
        for plan in &mut plans {
            vgpu_node_agent::mps::leave_compute_to_mps(
                &self.shared.config,
                &cards,
                &mut plan.devices,
            );
        }
        for plan in &plans {
            let dir =
                crate::response::write_prestart(&self.shared.config, plan).map_err(|err| {
                    self.refuse(Status::internal(format!(
                        "cannot write the container config: {err}"
                    )))
                })?;
            tracing::info!(
                allocation = %plan.allocation_id, aliases = ?plan.alias_ids, owner = ?plan.owner,
                dir = %dir.display(), "container config written"
            );
        }
        self.shared
            .allocator()
            .commit_prestart(&plans, now_unix())
            .map_err(|err| self.refuse(Status::internal(err.to_string())))?;
        self.shared
            .counters
            .prestarts
            .fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
