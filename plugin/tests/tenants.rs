//! Hostile tenants against the running plugin: a flood of idle and slow connections on
//! the metrics port of the `vgpu-plugin` process (at a low descriptor limit), a region
//! whose every slot claims work at `u64::MAX` (the process's log and its coordination),
//! parallel scrapes racing the running totals, and counters of a two-card container
//! filed under the card they belong to.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{
    TestKubelet, allocate, host_path_of, http_get, http_get_from, list_ids, metric_value as value,
    plugin_client, sim_nvml, started_container, tenant,
};
use vgpu_contract::limiter_words::slot as words;
use vgpu_contract::process::Identity;
use vgpu_contract::region::{MAX_SLOTS, Region};
use vgpu_node_agent::devices::CardInfo;
use vgpu_node_agent::devices::FakeSource;

/// The plugin binary: this build's, or `VGPU_MEASURE_PLUGIN` (a release build, for
/// [`measure_a_plugin_binary`]).
fn plugin_binary() -> PathBuf {
    std::env::var_os("VGPU_MEASURE_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vgpu-plugin")))
}

/// A free TCP port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("port")
        .port()
}

/// The `vgpu-plugin` binary over the simulated driver (one card), against `kubelet`,
/// metrics on loopback (`--metrics-address`, as the DaemonSet passes the node's
/// address), its config checked every 100 ms; `open_files` limits its
/// descriptors. Its log goes to `<root>/plugin.log`.
struct Running {
    child: Child,
    log: PathBuf,
    metrics: SocketAddr,
}

impl Running {
    async fn start(kubelet: &TestKubelet, sim: &Path, open_files: Option<u32>) -> Running {
        let base = kubelet.plugin_config();
        let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let config = kubelet.root.path().join("plugin.yaml");
        std::fs::write(
            &config,
            format!(
                "device_plugin_dir: {}\npod_resources_socket: {}\nstate_dir: {}\nnvml_library: {}\nmetrics_address: null\nkubelet_watch_interval_ms: 50\nconfig_watch_interval_ms: 100\npod_annotations: false\ncheck_foreign_plugins: false\n",
                base.device_plugin_dir.display(),
                base.pod_resources_socket.display(),
                base.state_dir.display(),
                sim.display()
            ),
        )
        .expect("config");
        let log = kubelet.root.path().join("plugin.log");
        let limit = open_files.map_or(String::new(), |n| format!("ulimit -n {n} && "));
        let child = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{limit}exec \"$0\" --config \"$1\" --metrics-address \"$2\""
            ))
            .arg(plugin_binary())
            .arg(&config)
            .arg(metrics.to_string())
            .env("VGPU_SIM_GPUS", "1")
            .env("VGPU_SIM_STATE", kubelet.root.path().join("sim.state"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn vgpu-plugin");
        kubelet.wait_registrations(2).await;
        Running {
            child,
            log,
            metrics,
        }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |meta| meta.len())
    }

    /// (CPU seconds so far, resident KiB) of the plugin process.
    fn cpu_and_rss(&self) -> (f64, u64) {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|&n| fields.get(n).and_then(|v| v.parse::<u64>().ok()))
            .sum();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        (ticks as f64 / 100.0, rss)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Allocates and starts a container of `cores` and `memory` units on the card:
    /// its usage region on the host.
    async fn container(&self, kubelet: &TestKubelet, cores: usize, memory: usize) -> PathBuf {
        let sockets = kubelet.device_plugin_dir();
        let sockets = [
            sockets.join("vgpu-vcuda-core.sock"),
            sockets.join("vgpu-vcuda-memory.sock"),
        ];
        let response = started_container(kubelet, &sockets, cores, memory).await;
        PathBuf::from(host_path_of(&response, "/etc/vgpu/usage.region"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What [`launch_while_scraping`]'s process waits for its compute limit per launch.
const THROTTLED_NS: u64 = 1_000_000;

/// A process of `identity` in `region` launching kernels without pause (each counted
/// as throttled for [`THROTTLED_NS`] too) while five
/// scrapers scrape `address` without pause, for `how_long`: the launches it counted.
async fn launch_while_scraping(
    region: &Arc<Region>,
    identity: Identity,
    address: SocketAddr,
    how_long: Duration,
) -> u64 {
    let slot = region.attach(&identity).expect("attach");
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let launcher = {
        let (region, stop, counted) = (region.clone(), stop.clone(), counted.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                region.add_busy(slot, 0, 1000, 1);
                // And waits a millisecond for its compute limit each time.
                region.add_throttled(0, THROTTLED_NS);
                counted.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    };
    let scrapers: Vec<_> = (0..5u8)
        .map(|n| {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    http_get_from([127, 0, 0, 10 + n], address, "/metrics").await;
                }
            })
        })
        .collect();
    tokio::time::sleep(how_long).await;
    stop.store(true, Ordering::Relaxed);
    launcher.join().expect("launcher");
    for scraper in scrapers {
        scraper.await.expect("scraper");
    }
    counted.load(Ordering::Relaxed)
}

/// `GET /healthz` with a deadline: the status code, or `None` when no answer came.
fn healthz(address: SocketAddr, within: Duration) -> Option<u16> {
    let mut stream = TcpStream::connect_timeout(&address, within).ok()?;
    stream.set_read_timeout(Some(within)).ok()?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Waits (10 s at most) for `/healthz` at `address` to say 200: the plugin started.
fn wait_healthy(address: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while healthz(address, Duration::from_secs(1)) != Some(200) {
        assert!(Instant::now() < deadline, "/healthz never said 200");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Connects to `address` from `source` (a loopback address of its own: another pod, as
/// the server sees it).
async fn connect_from(source: [u8; 4], address: SocketAddr) -> Option<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind((source, 0).into()).ok()?;
    let stream = tokio::time::timeout(Duration::from_secs(1), socket.connect(address))
        .await
        .ok()?
        .ok()?;
    stream.into_std().ok()
}

/// How many of `held` the server still serves (a read would block, where a closed one
/// reads its end).
fn still_open(held: &mut [TcpStream]) -> usize {
    let mut open = 0;
    for stream in held.iter_mut() {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
        let mut bytes = [0u8; 512];
        let blocked = matches!(stream.read(&mut bytes), Err(err) if err.kind() == std::io::ErrorKind::WouldBlock);
        open += usize::from(blocked);
    }
    open
}

/// Descriptors the process `pid` holds.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_cannot_exhaust_or_stop_the_plugin() {
    let Some(sim) = sim_nvml("tenants") else {
        return;
    };
    let kubelet = TestKubelet::start().await;
    let mut plugin = Running::start(&kubelet, &sim, Some(128)).await;
    wait_healthy(plugin.metrics);
    let (cpu_before, _) = plugin.cpu_and_rss();
    // 300 connections from six other addresses (pods, as the server sees them): most
    // idle, every third sending half a header and then nothing.
    const FLOODERS: u8 = 6;
    let mut held: Vec<TcpStream> = Vec::new();
    for n in 0..300 {
        let source = [127, 0, 0, 2 + (n % usize::from(FLOODERS)) as u8];
        let Some(mut stream) = connect_from(source, plugin.metrics).await else {
            continue;
        };
        if n % 3 == 0 {
            let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
        }
        held.push(stream);
    }
    let opened = held.len();
    let flooded = Instant::now();
    // While they are held, the node's probe and kubelet's Allocate are answered at once.
    // (The old server served them all until its descriptors ran out: its accept loop
    // then spun, and its config watcher took a failed read for a removed file and
    // stopped the plugin; the server before this one served the first 40 and turned
    // every other client away, the probe included, until the flood timed out.)
    let probe = healthz(plugin.metrics, Duration::from_secs(2));
    let probed = flooded.elapsed();
    let region = plugin.container(&kubelet, 30, 4).await;
    assert!(
        region.exists(),
        "Allocate and PreStart answered during the flood"
    );
    let descriptors_held = descriptors(plugin.child.id());
    // The server keeps a few connections of each flooding address and closes the rest.
    let bound = usize::from(FLOODERS) * vgpu_node_agent::http::PER_PEER;
    let mut served = still_open(&mut held);
    while served > bound && flooded.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(100));
        served = still_open(&mut held);
    }
    // The held ones are closed by the server (header timeout).
    std::thread::sleep(vgpu_node_agent::http::HEADER_TIMEOUT + Duration::from_secs(1));
    let after_timeout = still_open(&mut held);
    let (cpu_after, _) = plugin.cpu_and_rss();
    let window = flooded.elapsed();
    eprintln!(
        "connections opened {opened} from {FLOODERS} addresses; served at once {served} (bound {bound}); \
         /healthz during the flood: {probe:?} in {probed:?}; descriptors held {descriptors_held} of 128; \
         still served after {window:?}: {after_timeout}; plugin CPU {:.2} s in that time",
        cpu_after - cpu_before
    );
    assert!(plugin.alive(), "the plugin stopped: {}", plugin.log());
    assert_eq!(
        probe,
        Some(200),
        "the probe was turned away: {}",
        plugin.log()
    );
    assert!(served <= bound, "{served} flood connections served at once");
    assert_eq!(after_timeout, 0, "the server holds idle connections open");
    // Nothing spins: the process used a fraction of one core over the flood (a spinning
    // accept loop takes a whole one, whatever else runs).
    assert!(
        cpu_after - cpu_before < window.as_secs_f64() / 3.0,
        "{:.2} CPU seconds in {window:?}",
        cpu_after - cpu_before
    );
    assert_eq!(healthz(plugin.metrics, Duration::from_secs(2)), Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_that_cannot_be_read_keeps_the_plugin_on_the_config_it_has() {
    let Some(sim) = sim_nvml("tenants") else {
        return;
    };
    let kubelet = TestKubelet::start().await;
    let mut plugin = Running::start(&kubelet, &sim, None).await;
    wait_healthy(plugin.metrics);
    let config = kubelet.root.path().join("plugin.yaml");
    let text = std::fs::read_to_string(&config).expect("config");
    // A read that fails (EISDIR here; EMFILE or EACCES in the field), for 20 looks of
    // the watcher (every 100 ms).
    std::fs::remove_file(&config).expect("rm");
    std::fs::create_dir(&config).expect("mkdir");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        plugin.alive(),
        "a failed read was taken for a removed file: {}",
        plugin.log()
    );
    assert_eq!(healthz(plugin.metrics, Duration::from_secs(2)), Some(200));
    let said = plugin
        .log()
        .lines()
        .filter(|line| line.contains("cannot read") && line.contains("keeping the config"))
        .count();
    assert_eq!(said, 1, "reported once: {}", plugin.log());
    // Readable again with the same text: no change.
    std::fs::remove_dir(&config).expect("rmdir");
    std::fs::write(&config, &text).expect("write");
    std::thread::sleep(Duration::from_millis(600));
    assert!(plugin.alive(), "{}", plugin.log());
    // The watcher still watches: a real change stops the plugin (for kubelet to
    // restart it with the new config).
    std::fs::write(&config, format!("{text}policy: spread\n")).expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    while plugin.alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !plugin.alive(),
        "a real change was missed: {}",
        plugin.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_stamps_at_u64_max_in_every_slot_neither_flood_the_log_nor_repeat() {
    let Some(sim) = sim_nvml("tenants") else {
        return;
    };
    let kubelet = TestKubelet::start().await;
    let mut plugin = Running::start(&kubelet, &sim, None).await;
    let region_path = plugin.container(&kubelet, 30, 4).await;
    let region = Region::open_existing(&region_path).expect("region");
    for pid in 1..=MAX_SLOTS as i32 {
        let slot = region.attach(&tenant(pid)).expect("attach");
        region.slot_limiter(slot, 0)[words::ACTIVE_NS].store(u64::MAX, Ordering::SeqCst);
    }
    // Let the coordinator see it, then measure what the log grows by.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = plugin.log_len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let grown = plugin.log_len() - before;
    let log = plugin.log();
    let lines = log
        .lines()
        .filter(|line| line.contains("in the future"))
        .count();
    eprintln!("log grew {grown} bytes in 3 s; {lines} 'in the future' lines in all");
    assert!(plugin.alive(), "{log}");
    assert_eq!(
        lines, 1,
        "one line for the container, not one per slot and tick: {grown} bytes in 3 s"
    );
    assert!(grown < 2048, "{grown} bytes of log in 3 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_scrapes_never_inflate_the_running_totals() {
    let (_kubelet, plugin, region_path, address) = common::one_container_on_a_4gib_card().await;

    // One process launching kernels without pause, five scrapers without pause.
    let region = Arc::new(Region::open_existing(&region_path).expect("region"));
    let counted =
        launch_while_scraping(&region, tenant(100), address, Duration::from_secs(3)).await;
    let labels = r#"namespace="team",pod="trainer",container="cuda",UUID="GPU-fake-0""#;
    let (_, metrics) = http_get(address, "/metrics").await;
    let total = value(&metrics, "vgpu_container_kernel_launches_total", labels).expect("total");
    let throttled =
        value(&metrics, "vgpu_container_throttled_seconds_total", labels).expect("throttled");
    let throttled_counted = (counted * THROTTLED_NS) as f64 / 1e9;
    let counted = counted as f64;
    eprintln!(
        "launches counted by the process {counted}, reported {total} (x{:.2}); throttled seconds counted {throttled_counted}, reported {throttled} (x{:.2})",
        total / counted,
        throttled / throttled_counted
    );
    assert_eq!(total, counted, "parallel scrapes inflated the total");
    assert!(
        (throttled - throttled_counted).abs() < 1e-6,
        "parallel scrapes inflated the throttled seconds: {throttled} for {throttled_counted}"
    );
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_card_containers_figures_are_filed_under_their_own_card() {
    // Host index order and UUID order disagree: card 0 is `GPU-fake-b`.
    let cards = ["GPU-fake-b", "GPU-fake-a"]
        .iter()
        .enumerate()
        .map(|(index, uuid)| CardInfo {
            uuid: uuid.to_string(),
            index: index as u32,
            minor: Some(index as u32),
            memory_total: 8 << 30,
            numa_node: None,
        })
        .collect();
    let kubelet = TestKubelet::start().await;
    let plugin = vgpu_plugin::start(kubelet.plugin_config(), Arc::new(FakeSource::new(cards)))
        .await
        .expect("plugin");
    kubelet.wait_registrations(2).await;
    let mut cores = plugin_client(&plugin.sockets()[0]).await;
    let core_ids = list_ids(&mut cores).await;
    assert_eq!(core_ids.len(), 200);
    let response = allocate(&mut cores, &core_ids)
        .await
        .expect("two whole cards");
    kubelet.add_container("team", "wide", "cuda", &core_ids, &[]);
    common::prestart(&mut cores, &core_ids)
        .await
        .expect("PreStart");
    let config =
        vgpu_contract::Config::load(Path::new(host_path_of(&response, "/etc/vgpu/vgpu.yaml")))
            .expect("config");
    // The shim writes device `d` of the region for the config's device `d`.
    let on_a = config
        .devices
        .iter()
        .position(|device| device.uuid.as_deref() == Some("GPU-fake-a"))
        .expect("card a in the config");
    let region =
        Region::open_existing(Path::new(host_path_of(&response, "/etc/vgpu/usage.region")))
            .expect("region");
    let slot = region.attach(&tenant(100)).expect("attach");
    region.add_used(slot, on_a, 3 << 30);
    region.add_busy(slot, on_a, 1_000_000_000, 777);
    let (_, metrics) = http_get(plugin.metrics_address().expect("metrics"), "/metrics").await;
    let labels =
        |uuid: &str| format!(r#"namespace="team",pod="wide",container="cuda",UUID="{uuid}""#);
    let filed = |name: &str, uuid: &str| value(&metrics, name, &labels(uuid));
    eprintln!(
        "launches under a: {:?}, under b: {:?}",
        filed("vgpu_container_kernel_launches_total", "GPU-fake-a"),
        filed("vgpu_container_kernel_launches_total", "GPU-fake-b")
    );
    assert_eq!(
        filed("vgpu_container_kernel_launches_total", "GPU-fake-a"),
        Some(777.0),
        "{metrics}"
    );
    assert_eq!(
        filed("vgpu_container_kernel_launches_total", "GPU-fake-b"),
        Some(0.0)
    );
    assert_eq!(
        filed("vgpu_container_memory_used_bytes", "GPU-fake-a"),
        Some(3221225472.0)
    );
    assert_eq!(
        filed("vgpu_container_memory_used_bytes", "GPU-fake-b"),
        Some(0.0)
    );
    assert_eq!(
        value(
            &metrics,
            "vgpu_card_used_memory_bytes",
            r#"UUID="GPU-fake-a",gpu="1""#
        ),
        Some(3221225472.0)
    );
    assert_eq!(
        value(
            &metrics,
            "vgpu_card_used_memory_bytes",
            r#"UUID="GPU-fake-b",gpu="0""#
        ),
        Some(0.0)
    );
    plugin.stop().await;
}

/// Figures for the report, not a judge: `VGPU_MEASURE_PLUGIN=<vgpu-plugin binary>
/// VGPU_MEASURE_SECS=<n> cargo test -p vgpu-plugin --test tenants -- --ignored
/// --nocapture`. A tenant stamps its 256 slots at u64::MAX for n seconds (log bytes,
/// tick period from the card view's stamps, plugin CPU, and RSS with its series every
/// 10 s), then one process launches while five scrapers scrape for n seconds (inflation
/// of the total; `VGPU_MEASURE_SCRAPERS=0` leaves that part out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run by hand with a release build"]
async fn measure_a_plugin_binary() {
    let Some(sim) = sim_nvml("tenants") else {
        return;
    };
    let secs: u64 = std::env::var("VGPU_MEASURE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let kubelet = TestKubelet::start().await;
    let mut plugin = Running::start(&kubelet, &sim, None).await;
    let region_path = plugin.container(&kubelet, 30, 4).await;
    let cards = kubelet.root.path().join("vgpu/cards");
    let find_view = || {
        std::fs::read_dir(&cards)
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".card").map(str::to_string)
            })
    };
    let region = Arc::new(Region::open_existing(&region_path).expect("region"));
    let mut slots = Vec::new();
    for pid in 1..=MAX_SLOTS as i32 {
        let slot = region.attach(&tenant(pid)).expect("attach");
        region.slot_limiter(slot, 0)[words::ACTIVE_NS].store(u64::MAX, Ordering::SeqCst);
        slots.push(slot);
    }
    let (cpu_before, rss_before) = plugin.cpu_and_rss();
    let log_before = plugin.log_len();
    let started = Instant::now();
    let mut stamps = Vec::new();
    let mut uuid = None;
    // The plugin's resident size every 10 s: whether it levels off or keeps growing.
    let mut rss_series = vec![(0, rss_before)];
    while started.elapsed() < Duration::from_secs(secs) {
        let at = started.elapsed().as_secs();
        if at >= rss_series.last().map_or(0, |(last, _)| last + 10) {
            rss_series.push((at, plugin.cpu_and_rss().1));
        }
        uuid = uuid.or_else(find_view);
        if let Some(view) = uuid
            .as_deref()
            .and_then(|uuid| vgpu_contract::cardview::CardView::read(&cards, uuid).ok())
            && stamps.last() != Some(&view.written_ns)
        {
            stamps.push(view.written_ns);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (cpu_after, rss_after) = plugin.cpu_and_rss();
    let periods: Vec<f64> = stamps
        .windows(2)
        .map(|pair| (pair[1] - pair[0]) as f64 / 1e6)
        .collect();
    let mean = periods.iter().sum::<f64>() / periods.len().max(1) as f64;
    let worst = periods.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "u64::MAX stamps, {secs} s: log {} bytes ({} lines 'in the future'), tick mean {mean:.1} ms worst {worst:.1} ms over {} ticks, plugin CPU {:.0} %, RSS {} -> {} KiB",
        plugin.log_len() - log_before,
        plugin
            .log()
            .lines()
            .filter(|l| l.contains("in the future"))
            .count(),
        periods.len(),
        (cpu_after - cpu_before) * 100.0 / secs as f64,
        rss_before,
        rss_after
    );
    eprintln!(
        "RSS every 10 s (s: KiB): {}",
        rss_series
            .iter()
            .map(|(at, rss)| format!("{at}: {rss}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(line) = plugin.log().lines().find(|l| l.contains("in the future")) {
        eprintln!("first: {line}");
    }
    for slot in slots {
        region.slot_limiter(slot, 0)[words::ACTIVE_NS].store(0, Ordering::SeqCst);
        region.detach(slot);
    }

    if std::env::var("VGPU_MEASURE_SCRAPERS").as_deref() == Ok("0") {
        return;
    }
    // Five scrapers against one launching process.
    let counted = launch_while_scraping(
        &region,
        tenant(9999),
        plugin.metrics,
        Duration::from_secs(secs),
    )
    .await;
    let address = plugin.metrics;
    let (_, metrics) = http_get(address, "/metrics").await;
    let total: f64 = metrics
        .lines()
        .filter(|line| line.starts_with("vgpu_container_kernel_launches_total{"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    let counted = counted as f64;
    eprintln!(
        "5 scrapers, {secs} s: launches counted {counted}, reported {total} (x{:.2})",
        total / counted
    );
    assert!(plugin.alive());
}
