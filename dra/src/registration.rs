//! The pluginregistration v1 Registration service that kubelet's plugin watcher calls
//! on `<plugins_registry>/<driver>-reg.sock`: GetInfo names a `DRAPlugin`, its DRA
//! socket and the services it serves (`v1.DRAPlugin`, `v1beta1.DRAPlugin`);
//! NotifyRegistrationStatus reports kubelet's verdict, which is logged and counted.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::{Request, Response, Status};

use vgpu_kubelet_api::registration::registration_server::Registration;
use vgpu_kubelet_api::registration::{
    DRA_PLUGIN_TYPE, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use vgpu_kubelet_api::{dra_v1, dra_v1beta1};

/// What kubelet said about registration.
#[derive(Default)]
pub struct RegistrationBook {
    /// NotifyRegistrationStatus calls with `plugin_registered: true`: one per successful
    /// registration (kubelet's plugin watcher registers again after it restarts or the
    /// socket is served anew).
    pub accepted: AtomicU64,
    /// NotifyRegistrationStatus calls with `plugin_registered: false` (kubelet refused the
    /// plugin; its `error` is logged).
    pub refused: AtomicU64,
    /// Woken by every NotifyRegistrationStatus, so that the supervisor's next pass (and
    /// `/healthz`) sees a registration at once rather than at its next tick.
    pub changed: tokio::sync::Notify,
}

/// The Registration service.
pub(crate) struct RegistrationService {
    pub driver: String,
    pub endpoint: PathBuf,
    pub book: Arc<RegistrationBook>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: DRA_PLUGIN_TYPE.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: vec![dra_v1::SERVICE.into(), dra_v1beta1::SERVICE.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            self.book.accepted.fetch_add(1, Ordering::Relaxed);
            tracing::info!(driver = %self.driver, "kubelet registered the DRA plugin");
        } else {
            self.book.refused.fetch_add(1, Ordering::Relaxed);
            tracing::error!(driver = %self.driver, error = %status.error, "kubelet refused the DRA plugin");
        }
        self.book.changed.notify_one();
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
