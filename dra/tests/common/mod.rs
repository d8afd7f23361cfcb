//! The stand-ins the DRA tests run against: a test kubelet (the plugin watcher's
//! registration calls and the DRA v1/v1beta1 clients, real gRPC over unix sockets), the
//! stand-in API server from vgpu-kube, a tiny scheduler that places claims from the
//! published ResourceSlices as the stock scheduler's consumable-capacity rules do, and
//! the sim driver with four GPUs.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use serde_json::{Value, json};
use vgpu_dra::DraConfig;
use vgpu_kube::k8s_openapi::api::resource::v1::ResourceSlice;
use vgpu_kube::quantity;
use vgpu_kubelet_api::dra_v1::dra_plugin_client::DraPluginClient as V1Client;
use vgpu_kubelet_api::dra_v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use vgpu_kubelet_api::dra_v1beta1::dra_plugin_client::DraPluginClient as V1beta1Client;
use vgpu_kubelet_api::registration::registration_client::RegistrationClient;
use vgpu_kubelet_api::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use vgpu_node_agent::dial::connect_unix;

pub const DRIVER: &str = "gpu.vgpu-shim.io";
pub const NODE: &str = "node-a";
pub const GPUS: u32 = 4;

pub use vgpu_test_support::built;
use vgpu_test_support::{Need, require};

/// The sim driver, loaded with four GPUs; `None` (by the prerequisite policy) when not
/// built.
pub fn sim_library() -> Option<PathBuf> {
    static ENV: Once = Once::new();
    require!(return None; Need::Built("libvgpu_sim.so"));
    let sim = built("libvgpu_sim.so")?;
    ENV.call_once(|| {
        // SAFETY: set once, before the sim is loaded by this process; the test threads
        // read it only through the sim, after this point.
        unsafe { std::env::set_var("VGPU_SIM_GPUS", GPUS.to_string()) };
    });
    Some(sim)
}

/// The test kubelet: its folders and its gRPC clients.
pub struct TestKubelet {
    pub root: tempfile::TempDir,
}

impl TestKubelet {
    pub fn new() -> TestKubelet {
        let root = tempfile::tempdir().expect("tempdir");
        for dir in [
            "plugins_registry",
            "plugins",
            "device-plugins",
            "cdi",
            "dev",
        ] {
            std::fs::create_dir_all(root.path().join(dir)).expect("mkdir");
        }
        TestKubelet { root }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// A plugin config in this kubelet's folders, talking to the API server at `url`.
    pub fn config(&self, url: &str) -> DraConfig {
        let state_dir = self.path("vgpu-dra");
        DraConfig {
            node_name: Some(NODE.into()),
            plugins_registry_dir: self.path("plugins_registry"),
            plugin_dir: Some(self.path("plugins").join(DRIVER)),
            host_driver_dir: self.path("driver"),
            shim_dir: self.path("driver/shim"),
            state_dir,
            cdi_dir: self.path("cdi"),
            device_plugin_dir: self.path("device-plugins"),
            api_server_url: Some(url.into()),
            registration_watch_interval_ms: 50,
            health_interval_secs: 1,
            dev_root: self.path("dev"),
            metrics_address: Some("127.0.0.1:0".parse().expect("address")),
            ..DraConfig::default()
        }
    }

    /// What kubelet's plugin watcher does with a new socket in plugins_registry:
    /// GetInfo, check it, dial the endpoint, NotifyRegistrationStatus.
    pub async fn register(&self) -> PluginInfo {
        let socket = self.wait_registration_socket().await;
        let mut client =
            RegistrationClient::new(connect_unix(&socket).await.expect("dial registration"));
        let info = client
            .get_info(InfoRequest {})
            .await
            .expect("GetInfo")
            .into_inner();
        let ok = info.r#type == "DRAPlugin"
            && info.supported_versions.iter().any(|v| v == "v1.DRAPlugin");
        let dialed = connect_unix(Path::new(&info.endpoint)).await.is_ok();
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: ok && dialed,
                error: if ok && dialed {
                    String::new()
                } else {
                    "not a usable DRA plugin".into()
                },
            })
            .await
            .expect("NotifyRegistrationStatus");
        assert!(ok && dialed, "{info:?}");
        info
    }

    /// The first `*.sock` in plugins_registry.
    pub async fn wait_registration_socket(&self) -> PathBuf {
        for _ in 0..200 {
            if let Some(socket) = std::fs::read_dir(self.path("plugins_registry"))
                .expect("registry")
                .flatten()
                .map(|entry| entry.path())
                .find(|path| path.extension().is_some_and(|ext| ext == "sock"))
            {
                return socket;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no registration socket appeared");
    }

    pub async fn v1(&self, endpoint: &str) -> V1Client<tonic::transport::Channel> {
        V1Client::new(connect_unix(Path::new(endpoint)).await.expect("dial DRA"))
    }

    pub async fn v1beta1(&self, endpoint: &str) -> V1beta1Client<tonic::transport::Channel> {
        V1beta1Client::new(connect_unix(Path::new(endpoint)).await.expect("dial DRA"))
    }
}

pub fn claim(namespace: &str, name: &str, uid: &str) -> Claim {
    Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// Prepares one claim through v1; the devices or the error.
pub async fn prepare(
    client: &mut V1Client<tonic::transport::Channel>,
    claim: Claim,
) -> Result<Vec<vgpu_kubelet_api::dra_v1::Device>, String> {
    let uid = claim.uid.clone();
    let mut answer = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim],
        })
        .await
        .expect("NodePrepareResources")
        .into_inner();
    let entry = answer.claims.remove(&uid).expect("an entry for the claim");
    if entry.error.is_empty() {
        Ok(entry.devices)
    } else {
        Err(entry.error)
    }
}

/// Unprepares one claim through v1; the error, empty on success.
pub async fn unprepare(client: &mut V1Client<tonic::transport::Channel>, claim: Claim) -> String {
    let uid = claim.uid.clone();
    let mut answer = client
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim],
        })
        .await
        .expect("NodeUnprepareResources")
        .into_inner();
    answer.claims.remove(&uid).expect("an entry").error
}

/// The slices the stand-in holds, parsed with k8s-openapi.
pub fn parsed_slices(slices: &[Value]) -> Vec<ResourceSlice> {
    slices
        .iter()
        .map(|slice| serde_json::from_value(slice.clone()).expect("a ResourceSlice"))
        .collect()
}

/// Where the scheduler put a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub pool: String,
    pub device: String,
    pub cores: u64,
    pub memory: u64,
}

/// A first-fit allocator over the slices' consumable capacity, with the API's rules:
/// a missing request takes the policy default, a request below `validRange.min` is
/// raised to it and one off the step is rounded up to `min + n·step`, and a device
/// takes a share only while the sum of what it has handed out stays within its
/// capacity. Tainted (NoSchedule/NoExecute) devices take nothing. The same arithmetic
/// the kube-scheduler's structured allocator does for KEP-5075, in a few lines.
#[derive(Default)]
pub struct Scheduler {
    pub placed: Vec<Placement>,
}

fn policy_value(
    capacity: &vgpu_kube::k8s_openapi::api::resource::v1::DeviceCapacity,
    wanted: Option<u64>,
) -> Option<u64> {
    let policy = capacity.request_policy.as_ref();
    let value = match wanted {
        Some(value) => value,
        None => policy
            .and_then(|p| p.default.as_ref())
            .map(|q| quantity::whole(q).expect("default"))
            .unwrap_or_else(|| quantity::whole(&capacity.value).expect("value")),
    };
    let Some(range) = policy.and_then(|p| p.valid_range.as_ref()) else {
        return Some(value);
    };
    let min = quantity::whole(&range.min).expect("min");
    let mut value = value.max(min);
    if let Some(step) = range
        .step
        .as_ref()
        .map(|q| quantity::whole(q).expect("step"))
    {
        value = min + (value - min).div_ceil(step) * step;
    }
    if let Some(max) = range.max.as_ref().map(|q| quantity::whole(q).expect("max"))
        && value > max
    {
        return None;
    }
    Some(value)
}

impl Scheduler {
    /// Places a request for `cores` and `memory` bytes (`None`: not asked).
    pub fn place(
        &mut self,
        slices: &[ResourceSlice],
        cores: Option<u64>,
        memory: Option<u64>,
    ) -> Option<Placement> {
        for slice in slices {
            for device in slice.spec.devices.iter().flatten() {
                if device.allow_multiple_allocations != Some(true) {
                    continue;
                }
                if device
                    .taints
                    .iter()
                    .flatten()
                    .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                {
                    continue;
                }
                let capacity = device.capacity.as_ref()?;
                let (Some(core_cap), Some(memory_cap)) =
                    (capacity.get("cores"), capacity.get("memory"))
                else {
                    continue;
                };
                let (Some(want_cores), Some(want_memory)) = (
                    policy_value(core_cap, cores),
                    policy_value(memory_cap, memory),
                ) else {
                    continue;
                };
                let used = |pick: fn(&Placement) -> u64| -> u64 {
                    self.placed
                        .iter()
                        .filter(|p| p.pool == slice.spec.pool.name && p.device == device.name)
                        .map(pick)
                        .sum()
                };
                let fits = used(|p| p.cores) + want_cores
                    <= quantity::whole(&core_cap.value).expect("cores")
                    && used(|p| p.memory) + want_memory
                        <= quantity::whole(&memory_cap.value).expect("memory");
                if fits {
                    let placement = Placement {
                        pool: slice.spec.pool.name.clone(),
                        device: device.name.clone(),
                        cores: want_cores,
                        memory: want_memory,
                    };
                    self.placed.push(placement.clone());
                    return Some(placement);
                }
            }
        }
        None
    }
}

/// A ResourceClaim as the API server holds it once the scheduler allocated it and
/// reserved it for `pod`.
pub fn allocated_claim(
    namespace: &str,
    name: &str,
    uid: &str,
    request: &str,
    placement: &Placement,
    pod: (&str, &str),
) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": request, "exactly": {
            "deviceClassName": "gpu.vgpu-shim.io",
            "capacity": {"requests": {
                "cores": placement.cores.to_string(),
                "memory": quantity::bytes(placement.memory).0,
            }}
        }}]}},
        "status": {
            "allocation": {"devices": {"results": [{
                "request": request, "driver": DRIVER, "pool": placement.pool,
                "device": placement.device, "shareID": format!("share-{uid}"),
                "consumedCapacity": {
                    "cores": placement.cores.to_string(),
                    "memory": quantity::bytes(placement.memory).0,
                }
            }]}},
            "reservedFor": [{"resource": "pods", "name": pod.0, "uid": pod.1}]
        }
    })
}

/// Puts into the stand-in a claim `namespace/name` (request `gpu`) allocated at
/// `placement` and reserved for the pod `pod` (name, UID), and that pod.
pub fn put_reserved_claim(
    server: &vgpu_kube::standin::StandInApiServer,
    (namespace, name, uid): (&str, &str, &str),
    placement: &Placement,
    pod_ref: (&str, &str),
) {
    server.put_claim(allocated_claim(
        namespace, name, uid, "gpu", placement, pod_ref,
    ));
    server.put_pod(pod(namespace, pod_ref.0, pod_ref.1, None));
}

/// A pod bound to the test node, with the ceiling annotation when given.
pub fn pod(namespace: &str, name: &str, uid: &str, ceiling: Option<&str>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"nodeName": NODE, "containers": [{"name": "cuda", "image": "x"}]}
    });
    if let Some(value) = ceiling {
        pod["metadata"]["annotations"] = json!({"tencent.com/vcuda-core-limit": value});
    }
    pod
}

/// Waits until `check` holds on the stand-in's slices.
pub async fn wait_slices(
    server: &vgpu_kube::standin::StandInApiServer,
    check: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    for _ in 0..400 {
        let slices = server.slices();
        if check(&slices) {
            return slices;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the slices never got there: {:?}", server.slices());
}

/// `GET path`: the status code and body, or `None` when no answer came in time.
pub fn http_get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
}
