//! The ResourceClaim reader: what the scheduler allocated from this driver for a claim
//! (`status.allocation.devices.results[]` with their `consumedCapacity`), and the pods
//! the claim is reserved for (`status.reservedFor`).

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;

use crate::quantity;

/// One allocated share of a card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatedShare {
    /// The request (`name`, or `name/subrequest`).
    pub request: String,
    /// The result's `pool`: the ResourceSlice pool the device came from (this driver
    /// names its pool after the node).
    pub pool: String,
    /// The result's `device`: the slice's device name (`gpu-<index>`).
    pub device: String,
    /// The result's `shareID`: set by the scheduler when it allocated one share of a
    /// multi-allocatable device (KEP-5075), unique among that device's shares; `None`
    /// where the device was allocated whole.
    pub share_id: Option<String>,
    /// Consumed `cores`; `None` where the allocation carries no consumed capacity (a
    /// cluster without consumable capacity allocates the device whole).
    pub cores: Option<u64>,
    /// Consumed `memory`, bytes; `None` as for `cores`.
    pub memory: Option<u64>,
}

/// A pod a claim is reserved for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// The consumer's `name` in `status.reservedFor` (the pod, in the claim's namespace).
    pub name: String,
    /// The consumer's `uid`: tells this pod from a later one of the same name.
    pub uid: String,
}

/// What a claim holds from this driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimAllocation {
    /// The claim's `metadata.namespace`.
    pub namespace: String,
    /// The claim's `metadata.name`.
    pub name: String,
    /// The claim's `metadata.uid`, checked equal to the one kubelet asked for.
    pub uid: String,
    /// This driver's entries of `status.allocation.devices.results`, in their order;
    /// results of other drivers are left out.
    pub shares: Vec<AllocatedShare>,
    /// The pods of `status.reservedFor` (consumers of another resource are left out);
    /// empty until the scheduler reserves the claim.
    pub pods: Vec<PodRef>,
}

/// Why a claim could not be read.
///
/// Every variant names the claim (`namespace`, `name`) so the message can be handed back
/// to kubelet as it is.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The API server answered 404: the claim was deleted (or never existed).
    #[error("ResourceClaim {namespace}/{name} not found")]
    NotFound {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
    },
    /// The claim of that name is another object than the one kubelet prepares.
    #[error(
        "ResourceClaim {namespace}/{name} has UID {found}, kubelet asked for {wanted} (the claim was replaced)"
    )]
    UidMismatch {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The `metadata.uid` the API server holds (empty if it has none).
        found: String,
        /// The UID kubelet named in its request.
        wanted: String,
    },
    /// The claim has no `status.allocation.devices.results` yet.
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
    },
    /// The allocation is malformed (e.g. a `consumedCapacity` that is not a whole
    /// quantity).
    #[error("ResourceClaim {namespace}/{name}: {message}")]
    Invalid {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// What is wrong, naming the request, device and field.
        message: String,
    },
    /// The GET failed for another reason than 404 (connection, auth, server error);
    /// worth retrying.
    #[error("cannot read ResourceClaim {namespace}/{name}: {message}")]
    Unreachable {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The client's error.
        message: String,
    },
}

/// GETs the claim and extracts this driver's part of its allocation.
pub async fn read_claim(
    client: kube::Client,
    driver: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<ClaimAllocation, ClaimError> {
    let api: Api<ResourceClaim> = Api::namespaced(client, namespace);
    let claim = match api.get(name).await {
        Ok(claim) => claim,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(ClaimError::NotFound {
                namespace: namespace.into(),
                name: name.into(),
            });
        }
        Err(err) => {
            return Err(ClaimError::Unreachable {
                namespace: namespace.into(),
                name: name.into(),
                message: err.to_string(),
            });
        }
    };
    allocation_of(&claim, driver, namespace, name, uid)
}

/// This driver's part of a claim already read.
pub fn allocation_of(
    claim: &ResourceClaim,
    driver: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<ClaimAllocation, ClaimError> {
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != uid {
        return Err(ClaimError::UidMismatch {
            namespace: namespace.into(),
            name: name.into(),
            found,
            wanted: uid.into(),
        });
    }
    let status = claim.status.as_ref();
    let results = status
        .and_then(|status| status.allocation.as_ref())
        .and_then(|allocation| allocation.devices.as_ref())
        .and_then(|devices| devices.results.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated {
            namespace: namespace.into(),
            name: name.into(),
        })?;
    let invalid = |message: String| ClaimError::Invalid {
        namespace: namespace.into(),
        name: name.into(),
        message,
    };
    let mut shares = Vec::new();
    for result in results.iter().filter(|result| result.driver == driver) {
        let consumed = result.consumed_capacity.as_ref();
        let read = |key: &str| -> Result<Option<u64>, ClaimError> {
            consumed
                .and_then(|capacity| capacity.get(key))
                .map(|value| {
                    quantity::whole(value).map_err(|why| {
                        invalid(format!(
                            "request {} device {}: consumedCapacity.{key}: {why}",
                            result.request, result.device
                        ))
                    })
                })
                .transpose()
        };
        shares.push(AllocatedShare {
            request: result.request.clone(),
            pool: result.pool.clone(),
            device: result.device.clone(),
            share_id: result.share_id.clone(),
            cores: read("cores")?,
            memory: read("memory")?,
        });
    }
    let pods = status
        .and_then(|status| status.reserved_for.as_ref())
        .map(|consumers| {
            consumers
                .iter()
                .filter(|consumer| {
                    consumer.resource == "pods"
                        && consumer.api_group.as_deref().unwrap_or("").is_empty()
                })
                .map(|consumer| PodRef {
                    name: consumer.name.clone(),
                    uid: consumer.uid.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(ClaimAllocation {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
        shares,
        pods,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(json: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json).expect("claim JSON")
    }

    #[test]
    fn reads_consumed_capacity_and_the_reserving_pod() {
        let claim = claim(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": "gpu.example", "pool": "n", "device": "gpu-1",
                     "shareID": "s1", "consumedCapacity": {"cores": "30", "memory": "2560Mi"}},
                    {"request": "nic", "driver": "other.example", "pool": "n", "device": "eth0"}
                ]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}]
            }
        }));
        let got = allocation_of(&claim, "gpu.example", "ns", "c", "u-1").expect("allocation");
        assert_eq!(got.shares.len(), 1);
        assert_eq!(got.shares[0].cores, Some(30));
        assert_eq!(got.shares[0].memory, Some(2560 << 20));
        assert_eq!(got.shares[0].share_id.as_deref(), Some("s1"));
        assert_eq!(
            got.pods,
            vec![PodRef {
                name: "p".into(),
                uid: "pod-1".into()
            }]
        );
        assert!(matches!(
            allocation_of(&claim, "gpu.example", "ns", "c", "u-2"),
            Err(ClaimError::UidMismatch { .. })
        ));
    }

    #[test]
    fn unallocated_and_bad_quantities_are_errors() {
        let pending = claim(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "spec": {"devices": {"requests": []}}
        }));
        assert!(matches!(
            allocation_of(&pending, "d", "ns", "c", "u"),
            Err(ClaimError::NotAllocated { .. })
        ));
        let bad = claim(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "d", "pool": "n", "device": "gpu-0",
                 "consumedCapacity": {"cores": "30m"}}
            ]}}}
        }));
        let err = allocation_of(&bad, "d", "ns", "c", "u")
            .unwrap_err()
            .to_string();
        assert!(err.contains("consumedCapacity.cores"), "{err}");
    }
}
