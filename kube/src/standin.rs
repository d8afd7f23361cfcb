//! A stand-in API server for tests: plain HTTP/1.1 on 127.0.0.1 only, serving the few
//! endpoints vgpu-shim calls, at their real paths and with their real JSON:
//!
//! * `GET|POST /apis/resource.k8s.io/v1/resourceslices` (list with `fieldSelector`,
//!   `watch=true` as a stream of watch events), `PUT|DELETE .../resourceslices/<name>`
//!   (`resourceVersion` conflicts give 409, immutable fields 422);
//! * `GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>`;
//! * `GET /api/v1/namespaces/<ns>/pods/<name>`, `GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`;
//! * `POST /apis/events.k8s.io/v1/namespaces/<ns>/events` (409 for a name taken),
//!   `GET` of the same path lists them.
//!
//! Every object written is parsed with k8s-openapi's type first (400 when it does not
//! parse). Errors are `metav1.Status` bodies, as kube-rs expects. It is no
//! kube-apiserver: no authentication, no admission, no field validation beyond that.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::task::JoinSet;

type Body = BoxBody<Bytes, Infallible>;

#[derive(Default)]
struct Store {
    slices: BTreeMap<String, Value>,
    claims: BTreeMap<(String, String), Value>,
    pods: BTreeMap<(String, String), Value>,
    k8s_events: BTreeMap<(String, String), Value>,
    resource_version: u64,
    requests: Vec<String>,
    down: bool,
}

struct Inner {
    store: Mutex<Store>,
    /// Watch events of slices: `{"type": ..., "object": ...}`.
    events: broadcast::Sender<Value>,
}

impl Inner {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The running stand-in; stops when dropped.
pub struct StandInApiServer {
    address: SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StandInApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandInApiServer {
    /// Binds a free port on 127.0.0.1 and serves.
    pub async fn start() -> std::io::Result<StandInApiServer> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let inner = Arc::new(Inner {
            store: Mutex::new(Store::default()),
            events: broadcast::channel(256).0,
        });
        let shared = inner.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let inner = shared.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let inner = inner.clone();
                        async move { Ok::<_, Infallible>(handle(&inner, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(StandInApiServer {
            address,
            inner,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Stores a ResourceClaim (its namespace and name from its metadata).
    pub fn put_claim(&self, claim: Value) {
        let key = namespaced_key(&claim);
        let mut store = self.inner.store();
        let claim = stamp(&mut store, claim);
        store.claims.insert(key, claim);
    }

    /// Stores a Pod.
    pub fn put_pod(&self, pod: Value) {
        let key = namespaced_key(&pod);
        let mut store = self.inner.store();
        let pod = stamp(&mut store, pod);
        store.pods.insert(key, pod);
    }

    /// The ResourceSlices stored now, by name.
    pub fn slices(&self) -> Vec<Value> {
        self.inner.store().slices.values().cloned().collect()
    }

    /// Deletes a slice as another client would (a watch event follows).
    pub fn delete_slice(&self, name: &str) -> bool {
        let removed = self.inner.store().slices.remove(name);
        if let Some(object) = &removed {
            let _ = self
                .inner
                .events
                .send(json!({"type": "DELETED", "object": object}));
        }
        removed.is_some()
    }

    /// The Events (`events.k8s.io/v1`) created so far, by namespace and name.
    pub fn k8s_events(&self) -> Vec<Value> {
        self.inner.store().k8s_events.values().cloned().collect()
    }

    /// The Events once there are `count` of them, or those there are after `within`.
    pub async fn k8s_events_within(&self, count: usize, within: std::time::Duration) -> Vec<Value> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let events = self.k8s_events();
            if events.len() >= count || std::time::Instant::now() > deadline {
                return events;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Every request so far, as `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.inner.store().requests.clone()
    }

    /// While `down`, every request gets 503.
    pub fn set_down(&self, down: bool) {
        self.inner.store().down = down;
    }
}

fn namespaced_key(object: &Value) -> (String, String) {
    let text = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (text("/metadata/namespace"), text("/metadata/name"))
}

fn stamp(store: &mut Store, mut object: Value) -> Value {
    store.resource_version += 1;
    let version = store.resource_version.to_string();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(version.clone()));
        meta.entry("uid")
            .or_insert_with(|| Value::String(format!("standin-uid-{version}")));
        meta.entry("creationTimestamp")
            .or_insert_with(|| Value::String("2026-01-01T00:00:00Z".into()));
    }
    object
}

fn full(status: StatusCode, body: Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("header"));
    response
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    full(
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason,
            "code": code.as_u16(),
        }),
    )
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'+' => out.push(b' '),
            b'%' if at + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[at + 1..at + 3])
                    .ok()
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                {
                    Some(byte) => {
                        out.push(byte);
                        at += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        at += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(request: &Request<Incoming>) -> BTreeMap<String, String> {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

/// `a.b=x,c=y` against the object's fields `/a/b` and `/c`.
fn selected(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    selector.split(',').all(|term| {
        let Some((field, want)) = term.split_once('=') else {
            return false;
        };
        let pointer = format!("/{}", field.replace('.', "/"));
        object.pointer(&pointer).and_then(Value::as_str) == Some(want.trim_start_matches('='))
    })
}

fn list(kind: &str, version: u64, items: Vec<Value>) -> Response<Body> {
    full(
        StatusCode::OK,
        json!({
            "kind": kind, "apiVersion": if kind == "PodList" { "v1" } else { "resource.k8s.io/v1" },
            "metadata": {"resourceVersion": version.to_string()},
            "items": items,
        }),
    )
}

async fn handle(inner: &Arc<Inner>, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let params = query(&request);
    {
        let mut store = inner.store();
        store.requests.push(format!(
            "{method} {path}{}",
            request
                .uri()
                .query()
                .map(|q| format!("?{}", decode(q)))
                .unwrap_or_default()
        ));
        if store.down {
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the stand-in is down".into(),
            );
        }
    }
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => return status(StatusCode::BAD_REQUEST, "BadRequest", err.to_string()),
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        (Method::GET, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
            if params.get("watch").map(String::as_str) == Some("true") {
                return watch_slices(inner, params.get("fieldSelector").cloned());
            }
            let store = inner.store();
            let items = store
                .slices
                .values()
                .filter(|slice| selected(slice, params.get("fieldSelector")))
                .cloned()
                .collect();
            list("ResourceSliceList", store.resource_version, items)
        }
        (Method::POST, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
            write_slice(inner, None, &body)
        }
        (Method::PUT, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            write_slice(inner, Some(name), &body)
        }
        (Method::DELETE, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            let removed = inner.store().slices.remove(*name);
            match removed {
                Some(object) => {
                    let _ = inner
                        .events
                        .send(json!({"type": "DELETED", "object": object.clone()}));
                    full(StatusCode::OK, object)
                }
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("resourceslices.resource.k8s.io \"{name}\" not found"),
                ),
            }
        }
        (
            Method::GET,
            [
                "apis",
                "resource.k8s.io",
                "v1",
                "namespaces",
                ns,
                "resourceclaims",
                name,
            ],
        ) => {
            let found = inner
                .store()
                .claims
                .get(&(ns.to_string(), name.to_string()))
                .cloned();
            match found {
                Some(claim) => full(StatusCode::OK, claim),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            }
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => {
            let found = inner
                .store()
                .pods
                .get(&(ns.to_string(), name.to_string()))
                .cloned();
            match found {
                Some(pod) => full(StatusCode::OK, pod),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("pods \"{name}\" not found"),
                ),
            }
        }
        (Method::GET, ["api", "v1", "pods"]) => {
            let store = inner.store();
            let items = store
                .pods
                .values()
                .filter(|pod| selected(pod, params.get("fieldSelector")))
                .cloned()
                .collect();
            list("PodList", store.resource_version, items)
        }
        (Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            create_event(inner, ns, &body)
        }
        (Method::GET, ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            let store = inner.store();
            let items: Vec<Value> = store
                .k8s_events
                .iter()
                .filter(|((namespace, _), _)| namespace == ns)
                .map(|(_, event)| event.clone())
                .collect();
            full(
                StatusCode::OK,
                json!({
                    "kind": "EventList", "apiVersion": "events.k8s.io/v1",
                    "metadata": {"resourceVersion": store.resource_version.to_string()},
                    "items": items,
                }),
            )
        }
        (method, _) => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the stand-in does not serve {method} {path}"),
        ),
    }
}

/// Creates an Event in `ns`: parsed as k8s-openapi's type, in the path's namespace,
/// with a name (409 when taken), a `regarding` object, a `reason` and a `note` within
/// the API server's 1 KiB.
fn create_event(inner: &Arc<Inner>, ns: &str, body: &Bytes) -> Response<Body> {
    use k8s_openapi::api::events::v1::Event;
    let object: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(err) => return status(StatusCode::BAD_REQUEST, "BadRequest", err.to_string()),
    };
    let event: Event = match serde_json::from_value(object.clone()) {
        Ok(event) => event,
        Err(err) => return status(StatusCode::BAD_REQUEST, "BadRequest", err.to_string()),
    };
    let name = event.metadata.name.clone().unwrap_or_default();
    let problems: Vec<&str> = [
        (name.is_empty(), "metadata.name: required"),
        (
            event.metadata.namespace.as_deref().is_some_and(|n| n != ns),
            "metadata.namespace: does not match the request",
        ),
        (event.regarding.is_none(), "regarding: required"),
        (event.reason.is_none(), "reason: required"),
        (event.event_time.is_none(), "eventTime: required"),
        (
            event.note.as_ref().is_some_and(|note| note.len() > 1024),
            "note: must have at most 1024 bytes",
        ),
        (
            !matches!(event.type_.as_deref(), Some("Normal" | "Warning")),
            "type: must be Normal or Warning",
        ),
    ]
    .into_iter()
    .filter_map(|(bad, why)| bad.then_some(why))
    .collect();
    if !problems.is_empty() {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            problems.join("; "),
        );
    }
    let mut store = inner.store();
    let key = (ns.to_string(), name.clone());
    if store.k8s_events.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("events.events.k8s.io \"{name}\" already exists"),
        );
    }
    let object = stamp(&mut store, object);
    store.k8s_events.insert(key, object.clone());
    full(StatusCode::CREATED, object)
}

fn write_slice(inner: &Arc<Inner>, name: Option<&str>, body: &Bytes) -> Response<Body> {
    let mut object: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(err) => return status(StatusCode::BAD_REQUEST, "BadRequest", err.to_string()),
    };
    if let Err(err) = serde_json::from_value::<ResourceSlice>(object.clone()) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("not a ResourceSlice: {err}"),
        );
    }
    let object_name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if object_name.is_empty() || name.is_some_and(|name| name != object_name) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "metadata.name is missing or differs from the path".into(),
        );
    }
    // The server stamps the time of taints that have none.
    if let Some(devices) = object
        .pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
    {
        for taint in devices
            .iter_mut()
            .filter_map(|device| device.get_mut("taints").and_then(Value::as_array_mut))
            .flatten()
        {
            if let Some(taint) = taint.as_object_mut() {
                taint
                    .entry("timeAdded")
                    .or_insert_with(|| Value::String("2026-01-01T00:00:00Z".into()));
            }
        }
    }
    let mut store = inner.store();
    let existing = store.slices.get(&object_name).cloned();
    let event = match (name, &existing) {
        (None, Some(_)) => {
            return status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("resourceslices.resource.k8s.io \"{object_name}\" already exists"),
            );
        }
        (Some(_), None) => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("resourceslices.resource.k8s.io \"{object_name}\" not found"),
            );
        }
        (Some(_), Some(old)) => {
            let sent = object.pointer("/metadata/resourceVersion").cloned();
            if sent.is_some() && sent.as_ref() != old.pointer("/metadata/resourceVersion") {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{object_name}\": the object has been modified"
                    ),
                );
            }
            for immutable in ["/spec/driver", "/spec/nodeName", "/spec/pool/name"] {
                if object.pointer(immutable) != old.pointer(immutable) {
                    return status(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        format!("{immutable}: field is immutable"),
                    );
                }
            }
            if let (Some(meta), Some(uid)) = (
                object.get_mut("metadata").and_then(Value::as_object_mut),
                old.pointer("/metadata/uid"),
            ) {
                meta.insert("uid".into(), uid.clone());
            }
            "MODIFIED"
        }
        (None, None) => "ADDED",
    };
    let object = stamp(&mut store, object);
    store.slices.insert(object_name, object.clone());
    drop(store);
    let _ = inner
        .events
        .send(json!({"type": event, "object": object.clone()}));
    full(
        if event == "ADDED" {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        object,
    )
}

fn watch_slices(inner: &Arc<Inner>, selector: Option<String>) -> Response<Body> {
    let receiver = inner.events.subscribe();
    let initial: Vec<Value> = inner
        .store()
        .slices
        .values()
        .filter(|slice| selected(slice, selector.as_ref()))
        .map(|slice| json!({"type": "ADDED", "object": slice}))
        .collect();
    let stream = futures_util::stream::unfold(
        (initial.into_iter(), receiver, selector),
        |(mut initial, mut receiver, selector)| async move {
            if let Some(event) = initial.next() {
                return Some((line(&event), (initial, receiver, selector)));
            }
            loop {
                match receiver.recv().await {
                    Ok(event) => {
                        if selected(&event["object"], selector.as_ref()) {
                            return Some((line(&event), (initial, receiver, selector)));
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        },
    );
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("header"));
    response
}

fn line(event: &Value) -> Result<Frame<Bytes>, Infallible> {
    Ok(Frame::data(Bytes::from(format!("{event}\n"))))
}
