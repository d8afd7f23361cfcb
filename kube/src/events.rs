//! Kubernetes Events (`events.k8s.io/v1`) on a tenant's pod: what the quota did to it
//! (an allocation refused, the container found over its quota), so that
//! `kubectl describe pod` and `kubectl get events` tell "my quota" from "a bug".
//!
//! One call, a `POST` of a new Event; the caller decides when (the device plugin's
//! refusal watch rate-limits per container and device). Each Event gets a name of its
//! own (`<pod>.vgpu.<nanoseconds>`), so a retry never overwrites another's.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// The `reportingController` of the device plugin's Events (the DRA driver reports as
/// its driver name).
pub const PLUGIN_REPORTER: &str = "tencent.com/vgpu-plugin";
/// The reason of an Event for an allocation refused at the memory quota.
pub const REASON_REFUSED: &str = "GPUMemoryQuotaRefused";
/// The reason of an Event for a container found over its memory quota.
pub const REASON_OVER_QUOTA: &str = "GPUMemoryOverQuota";
/// The API server's limit on `note`.
pub const MAX_NOTE_BYTES: usize = 1024;

/// The pod an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID, when known (kubectl matches Events to the pod by it).
    pub uid: Option<String>,
}

/// One Event to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEvent {
    /// The pod.
    pub pod: PodRef,
    /// [`REASON_REFUSED`] or [`REASON_OVER_QUOTA`] (UpperCamelCase, as the API wants).
    pub reason: &'static str,
    /// What the reporter did (`Allocate`, `Account`).
    pub action: &'static str,
    /// The sentence a person reads; cut to [`MAX_NOTE_BYTES`].
    pub note: String,
    /// The node (the `reportingInstance` is `<reporter>-<node>`).
    pub node: String,
    /// Who reports it (the `reportingController`): [`PLUGIN_REPORTER`] or the DRA
    /// driver's name.
    pub reporter: String,
}

impl PodEvent {
    /// The Event object, stamped `now`.
    pub fn to_event(&self, now: Timestamp) -> Event {
        let mut note = self.note.clone();
        if note.len() > MAX_NOTE_BYTES {
            let mut end = MAX_NOTE_BYTES;
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            note.truncate(end);
        }
        Event {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.vgpu.{}",
                    self.pod.name,
                    now.as_nanosecond().unsigned_abs()
                )),
                namespace: Some(self.pod.namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(self.action.into()),
            reason: Some(self.reason.into()),
            note: Some(note),
            type_: Some("Warning".into()),
            reporting_controller: Some(self.reporter.clone()),
            reporting_instance: Some(format!("{}-{}", self.reporter, self.node)),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(self.pod.namespace.clone()),
                name: Some(self.pod.name.clone()),
                uid: self.pod.uid.clone(),
                ..ObjectReference::default()
            }),
            ..Event::default()
        }
    }
}

/// Writes `event` (a `create` of `events.k8s.io/v1`); the error says why not. Without
/// the pod's UID it reads the pod first for it (`kubectl describe pod` selects Events
/// by the pod's UID); a pod that cannot be read still gets the Event, by name.
pub async fn post(client: &kube::Client, event: &PodEvent) -> anyhow::Result<()> {
    let mut event = event.clone();
    if event.pod.uid.is_none() {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &event.pod.namespace);
        if let Ok(Ok(pod)) =
            tokio::time::timeout(crate::client::CALL_TIMEOUT, pods.get(&event.pod.name)).await
        {
            event.pod.uid = pod.metadata.uid;
        }
    }
    let api: Api<Event> = Api::namespaced(client.clone(), &event.pod.namespace);
    let object = event.to_event(Timestamp::now());
    tokio::time::timeout(
        crate::client::CALL_TIMEOUT,
        api.create(&PostParams::default(), &object),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the API server did not answer in time"))?
    .map_err(|err| anyhow::anyhow!("cannot write the Event: {err}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(note: &str) -> PodEvent {
        PodEvent {
            pod: PodRef {
                namespace: "team-a".into(),
                name: "trainer-0".into(),
                uid: Some("uid-1".into()),
            },
            reason: REASON_REFUSED,
            action: "Allocate",
            note: note.into(),
            node: "gpu-node-1".into(),
            reporter: PLUGIN_REPORTER.into(),
        }
    }

    #[test]
    fn events_name_the_pod_and_keep_the_note_within_the_api_limit() {
        let now = Timestamp::from_second(1_800_000_000).expect("time");
        let object = event(&"é".repeat(700)).to_event(now);
        let note = object.note.as_deref().expect("note");
        assert!(note.len() <= MAX_NOTE_BYTES && note.len() >= MAX_NOTE_BYTES - 1);
        let regarding = object.regarding.expect("regarding");
        assert_eq!(regarding.kind.as_deref(), Some("Pod"));
        assert_eq!(regarding.name.as_deref(), Some("trainer-0"));
        assert_eq!(regarding.uid.as_deref(), Some("uid-1"));
        assert_eq!(object.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            object.metadata.name.as_deref(),
            Some("trainer-0.vgpu.1800000000000000000")
        );
        assert_eq!(object.type_.as_deref(), Some("Warning"));
    }

    #[tokio::test]
    async fn the_stand_in_takes_an_event_and_refuses_a_second_of_the_same_name() {
        let server = crate::standin::StandInApiServer::start()
            .await
            .expect("stand-in");
        let client = crate::connect(&crate::ClientSource::Url(server.url()))
            .await
            .expect("client");
        server.put_pod(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "team-a", "name": "trainer-0", "uid": "pod-uid-7"},
        }));
        let mut unknown_uid = event("refused 2.0 GiB");
        unknown_uid.pod.uid = None;
        post(&client, &unknown_uid).await.expect("post");
        let stored = server.k8s_events();
        assert_eq!(
            stored[0]["regarding"]["uid"], "pod-uid-7",
            "read from the pod"
        );
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0]["reason"], REASON_REFUSED);
        assert_eq!(stored[0]["note"], "refused 2.0 GiB");
        assert_eq!(stored[0]["regarding"]["name"], "trainer-0");
        let api: Api<Event> = Api::namespaced(client.clone(), "team-a");
        let mut again = event("x").to_event(Timestamp::now());
        again.metadata.name = stored[0]["metadata"]["name"].as_str().map(String::from);
        assert!(
            api.create(&PostParams::default(), &again).await.is_err(),
            "a name taken is a conflict"
        );
        server.set_down(true);
        assert!(post(&client, &event("y")).await.is_err());
    }
}
