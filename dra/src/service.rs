//! The DRAPlugin service, v1 and v1beta1 (the same messages in two packages): each
//! claim of a request is prepared or unprepared on its own, and its failure is reported
//! in its own entry, as the API asks.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use vgpu_kube::claims::read_claim;
use vgpu_kube::pods::PodReader;

use crate::checkpoint::PreparedDevice;
use crate::config::DraConfig;
use crate::prepare::{ClaimRef, Preparer};
use vgpu_kubelet_api::{dra_v1, dra_v1beta1};

/// What both versions share.
pub struct DraService {
    pub config: DraConfig,
    pub preparer: Arc<Preparer>,
    pub client: Option<vgpu_kube::kube::Client>,
}

impl DraService {
    async fn prepare_one(&self, claim: ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        let pods = self
            .client
            .clone()
            .map(|client| PodReader::new(client, Some(self.config.node())));
        let client = self.client.clone();
        let driver = self.config.driver_name.clone();
        let wanted = claim.clone();
        let read = move || async move {
            let client = client.ok_or_else(|| "no API server client".to_string())?;
            read_claim(
                client,
                &driver,
                &wanted.namespace,
                &wanted.name,
                &wanted.uid,
            )
            .await
            .map_err(|err| err.to_string())
        };
        let result = self.preparer.prepare(&claim, read, pods.as_ref()).await;
        if let Err(err) = &result {
            tracing::warn!(namespace = %claim.namespace, claim = %claim.name, uid = %claim.uid, error = %err, "prepare failed");
        }
        result
    }

    /// Prepares every claim; `(uid, devices or error)`.
    pub async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> Vec<(String, Result<Vec<PreparedDevice>, String>)> {
        let mut answers = Vec::new();
        for claim in claims {
            let uid = claim.uid.clone();
            let answer =
                if claim.uid.is_empty() || claim.name.is_empty() || claim.namespace.is_empty() {
                    Err("the claim needs a namespace, a name and a UID".to_string())
                } else {
                    self.prepare_one(claim).await
                };
            answers.push((uid, answer));
        }
        answers
    }

    /// Unprepares every claim; `(uid, error if any)`.
    pub async fn unprepare(&self, uids: Vec<String>) -> Vec<(String, Result<(), String>)> {
        let mut answers = Vec::new();
        for uid in uids {
            let answer = self.preparer.unprepare(&uid).await;
            answers.push((uid, answer));
        }
        answers
    }
}

/// Generates one version's service from the shared one; the messages of both versions
/// have the same fields.
macro_rules! dra_version {
    ($module:ident, $server:ident) => {
        #[tonic::async_trait]
        impl $module::dra_plugin_server::DraPlugin for $server {
            async fn node_prepare_resources(
                &self,
                request: Request<$module::NodePrepareResourcesRequest>,
            ) -> Result<Response<$module::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|claim| ClaimRef {
                        namespace: claim.namespace,
                        name: claim.name,
                        uid: claim.uid,
                    })
                    .collect();
                let mut answer = HashMap::new();
                for (uid, result) in self.0.prepare(claims).await {
                    let entry = match result {
                        Ok(devices) => $module::NodePrepareResourceResponse {
                            devices: devices
                                .into_iter()
                                .map(|device| $module::Device {
                                    request_names: device.request_names,
                                    pool_name: device.pool_name,
                                    device_name: device.device_name,
                                    cdi_device_ids: device.cdi_device_ids,
                                })
                                .collect(),
                            error: String::new(),
                        },
                        Err(error) => $module::NodePrepareResourceResponse {
                            devices: Vec::new(),
                            error,
                        },
                    };
                    answer.insert(uid, entry);
                }
                Ok(Response::new($module::NodePrepareResourcesResponse {
                    claims: answer,
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$module::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$module::NodeUnprepareResourcesResponse>, Status> {
                let uids = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|claim| claim.uid)
                    .collect();
                let mut answer = HashMap::new();
                for (uid, result) in self.0.unprepare(uids).await {
                    answer.insert(
                        uid,
                        $module::NodeUnprepareResourceResponse {
                            error: result.err().unwrap_or_default(),
                        },
                    );
                }
                Ok(Response::new($module::NodeUnprepareResourcesResponse {
                    claims: answer,
                }))
            }
        }
    };
}

/// The v1 service.
pub struct DraV1(pub Arc<DraService>);
/// The v1beta1 service.
pub struct DraV1beta1(pub Arc<DraService>);

dra_version!(dra_v1, DraV1);
dra_version!(dra_v1beta1, DraV1beta1);
