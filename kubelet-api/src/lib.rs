//! vgpu-kubelet-api: the kubelet gRPC APIs both host daemons speak, generated at build
//! time from the protos vendored in `kubelet-api/proto/` (clients and servers both), so
//! each proto is compiled once in the workspace:
//!
//! * [`deviceplugin`] and [`podresources`]: the device plugin (`vgpu-plugin`);
//! * [`dra_v1`], [`dra_v1beta1`] and [`registration`]: the DRA driver (`vgpu-dra-plugin`).
//!
//! The tests use the same modules to play kubelet.

#![forbid(unsafe_code)]

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

/// `k8s.io/kubelet/pkg/apis/dra/v1`.
pub mod dra_v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");

    /// What registration lists for this service (`supported_versions`).
    pub const SERVICE: &str = "v1.DRAPlugin";
}

/// `k8s.io/kubelet/pkg/apis/dra/v1beta1`.
pub mod dra_v1beta1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");

    /// What registration lists for this service (`supported_versions`).
    pub const SERVICE: &str = "v1beta1.DRAPlugin";
}

/// `k8s.io/kubelet/pkg/apis/pluginregistration/v1`.
pub mod registration {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("pluginregistration");

    /// `PluginInfo.type` of a DRA plugin.
    pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
}
