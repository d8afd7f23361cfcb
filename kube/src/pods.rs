//! gpu-manager's soft ceiling annotation, `tencent.com/vcuda-core-limit`, read from the
//! one pod that asks (a GET of `namespace/name`, checked to be bound to this node), or
//! from every pod of the node (a list with the field selector `spec.nodeName=<node>`).
//!
//! The fallback is explicit: [`CeilingLookup::or_default`] turns "no annotation",
//! "annotation not 1-100" and "API server unreachable" into the operator's default
//! ceiling (the plugin's `default_core_ceiling`), so a pod never fails to start because
//! the API server is away; only the first two are the pod's own doing, and all three
//! are logged by the caller.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use vgpu_contract::{CoreMode, DeviceQuota};

/// The annotation.
pub const CORE_LIMIT_ANNOTATION: &str = "tencent.com/vcuda-core-limit";

/// How long a PreStart or prepare path waits for the API server.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The ceiling a pod asks for: `Ok(None)` without the annotation, an error naming the
/// value when it is not a whole number in 1-100.
pub fn core_ceiling_of(pod: &Pod) -> Result<Option<u32>, String> {
    let Some(text) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(CORE_LIMIT_ANNOTATION))
    else {
        return Ok(None);
    };
    match text.trim().parse::<u32>() {
        Ok(value) if (1..=100).contains(&value) => Ok(Some(value)),
        _ => Err(format!(
            "{CORE_LIMIT_ANNOTATION}: `{text}` is not a whole number in 1-100"
        )),
    }
}

/// gpu-manager's rule for a ceiling: a partial share (1-99 cores) becomes `soft` with
/// `core_ceiling = max(ceiling, its cores)`; a whole card (no core limit) is left alone.
pub fn apply_ceiling(device: &mut DeviceQuota, ceiling: u32) {
    if let Some(cores) = device.effective_core_limit() {
        device.core_mode = CoreMode::Soft;
        device.core_ceiling = Some(ceiling.max(cores));
    }
}

/// What a lookup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CeilingLookup {
    /// The pod asks for this ceiling.
    Set(u32),
    /// The pod has no annotation.
    Unset,
    /// The annotation is there but not 1-100.
    Invalid(String),
    /// The pod could not be read (API server down, pod gone, not on this node).
    Unreachable(String),
}

impl CeilingLookup {
    /// The ceiling to write: the pod's, else `default`.
    pub fn or_default(&self, default: Option<u32>) -> Option<u32> {
        match self {
            CeilingLookup::Set(value) => Some(*value),
            _ => default,
        }
    }

    /// Of a pod already read.
    pub fn of_pod(pod: &Pod) -> CeilingLookup {
        match core_ceiling_of(pod) {
            Ok(Some(value)) => CeilingLookup::Set(value),
            Ok(None) => CeilingLookup::Unset,
            Err(message) => CeilingLookup::Invalid(message),
        }
    }
}

/// Reads pods of one node.
#[derive(Clone)]
pub struct PodReader {
    client: kube::Client,
    node: Option<String>,
    timeout: Duration,
}

impl PodReader {
    /// A reader that only accepts pods bound to `node` (`None`: any pod).
    pub fn new(client: kube::Client, node: Option<&str>) -> PodReader {
        PodReader {
            client,
            node: node.map(str::to_string),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Gives up on the API server after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> PodReader {
        self.timeout = timeout;
        self
    }

    /// GETs one pod; an error when it cannot be read or is bound to another node.
    pub async fn get(&self, namespace: &str, name: &str) -> anyhow::Result<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = tokio::time::timeout(self.timeout, api.get(name))
            .await
            .map_err(|_| anyhow::anyhow!("reading pod {namespace}/{name} timed out"))?
            .map_err(|err| anyhow::anyhow!("cannot read pod {namespace}/{name}: {err}"))?;
        if let Some(node) = &self.node {
            let bound = pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref());
            if bound != Some(node.as_str()) {
                anyhow::bail!(
                    "pod {namespace}/{name} is bound to {}, not to this node ({node})",
                    bound.unwrap_or("no node")
                );
            }
        }
        Ok(pod)
    }

    /// Every pod bound to this node (a list with `spec.nodeName=<node>`).
    pub async fn list_on_node(&self) -> anyhow::Result<Vec<Pod>> {
        let node = self
            .node
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("no node name to select pods by"))?;
        let api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = tokio::time::timeout(self.timeout, api.list(&params))
            .await
            .map_err(|_| anyhow::anyhow!("listing the pods of {node} timed out"))?
            .map_err(|err| anyhow::anyhow!("cannot list the pods of {node}: {err}"))?;
        Ok(list.items)
    }

    /// The ceiling of `namespace/name`; with `uid`, only that incarnation of the pod.
    pub async fn core_ceiling(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> CeilingLookup {
        match self.get(namespace, name).await {
            Ok(pod) => {
                if let Some(uid) = uid
                    && pod.metadata.uid.as_deref() != Some(uid)
                {
                    return CeilingLookup::Unreachable(format!(
                        "pod {namespace}/{name} has UID {}, not {uid}",
                        pod.metadata.uid.as_deref().unwrap_or("none")
                    ));
                }
                CeilingLookup::of_pod(&pod)
            }
            Err(err) => CeilingLookup::Unreachable(format!("{err:#}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotation: Option<&str>) -> Pod {
        let mut json = serde_json::json!({"metadata": {"name": "p", "namespace": "ns"}});
        if let Some(value) = annotation {
            json["metadata"]["annotations"] = serde_json::json!({ CORE_LIMIT_ANNOTATION: value });
        }
        serde_json::from_value(json).expect("pod")
    }

    #[test]
    fn a_ceiling_softens_partial_shares_only() {
        let mut partial = DeviceQuota::unlimited_index(0);
        partial.core_limit = Some(60);
        apply_ceiling(&mut partial, 40);
        assert_eq!(
            (partial.core_mode, partial.core_ceiling),
            (CoreMode::Soft, Some(60))
        );
        apply_ceiling(&mut partial, 90);
        assert_eq!(partial.core_ceiling, Some(90));
        let mut whole = DeviceQuota::unlimited_index(0);
        apply_ceiling(&mut whole, 50);
        assert_eq!(
            (whole.core_mode, whole.core_ceiling),
            (CoreMode::Hard, None)
        );
    }

    #[test]
    fn the_annotation_is_read_and_checked() {
        assert_eq!(
            CeilingLookup::of_pod(&pod(Some("50"))),
            CeilingLookup::Set(50)
        );
        assert_eq!(CeilingLookup::of_pod(&pod(None)), CeilingLookup::Unset);
        for bad in ["0", "101", "fifty", "-5", ""] {
            assert!(
                matches!(
                    CeilingLookup::of_pod(&pod(Some(bad))),
                    CeilingLookup::Invalid(_)
                ),
                "{bad}"
            );
        }
        assert_eq!(CeilingLookup::Set(50).or_default(Some(80)), Some(50));
        assert_eq!(CeilingLookup::Unset.or_default(Some(80)), Some(80));
        assert_eq!(
            CeilingLookup::Unreachable("down".into()).or_default(None),
            None
        );
    }
}
