//! The DRA driver's `/metrics` and `/healthz` (the device plugin's hardened HTTP
//! server), and the node's compute coordination the driver runs, against hostile
//! tenants: idle connections that the server must close, and a prepared request whose
//! every slot claims work at `u64::MAX` (one steady log line, not one per slot and tick).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use vgpu_contract::Config;
use vgpu_contract::limiter_words::slot as words;
use vgpu_contract::process::Identity;
use vgpu_contract::region::{MAX_SLOTS, Region};
use vgpu_dra::cards::NvmlDetails;
use vgpu_kube::standin::StandInApiServer;
use vgpu_node_agent::devices::{DeviceSource, NvmlSource};

const GIB: u64 = 1 << 30;

/// Everything the driver logs, kept for the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_healthz_are_served_and_hold_up_against_hostile_tenants() {
    let Some(sim) = sim_library() else { return };
    let captured = Captured::default();
    let writer = captured.clone();
    let _ = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .try_init();
    let server = StandInApiServer::start().await.expect("stand-in");
    let kubelet = TestKubelet::new();
    let config = kubelet.config(&server.url());
    let source: Arc<dyn DeviceSource> =
        Arc::new(NvmlSource::open(&sim).expect("NVML over the sim"));
    let details = Arc::new(NvmlDetails::open(&sim).expect("details"));
    let plugin = vgpu_dra::start(config.clone(), source, details)
        .await
        .expect("start");
    let info = kubelet.register().await;
    assert_eq!(plugin.registration().accepted.load(Ordering::Relaxed), 1);
    let address = plugin.metrics_address().expect("metrics served");

    // A claim of 60 cores and 4 GiB, prepared.
    let slices = parsed_slices(&wait_slices(&server, |s| s.len() == 1).await);
    let placement = Scheduler::default()
        .place(&slices, Some(60), Some(4 * GIB))
        .expect("fits");
    let uid = "33333333-cccc-4ccc-8ccc-000000000060";
    put_reserved_claim(
        &server,
        ("team", "train", uid),
        &placement,
        ("trainer", "pod-a"),
    );
    let mut v1 = kubelet.v1(&info.endpoint).await;
    prepare(&mut v1, claim("team", "train", uid))
        .await
        .expect("prepared");
    let request = plugin.preparer().prepared()[uid].requests[0].clone();
    let dir = plugin.preparer().allocation_dir(&request.container_id);
    let uuid = Config::load(&dir.join("vgpu.yaml"))
        .expect("config")
        .devices[0]
        .uuid
        .clone()
        .expect("uuid");

    let (code, body) = http_get(address, "/healthz").expect("healthz");
    assert_eq!(code, 200, "{body}");
    let (code, metrics) = http_get(address, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    let labels = format!(r#"namespace="team",claim="train",request="gpu",UUID="{uuid}""#);
    assert!(
        metrics.contains(&format!("vgpu_container_core_limit{{{labels}}} 60")),
        "{metrics}"
    );
    assert!(metrics.contains("vgpu_dra_prepared_claims 1"), "{metrics}");
    assert!(
        metrics.contains(&format!(
            "vgpu_container_memory_limit_bytes{{{labels}}} {}",
            4 * GIB
        )),
        "{metrics}"
    );

    // What the quota did, as the shim counts it in the region: refusals, throttling.
    {
        let region = Region::open_existing(&dir.join("usage.region")).expect("region");
        region.count_refusal(0, GIB, 3 * GIB);
        region.count_refusal(0, GIB, 3 * GIB);
        region.add_throttled(0, 1_500_000_000);
    }
    let (_, metrics) = http_get(address, "/metrics").expect("metrics");
    for (name, value) in [
        ("vgpu_container_memory_refusals_total", "2"),
        ("vgpu_container_memory_refused_bytes_total", "2147483648"),
        ("vgpu_container_throttled_seconds_total", "1.5"),
        ("vgpu_container_memory_over_quota_total", "0"),
    ] {
        assert!(
            metrics.contains(&format!("{name}{{{labels}}} {value}\n")),
            "{name} {value}: {metrics}"
        );
    }

    // The tenant stamps every slot of its region at u64::MAX.
    let region = Region::open_existing(&dir.join("usage.region")).expect("region");
    for pid in 1..=MAX_SLOTS as i32 {
        let identity = Identity {
            pid,
            start_time: 7000 + pid as u64,
            pid_ns: 4026532999,
        };
        let slot = region.attach(&identity).expect("attach");
        region.slot_limiter(slot, 0)[words::ACTIVE_NS].store(u64::MAX, Ordering::SeqCst);
    }
    // And 300 idle connections to the metrics port.
    let mut held: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok())
        .collect();
    let started = Instant::now();
    tokio::time::sleep(vgpu_node_agent::http::HEADER_TIMEOUT + Duration::from_secs(1)).await;
    let mut still_open = 0;
    for stream in &mut held {
        stream
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("timeout");
        let mut bytes = [0u8; 64];
        let open = matches!(stream.read(&mut bytes), Err(err) if err.kind() == std::io::ErrorKind::WouldBlock);
        still_open += usize::from(open);
    }
    assert_eq!(still_open, 0, "idle connections are closed by the server");
    assert_eq!(
        http_get(address, "/healthz").map(|(code, _)| code),
        Some(200)
    );
    let log = captured.text();
    let future = log
        .lines()
        .filter(|line| line.contains("in the future"))
        .count();
    eprintln!(
        "after {:?}: {future} 'in the future' lines, {} bytes of log in all",
        started.elapsed(),
        log.len()
    );
    assert_eq!(future, 1, "one steady line: {log}");
    plugin.stop().await;
}
