//! What pods get, against the stand-in kubelet (real gRPC): the two Allocate calls of a
//! container are never joined to another pod's, so a memory-only pod or a whole-card
//! pod without memory leaves nothing the next pod trips over; an init container's
//! devices handed to the app container again (`devicesToReuse`) work and each gets its
//! own allocation; and a tenant truncating its usage region in a loop neither crashes
//! nor stalls the plugin.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Admitted, CORE, MEMORY, Plugin, TestKubelet, card_of, config_of, host_path_of};
use tonic::Code;
use vgpu_contract::{ByteSize, Config, CoreMode};
use vgpu_node_agent::devices::FakeSource;

const CARD_MEMORY: u64 = 4 << 30; // 16 memory units of 256MiB

/// The stand-in kubelet and the plugin under test, with the steps of a pod's life that
/// every test takes (each must succeed unless the name says it is refused).
struct Node {
    kubelet: TestKubelet,
    plugin: Plugin,
}

impl Node {
    /// A kubelet and a plugin over `cards` fake cards of 4 GiB.
    async fn start(cards: u32) -> Node {
        let kubelet = TestKubelet::start().await;
        let plugin = Plugin::start(
            &kubelet,
            kubelet.plugin_config(),
            Arc::new(FakeSource::uniform(cards, CARD_MEMORY)),
        )
        .await;
        Node { kubelet, plugin }
    }

    /// Admits `container` of pod `namespace/pod` asking `requests`, in that order.
    async fn admit(
        &mut self,
        namespace: &str,
        pod: &str,
        container: &str,
        requests: &[(&str, usize)],
    ) -> Admitted {
        match self
            .kubelet
            .admit(&mut self.plugin, namespace, pod, container, requests)
            .await
        {
            Ok(admitted) => admitted,
            Err((_, status)) => panic!("{namespace}/{pod}/{container} not admitted: {status}"),
        }
    }

    /// Starts an admitted container (PreStartContainer of its resources).
    async fn start_container(&mut self, admitted: &Admitted) -> Result<(), tonic::Status> {
        self.kubelet
            .start_container(&mut self.plugin, admitted)
            .await
    }

    /// Starts an admitted container, which must start; its config.
    async fn started(&mut self, admitted: &Admitted, what: &str) -> Config {
        if let Err(status) = self.start_container(admitted).await {
            panic!("{what} does not start: {status}");
        }
        config_of(admitted)
    }

    /// PreStartContainer must refuse the container (FailedPrecondition), saying `fix`.
    async fn refused(&mut self, admitted: &Admitted, fix: &str) {
        let refused = self
            .start_container(admitted)
            .await
            .expect_err("refused at start");
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert!(refused.message().contains(fix), "{}", refused.message());
    }

    async fn stop(self) {
        self.plugin.handle.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_only_pod_does_not_break_the_next_pod_on_its_card() {
    let mut node = Node::start(1).await;
    // Kubelet cannot know it is memory alone.
    let stray = node.admit("default", "stray", "main", &[(MEMORY, 2)]).await;
    // The next pod, cores first: its cores are the very next call after the stray half.
    let tenant = node
        .admit("default", "tenant", "cuda", &[(CORE, 30), (MEMORY, 10)])
        .await;
    assert_eq!(card_of(&tenant.cores[0]), card_of(&stray.memory[0]));
    let config = node.started(&tenant, "the second pod").await;
    assert_eq!(config.devices.len(), 1);
    assert_eq!(config.devices[0].core_limit, Some(30));
    assert_eq!(config.devices[0].memory_limit, Some(ByteSize::mib(2560)));
    // And once more with memory first, after another memory-only pod.
    let stray2 = node
        .admit("default", "stray2", "main", &[(MEMORY, 1)])
        .await;
    let other = node
        .admit("default", "other", "cuda", &[(MEMORY, 2), (CORE, 20)])
        .await;
    let config = node.started(&other, "the memory-first pod").await;
    assert_eq!(config.devices[0].core_limit, Some(20));
    assert_eq!(config.devices[0].memory_limit, Some(ByteSize::mib(512)));
    // The memory-only pods themselves are refused at start, saying what to change.
    for stray in [&stray, &stray2] {
        node.refused(
            stray,
            "add tencent.com/vcuda-core: N (1-99 for part of a card, 100 per whole card) to this container's limits",
        )
        .await;
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_card_pod_without_memory_does_not_break_the_next_pod() {
    let mut node = Node::start(2).await;
    let trainer = node.admit("ml", "trainer", "main", &[(CORE, 100)]).await;
    let whole = card_of(&trainer.cores[0]);
    // The next pod asks for memory first: it must not be drawn onto the card held whole.
    let tenant = node
        .admit("default", "tenant", "cuda", &[(MEMORY, 4), (CORE, 30)])
        .await;
    assert_ne!(card_of(&tenant.memory[0]), whole);
    assert_eq!(card_of(&tenant.cores[0]), card_of(&tenant.memory[0]));
    let config = node.started(&tenant, "the second pod").await;
    assert_eq!(config.devices[0].core_limit, Some(30));
    let config = node.started(&trainer, "the whole-card pod").await;
    assert_eq!(config.devices[0].uuid.as_deref(), Some(whole.as_str()));
    assert_eq!(config.devices[0].core_limit, None);
    assert_eq!(config.devices[0].memory_limit, None);
    // A pod of cores without memory is refused at start with what to add.
    let lonely = node.admit("default", "lonely", "main", &[(CORE, 10)]).await;
    node.refused(
        &lonely,
        "add tencent.com/vcuda-memory: M (M x 256MiB of that card)",
    )
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_containers_devices_are_reused_by_the_app_container() {
    let mut node = Node::start(1).await;
    // Admission: the init container, then the app container with the very same IDs
    // (kubelet's devicesToReuse), each resource allocated again. (The stand-in records
    // the init container in PodResources as it goes, as kubelets that list init
    // containers do; below it is taken out again, as the others never list it.)
    let init = node
        .admit("default", "job", "init", &[(CORE, 30), (MEMORY, 10)])
        .await;
    let mut app = Admitted {
        cores: init.cores.clone(),
        memory: init.memory.clone(),
        responses: Vec::new(),
    };
    for (resource, ids) in [(MEMORY, &init.memory), (CORE, &init.cores)] {
        let response = common::allocate(node.plugin.client(resource), ids)
            .await
            .expect("reused IDs are handed out again during admission");
        app.responses.push(response);
    }
    // PodResources lists regular containers only: the app container holds the IDs.
    node.kubelet.remove_pod("default", "job");
    node.kubelet
        .set_container("default", "job", "app", &app.cores, &app.memory);
    let init_folder = host_path_of(&init.merged(), "/etc/vgpu/vgpu.yaml").to_string();
    let app_folder = host_path_of(&app.merged(), "/etc/vgpu/vgpu.yaml").to_string();
    assert_ne!(init_folder, app_folder, "each container has its own state");
    let init_config = node.started(&init, "the init container").await;
    assert_eq!(init_config.devices[0].core_limit, Some(30));
    assert_eq!(
        init_config.devices[0].memory_limit,
        Some(ByteSize::mib(2560))
    );
    let app_config = node
        .started(&app, "then the app container, with the same devices,")
        .await;
    assert_eq!(app_config.devices, init_config.devices, "the same quota");
    assert_ne!(
        app_config.container_id, init_config.container_id,
        "and its own identity"
    );
    // Metrics count the shared devices once.
    let metrics = common::scrape(node.plugin.handle.metrics_address().expect("metrics")).await;
    assert!(
        metrics.contains("vgpu_card_allocated_cores{UUID=\"GPU-fake-0\",gpu=\"0\"} 30"),
        "{metrics}"
    );
    // Once a container of the pod has started, the IDs are no longer handed out.
    let refused = common::allocate(&mut node.plugin.cores, &init.cores)
        .await
        .expect_err("held by a started container");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("already allocated"),
        "{}",
        refused.message()
    );
    // The app container restarts: its PreStart is answered again, the quota unchanged.
    let restarted = node.started(&app, "the restarted app container").await;
    assert_eq!(restarted.devices[0].core_mode, CoreMode::Hard);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_truncating_its_region_in_a_loop_neither_crashes_nor_stalls_the_plugin() {
    let mut node = Node::start(2).await;
    let tenant = node
        .admit("default", "tenant", "cuda", &[(CORE, 30), (MEMORY, 4)])
        .await;
    node.start_container(&tenant).await.expect("starts");
    let region = std::path::PathBuf::from(host_path_of(&tenant.merged(), "/etc/vgpu/usage.region"));
    // The tenant's side: it holds the file read-write (its mount) and truncates,
    // regrows and scribbles on it as fast as it can, as the region's own processes could.
    let stop = Arc::new(AtomicBool::new(false));
    let vandal = {
        let stop = stop.clone();
        let region = region.clone();
        std::thread::spawn(move || {
            use std::io::{Seek, Write};
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&region)
                .expect("the tenant's own file");
            let full = vgpu_contract::region::REGION_LEN as u64;
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = file.set_len(0);
                let _ = file.set_len(full / 3);
                let _ = file.set_len(full);
                let _ = file.rewind();
                let _ = file.write_all(&[0x5a; 4096]);
                rounds += 1;
            }
            rounds
        })
    };
    let address = node.plugin.handle.metrics_address().expect("metrics");
    let started = Instant::now();
    let mut scrapes = 0;
    let mut allocations = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let text = tokio::time::timeout(Duration::from_secs(5), common::scrape(address))
            .await
            .expect("metrics answer while the region is being truncated");
        assert!(text.contains("vgpu_card_allocated_cores"), "{text}");
        scrapes += 1;
        // Allocate and ListAndWatch keep answering too.
        let other = node
            .kubelet
            .admit(
                &mut node.plugin,
                "default",
                &format!("other-{allocations}"),
                "main",
                &[(CORE, 1), (MEMORY, 1)],
            )
            .await;
        // An answer: admitted, or refused saying why (once card 0's memory is booked,
        // a pod whose cores went there and whose memory kubelet puts on card 1).
        assert!(
            other.as_ref().map_or_else(
                |(_, status)| status.code() == Code::InvalidArgument,
                |_| true
            ),
            "Allocate answers: {:?}",
            other.err().map(|e| e.1)
        );
        allocations += 1;
        if allocations >= 20 {
            node.kubelet.clear_pods();
            node.kubelet
                .set_container("default", "tenant", "cuda", &tenant.cores, &tenant.memory);
            vgpu_plugin::daemon::collect_garbage(node.plugin.handle.shared())
                .await
                .expect("gc");
            allocations = 0;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = vandal.join().expect("vandal");
    assert!(rounds > 100, "the file was truncated {rounds} times");
    assert!(scrapes > 5, "{scrapes} scrapes");
    // The host-PID loop (every second) read the same file meanwhile; the process is still
    // here, so nothing faulted. A FIFO in place of the region does not stall a scrape.
    std::fs::remove_file(&region).expect("rm");
    let name = std::ffi::CString::new(region.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo on a NUL-terminated path in our temp folder.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o666) }, 0);
    tokio::time::timeout(Duration::from_secs(5), common::scrape(address))
        .await
        .expect("a FIFO does not stall the metrics");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tokio::time::timeout(Duration::from_secs(5), common::scrape(address))
        .await
        .expect("nor the host-PID loop");
    // Only the host can put a file in the allocation folder (the tenant holds the one
    // inode it mounts); with the FIFO gone, the next start gets a valid region again.
    std::fs::remove_file(&region).expect("rm fifo");
    node.start_container(&tenant).await.expect("restart");
    assert!(vgpu_contract::snapshot::RegionSnapshot::read(&region).is_ok());
    node.stop().await;
}
