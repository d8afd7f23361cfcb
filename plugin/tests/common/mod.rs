//! A stand-in kubelet for the integration tests: real tonic Registration and
//! PodResourcesLister servers on unix sockets in a temp folder, plus helpers to start
//! the plugin against it and to talk to the plugin as kubelet does.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use vgpu_plugin::PluginConfig;
use vgpu_plugin::kubelet::connect_unix;
use vgpu_plugin::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use vgpu_plugin::proto::deviceplugin::registration_server::{Registration, RegistrationServer};
use vgpu_plugin::proto::deviceplugin::{Empty, RegisterRequest};
use vgpu_plugin::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use vgpu_plugin::proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};

pub const CORE: &str = "tencent.com/vcuda-core";
pub const MEMORY: &str = "tencent.com/vcuda-memory";

#[derive(Clone, Default)]
struct RegistrationBook(Arc<Mutex<Vec<RegisterRequest>>>);

#[tonic::async_trait]
impl Registration for RegistrationBook {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        if request.version != "v1beta1" {
            return Err(Status::invalid_argument("unsupported version"));
        }
        self.0.lock().expect("lock").push(request);
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

    pub fn registrations(&self) -> Vec<RegisterRequest> {
        self.registrations.0.lock().expect("lock").clone()
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
        let mut devices = Vec::new();
        for (resource, ids) in [(CORE, cores), (MEMORY, memory)] {
            if !ids.is_empty() {
                devices.push(ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.to_vec(),
                    topology: None,
                });
            }
        }
        self.pods.0.lock().expect("lock").push(PodResources {
            name: pod.into(),
            namespace: namespace.into(),
            containers: vec![ContainerResources {
                name: container.into(),
                devices,
                cpu_ids: vec![],
                memory: vec![],
            }],
        });
    }

    pub fn clear_pods(&self) {
        self.pods.0.lock().expect("lock").clear();
    }

    /// A plugin config pointing at this kubelet and a state folder inside the temp dir.
    pub fn plugin_config(&self) -> PluginConfig {
        let state_dir = self.root.path().join("vgpu");
        PluginConfig {
            device_plugin_dir: self.device_plugin_dir(),
            pod_resources_socket: self.pod_resources_socket(),
            host_driver_dir: state_dir.join("driver"),
            shim_dir: state_dir.join("driver/shim"),
            state_dir,
            kubelet_watch_interval_ms: 50,
            health_interval_secs: 1,
            metrics_address: Some("127.0.0.1:0".parse().expect("address")),
            dev_root: self.root.path().join("dev"),
            ..PluginConfig::default()
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

/// The devices of the first ListAndWatch answer.
pub async fn listed_devices(
    client: &mut DevicePluginClient<tonic::transport::Channel>,
) -> Vec<vgpu_plugin::proto::deviceplugin::Device> {
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

/// The device IDs of the first ListAndWatch answer.
pub async fn listed_ids(client: &mut DevicePluginClient<tonic::transport::Channel>) -> Vec<String> {
    listed_devices(client)
        .await
        .into_iter()
        .map(|device| device.id)
        .collect()
}

/// Allocate for one container asking for `ids`.
pub async fn allocate_one(
    client: &mut DevicePluginClient<tonic::transport::Channel>,
    ids: &[String],
) -> Result<vgpu_plugin::proto::deviceplugin::ContainerAllocateResponse, Status> {
    let request = vgpu_plugin::proto::deviceplugin::AllocateRequest {
        container_requests: vec![vgpu_plugin::proto::deviceplugin::ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    };
    client
        .allocate(request)
        .await
        .map(|reply| reply.into_inner().container_responses.remove(0))
}

/// `GET path` on the plugin's metrics server: (status code, body).
pub async fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect metrics");
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
