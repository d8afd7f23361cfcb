//! kubelet's Registration and PodResourcesLister, called over its unix sockets
//! ([`vgpu_node_agent::dial`]).

use std::path::Path;

use vgpu_node_agent::dial::connect_unix;

use vgpu_kubelet_api::deviceplugin::registration_client::RegistrationClient;
use vgpu_kubelet_api::deviceplugin::{DevicePluginOptions, RegisterRequest, VERSION};
use vgpu_kubelet_api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use vgpu_kubelet_api::podresources::{ListPodResourcesRequest, PodResources};

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
