//! gRPC clients over unix sockets: kubelet's Registration and PodResourcesLister.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::proto::deviceplugin::registration_client::RegistrationClient;
use crate::proto::deviceplugin::{DevicePluginOptions, RegisterRequest, VERSION};
use crate::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use crate::proto::podresources::{ListPodResourcesRequest, PodResources};

/// How long one call to kubelet may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A channel to the gRPC server on the unix socket `path`.
pub async fn connect_unix(path: &Path) -> anyhow::Result<Channel> {
    let path: PathBuf = path.to_path_buf();
    let shown = path.display().to_string();
    // The URI is required by the API but unused: the connector always dials `path`.
    let channel = Endpoint::from_static("http://localhost")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|err| anyhow::anyhow!("cannot connect to {shown}: {err}"))?;
    Ok(channel)
}

/// Registers `resource`, served on `endpoint` (a socket file name in the device-plugin dir).
pub async fn register(kubelet_socket: &Path, endpoint: &str, resource: &str) -> anyhow::Result<()> {
    let channel = connect_unix(kubelet_socket).await?;
    let request = RegisterRequest {
        version: VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }),
    };
    RegistrationClient::new(channel)
        .register(request)
        .await
        .map_err(|status| {
            anyhow::anyhow!(
                "kubelet refused to register {resource}: {}",
                status.message()
            )
        })?;
    Ok(())
}

/// Every pod's resources, from the PodResources API.
pub async fn list_pod_resources(socket: &Path) -> anyhow::Result<Vec<PodResources>> {
    let channel = connect_unix(socket).await?;
    let reply = PodResourcesListerClient::new(channel)
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|status| anyhow::anyhow!("PodResources List failed: {}", status.message()))?;
    Ok(reply.into_inner().pod_resources)
}
