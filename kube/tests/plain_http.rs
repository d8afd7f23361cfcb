//! A client of a plain-HTTP API server (the tests' stand-in) needs no trust store: on a
//! machine without CA certificates (no `ca-certificates` package, as a fresh machine
//! with only the Rust toolchain) it is built and answers all the same. That machine is
//! this test binary run again with rustls' certificate lookup pointed at nothing
//! (`SSL_CERT_FILE`, `SSL_CERT_DIR`); it first shows that a TLS client cannot be built
//! there, so the test judges the machine it claims to.

use std::process::Command;

use vgpu_kube::claims::{ClaimError, read_claim};
use vgpu_kube::standin::StandInApiServer;
use vgpu_kube::{ClientSource, connect};

/// Set in the child's environment: it runs the client instead of the test.
const CHILD: &str = "VGPU_KUBE_NO_CA_CHILD";
const TEST: &str = "a_plain_http_client_is_built_and_answers_on_a_machine_without_ca_certificates";

/// The child: no CA certificate can be found here.
async fn without_ca_certificates() {
    let tls = kube::Client::try_from(kube::Config::new(
        "https://127.0.0.1:1".parse().expect("uri"),
    ));
    let err = tls.err().map(|err| err.to_string()).unwrap_or_default();
    assert!(
        err.contains("No CA certificates"),
        "this machine has CA certificates after all: {err:?}"
    );
    let server = StandInApiServer::start().await.expect("stand-in");
    let client = connect(&ClientSource::Url(server.url()))
        .await
        .expect("a plain-HTTP client without CA certificates");
    assert!(matches!(
        read_claim(client, "gpu.example.io", "team", "missing", "x").await,
        Err(ClaimError::NotFound { .. })
    ));
    let https = connect(&ClientSource::Url("https://127.0.0.1:1".into())).await;
    let refused = https.err().map(|err| err.to_string()).unwrap_or_default();
    assert!(refused.contains("plain HTTP only"), "{refused:?}");
}

#[tokio::test]
async fn a_plain_http_client_is_built_and_answers_on_a_machine_without_ca_certificates() {
    if std::env::var_os(CHILD).is_some() {
        without_ca_certificates().await;
        return;
    }
    let output = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", TEST, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .env("SSL_CERT_FILE", "/nonexistent/vgpu-no-ca-certificates.pem")
        .env("SSL_CERT_DIR", "/nonexistent/vgpu-no-ca-certificates")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test: {stdout}"
    );
}
