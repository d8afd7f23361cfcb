//! NodePrepareResources and NodeUnprepareResources for one claim.
//!
//! Preparing reads the claim (this driver's results and their consumed `cores` and
//! `memory`; the pods it is reserved for, for `tencent.com/vcuda-core-limit`, kept in
//! the checkpoint as whose Events the quota watch writes), and for
//! each request of the claim writes what the device plugin writes for a container:
//! `<state_dir>/allocations/<container_id>/vgpu.yaml` and `usage.region`, and a CDI
//! spec with exactly the mounts, device nodes and env of the device plugin's Allocate
//! response (built by the same code, `vgpu_node_agent::container::allocate_response`).
//! `container_id` is `<claim uid>-<request>` (contract 3). The answer is checkpointed
//! before it is returned; a claim already prepared gets the checkpointed answer again,
//! and unpreparing a claim nobody prepared still sweeps anything named after its UID.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use vgpu_contract::{ByteSize, Config, CoreMode, DeviceQuota};
use vgpu_kube::claims::{AllocatedShare, ClaimAllocation};
use vgpu_kube::pods::{CeilingLookup, PodReader, apply_ceiling};
use vgpu_kube::slices::{CORES_PER_CARD, device_name};
use vgpu_node_agent::cdi::SpecWriter;
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::container;
use vgpu_node_agent::devices::CardInfo;
use vgpu_node_agent::persist::{Versioned, write_atomically};
use vgpu_node_agent::state::AllocationRecord;

use crate::checkpoint::{Checkpoint, ClaimPod, PreparedClaim, PreparedDevice, PreparedRequest};
use crate::config::DraConfig;

/// What kubelet names in a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// `[A-Za-z0-9._-]`, anything else becomes `-` (a subrequest's `/` becomes `.`).
fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            '/' => '.',
            _ => '-',
        })
        .collect()
}

/// `<uid>-<request>`, at most 64 characters (longer ones keep their head and end in an
/// FNV-1a hash of the whole, so distinct requests stay distinct).
pub(crate) fn container_id(claim_uid: &str, request: &str) -> String {
    let id = format!("{}-{}", sanitize(claim_uid), sanitize(request));
    if id.len() <= 64 {
        return id;
    }
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{}-{:08x}", &id[..55], hash as u32)
}

/// The quota of one share: its consumed cores and memory; absent or 100 cores is the
/// card's whole compute, absent memory its whole memory. A ceiling makes a partial
/// share soft, never below its own cores (the device plugin's rule).
pub(crate) fn share_quota(
    card: &CardInfo,
    share: &AllocatedShare,
    ceiling: Option<u32>,
) -> DeviceQuota {
    let mut quota = DeviceQuota {
        uuid: Some(card.uuid.clone()),
        index: None,
        memory_limit: share.memory.filter(|bytes| *bytes > 0).map(ByteSize),
        core_limit: share
            .cores
            .filter(|cores| *cores < CORES_PER_CARD)
            .map(|cores| cores as u32),
        core_mode: CoreMode::Hard,
        core_ceiling: None,
    };
    if let Some(ceiling) = ceiling {
        apply_ceiling(&mut quota, ceiling);
    }
    quota
}

/// One request of a claim, ready to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RequestPlan {
    pub request: String,
    pub container_id: String,
    pub shares: Vec<AllocatedShare>,
    pub cards: Vec<CardInfo>,
    pub quotas: Vec<DeviceQuota>,
}

/// Groups this driver's shares by request and checks them against the node's cards.
pub(crate) fn plan_claim(
    allocation: &ClaimAllocation,
    node: &str,
    cards: &[CardInfo],
    ceiling: Option<u32>,
) -> Result<Vec<RequestPlan>, String> {
    if allocation.shares.is_empty() {
        return Err("the claim holds no device of this driver".into());
    }
    let mut plans: Vec<RequestPlan> = Vec::new();
    for share in &allocation.shares {
        if share.pool != node {
            return Err(format!(
                "request {}: device {} is in pool {}, this node is {node}",
                share.request, share.device, share.pool
            ));
        }
        let card = cards
            .iter()
            .find(|card| device_name(card.index) == share.device)
            .ok_or_else(|| {
                format!(
                    "request {}: this node has no device {}",
                    share.request, share.device
                )
            })?;
        let quota = share_quota(card, share, ceiling);
        match plans.iter_mut().find(|plan| plan.request == share.request) {
            Some(plan) => {
                if plan.cards.iter().any(|known| known.uuid == card.uuid) {
                    return Err(format!(
                        "request {} holds device {} twice",
                        share.request, share.device
                    ));
                }
                plan.shares.push(share.clone());
                plan.cards.push(card.clone());
                plan.quotas.push(quota);
            }
            None => plans.push(RequestPlan {
                request: share.request.clone(),
                container_id: container_id(&allocation.uid, &share.request),
                shares: vec![share.clone()],
                cards: vec![card.clone()],
                quotas: vec![quota],
            }),
        }
    }
    Ok(plans)
}

/// The soft ceiling of a claim's pods: the lowest any of them asks for; the default
/// when none does or none can be read.
pub(crate) async fn claim_ceiling(
    reader: Option<&PodReader>,
    allocation: &ClaimAllocation,
    default: Option<u32>,
) -> Option<u32> {
    let Some(reader) = reader else {
        return default;
    };
    let mut asked = Vec::new();
    for pod in &allocation.pods {
        let lookup = reader
            .core_ceiling(&allocation.namespace, &pod.name, Some(&pod.uid))
            .await;
        match &lookup {
            CeilingLookup::Set(value) => asked.push(*value),
            CeilingLookup::Unset => {}
            CeilingLookup::Invalid(why) | CeilingLookup::Unreachable(why) => tracing::warn!(
                claim = %allocation.name, pod = %pod.name, reason = %why,
                default = ?default, "core ceiling annotation not used; using the default"
            ),
        }
    }
    asked.into_iter().min().or(default)
}

/// The pods of `status.reservedFor`, as the checkpoint keeps them.
pub(crate) fn claim_pods(allocation: &ClaimAllocation) -> Vec<ClaimPod> {
    allocation
        .pods
        .iter()
        .map(|pod| ClaimPod {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        })
        .collect()
}

/// The device plugin's record of a prepared request, for its folder and edits writers.
fn allocation_record(container_id: &str, cards: &[CardInfo]) -> AllocationRecord {
    AllocationRecord {
        id: container_id.to_string(),
        sequence: 0,
        cards: cards.iter().map(|card| card.uuid.clone()).collect(),
        core_ids: Vec::new(),
        memory_ids: Vec::new(),
        created_unix: 0,
        owner: None,
        prepared_unix: None,
        reuses: None,
        aliases: Vec::new(),
        admitted_for: None,
    }
}

/// Prepares and unprepares claims; owns the checkpoint.
pub struct Preparer {
    config: DraConfig,
    node: NodeConfig,
    cards: Vec<CardInfo>,
    cdi: SpecWriter,
    checkpoint: Mutex<Checkpoint>,
    /// One prepare or unprepare at a time (kubelet may call concurrently).
    serial: tokio::sync::Mutex<()>,
}

impl Preparer {
    pub(crate) fn new(
        config: DraConfig,
        cards: Vec<CardInfo>,
        checkpoint: Checkpoint,
    ) -> anyhow::Result<Preparer> {
        let node = config.node_config();
        let cdi = node.cdi_writer()?;
        Ok(Preparer {
            node,
            config,
            cards,
            cdi,
            checkpoint: Mutex::new(checkpoint),
            serial: tokio::sync::Mutex::new(()),
        })
    }

    fn book(&self) -> MutexGuard<'_, Checkpoint> {
        self.checkpoint
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The claims prepared now.
    pub fn prepared(&self) -> BTreeMap<String, PreparedClaim> {
        self.book().claims.clone()
    }

    /// `<state_dir>/allocations/<container_id>`.
    pub fn allocation_dir(&self, container_id: &str) -> PathBuf {
        container::allocation_dir(&self.node, container_id)
    }

    /// The checkpointed answer, if the claim was prepared already.
    pub(crate) fn already_prepared(&self, uid: &str) -> Option<Vec<PreparedDevice>> {
        self.book()
            .claims
            .get(uid)
            .map(|claim| claim.devices.clone())
    }

    /// Prepares `claim`, whose allocation `read` fetches; the same answer every time.
    pub(crate) async fn prepare<F, Fut>(
        &self,
        claim: &ClaimRef,
        read: F,
        pods: Option<&PodReader>,
    ) -> Result<Vec<PreparedDevice>, String>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<ClaimAllocation, String>>,
    {
        let _serial = self.serial.lock().await;
        if let Some(devices) = self.already_prepared(&claim.uid) {
            return Ok(devices);
        }
        let allocation = read().await?;
        let ceiling = claim_ceiling(pods, &allocation, self.config.default_core_ceiling).await;
        let plans = plan_claim(&allocation, self.config.node(), &self.cards, ceiling)?;
        let mut devices = Vec::new();
        let mut requests = Vec::new();
        for plan in &plans {
            match self.write_request(plan) {
                Ok(cdi_id) => {
                    for (position, share) in plan.shares.iter().enumerate() {
                        // The config, region and every card's node ride on one CDI device,
                        // named on the request's first device only (the runtime must not
                        // mount /etc/vgpu twice).
                        devices.push(PreparedDevice {
                            request_names: vec![share.request.clone()],
                            pool_name: share.pool.clone(),
                            device_name: share.device.clone(),
                            cdi_device_ids: if position == 0 {
                                vec![cdi_id.clone()]
                            } else {
                                Vec::new()
                            },
                        });
                    }
                    requests.push(PreparedRequest {
                        request: plan.request.clone(),
                        container_id: plan.container_id.clone(),
                        cards: plan
                            .cards
                            .iter()
                            .zip(&plan.shares)
                            .map(|(card, share)| (card.uuid.clone(), share.cores, share.memory))
                            .collect(),
                        core_ceiling: plan.quotas.iter().find_map(|quota| quota.core_ceiling),
                    });
                }
                Err(err) => {
                    for written in plans.iter() {
                        self.remove_request(&written.container_id);
                    }
                    return Err(format!("request {}: {err:#}", plan.request));
                }
            }
        }
        let mut book = self.book();
        book.claims.insert(
            claim.uid.clone(),
            PreparedClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                pods: claim_pods(&allocation),
                devices: devices.clone(),
                requests,
            },
        );
        if let Err(err) = book.save(&self.config.state_file()) {
            book.claims.remove(&claim.uid);
            drop(book);
            for plan in &plans {
                self.remove_request(&plan.container_id);
            }
            return Err(format!("cannot checkpoint: {err:#}"));
        }
        tracing::info!(
            namespace = %claim.namespace, claim = %claim.name, uid = %claim.uid,
            requests = plans.len(), ceiling = ?ceiling, "claim prepared"
        );
        Ok(devices)
    }

    /// Records the pods of a claim prepared by a driver that kept none (its checkpoint
    /// predates them); `false` when the claim is not prepared (any more).
    pub(crate) fn record_pods(&self, uid: &str, pods: Vec<ClaimPod>) -> anyhow::Result<bool> {
        let mut book = self.book();
        let Some(claim) = book.claims.get_mut(uid) else {
            return Ok(false);
        };
        claim.pods = pods;
        book.save(&self.config.state_file())?;
        Ok(true)
    }

    fn write_request(&self, plan: &RequestPlan) -> anyhow::Result<String> {
        let cards: Vec<&CardInfo> = plan.cards.iter().collect();
        // A request on one MPS card is its daemon's client at its share (taken before
        // the quota leaves compute to MPS).
        let mps_client = vgpu_node_agent::mps::client_card(&self.node, &cards).map(|card| {
            let quota = plan.quotas.first();
            let share = vgpu_mps::ClientShare {
                cores: quota.and_then(|quota| quota.core_limit),
                memory: quota
                    .and_then(|quota| quota.memory_limit)
                    .map(|m| m.bytes()),
            };
            (card, share)
        });
        let mut quotas = plan.quotas.clone();
        vgpu_node_agent::mps::leave_compute_to_mps(&self.node, &self.cards, &mut quotas);
        let quota: Config = container::container_config(&quotas, &plan.container_id);
        quota
            .validate()
            .map_err(|message| anyhow::anyhow!("the computed config is invalid: {message}"))?;
        let dir = self.allocation_dir(&plan.container_id);
        std::fs::create_dir_all(&dir)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", dir.display()))?;
        write_atomically(&dir.join("vgpu.yaml"), quota.to_yaml().as_bytes())?;
        vgpu_contract::region::Region::create_file(
            &dir.join("usage.region"),
            &quota.region_devices(),
        )?;
        // The device plugin's edits for these cards: driver layout, config, region,
        // device nodes, env; written as its CDI spec.
        let record = allocation_record(&plan.container_id, &plan.cards);
        let mut edits = container::container_edits(&self.node, &record, &cards);
        if let Some((card, share)) = mps_client {
            vgpu_node_agent::mps::add_client_edits(&self.node, card, share, true, &mut edits);
        }
        container::write_cdi_spec(&self.node, &record, &edits)
    }

    fn remove_request(&self, container_id: &str) {
        if let Err(err) = self.cdi.remove(container_id) {
            tracing::warn!(error = %err, "cannot remove a CDI spec");
        }
        let dir = self.allocation_dir(container_id);
        if let Err(err) = std::fs::remove_dir_all(&dir)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot remove allocation folder");
        }
    }

    /// Folder and CDI spec names on disk: every allocation folder and every spec of
    /// this driver's CDI kind.
    fn names_on_disk(&self) -> Vec<String> {
        let mut names = self.cdi.names();
        if let Ok(entries) = std::fs::read_dir(self.node.allocations_dir()) {
            names.extend(
                entries
                    .flatten()
                    .filter_map(|entry| entry.file_name().into_string().ok()),
            );
        }
        names.sort();
        names.dedup();
        names
    }

    /// At start: removes folders and specs that no checkpointed claim names (left by a
    /// crash between writing them and checkpointing; kubelet was never told of them and
    /// prepares the claim again). Returns how many names were swept.
    pub(crate) fn sweep_orphans(&self) -> usize {
        let known: Vec<String> = self
            .book()
            .claims
            .values()
            .flat_map(|claim| claim.requests.iter().map(|r| r.container_id.clone()))
            .collect();
        let orphans: Vec<String> = self
            .names_on_disk()
            .into_iter()
            .filter(|name| !known.contains(name))
            .collect();
        for name in &orphans {
            tracing::info!(name = %name, "removing a prepared request no checkpointed claim names");
            self.remove_request(name);
        }
        orphans.len()
    }

    /// Undoes `uid`: its CDI specs, allocation folders and checkpoint entry. A claim
    /// this plugin never prepared is a success, after sweeping anything named after
    /// its UID (left by a crash between writing and checkpointing).
    pub(crate) async fn unprepare(&self, uid: &str) -> Result<(), String> {
        let _serial = self.serial.lock().await;
        let known = self.book().claims.get(uid).cloned();
        match &known {
            Some(claim) => {
                for request in &claim.requests {
                    self.remove_request(&request.container_id);
                }
            }
            None => {
                let prefix = format!("{}-", sanitize(uid));
                for name in self
                    .names_on_disk()
                    .iter()
                    .filter(|name| name.starts_with(&prefix))
                {
                    tracing::info!(name = %name, "removing leftovers of a claim never checkpointed");
                    self.remove_request(name);
                }
                return Ok(());
            }
        }
        let mut book = self.book();
        book.claims.remove(uid);
        book.save(&self.config.state_file())
            .map_err(|err| format!("cannot checkpoint: {err:#}"))?;
        tracing::info!(uid, "claim unprepared");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_kube::claims::PodRef;

    fn card(index: u32) -> CardInfo {
        CardInfo {
            uuid: format!("GPU-{index}"),
            index,
            minor: Some(index),
            memory_total: 16 << 30,
            numa_node: None,
        }
    }

    fn share(
        request: &str,
        device: &str,
        cores: Option<u64>,
        memory: Option<u64>,
    ) -> AllocatedShare {
        AllocatedShare {
            request: request.into(),
            pool: "node-a".into(),
            device: device.into(),
            share_id: None,
            cores,
            memory,
        }
    }

    fn allocation(shares: Vec<AllocatedShare>) -> ClaimAllocation {
        ClaimAllocation {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "5e0f0c5a-1111-2222-3333-444455556666".into(),
            shares,
            pods: vec![PodRef {
                name: "p".into(),
                uid: "pu".into(),
            }],
        }
    }

    #[test]
    fn container_ids_fit_the_contract() {
        let uid = "5e0f0c5a-1111-2222-3333-444455556666";
        assert_eq!(container_id(uid, "gpu"), format!("{uid}-gpu"));
        assert_eq!(container_id(uid, "gpu/small"), format!("{uid}-gpu.small"));
        let long_a = container_id(uid, &"a".repeat(40));
        let long_b = container_id(uid, &format!("{}b", "a".repeat(39)));
        assert_eq!(long_a.len(), 64);
        assert_ne!(long_a, long_b);
        for id in [long_a, long_b, container_id("weird uid!", "x")] {
            vgpu_contract::config::validate_container_id(&id).expect("valid id");
        }
    }

    #[test]
    fn shares_become_quotas() {
        let cards = [card(0), card(1)];
        let plans = plan_claim(
            &allocation(vec![share("gpu", "gpu-1", Some(30), Some(2560 << 20))]),
            "node-a",
            &cards,
            Some(50),
        )
        .expect("plan");
        assert_eq!(plans.len(), 1);
        let quota = &plans[0].quotas[0];
        assert_eq!(quota.uuid.as_deref(), Some("GPU-1"));
        assert_eq!(quota.core_limit, Some(30));
        assert_eq!(quota.memory_limit, Some(ByteSize::mib(2560)));
        assert_eq!(
            (quota.core_mode, quota.core_ceiling),
            (CoreMode::Soft, Some(50))
        );

        let whole = plan_claim(
            &allocation(vec![share("gpu", "gpu-0", Some(100), None)]),
            "node-a",
            &cards,
            Some(50),
        )
        .expect("plan");
        let quota = &whole[0].quotas[0];
        assert_eq!((quota.core_limit, quota.memory_limit), (None, None));
        assert_eq!(quota.core_mode, CoreMode::Hard);

        let low = plan_claim(
            &allocation(vec![share("gpu", "gpu-0", Some(60), Some(1 << 30))]),
            "node-a",
            &cards,
            Some(40),
        )
        .expect("plan");
        assert_eq!(
            low[0].quotas[0].core_ceiling,
            Some(60),
            "never below the share"
        );

        let two = plan_claim(
            &allocation(vec![
                share("gpu", "gpu-0", Some(10), Some(1 << 30)),
                share("gpu", "gpu-1", Some(20), Some(1 << 30)),
            ]),
            "node-a",
            &cards,
            None,
        )
        .expect("plan");
        assert_eq!(two.len(), 1);
        assert_eq!(two[0].quotas.len(), 2);
    }

    #[test]
    fn foreign_pools_and_unknown_devices_are_refused() {
        let cards = [card(0)];
        let mut elsewhere = share("gpu", "gpu-0", Some(10), None);
        elsewhere.pool = "node-b".into();
        for (shares, needle) in [
            (vec![elsewhere], "pool node-b"),
            (vec![share("gpu", "gpu-7", None, None)], "no device gpu-7"),
            (vec![], "no device of this driver"),
            (
                vec![
                    share("gpu", "gpu-0", None, None),
                    share("gpu", "gpu-0", None, None),
                ],
                "twice",
            ),
        ] {
            let err = plan_claim(&allocation(shares), "node-a", &cards, None).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn a_request_on_an_mps_card_gets_the_client_edits_in_its_cdi_spec() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = DraConfig {
            node_name: Some("node-a".into()),
            state_dir: dir.path().join("state"),
            cdi_dir: dir.path().join("cdi"),
            dev_root: dir.path().join("dev"),
            host_driver_dir: dir.path().join("driver"),
            shim_dir: dir.path().join("driver/shim"),
            ..DraConfig::default()
        };
        config
            .card_sharing
            .insert("GPU-1".into(), vgpu_mps::Sharing::Mps);
        let cards = vec![card(0), card(1)];
        let preparer =
            Preparer::new(config.clone(), cards.clone(), Checkpoint::default()).expect("preparer");
        let spec_of = |device: &str, cores: Option<u64>, memory: Option<u64>| {
            let plans = plan_claim(
                &allocation(vec![share("gpu", device, cores, memory)]),
                "node-a",
                &cards,
                None,
            )
            .expect("plan");
            let name = preparer.write_request(&plans[0]).expect("written");
            let id = name.rsplit('=').next().expect("id").to_string();
            let text =
                std::fs::read_to_string(config.cdi_dir.join(format!("vgpu-shim.io-gpu_{id}.json")))
                    .expect("spec");
            let spec: serde_json::Value = serde_json::from_str(&text).expect("json");
            let quota =
                vgpu_contract::Config::load(&preparer.allocation_dir(&id).join("vgpu.yaml"))
                    .expect("quota");
            (spec["devices"][0]["containerEdits"].clone(), quota)
        };
        let (edits, quota) = spec_of("gpu-1", Some(25), Some(3 << 30));
        let env: Vec<&str> = edits["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        for wanted in [
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M",
        ] {
            assert!(env.contains(&wanted), "{wanted} missing: {env:?}");
        }
        let mounts: Vec<(String, String)> = edits["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .map(|m| {
                (
                    m["containerPath"].as_str().unwrap_or_default().to_string(),
                    m["hostPath"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        let card_dir = config.state_dir.join("mps/GPU-1");
        for (container, host) in [("/tmp/nvidia-mps", "pipe"), ("/dev/shm", "shm")] {
            assert!(
                mounts.contains(&(container.into(), card_dir.join(host).display().to_string())),
                "{container} missing: {mounts:?}"
            );
        }
        assert_eq!(quota.devices[0].core_limit, None, "compute left to MPS");
        assert_eq!(quota.devices[0].memory_limit, Some(ByteSize::gib(3)));

        let (edits, quota) = spec_of("gpu-0", Some(25), Some(3 << 30));
        let text = edits.to_string();
        assert!(!text.contains("CUDA_MPS_"), "time-sliced card: {text}");
        assert_eq!(quota.devices[0].core_limit, Some(25));
    }
}
