//! The kubelet gRPC APIs of a DRA plugin, generated at build time from the vendored
//! protos in `dra/proto/` (clients and servers both).

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
