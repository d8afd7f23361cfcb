//! The kubelet gRPC APIs, generated at build time from the vendored protos in
//! `plugin/proto/` (clients and servers both).

/// `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`.
pub mod deviceplugin {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("v1beta1");

    /// The API version this plugin speaks (`RegisterRequest.version`).
    pub const VERSION: &str = "v1beta1";
    /// `Device.health` of a usable device.
    pub const HEALTHY: &str = "Healthy";
    /// `Device.health` of a device that must not be handed out.
    pub const UNHEALTHY: &str = "Unhealthy";
}

/// `k8s.io/kubelet/pkg/apis/podresources/v1`.
pub mod podresources {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("v1");
}
