//! Client construction: in the cluster (the pod's service account), from a kubeconfig
//! file, or against a plain-HTTP URL (the tests' stand-in API server on loopback).

use std::path::PathBuf;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Where the API server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientSource {
    /// The service account of the pod (`KUBERNETES_SERVICE_HOST`, the mounted token),
    /// else `KUBECONFIG` / `~/.kube/config`: kube-rs's own inference.
    Infer,
    /// A kubeconfig file, its current context.
    Kubeconfig(PathBuf),
    /// A URL with no credentials (tests only: `http://127.0.0.1:PORT`).
    Url(String),
}

/// How long one API call may take before it counts as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A client for `source`.
pub async fn connect(source: &ClientSource) -> anyhow::Result<kube::Client> {
    let mut config = match source {
        ClientSource::Infer => kube::Config::infer()
            .await
            .map_err(|err| anyhow::anyhow!("cannot find the API server: {err}"))?,
        ClientSource::Kubeconfig(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))?
        }
        ClientSource::Url(url) => {
            let uri: http::Uri = url
                .parse()
                .map_err(|err| anyhow::anyhow!("`{url}` is not a URL: {err}"))?;
            if uri.scheme_str() != Some("http") {
                anyhow::bail!(
                    "`{url}`: an API server URL is plain HTTP only (the tests' stand-in); reach a real one through the service account or a kubeconfig"
                );
            }
            let mut config = kube::Config::new(uri);
            // Plain HTTP: nothing to trust, so an empty set of roots. Without it kube-rs
            // looks for the system's CA certificates, and a machine with none (no
            // ca-certificates package) fails to build even this client.
            config.root_cert = Some(Vec::new());
            config
        }
    };
    config.connect_timeout = Some(CALL_TIMEOUT);
    config.read_timeout = Some(Duration::from_secs(300));
    config.write_timeout = Some(CALL_TIMEOUT);
    // kube-rs retries 429/503/504 up to 15 times with delays of up to 1000s: too long
    // for kubelet's calls, which have their own deadlines and retry themselves.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|err| anyhow::anyhow!("cannot build a client: {err}"))
}
