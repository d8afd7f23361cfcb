//! A stand-in kubelet for the integration tests: real tonic Registration and
//! PodResourcesLister servers on unix sockets in a temp folder, plus helpers to start
//! the plugin against it and to talk to the plugin as kubelet does: the device plugin
//! calls of one container's admission (ListAndWatch, GetPreferredAllocation, Allocate,
//! each resource recorded in PodResources as soon as its Allocate returns),
//! PreStartContainer, and the merge of a container's responses (one mount, device and
//! env per container path or name, the first wins).
#![allow(dead_code)]

pub mod e2e;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use vgpu_kubelet_api::deviceplugin::device_plugin_client::DevicePluginClient;
use vgpu_kubelet_api::deviceplugin::registration_server::{Registration, RegistrationServer};
use vgpu_kubelet_api::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, Empty, PreStartContainerRequest,
    PreferredAllocationRequest, RegisterRequest,
};
use vgpu_kubelet_api::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use vgpu_kubelet_api::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use vgpu_node_agent::config::NodeConfig;
use vgpu_node_agent::dial::connect_unix;

pub const CORE: &str = "tencent.com/vcuda-core";
pub const MEMORY: &str = "tencent.com/vcuda-memory";

/// The registrations kubelet accepted, and how many more it refuses first (as a
/// kubelet that is still starting does).
#[derive(Clone, Default)]
struct RegistrationBook {
    accepted: Arc<Mutex<Vec<RegisterRequest>>>,
    refuse_next: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Registration for RegistrationBook {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        if request.version != "v1beta1" {
            return Err(Status::invalid_argument("unsupported version"));
        }
        let refuse = self
            .refuse_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            });
        if refuse.is_ok() {
            return Err(Status::unavailable(
                "the test kubelet refuses this registration",
            ));
        }
        self.accepted.lock().expect("lock").push(request);
        Ok(Response::new(Empty {}))
    }
}

#[derive(Clone, Default)]
struct PodBook(Arc<Mutex<Vec<PodResources>>>);

#[tonic::async_trait]
impl PodResourcesLister for PodBook {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: self.0.lock().expect("lock").clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse::default()))
    }
}

/// The test kubelet.
pub struct TestKubelet {
    pub root: tempfile::TempDir,
    registrations: RegistrationBook,
    pods: PodBook,
    registration_stop: Option<oneshot::Sender<()>>,
    pods_stop: Option<oneshot::Sender<()>>,
}

fn spawn_server<S>(path: &Path, router: S) -> oneshot::Sender<()>
where
    S: FnOnce(tonic::transport::Server) -> tonic::transport::server::Router + Send + 'static,
{
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).expect("bind test kubelet socket");
    let (stop, stopped) = oneshot::channel::<()>();
    let router = router(tonic::transport::Server::builder());
    tokio::spawn(async move {
        let _ = router
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stopped.await;
            })
            .await;
    });
    stop
}

impl TestKubelet {
    pub async fn start() -> TestKubelet {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("device-plugins")).expect("mkdir");
        std::fs::create_dir_all(root.path().join("pod-resources")).expect("mkdir");
        let mut kubelet = TestKubelet {
            root,
            registrations: RegistrationBook::default(),
            pods: PodBook::default(),
            registration_stop: None,
            pods_stop: None,
        };
        kubelet.start_registration();
        let pods = kubelet.pods.clone();
        kubelet.pods_stop = Some(spawn_server(
            &kubelet.pod_resources_socket(),
            move |server| {
                let mut server = server;
                server.add_service(PodResourcesListerServer::new(pods))
            },
        ));
        kubelet
    }

    fn start_registration(&mut self) {
        let book = self.registrations.clone();
        self.registration_stop = Some(spawn_server(&self.kubelet_socket(), move |server| {
            let mut server = server;
            server.add_service(RegistrationServer::new(book))
        }));
    }

    pub fn device_plugin_dir(&self) -> PathBuf {
        self.root.path().join("device-plugins")
    }

    pub fn kubelet_socket(&self) -> PathBuf {
        self.device_plugin_dir().join("kubelet.sock")
    }

    pub fn pod_resources_socket(&self) -> PathBuf {
        self.root.path().join("pod-resources/kubelet.sock")
    }

    /// What kubelet does when it restarts: stops, deletes every socket in the
    /// device-plugin folder, comes back with a fresh kubelet.sock.
    pub async fn restart(&mut self) {
        if let Some(stop) = self.registration_stop.take() {
            let _ = stop.send(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        for entry in std::fs::read_dir(self.device_plugin_dir())
            .expect("read dir")
            .flatten()
        {
            let _ = std::fs::remove_file(entry.path());
        }
        self.start_registration();
    }

    /// Makes the next `count` Register calls fail with UNAVAILABLE.
    pub fn refuse_registrations(&self, count: usize) {
        self.registrations
            .refuse_next
            .store(count, Ordering::SeqCst);
    }

    pub fn registrations(&self) -> Vec<RegisterRequest> {
        self.registrations.accepted.lock().expect("lock").clone()
    }

    /// Waits until at least `count` registrations arrived.
    pub async fn wait_registrations(&self, count: usize) -> Vec<RegisterRequest> {
        for _ in 0..200 {
            let seen = self.registrations();
            if seen.len() >= count {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "only {} registrations arrived, expected {count}",
            self.registrations().len()
        );
    }

    /// Makes PodResources list `container` of `namespace/pod` holding these IDs.
    pub fn add_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        cores: &[String],
        memory: &[String],
    ) {
        self.set_container(namespace, pod, container, cores, memory);
    }

    /// Sets the devices of `container` of `namespace/pod` (adding the pod or container
    /// when missing), as kubelet records each resource right after its Allocate.
    pub fn set_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        cores: &[String],
        memory: &[String],
    ) {
        let devices: Vec<ContainerDevices> = [(CORE, cores), (MEMORY, memory)]
            .into_iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|(resource, ids)| ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.to_vec(),
                topology: None,
            })
            .collect();
        let mut pods = self.pods.0.lock().expect("lock");
        let position = match pods
            .iter()
            .position(|p| p.namespace == namespace && p.name == pod)
        {
            Some(position) => position,
            None => {
                pods.push(PodResources {
                    name: pod.into(),
                    namespace: namespace.into(),
                    containers: vec![],
                });
                pods.len() - 1
            }
        };
        let containers = &mut pods[position].containers;
        match containers.iter_mut().find(|c| c.name == container) {
            Some(existing) => existing.devices = devices,
            None => containers.push(ContainerResources {
                name: container.into(),
                devices,
                cpu_ids: vec![],
                memory: vec![],
            }),
        }
    }

    /// Whether PodResources lists `container` of `namespace/pod`.
    pub fn lists(&self, namespace: &str, pod: &str, container: &str) -> bool {
        self.pods.0.lock().expect("lock").iter().any(|p| {
            p.namespace == namespace
                && p.name == pod
                && p.containers.iter().any(|c| c.name == container)
        })
    }

    /// Removes a pod from PodResources (kubelet forgets a pod that is gone).
    pub fn remove_pod(&self, namespace: &str, pod: &str) {
        self.pods
            .0
            .lock()
            .expect("lock")
            .retain(|p| !(p.namespace == namespace && p.name == pod));
    }

    pub fn clear_pods(&self) {
        self.pods.0.lock().expect("lock").clear();
    }

    /// A plugin config pointing at this kubelet and a state folder inside the temp dir.
    pub fn plugin_config(&self) -> NodeConfig {
        let state_dir = self.root.path().join("vgpu");
        NodeConfig {
            device_plugin_dir: self.device_plugin_dir(),
            pod_resources_socket: self.pod_resources_socket(),
            host_driver_dir: state_dir.join("driver"),
            shim_dir: state_dir.join("driver/shim"),
            state_dir,
            kubelet_watch_interval_ms: 50,
            health_interval_secs: 1,
            metrics_address: Some("127.0.0.1:0".parse().expect("address")),
            dev_root: self.root.path().join("dev"),
            ..NodeConfig::default()
        }
    }
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        for stop in [self.registration_stop.take(), self.pods_stop.take()]
            .into_iter()
            .flatten()
        {
            let _ = stop.send(());
        }
    }
}

/// A DevicePlugin client on a plugin socket, as kubelet dials it.
pub async fn plugin_client(socket: &Path) -> DevicePluginClient<tonic::transport::Channel> {
    DevicePluginClient::new(connect_unix(socket).await.expect("connect to plugin"))
}

pub type Client = DevicePluginClient<tonic::transport::Channel>;

/// A running plugin and a client on each of its sockets (cores, memory).
pub struct Plugin {
    pub handle: vgpu_plugin::PluginHandle,
    pub cores: Client,
    pub memory: Client,
}

impl Plugin {
    /// Starts the plugin with `config` against `kubelet` and waits for both registrations.
    pub async fn start(
        kubelet: &TestKubelet,
        config: NodeConfig,
        source: Arc<dyn vgpu_node_agent::devices::DeviceSource>,
    ) -> Plugin {
        let before = kubelet.registrations().len();
        let handle = vgpu_plugin::start(config, source)
            .await
            .expect("plugin starts");
        kubelet.wait_registrations(before + 2).await;
        let cores = plugin_client(&handle.sockets()[0]).await;
        let memory = plugin_client(&handle.sockets()[1]).await;
        Plugin {
            handle,
            cores,
            memory,
        }
    }

    pub fn client(&mut self, resource: &str) -> &mut Client {
        if resource == CORE {
            &mut self.cores
        } else {
            &mut self.memory
        }
    }
}

/// The first ListAndWatch list of a resource.
pub async fn device_list(client: &mut Client) -> Vec<vgpu_kubelet_api::deviceplugin::Device> {
    let mut stream = client
        .list_and_watch(Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    stream
        .message()
        .await
        .expect("stream")
        .expect("first list")
        .devices
}

/// Every device ID of a resource.
pub async fn list_ids(client: &mut Client) -> Vec<String> {
    device_list(client)
        .await
        .into_iter()
        .map(|device| device.id)
        .collect()
}

pub async fn preferred(client: &mut Client, available: &[String], size: usize) -> Vec<String> {
    let request = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: available.to_vec(),
            must_include_device_i_ds: vec![],
            allocation_size: size as i32,
        }],
    };
    let mut reply = client
        .get_preferred_allocation(request)
        .await
        .expect("GetPreferredAllocation")
        .into_inner();
    assert_eq!(reply.container_responses.len(), 1);
    reply.container_responses.remove(0).device_i_ds
}

pub async fn allocate(
    client: &mut Client,
    ids: &[String],
) -> Result<ContainerAllocateResponse, Status> {
    let request = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    };
    client
        .allocate(request)
        .await
        .map(|reply| reply.into_inner().container_responses.remove(0))
}

pub async fn prestart(client: &mut Client, ids: &[String]) -> Result<(), Status> {
    client
        .pre_start_container(PreStartContainerRequest {
            devices_ids: ids.to_vec(),
        })
        .await
        .map(|_| ())
}

/// The node name the stand-in API server binds pods to.
pub const NODE: &str = "node-a";

/// A stand-in API server, a stand-in kubelet and a plugin on `cards` cards of
/// `card_memory` bytes that reads this node's pods from that server.
pub async fn plugin_with_api(
    cards: u32,
    card_memory: u64,
) -> (vgpu_kube::standin::StandInApiServer, TestKubelet, Plugin) {
    plugin_with_api_and(cards, card_memory, |_| {}).await
}

/// [`plugin_with_api`] with the plugin's config edited by `edit` first.
pub async fn plugin_with_api_and(
    cards: u32,
    card_memory: u64,
    edit: impl FnOnce(&mut NodeConfig),
) -> (vgpu_kube::standin::StandInApiServer, TestKubelet, Plugin) {
    let server = vgpu_kube::standin::StandInApiServer::start()
        .await
        .expect("stand-in API server");
    let kubelet = TestKubelet::start().await;
    let mut config = config_with_api(&kubelet, &server);
    edit(&mut config);
    let plugin = Plugin::start(
        &kubelet,
        config,
        Arc::new(vgpu_node_agent::devices::FakeSource::uniform(
            cards,
            card_memory,
        )),
    )
    .await;
    (server, kubelet, plugin)
}

/// The config of a plugin against `kubelet` that reads this node's pods from `server`.
pub fn config_with_api(
    kubelet: &TestKubelet,
    server: &vgpu_kube::standin::StandInApiServer,
) -> NodeConfig {
    let mut config = kubelet.plugin_config();
    config.api_server_url = Some(server.url());
    config.node_name = Some(NODE.into());
    config
}

/// Puts a pending pod bound to [`NODE`] in the stand-in API server: one container per
/// `(name, cores, memory units)`, limits only where not 0.
pub fn put_pod(
    server: &vgpu_kube::standin::StandInApiServer,
    namespace: &str,
    name: &str,
    containers: &[(&str, usize, usize)],
) {
    put_pod_in_phase(server, namespace, name, containers, "Pending");
}

/// [`put_pod`] in `phase` (kubelet fails a pod it rejects at admission).
pub fn put_pod_in_phase(
    server: &vgpu_kube::standin::StandInApiServer,
    namespace: &str,
    name: &str,
    containers: &[(&str, usize, usize)],
    phase: &str,
) {
    let containers: Vec<serde_json::Value> = containers
        .iter()
        .map(|(container, cores, memory)| {
            let mut limits = serde_json::Map::new();
            if *cores > 0 {
                limits.insert(CORE.into(), cores.to_string().into());
            }
            if *memory > 0 {
                limits.insert(MEMORY.into(), memory.to_string().into());
            }
            serde_json::json!({"name": container, "image": "x", "resources": {"limits": limits}})
        })
        .collect();
    server.put_pod(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        "spec": {"nodeName": NODE, "containers": containers},
        "status": {"phase": phase}
    }));
}

/// One container as kubelet admitted it.
#[derive(Clone, Debug, Default)]
pub struct Admitted {
    pub cores: Vec<String>,
    pub memory: Vec<String>,
    /// The Allocate responses, in call order.
    pub responses: Vec<ContainerAllocateResponse>,
}

impl Admitted {
    /// The responses merged as kubelet merges them for the runtime: one mount and
    /// device per container path and one value per env name, the first wins; every
    /// CDI device and annotation.
    pub fn merged(&self) -> ContainerAllocateResponse {
        let mut merged = ContainerAllocateResponse::default();
        let mut mounts = BTreeSet::new();
        let mut devices = BTreeSet::new();
        for response in &self.responses {
            for mount in &response.mounts {
                if mounts.insert(mount.container_path.clone()) {
                    merged.mounts.push(mount.clone());
                }
            }
            for device in &response.devices {
                if devices.insert(device.container_path.clone()) {
                    merged.devices.push(device.clone());
                }
            }
            for (merged, theirs) in [
                (&mut merged.envs, &response.envs),
                (&mut merged.annotations, &response.annotations),
            ] {
                for (key, value) in theirs {
                    merged.entry(key.clone()).or_insert_with(|| value.clone());
                }
            }
            merged
                .cdi_devices
                .extend(response.cdi_devices.iter().cloned());
        }
        merged
    }
}

impl TestKubelet {
    /// Every device ID some container holds.
    pub fn held_ids(&self) -> BTreeSet<String> {
        self.pods
            .0
            .lock()
            .expect("lock")
            .iter()
            .flat_map(|pod| pod.containers.iter())
            .flat_map(|container| container.devices.iter())
            .flat_map(|devices| devices.device_ids.iter().cloned())
            .collect()
    }

    /// Kubelet's admission of one container: for each `(resource, count)` in order, the
    /// free devices (listed minus held), GetPreferredAllocation (its pick filled by
    /// kubelet when short), Allocate, and the devices recorded in PodResources at once.
    /// An Allocate refusal is returned with what was admitted before it. A short pick is
    /// filled in list order (see [`TestKubelet::admit_filling`]).
    pub async fn admit(
        &self,
        plugin: &mut Plugin,
        namespace: &str,
        pod: &str,
        container: &str,
        requests: &[(&str, usize)],
    ) -> Result<Admitted, (Admitted, Status)> {
        self.admit_filling(plugin, namespace, pod, container, requests, |_| {})
            .await
    }

    /// [`TestKubelet::admit`] with kubelet's fill order: `order` arranges the free IDs
    /// a short pick is filled from (kubelet v1.37 `devicesToAllocate` walks a Go set:
    /// a random order).
    pub async fn admit_filling(
        &self,
        plugin: &mut Plugin,
        namespace: &str,
        pod: &str,
        container: &str,
        requests: &[(&str, usize)],
        mut order: impl FnMut(&mut [String]),
    ) -> Result<Admitted, (Admitted, Status)> {
        let mut admitted = Admitted::default();
        // Kubelet adds the pod to its pod manager before it admits it: PodResources
        // lists the container, holding nothing yet, before its first Allocate.
        if !self.lists(namespace, pod, container) {
            self.set_container(namespace, pod, container, &[], &[]);
        }
        for &(resource, count) in requests {
            let client = plugin.client(resource);
            let held = self.held_ids();
            let mut available: Vec<String> = list_ids(client)
                .await
                .into_iter()
                .filter(|id| !held.contains(id))
                .collect();
            // Kubelet refuses before it asks the plugin when too few are free.
            if available.len() < count {
                let status = Status::resource_exhausted(format!(
                    "requested number of devices unavailable for {resource}. Requested: {count}, Available: {}",
                    available.len()
                ));
                return Err((admitted, status));
            }
            // As kubelet (v1.37 `devicesToAllocate`): the plugin's pick counts only where
            // it names free IDs, and a short pick is filled from the other free IDs.
            let mut ids = preferred(client, &available, count).await;
            ids.retain(|id| available.contains(id));
            order(&mut available);
            for id in &available {
                if ids.len() >= count {
                    break;
                }
                if !ids.contains(id) {
                    ids.push(id.clone());
                }
            }
            match allocate(client, &ids).await {
                Ok(response) => admitted.responses.push(response),
                Err(status) => return Err((admitted, status)),
            }
            if resource == CORE {
                admitted.cores = ids;
            } else {
                admitted.memory = ids;
            }
            self.set_container(namespace, pod, container, &admitted.cores, &admitted.memory);
        }
        Ok(admitted)
    }

    /// [`TestKubelet::admit`] then [`TestKubelet::start_container`], each expected to
    /// succeed: a container that is running.
    pub async fn admit_and_start(
        &self,
        plugin: &mut Plugin,
        namespace: &str,
        pod: &str,
        container: &str,
        requests: &[(&str, usize)],
    ) -> Admitted {
        let admitted = self
            .admit(plugin, namespace, pod, container, requests)
            .await
            .map_err(|(_, status)| status)
            .expect("admitted");
        self.start_container(plugin, &admitted)
            .await
            .expect("PreStart");
        admitted
    }

    /// Kubelet starting a container: PreStartContainer for each resource it holds.
    pub async fn start_container(
        &self,
        plugin: &mut Plugin,
        admitted: &Admitted,
    ) -> Result<(), Status> {
        if !admitted.cores.is_empty() {
            prestart(&mut plugin.cores, &admitted.cores).await?;
        }
        if !admitted.memory.is_empty() {
            prestart(&mut plugin.memory, &admitted.memory).await?;
        }
        Ok(())
    }
}

/// A plugin on one 4 GiB card with container `team/trainer/cuda` at 30 cores and 4
/// memory units allocated and started (through [`started_container`]): the kubelet,
/// the plugin, the container's usage region on the host, and the metrics address.
pub async fn one_container_on_a_4gib_card() -> (
    TestKubelet,
    vgpu_plugin::PluginHandle,
    PathBuf,
    std::net::SocketAddr,
) {
    let kubelet = TestKubelet::start().await;
    let plugin = vgpu_plugin::start(
        kubelet.plugin_config(),
        Arc::new(vgpu_node_agent::devices::FakeSource::uniform(1, 4 << 30)),
    )
    .await
    .expect("plugin");
    kubelet.wait_registrations(2).await;
    let response = started_container(&kubelet, plugin.sockets(), 30, 4).await;
    let region = PathBuf::from(host_path_of(&response, "/etc/vgpu/usage.region"));
    let address = plugin.metrics_address().expect("metrics");
    (kubelet, plugin, region, address)
}

/// The host path mounted at `container_path`.
pub fn host_path_of<'a>(response: &'a ContainerAllocateResponse, container_path: &str) -> &'a str {
    &response
        .mounts
        .iter()
        .find(|mount| mount.container_path == container_path)
        .unwrap_or_else(|| panic!("no mount at {container_path}"))
        .host_path
}

/// The card of one of our device IDs.
pub fn card_of(id: &str) -> String {
    vgpu_plugin::ids::DeviceId::parse(id).expect("our ID").uuid
}

/// The final container config behind a container's merged response.
pub fn config_of(admitted: &Admitted) -> vgpu_contract::Config {
    let merged = admitted.merged();
    vgpu_contract::Config::load(Path::new(host_path_of(&merged, "/etc/vgpu/vgpu.yaml")))
        .expect("container config")
}

/// A metric's value in a scrape, by name and the label text inside its braces.
#[allow(unused_imports)] // not every includer of this module reads metrics
pub use vgpu_test_support::metric_value;

/// `GET path` on the plugin's metrics server: (status code, body).
pub async fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_get_from([127, 0, 0, 1], address, path).await
}

/// `GET path` on the plugin's metrics server from the loopback address `source` (the
/// server serves a few connections at once per client address: parallel clients are
/// several addresses, as several Prometheus replicas are).
pub async fn http_get_from(
    source: [u8; 4],
    address: std::net::SocketAddr,
    path: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind((source, 0).into()).expect("bind");
    let mut stream = socket.connect(address).await.expect("connect metrics");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (code, body.to_string())
}

/// `GET /metrics`, which must answer 200: the body.
pub async fn scrape(address: std::net::SocketAddr) -> String {
    let (code, body) = http_get(address, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    body
}

/// A process of a container, as the shim records it (a PID namespace of its own).
pub fn tenant(pid: i32) -> vgpu_contract::process::Identity {
    vgpu_contract::process::Identity {
        pid,
        start_time: 7000 + pid as u64,
        pid_ns: 4026532999,
    }
}

/// The simulated NVML this build made (`cargo test` builds it: a dev-dependency);
/// `None` where it was not built, by the prerequisite policy (an error under CI).
pub fn sim_nvml(_who: &str) -> Option<PathBuf> {
    use vgpu_test_support::{Need, require};
    require!(return None; Need::Built("libvgpu_sim.so"));
    vgpu_test_support::built("libvgpu_sim.so")
}

/// Container `team/trainer/cuda` with the first `cores` and `memory` IDs of the plugin
/// serving `sockets` (core, memory), allocated and started: its core response.
pub async fn started_container(
    kubelet: &TestKubelet,
    sockets: &[PathBuf],
    cores: usize,
    memory: usize,
) -> ContainerAllocateResponse {
    let mut core_client = plugin_client(&sockets[0]).await;
    let mut memory_client = plugin_client(&sockets[1]).await;
    let core_ids: Vec<String> = list_ids(&mut core_client)
        .await
        .into_iter()
        .take(cores)
        .collect();
    let memory_ids: Vec<String> = list_ids(&mut memory_client)
        .await
        .into_iter()
        .take(memory)
        .collect();
    let response = allocate(&mut core_client, &core_ids).await.expect("cores");
    allocate(&mut memory_client, &memory_ids)
        .await
        .expect("memory");
    kubelet.add_container("team", "trainer", "cuda", &core_ids, &memory_ids);
    prestart(&mut core_client, &core_ids)
        .await
        .expect("PreStart");
    response
}
