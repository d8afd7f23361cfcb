//! gpu-manager's `tencent.com/vcuda-core-limit` in device-plugin mode. At
//! PreStartContainer the plugin knows the container's pod from PodResources
//! (namespace/name); [`PodCeilings::apply`] GETs that one pod (checked to be bound to
//! this node when `node_name` or `NODE_NAME` names it) and makes each partial card of
//! the plan `core_mode: soft` with `core_ceiling: max(annotation, cores)`.
//!
//! Fallback: no annotation, a value outside 1-100, or an API server that cannot be
//! reached (or no client at all: not in a cluster, `pod_annotations: false`) keep what
//! the plan already has, which is `default_core_ceiling` or a hard limit. The container
//! always starts; the reason is logged.
//!
//! The same reader lists the pods of this node for [`crate::admitting`] (RBAC: `list`
//! pods, with a `spec.nodeName` field selector).

use tokio::sync::OnceCell;
use vgpu_kube::pods::{CeilingLookup, PodReader, apply_ceiling};

use crate::allocator::PreStartPlan;
use vgpu_node_agent::config::NodeConfig;

/// How long PreStart waits for the API server before it falls back.
const LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The pod reader of the device plugin, made on first use.
pub struct PodCeilings {
    enabled: bool,
    source: vgpu_kube::ClientSource,
    node: Option<String>,
    reader: OnceCell<Option<PodReader>>,
}

impl PodCeilings {
    pub(crate) fn new(config: &NodeConfig) -> PodCeilings {
        PodCeilings {
            enabled: config.pod_annotations,
            source: match &config.api_server_url {
                Some(url) => vgpu_kube::ClientSource::Url(url.clone()),
                None => vgpu_kube::ClientSource::Infer,
            },
            node: config.node_name.clone().or_else(|| {
                std::env::var("NODE_NAME")
                    .ok()
                    .filter(|node| !node.is_empty())
            }),
            reader: OnceCell::new(),
        }
    }

    async fn reader(&self) -> Option<&PodReader> {
        if !self.enabled {
            return None;
        }
        self.reader
            .get_or_init(|| async {
                match vgpu_kube::connect(&self.source).await {
                    Ok(client) => Some(
                        PodReader::new(client, self.node.as_deref()).with_timeout(LOOKUP_TIMEOUT),
                    ),
                    Err(err) => {
                        tracing::warn!(error = %format!("{err:#}"), "no API server: tencent.com/vcuda-core-limit is not read; default_core_ceiling applies");
                        None
                    }
                }
            })
            .await
            .as_ref()
    }

    /// The pods bound to this node (for [`crate::admitting`]); `None` when there is no
    /// API server, no node name, or the list fails (logged).
    pub async fn pods_on_node(&self) -> Option<Vec<vgpu_kube::k8s_openapi::api::core::v1::Pod>> {
        self.node.as_ref()?;
        let reader = self.reader().await?;
        match reader.list_on_node().await {
            Ok(pods) => Some(pods),
            Err(err) => {
                tracing::warn!(error = %format!("{err:#}"), "cannot list this node's pods: a container's two resources are placed from the calls alone");
                None
            }
        }
    }

    /// Applies each plan's pod's annotation to its partial cards.
    pub async fn apply(&self, plans: &mut [PreStartPlan]) {
        let Some(reader) = self.reader().await else {
            return;
        };
        for plan in plans.iter_mut() {
            let Some(owner) = &plan.owner else { continue };
            match reader
                .core_ceiling(&owner.namespace, &owner.pod, None)
                .await
            {
                CeilingLookup::Set(ceiling) => {
                    for device in &mut plan.devices {
                        apply_ceiling(device, ceiling);
                    }
                    tracing::info!(namespace = %owner.namespace, pod = %owner.pod, ceiling, "soft ceiling from the pod's annotation");
                }
                CeilingLookup::Unset => {}
                CeilingLookup::Invalid(why) | CeilingLookup::Unreachable(why) => tracing::warn!(
                    namespace = %owner.namespace, pod = %owner.pod, reason = %why,
                    "tencent.com/vcuda-core-limit not used; default_core_ceiling applies"
                ),
            }
        }
    }
}
