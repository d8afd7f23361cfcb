//! The allocator's phases end to end, as kubelet calls them.

use super::*;
use vgpu_contract::CoreMode;
use vgpu_kubelet_api::podresources::{ContainerDevices, ContainerResources, PodResources};
use vgpu_node_agent::config::Policy;

fn cards(count: u32) -> Vec<CardInfo> {
    (0..count)
        .map(|index| CardInfo {
            uuid: format!("GPU-card-{index}"),
            index,
            minor: Some(index),
            memory_total: 4 << 30,
            numa_node: None,
        })
        .collect()
}

fn ids(allocator: &Allocator, kind: Kind) -> Vec<String> {
    allocator
        .devices(kind)
        .into_iter()
        .map(|device| device.id)
        .collect()
}

/// What kubelet does for one resource of a container: preferred, then Allocate.
fn take(allocator: &mut Allocator, kind: Kind, size: usize, now: u64) -> Vec<String> {
    let chosen = allocator.preferred(kind, &ids(allocator, kind), &[], size, None, now);
    allocator
        .allocate(kind, &chosen, None, now)
        .expect("allocate");
    chosen
}

/// One fractional container: cores then memory, as kubelet asks for them.
fn place(allocator: &mut Allocator, cores: usize, memory: usize, now: u64) -> String {
    let core_ids = take(allocator, Kind::Core, cores, now);
    let memory_ids = take(allocator, Kind::Memory, memory, now);
    let core_card = DeviceId::parse(&core_ids[0]).expect("id").uuid;
    let memory_card = DeviceId::parse(&memory_ids[0]).expect("id").uuid;
    assert_eq!(
        core_card, memory_card,
        "one container's cores and memory on one card"
    );
    core_card
}

fn allocator(policy: Policy, dir: &std::path::Path, count: u32) -> Allocator {
    let config = NodeConfig {
        policy,
        state_dir: dir.to_path_buf(),
        ..NodeConfig::default()
    };
    Allocator::new(config, cards(count), PluginState::default())
}

fn pod(name: &str, containers: &[(&str, &[String], &[String])]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: "default".into(),
        containers: containers
            .iter()
            .map(|(container, cores, memory)| ContainerResources {
                name: (*container).into(),
                devices: [
                    ("tencent.com/vcuda-core", *cores),
                    ("tencent.com/vcuda-memory", *memory),
                ]
                .into_iter()
                .filter(|(_, ids)| !ids.is_empty())
                .map(|(resource, ids)| ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.to_vec(),
                    topology: None,
                })
                .collect(),
                cpu_ids: vec![],
                memory: vec![],
            })
            .collect(),
    }
}

fn index(pods: &[PodResources]) -> HolderIndex {
    HolderIndex::from_list(pods, "tencent.com/vcuda-core", "tencent.com/vcuda-memory")
}

#[test]
fn binpack_fills_one_card_before_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut allocator = allocator(Policy::Binpack, dir.path(), 2);
    let first = place(&mut allocator, 30, 4, 1);
    let second = place(&mut allocator, 30, 4, 2);
    assert_eq!(
        first, second,
        "binpack puts the second container beside the first"
    );
    let third = place(&mut allocator, 50, 4, 3);
    assert_ne!(third, first, "50 more cores do not fit the first card's 40");
}

#[test]
fn spread_puts_each_container_on_the_emptiest_card() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut allocator = allocator(Policy::Spread, dir.path(), 2);
    let first = place(&mut allocator, 30, 4, 1);
    let second = place(&mut allocator, 30, 4, 2);
    assert_ne!(first, second, "spread uses the idle card");
    let third = place(&mut allocator, 10, 2, 3);
    assert!(third == first || third == second);
}

#[test]
fn every_call_gets_its_own_record_and_prestart_folds_a_container_from_podresources() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut allocator = allocator(Policy::Binpack, dir.path(), 1);
    // A memory-only pod, then a normal pod whose cores come first: the cores land
    // right after the stray memory half and must not be paired with it.
    let stray = take(&mut allocator, Kind::Memory, 2, 1);
    let cores = take(&mut allocator, Kind::Core, 30, 1);
    let memory = take(&mut allocator, Kind::Memory, 4, 1);
    assert_eq!(
        allocator.state().allocations.len(),
        3,
        "no call joins another"
    );
    let holders = index(&[
        pod("stray", &[("main", &[], &stray)]),
        pod("tenant", &[("cuda", &cores, &memory)]),
    ]);
    let plans = allocator
        .plan_prestart(Kind::Core, &cores, &holders)
        .expect("the normal pod starts");
    assert_eq!(plans.len(), 1);
    let plan = &plans[0];
    assert_eq!(plan.devices[0].core_limit, Some(30));
    assert_eq!(
        plan.devices[0].memory_limit,
        Some(vgpu_contract::ByteSize::gib(1))
    );
    assert_eq!(
        plan.alias_ids.len(),
        1,
        "its memory call's folder is an alias"
    );
    allocator.commit_prestart(&plans, 2).expect("commit");
    let again = allocator
        .plan_prestart(Kind::Memory, &memory, &holders)
        .expect("the memory PreStart of the same start");
    assert_eq!(
        again,
        plans
            .iter()
            .map(|p| PreStartPlan {
                folded: vec![p.allocation_id.clone()],
                ..p.clone()
            })
            .collect::<Vec<_>>()
    );
    let refused = allocator
        .plan_prestart(Kind::Memory, &stray, &holders)
        .expect_err("memory alone");
    assert!(
        refused.message().contains("add tencent.com/vcuda-core: N"),
        "{}",
        refused.message()
    );
}

#[test]
fn a_whole_card_pod_without_memory_does_not_draw_the_next_pods_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut allocator = allocator(Policy::Binpack, dir.path(), 2);
    let whole = take(&mut allocator, Kind::Core, 100, 1);
    let whole_card = DeviceId::parse(&whole[0]).expect("id").uuid;
    // The next pod asks for memory first.
    let memory = take(&mut allocator, Kind::Memory, 4, 1);
    let cores = take(&mut allocator, Kind::Core, 30, 1);
    let card = DeviceId::parse(&memory[0]).expect("id").uuid;
    assert_ne!(
        card, whole_card,
        "memory is never steered onto a card held whole"
    );
    assert_eq!(DeviceId::parse(&cores[0]).expect("id").uuid, card);
    let holders = index(&[
        pod("trainer", &[("main", &whole, &[])]),
        pod("tenant", &[("cuda", &cores, &memory)]),
    ]);
    let plans = allocator
        .plan_prestart(Kind::Memory, &memory, &holders)
        .expect("starts");
    assert_eq!(plans[0].devices[0].core_limit, Some(30));
    let plans = allocator
        .plan_prestart(Kind::Core, &whole, &holders)
        .expect("whole");
    assert_eq!(plans[0].devices[0].core_limit, None);
}

#[test]
fn a_whole_card_container_may_take_memory_of_its_own_card_right_after_its_cores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut allocator = allocator(Policy::Binpack, dir.path(), 1);
    let whole = take(&mut allocator, Kind::Core, 100, 1);
    let memory = take(&mut allocator, Kind::Memory, 2, 1);
    let holders = index(&[pod("trainer", &[("main", &whole, &memory)])]);
    let plans = allocator
        .plan_prestart(Kind::Core, &whole, &holders)
        .expect("whole");
    assert_eq!(
        plans[0].devices[0].memory_limit, None,
        "a whole card has all its memory"
    );
    allocator.commit_prestart(&plans, 2).expect("commit");
    let later = allocator.allocate(Kind::Memory, &ids(&allocator, Kind::Memory)[2..3], None, 3);
    assert_eq!(
        later.expect_err("held whole").code(),
        tonic::Code::FailedPrecondition
    );
}

#[test]
fn an_init_containers_devices_are_handed_out_again_during_admission_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut allocator = allocator(Policy::Binpack, dir.path(), 1);
    // Init container, then the app container reusing its IDs (kubelet order).
    let cores = take(&mut allocator, Kind::Core, 30, 1);
    let memory = take(&mut allocator, Kind::Memory, 4, 1);
    let app_memory = allocator
        .allocate(Kind::Memory, &memory, None, 1)
        .expect("reuse")
        .record;
    let app_cores = allocator
        .allocate(Kind::Core, &cores, None, 1)
        .expect("reuse")
        .record;
    assert!(app_cores.reuses.is_some() && app_memory.reuses.is_some());
    assert_eq!(
        allocator.booked_units("GPU-card-0"),
        (30, 4),
        "shared IDs count once"
    );
    // PodResources lists the app container only.
    let holders = index(&[pod("job", &[("app", &cores, &memory)])]);
    let plans = allocator
        .plan_prestart(Kind::Core, &cores, &holders)
        .expect("init starts");
    assert_eq!(
        plans.len(),
        2,
        "the init container's allocation and the app's"
    );
    assert_ne!(
        plans[0].allocation_id, plans[1].allocation_id,
        "each its own folder"
    );
    assert!(
        plans
            .iter()
            .all(|plan| plan.devices[0].core_limit == Some(30))
    );
    allocator.commit_prestart(&plans, 2).expect("commit");
    assert_eq!(allocator.state().allocations.len(), 2);
    // Once a container has started, the same IDs are refused.
    let refused = allocator
        .allocate(Kind::Core, &cores, None, 2)
        .expect_err("started");
    assert!(
        refused.message().contains("already allocated"),
        "{}",
        refused.message()
    );
    assert!(
        allocator
            .plan_prestart(Kind::Memory, &memory, &holders)
            .is_ok(),
        "the app container's own start"
    );
}

#[test]
fn an_unlisted_init_container_is_paired_with_its_neighbouring_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut allocator = allocator(Policy::Binpack, dir.path(), 1);
    let stray = take(&mut allocator, Kind::Memory, 2, 1);
    let cores = take(&mut allocator, Kind::Core, 30, 1);
    let _memory = take(&mut allocator, Kind::Memory, 4, 1);
    // Only the stray pod is listed; the init container is not (PodResources lists
    // regular containers only).
    let holders = index(&[pod("stray", &[("main", &[], &stray)])]);
    let plans = allocator
        .plan_prestart(Kind::Core, &cores, &holders)
        .expect("init");
    assert_eq!(
        plans[0].devices[0].memory_limit,
        Some(vgpu_contract::ByteSize::gib(1))
    );
    let cores_only = {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut lonely = super::tests::allocator(Policy::Binpack, dir.path(), 1);
        let cores = take(&mut lonely, Kind::Core, 30, 1);
        lonely
            .plan_prestart(Kind::Core, &cores, &HolderIndex::default())
            .expect_err("no memory")
    };
    assert!(
        cores_only
            .message()
            .contains("add tencent.com/vcuda-memory: M"),
        "{}",
        cores_only.message()
    );
}

#[test]
fn default_core_ceiling_makes_a_partial_card_soft_and_leaves_a_whole_card_hard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = NodeConfig {
        state_dir: dir.path().to_path_buf(),
        default_core_ceiling: Some(20),
        ..NodeConfig::default()
    };
    let mut allocator = Allocator::new(config, cards(2), PluginState::default());
    let cores = take(&mut allocator, Kind::Core, 30, 1);
    let memory = take(&mut allocator, Kind::Memory, 4, 1);
    let whole = take(&mut allocator, Kind::Core, 100, 2);
    let holders = index(&[
        pod("partial", &[("cuda", &cores, &memory)]),
        pod("whole", &[("cuda", &whole, &[])]),
    ]);
    let partial = allocator
        .plan_prestart(Kind::Core, &cores, &holders)
        .expect("partial");
    let device = &partial[0].devices[0];
    assert_eq!(device.core_mode, CoreMode::Soft);
    assert_eq!(
        device.core_ceiling,
        Some(30),
        "a ceiling below the share is raised to it"
    );
    let whole = allocator
        .plan_prestart(Kind::Core, &whole, &holders)
        .expect("whole");
    assert_eq!(whole[0].devices[0].core_mode, CoreMode::Hard);
    assert_eq!(whole[0].devices[0].core_ceiling, None);
}
