//! The simulated CUDA driver API, exercised through raw symbols of the built cdylib:
//! devices, contexts, allocations, OOM, threads, cross-process truth and dead-process
//! reclaim, VMM, pools, arrays, simulated kernel time, cuGetProcAddress rules, bad
//! config handling and fork. Each test runs in its own child process and state file.

mod common;

use std::collections::HashSet;
use std::ffi::{CStr, c_char, c_void};
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Instant;

use common::Sim;

macro_rules! call {
    ($sim:expr, $name:literal, fn($($t:ty),* $(,)?) $(, $a:expr)* $(,)?) => {
        // SAFETY: the test names the export's C signature with the arguments it passes.
        unsafe { ($sim.sym::<unsafe extern "C" fn($($t),*) -> i32>($name))($($a),*) }
    };
}

const SUCCESS: i32 = 0;
const INVALID_VALUE: i32 = 1;
const OUT_OF_MEMORY: i32 = 2;
const NOT_INITIALIZED: i32 = 3;
const INVALID_DEVICE: i32 = 101;
const INVALID_CONTEXT: i32 = 201;
const INVALID_HANDLE: i32 = 400;
const NOT_FOUND: i32 = 500;
const NOT_READY: i32 = 600;
const MIB: u64 = 1 << 20;

fn init(sim: &Sim) {
    assert_eq!(call!(sim, "cuInit", fn(u32), 0), SUCCESS);
}

/// In a child test's process (`common::inner`): the simulator loaded, initialised and
/// a context current on device 0; `None` when run as a test of its own.
fn child_with_a_context() -> Option<Sim> {
    if !common::inner() {
        return None;
    }
    let sim = Sim::load();
    init(&sim);
    create_context(&sim, 0);
    Some(sim)
}

fn create_context(sim: &Sim, dev: i32) -> u64 {
    let mut ctx = 0u64;
    assert_eq!(
        call!(
            sim,
            "cuCtxCreate_v2",
            fn(*mut u64, u32, i32),
            &mut ctx,
            0,
            dev
        ),
        SUCCESS
    );
    assert_ne!(ctx, 0);
    ctx
}

fn mem_info(sim: &Sim) -> (u64, u64) {
    let (mut free, mut total) = (0usize, 0usize);
    assert_eq!(
        call!(
            sim,
            "cuMemGetInfo_v2",
            fn(*mut usize, *mut usize),
            &mut free,
            &mut total
        ),
        SUCCESS
    );
    (free as u64, total as u64)
}

fn alloc(sim: &Sim, size: u64) -> Result<u64, i32> {
    let mut ptr = 0u64;
    match call!(
        sim,
        "cuMemAlloc_v2",
        fn(*mut u64, usize),
        &mut ptr,
        size as usize
    ) {
        SUCCESS => Ok(ptr),
        code => Err(code),
    }
}

fn free(sim: &Sim, ptr: u64) {
    assert_eq!(call!(sim, "cuMemFree_v2", fn(u64), ptr), SUCCESS);
}

isolated!(
    devices_and_contexts,
    devices_and_contexts_inner,
    [
        ("VGPU_SIM_GPUS", "2"),
        ("VGPU_SIM_MEMORY", "8GiB"),
        ("VGPU_SIM_CONTEXT_OVERHEAD", "300MiB")
    ],
    {
        let sim = Sim::load();
        let mut count = -1;
        assert_eq!(
            call!(sim, "cuDeviceGetCount", fn(*mut i32), &mut count),
            NOT_INITIALIZED,
            "before cuInit"
        );
        assert_eq!(call!(sim, "cuInit", fn(u32), 7), INVALID_VALUE);
        init(&sim);
        let mut version = 0;
        assert_eq!(
            call!(sim, "cuDriverGetVersion", fn(*mut i32), &mut version),
            SUCCESS
        );
        assert_eq!(version, 13000);
        assert_eq!(
            call!(sim, "cuDeviceGetCount", fn(*mut i32), &mut count),
            SUCCESS
        );
        assert_eq!(count, 2);
        let mut dev = -1;
        assert_eq!(
            call!(sim, "cuDeviceGet", fn(*mut i32, i32), &mut dev, 1),
            SUCCESS
        );
        assert_eq!(dev, 1);
        assert_eq!(
            call!(sim, "cuDeviceGet", fn(*mut i32, i32), &mut dev, 2),
            INVALID_DEVICE
        );
        let mut name = [0 as c_char; 64];
        assert_eq!(
            call!(
                sim,
                "cuDeviceGetName",
                fn(*mut c_char, i32, i32),
                name.as_mut_ptr(),
                64,
                0
            ),
            SUCCESS
        );
        assert_eq!(
            // SAFETY: the sim NUL-terminates the name within the buffer.
            unsafe { CStr::from_ptr(name.as_ptr()) }.to_str().unwrap(),
            "NVIDIA H200 (simulated)"
        );
        let mut uuid = [0u8; 16];
        assert_eq!(
            call!(
                sim,
                "cuDeviceGetUuid_v2",
                fn(*mut [u8; 16], i32),
                &mut uuid,
                1
            ),
            SUCCESS
        );
        assert_eq!(
            uuid,
            [0x51, 0xd0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 2]
        );
        let mut total = 0usize;
        assert_eq!(
            call!(
                sim,
                "cuDeviceTotalMem_v2",
                fn(*mut usize, i32),
                &mut total,
                0
            ),
            SUCCESS
        );
        assert_eq!(total as u64, 8 << 30);
        let mut value = 0;
        for (attribute, expected) in [
            (16, 132),
            (75, 9),
            (76, 0),
            (10, 32),
            (1, 1024),
            (33, 0x11),
            (41, 1),
            (90, 1),
            (115, 1),
            (102, 1),
        ] {
            assert_eq!(
                call!(
                    sim,
                    "cuDeviceGetAttribute",
                    fn(*mut i32, i32, i32),
                    &mut value,
                    attribute,
                    0
                ),
                SUCCESS
            );
            assert_eq!(value, expected, "attribute {attribute}");
        }
        assert_eq!(
            call!(
                sim,
                "cuDeviceGetAttribute",
                fn(*mut i32, i32, i32),
                &mut value,
                9999,
                0
            ),
            INVALID_VALUE
        );
        let mut bus = [0 as c_char; 32];
        assert_eq!(
            call!(
                sim,
                "cuDeviceGetPCIBusId",
                fn(*mut c_char, i32, i32),
                bus.as_mut_ptr(),
                32,
                1
            ),
            SUCCESS
        );
        assert_eq!(
            // SAFETY: the sim NUL-terminates the bus id within the buffer.
            unsafe { CStr::from_ptr(bus.as_ptr()) }.to_str().unwrap(),
            "0000:12:00.0"
        );
        assert_eq!(
            call!(
                sim,
                "cuDeviceGetByPCIBusId",
                fn(*mut i32, *const c_char),
                &mut dev,
                c"00000000:12:00.0".as_ptr()
            ),
            SUCCESS
        );
        assert_eq!(dev, 1);

        // No context yet: memory calls refuse.
        let (mut f, mut t) = (0usize, 0usize);
        assert_eq!(
            call!(
                sim,
                "cuMemGetInfo_v2",
                fn(*mut usize, *mut usize),
                &mut f,
                &mut t
            ),
            INVALID_CONTEXT
        );
        let ctx = create_context(&sim, 0);
        let mut current = 0u64;
        assert_eq!(
            call!(sim, "cuCtxGetCurrent", fn(*mut u64), &mut current),
            SUCCESS
        );
        assert_eq!(current, ctx);
        let (free_now, total_now) = mem_info(&sim);
        assert_eq!(total_now, 8 << 30);
        assert_eq!(
            free_now,
            (8 << 30) - 300 * MIB,
            "context overhead is charged"
        );
        // A second context on device 1, pushed and popped.
        let other = create_context(&sim, 1);
        assert_eq!(
            call!(sim, "cuCtxGetDevice", fn(*mut i32), &mut dev),
            SUCCESS
        );
        assert_eq!(dev, 1);
        let mut popped = 0u64;
        assert_eq!(
            call!(sim, "cuCtxPopCurrent_v2", fn(*mut u64), &mut popped),
            SUCCESS
        );
        assert_eq!(popped, other);
        assert_eq!(
            call!(sim, "cuCtxGetDevice", fn(*mut i32), &mut dev),
            SUCCESS
        );
        assert_eq!(dev, 0);
        assert_eq!(
            call!(sim, "cuCtxPushCurrent_v2", fn(u64), 0xdead_beef),
            INVALID_CONTEXT
        );
        assert_eq!(call!(sim, "cuCtxDestroy_v2", fn(u64), other), SUCCESS);
        assert_eq!(
            call!(sim, "cuCtxDestroy_v2", fn(u64), other),
            INVALID_CONTEXT
        );
        // Primary contexts: retain activates (and charges), release deactivates.
        let (mut flags, mut active) = (0u32, 0i32);
        assert_eq!(
            call!(
                sim,
                "cuDevicePrimaryCtxGetState",
                fn(i32, *mut u32, *mut i32),
                1,
                &mut flags,
                &mut active
            ),
            SUCCESS
        );
        assert_eq!(active, 0);
        let mut primary = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuDevicePrimaryCtxRetain",
                fn(*mut u64, i32),
                &mut primary,
                1
            ),
            SUCCESS
        );
        let mut again = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuDevicePrimaryCtxRetain",
                fn(*mut u64, i32),
                &mut again,
                1
            ),
            SUCCESS
        );
        assert_eq!(primary, again, "one primary context per device");
        assert_eq!(
            call!(
                sim,
                "cuDevicePrimaryCtxGetState",
                fn(i32, *mut u32, *mut i32),
                1,
                &mut flags,
                &mut active
            ),
            SUCCESS
        );
        assert_eq!(active, 1);
        assert_eq!(
            call!(sim, "cuDevicePrimaryCtxSetFlags", fn(i32, u32), 1, 4),
            708,
            "v1 refuses while active"
        );
        assert_eq!(
            call!(sim, "cuDevicePrimaryCtxSetFlags_v2", fn(i32, u32), 1, 4),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuCtxSetCurrent", fn(u64), primary), SUCCESS);
        let (free_primary, _) = mem_info(&sim);
        assert_eq!(free_primary, (8 << 30) - 300 * MIB);
        assert_eq!(
            call!(sim, "cuDevicePrimaryCtxRelease_v2", fn(i32), 1),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuDevicePrimaryCtxRelease_v2", fn(i32), 1),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuDevicePrimaryCtxRelease_v2", fn(i32), 1),
            INVALID_CONTEXT
        );
        assert_eq!(call!(sim, "cuCtxSetCurrent", fn(u64), ctx), SUCCESS);
        let mut api = 0u32;
        assert_eq!(
            call!(sim, "cuCtxGetApiVersion", fn(u64, *mut u32), ctx, &mut api),
            SUCCESS
        );
        assert_eq!(api, 3020);
        assert_eq!(call!(sim, "cuCtxDestroy_v2", fn(u64), ctx), SUCCESS);
        assert_eq!(
            call!(sim, "cuCtxGetCurrent", fn(*mut u64), &mut current),
            SUCCESS
        );
        assert_eq!(current, 0, "destroying the current context unbinds it");
    }
);

isolated!(
    allocations_and_oom,
    allocations_and_oom_inner,
    [
        ("VGPU_SIM_GPUS", "1"),
        ("VGPU_SIM_MEMORY", "1GiB"),
        ("VGPU_SIM_CONTEXT_OVERHEAD", "100MiB")
    ],
    {
        let sim = Sim::load();
        init(&sim);
        create_context(&sim, 0);
        let (free0, total) = mem_info(&sim);
        assert_eq!(total, 1 << 30);
        assert_eq!(free0, (1 << 30) - 100 * MIB);
        // Distinct, non-overlapping pointers.
        let mut ranges = Vec::new();
        for i in 1..=64u64 {
            let size = i * 1000 + 1;
            let ptr = alloc(&sim, size).unwrap();
            assert_eq!(ptr % 512, 0, "aligned");
            let (mut base, mut len) = (0u64, 0usize);
            assert_eq!(
                call!(
                    sim,
                    "cuMemGetAddressRange_v2",
                    fn(*mut u64, *mut usize, u64),
                    &mut base,
                    &mut len,
                    ptr + size - 1
                ),
                SUCCESS
            );
            assert_eq!((base, len as u64), (ptr, size));
            ranges.push((ptr, size));
        }
        let mut sorted = ranges.clone();
        sorted.sort();
        for pair in sorted.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap: {pair:?}");
        }
        let charged: u64 = ranges.iter().map(|(_, s)| s.div_ceil(512) * 512).sum();
        assert_eq!(
            mem_info(&sim).0,
            free0 - charged,
            "cuMemGetInfo is truthful"
        );
        // Pointer attributes.
        let (ptr, _) = ranges[3];
        let mut ordinal = -1i32;
        assert_eq!(
            call!(
                sim,
                "cuPointerGetAttribute",
                fn(*mut c_void, i32, u64),
                (&mut ordinal as *mut i32).cast(),
                9,
                ptr + 5
            ),
            SUCCESS
        );
        assert_eq!(ordinal, 0);
        let mut range_size = 0usize;
        assert_eq!(
            call!(
                sim,
                "cuPointerGetAttribute",
                fn(*mut c_void, i32, u64),
                (&mut range_size as *mut usize).cast(),
                12,
                ptr
            ),
            SUCCESS
        );
        assert_eq!(range_size as u64, ranges[3].1);
        let mut ctx_attr = 0u64;
        let mut current = 0u64;
        call!(sim, "cuCtxGetCurrent", fn(*mut u64), &mut current);
        assert_eq!(
            call!(
                sim,
                "cuPointerGetAttribute",
                fn(*mut c_void, i32, u64),
                (&mut ctx_attr as *mut u64).cast(),
                1,
                ptr
            ),
            SUCCESS
        );
        assert_eq!(ctx_attr, current);
        let host = 0u8;
        assert_eq!(
            call!(
                sim,
                "cuPointerGetAttribute",
                fn(*mut c_void, i32, u64),
                (&mut ordinal as *mut i32).cast(),
                9,
                &host as *const u8 as u64
            ),
            INVALID_VALUE
        );
        // Copies and sets are validated against live allocations.
        let data = [7u8; 4096];
        assert_eq!(
            call!(
                sim,
                "cuMemcpyHtoD_v2",
                fn(u64, *const c_void, usize),
                ptr,
                data.as_ptr().cast(),
                100
            ),
            SUCCESS
        );
        assert_eq!(
            call!(
                sim,
                "cuMemcpyHtoD_v2",
                fn(u64, *const c_void, usize),
                ptr,
                data.as_ptr().cast(),
                4096
            ),
            INVALID_VALUE
        );
        assert_eq!(
            call!(sim, "cuMemsetD32_v2", fn(u64, u32, usize), ptr, 1, 1000),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuMemsetD32_v2", fn(u64, u32, usize), ptr + 1, 1, 4),
            INVALID_VALUE,
            "misaligned"
        );
        assert_eq!(
            call!(
                sim,
                "cuMemcpyDtoD_v2",
                fn(u64, u64, usize),
                ranges[10].0,
                ranges[11].0,
                5000
            ),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuMemFree_v2", fn(u64), ptr + 8),
            INVALID_VALUE,
            "not a base address"
        );
        for (ptr, _) in &ranges {
            free(&sim, *ptr);
        }
        assert_eq!(
            call!(sim, "cuMemFree_v2", fn(u64), ranges[0].0),
            INVALID_VALUE,
            "double free"
        );
        assert_eq!(mem_info(&sim).0, free0);
        // OOM at capacity: exactly the free bytes fit, one more byte does not.
        let whole = alloc(&sim, free0).unwrap();
        assert_eq!(mem_info(&sim).0, 0);
        assert_eq!(alloc(&sim, 1), Err(OUT_OF_MEMORY));
        let mut managed = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMemAllocManaged",
                fn(*mut u64, usize, u32),
                &mut managed,
                4096,
                1
            ),
            OUT_OF_MEMORY
        );
        free(&sim, whole);
        assert_eq!(alloc(&sim, 2 << 30), Err(OUT_OF_MEMORY));
        assert_eq!(alloc(&sim, 0), Err(INVALID_VALUE));
        // Pitch and legacy 32-bit entry points.
        let (mut pitched, mut pitch) = (0u64, 0usize);
        assert_eq!(
            call!(
                sim,
                "cuMemAllocPitch_v2",
                fn(*mut u64, *mut usize, usize, usize, u32),
                &mut pitched,
                &mut pitch,
                1000,
                10,
                4
            ),
            SUCCESS
        );
        assert_eq!(pitch, 1024);
        assert_eq!(mem_info(&sim).0, free0 - 10240);
        free(&sim, pitched);
        let mut low = 0u32;
        assert_eq!(
            call!(sim, "cuMemAlloc", fn(*mut u32, u32), &mut low, 4096),
            SUCCESS
        );
        assert_ne!(low, 0);
        assert_eq!(call!(sim, "cuMemFree", fn(u32), low), SUCCESS);
        assert_eq!(mem_info(&sim).0, free0);
    }
);

isolated!(
    sixteen_threads,
    sixteen_threads_inner,
    [("VGPU_SIM_GPUS", "1"), ("VGPU_SIM_MEMORY", "16GiB")],
    {
        let sim = Sim::load();
        init(&sim);
        let mut primary = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuDevicePrimaryCtxRetain",
                fn(*mut u64, i32),
                &mut primary,
                0
            ),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuCtxSetCurrent", fn(u64), primary), SUCCESS);
        let (free0, _) = mem_info(&sim);
        let sim = std::sync::Arc::new(sim);
        let live = std::sync::Arc::new(std::sync::Mutex::new(HashSet::new()));
        let workers: Vec<_> = (0..16)
            .map(|worker| {
                let (sim, live) = (sim.clone(), live.clone());
                std::thread::spawn(move || {
                    assert_eq!(call!(sim, "cuCtxSetCurrent", fn(u64), primary), SUCCESS);
                    let mut held = Vec::new();
                    for round in 0..200u64 {
                        let ptr = alloc(&sim, 4096 + worker * 512 + round).expect("alloc");
                        assert!(live.lock().unwrap().insert(ptr), "pointer handed out twice");
                        held.push(ptr);
                        if held.len() > 8 {
                            let old = held.remove(0);
                            live.lock().unwrap().remove(&old);
                            free(&sim, old);
                        }
                    }
                    for ptr in held {
                        live.lock().unwrap().remove(&ptr);
                        free(&sim, ptr);
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("worker");
        }
        assert_eq!(mem_info(&sim).0, free0, "every byte came back");
    }
);

/// The child of `two_processes`: allocates the bytes it is told, says "ready", waits for stdin to close.
#[test]
#[ignore = "child of two_processes"]
fn holder_child() {
    let Some(sim) = child_with_a_context() else {
        return;
    };
    let bytes: u64 = std::env::var("HOLD_BYTES").unwrap().parse().unwrap();
    let _ptr = alloc(&sim, bytes).unwrap();
    println!("ready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn spawn_holder(dir: &std::path::Path, bytes: u64) -> (std::process::Child, u32) {
    let mut command = common::isolated_command(
        "holder_child",
        &[
            ("VGPU_SIM_GPUS", "1"),
            ("VGPU_SIM_MEMORY", "8GiB"),
            ("VGPU_SIM_CONTEXT_OVERHEAD", "200MiB"),
        ],
        dir,
    );
    command.env("HOLD_BYTES", bytes.to_string());
    spawn_until_ready(command)
}

/// Starts a child test that says `ready PID` once it holds what it holds, and waits for
/// that line; the child then waits for its stdin to close. The rest of its output is
/// read (and dropped) to its end, so that its harness's closing lines do not meet a
/// closed pipe ("io error when listing tests: Broken pipe" in CI's log).
fn spawn_until_ready(mut command: std::process::Command) -> (std::process::Child, u32) {
    command.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = command.spawn().expect("spawn holder");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let pid = loop {
        let line = lines.next().expect("holder output").expect("line");
        // The harness may print `test holder_child ... ` on the same line first.
        if let Some(at) = line.find("ready ") {
            break line[at + "ready ".len()..].trim().parse().unwrap();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (child, pid)
}

#[test]
fn two_processes_see_each_other_and_dead_ones_are_reclaimed() {
    // The parent side runs in its own child too, so that its state file is the holder's.
    let dir = tempfile::tempdir().unwrap();
    let output = common::isolated_command(
        "two_processes_parent",
        &[
            ("VGPU_SIM_GPUS", "1"),
            ("VGPU_SIM_MEMORY", "8GiB"),
            ("VGPU_SIM_CONTEXT_OVERHEAD", "200MiB"),
        ],
        dir.path(),
    )
    .env("SIM_DIR", dir.path())
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
#[ignore = "runs in a child process started by its outer test"]
fn two_processes_parent() {
    let Some(sim) = child_with_a_context() else {
        return;
    };
    let dir = std::path::PathBuf::from(std::env::var("SIM_DIR").unwrap());
    let (free_alone, _) = mem_info(&sim);
    assert_eq!(free_alone, (8 << 30) - 200 * MIB);
    let (mut child, pid) = spawn_holder(&dir, 1 << 30);
    let (free_shared, _) = mem_info(&sim);
    assert_eq!(
        free_shared,
        free_alone - (1 << 30) - 200 * MIB,
        "the other process's allocation and context are visible"
    );
    // NVML sees both processes with their bytes.
    assert_eq!(call!(sim, "nvmlInit_v2", fn()), 0);
    let mut handle: *const c_void = std::ptr::null();
    assert_eq!(
        call!(
            sim,
            "nvmlDeviceGetHandleByIndex_v2",
            fn(u32, *mut *const c_void),
            0,
            &mut handle
        ),
        0
    );
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Info {
        pid: u32,
        used: u64,
        gi: u32,
        ci: u32,
    }
    let mut infos = [Info::default(); 8];
    let mut count = 8u32;
    assert_eq!(
        call!(
            sim,
            "nvmlDeviceGetComputeRunningProcesses_v3",
            fn(*const c_void, *mut u32, *mut Info),
            handle,
            &mut count,
            infos.as_mut_ptr()
        ),
        0
    );
    assert_eq!(count, 2);
    let theirs = infos[..2]
        .iter()
        .find(|info| info.pid == pid)
        .expect("child listed");
    assert_eq!(theirs.used, (1 << 30) + 200 * MIB);
    let mine = infos[..2]
        .iter()
        .find(|info| info.pid == std::process::id())
        .expect("parent listed");
    assert_eq!(mine.used, 200 * MIB);
    // Killed without any cleanup: its memory comes back.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(mem_info(&sim).0, free_alone, "dead process reclaimed");
    count = 8;
    assert_eq!(
        call!(
            sim,
            "nvmlDeviceGetComputeRunningProcesses_v3",
            fn(*const c_void, *mut u32, *mut Info),
            handle,
            &mut count,
            infos.as_mut_ptr()
        ),
        0
    );
    assert_eq!(count, 1);
}

isolated!(
    virtual_memory_management,
    virtual_memory_management_inner,
    [
        ("VGPU_SIM_GPUS", "2"),
        ("VGPU_SIM_MEMORY", "4GiB"),
        ("VGPU_SIM_CONTEXT_OVERHEAD", "0")
    ],
    {
        #[repr(C)]
        struct Prop {
            kind: i32,
            handle_types: i32,
            location_type: i32,
            location_id: i32,
            win32: *mut c_void,
            flags: [u8; 8],
        }
        #[repr(C)]
        struct Access {
            location_type: i32,
            location_id: i32,
            flags: i32,
        }
        let sim = Sim::load();
        init(&sim);
        create_context(&sim, 0);
        let prop = Prop {
            kind: 1,
            handle_types: 0,
            location_type: 1,
            location_id: 1,
            win32: std::ptr::null_mut(),
            flags: [0; 8],
        };
        let mut granularity = 0usize;
        assert_eq!(
            call!(
                sim,
                "cuMemGetAllocationGranularity",
                fn(*mut usize, *const Prop, i32),
                &mut granularity,
                &prop,
                0
            ),
            SUCCESS
        );
        assert_eq!(granularity, 2 << 20);
        let bad = Prop {
            location_id: 7,
            ..prop
        };
        assert_ne!(
            call!(
                sim,
                "cuMemGetAllocationGranularity",
                fn(*mut usize, *const Prop, i32),
                &mut granularity,
                &bad,
                0
            ),
            SUCCESS
        );
        let mut handle = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMemCreate",
                fn(*mut u64, usize, *const Prop, u64),
                &mut handle,
                4096,
                &prop,
                0
            ),
            INVALID_VALUE,
            "unaligned size"
        );
        assert_eq!(
            call!(
                sim,
                "cuMemCreate",
                fn(*mut u64, usize, *const Prop, u64),
                &mut handle,
                8 << 20,
                &prop,
                0
            ),
            SUCCESS
        );
        // Charged on device 1 (the prop's location), seen from a context there.
        create_context(&sim, 1);
        assert_eq!(mem_info(&sim).0, (4 << 30) - (8 << 20));
        let mut va = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMemAddressReserve",
                fn(*mut u64, usize, usize, u64, u64),
                &mut va,
                16 << 20,
                0,
                0,
                0
            ),
            SUCCESS
        );
        assert_eq!(va % (2 << 20), 0);
        assert_eq!(
            call!(
                sim,
                "cuMemMap",
                fn(u64, usize, usize, u64, u64),
                va,
                8 << 20,
                0,
                handle,
                0
            ),
            SUCCESS
        );
        assert_eq!(
            call!(
                sim,
                "cuMemMap",
                fn(u64, usize, usize, u64, u64),
                va + (2 << 20),
                2 << 20,
                0,
                handle,
                0
            ),
            INVALID_VALUE,
            "overlapping map"
        );
        assert_eq!(
            call!(
                sim,
                "cuMemMap",
                fn(u64, usize, usize, u64, u64),
                va + (8 << 20),
                4 << 20,
                6 << 20,
                handle,
                0
            ),
            INVALID_VALUE,
            "past the handle's end"
        );
        let access = Access {
            location_type: 1,
            location_id: 1,
            flags: 3,
        };
        assert_eq!(
            call!(
                sim,
                "cuMemSetAccess",
                fn(u64, usize, *const Access, usize),
                va,
                8 << 20,
                &access,
                1
            ),
            SUCCESS
        );
        assert_eq!(
            call!(
                sim,
                "cuMemSetAccess",
                fn(u64, usize, *const Access, usize),
                va,
                16 << 20,
                &access,
                1
            ),
            INVALID_VALUE,
            "unmapped tail"
        );
        let data = [1u8; 64];
        assert_eq!(
            call!(
                sim,
                "cuMemcpyHtoD_v2",
                fn(u64, *const c_void, usize),
                va + 100,
                data.as_ptr().cast(),
                64
            ),
            SUCCESS
        );
        let mut retained = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMemRetainAllocationHandle",
                fn(*mut u64, *mut c_void),
                &mut retained,
                (va + 4096) as *mut c_void
            ),
            SUCCESS
        );
        assert_eq!(retained, handle);
        assert_eq!(
            call!(sim, "cuMemAddressFree", fn(u64, usize), va, 16 << 20),
            INVALID_VALUE,
            "still mapped"
        );
        assert_eq!(
            call!(sim, "cuMemUnmap", fn(u64, usize), va, 8 << 20),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuMemRelease", fn(u64), handle), SUCCESS);
        assert_eq!(
            mem_info(&sim).0,
            (4 << 30) - (8 << 20),
            "the retained reference keeps it"
        );
        assert_eq!(call!(sim, "cuMemRelease", fn(u64), retained), SUCCESS);
        assert_eq!(mem_info(&sim).0, 4 << 30, "released and unmapped: freed");
        assert_eq!(call!(sim, "cuMemRelease", fn(u64), handle), INVALID_VALUE);
        assert_eq!(
            call!(sim, "cuMemAddressFree", fn(u64, usize), va, 16 << 20),
            SUCCESS
        );
    }
);

isolated!(
    memory_pools,
    memory_pools_inner,
    [
        ("VGPU_SIM_GPUS", "1"),
        ("VGPU_SIM_MEMORY", "4GiB"),
        ("VGPU_SIM_CONTEXT_OVERHEAD", "0")
    ],
    {
        let sim = Sim::load();
        init(&sim);
        create_context(&sim, 0);
        let attr = |pool: u64, attribute: i32| -> u64 {
            let mut value = 0u64;
            assert_eq!(
                call!(
                    sim,
                    "cuMemPoolGetAttribute",
                    fn(u64, i32, *mut c_void),
                    pool,
                    attribute,
                    (&mut value as *mut u64).cast()
                ),
                SUCCESS
            );
            value
        };
        let mut pool = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuDeviceGetDefaultMemPool",
                fn(*mut u64, i32),
                &mut pool,
                0
            ),
            SUCCESS
        );
        let mut current_pool = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuDeviceGetMemPool",
                fn(*mut u64, i32),
                &mut current_pool,
                0
            ),
            SUCCESS
        );
        assert_eq!(pool, current_pool);
        assert_eq!(attr(pool, 4), 0, "default release threshold");
        let mut ptr = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMemAllocAsync",
                fn(*mut u64, usize, u64),
                &mut ptr,
                5 << 20,
                0
            ),
            SUCCESS
        );
        assert_eq!(
            (attr(pool, 5), attr(pool, 7)),
            (32 << 20, 5 << 20),
            "reserved in 32 MiB chunks, as a real pool does"
        );
        assert_eq!(mem_info(&sim).0, (4 << 30) - (32 << 20));
        assert_eq!(call!(sim, "cuMemFreeAsync", fn(u64, u64), ptr, 0), SUCCESS);
        assert_eq!(
            (attr(pool, 5), attr(pool, 7)),
            (32 << 20, 0),
            "freed memory stays reserved"
        );
        assert_eq!(
            mem_info(&sim).0,
            (4 << 30) - (32 << 20),
            "and is still used on the card"
        );
        // With a high threshold a synchronize keeps it; trimming gives it back.
        let mut keep = u64::MAX;
        assert_eq!(
            call!(
                sim,
                "cuMemPoolSetAttribute",
                fn(u64, i32, *mut c_void),
                pool,
                4,
                (&mut keep as *mut u64).cast()
            ),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuStreamSynchronize", fn(u64), 0), SUCCESS);
        assert_eq!(attr(pool, 5), 32 << 20);
        assert_eq!(
            call!(sim, "cuMemPoolTrimTo", fn(u64, usize), pool, 0),
            SUCCESS
        );
        assert_eq!(attr(pool, 5), 0);
        assert_eq!(mem_info(&sim).0, 4 << 30);
        // Threshold 0: the next synchronize releases idle memory.
        let mut zero = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMemPoolSetAttribute",
                fn(u64, i32, *mut c_void),
                pool,
                4,
                (&mut zero as *mut u64).cast()
            ),
            SUCCESS
        );
        assert_eq!(
            call!(
                sim,
                "cuMemAllocAsync",
                fn(*mut u64, usize, u64),
                &mut ptr,
                3 << 20,
                0
            ),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuMemFreeAsync", fn(u64, u64), ptr, 0), SUCCESS);
        assert_eq!(attr(pool, 5), 32 << 20);
        assert_eq!(call!(sim, "cuCtxSynchronize", fn()), SUCCESS);
        assert_eq!(attr(pool, 5), 0);
        assert_eq!(attr(pool, 6), 32 << 20, "high-water mark");
        assert_eq!(
            call!(
                sim,
                "cuMemPoolSetAttribute",
                fn(u64, i32, *mut c_void),
                pool,
                6,
                (&mut zero as *mut u64).cast()
            ),
            SUCCESS
        );
        assert_eq!(attr(pool, 6), 0);
        // An explicit pool.
        #[repr(C)]
        struct Props {
            alloc_type: i32,
            handle_types: i32,
            location_type: i32,
            location_id: i32,
            win32: *mut c_void,
            max_size: usize,
            usage: u16,
            reserved: [u8; 54],
        }
        let props = Props {
            alloc_type: 1,
            handle_types: 0,
            location_type: 1,
            location_id: 0,
            win32: std::ptr::null_mut(),
            max_size: 0,
            usage: 0,
            reserved: [0; 54],
        };
        let mut mine = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMemPoolCreate",
                fn(*mut u64, *const Props),
                &mut mine,
                &props
            ),
            SUCCESS
        );
        assert_eq!(
            call!(
                sim,
                "cuMemAllocFromPoolAsync",
                fn(*mut u64, usize, u64, u64),
                &mut ptr,
                1 << 20,
                mine,
                0
            ),
            SUCCESS
        );
        let mut owner = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuPointerGetAttribute",
                fn(*mut c_void, i32, u64),
                (&mut owner as *mut u64).cast(),
                17,
                ptr
            ),
            SUCCESS
        );
        assert_eq!(owner, mine);
        assert_eq!(mem_info(&sim).0, (4 << 30) - (32 << 20));
        assert_eq!(call!(sim, "cuMemPoolDestroy", fn(u64), mine), SUCCESS);
        assert_eq!(
            mem_info(&sim).0,
            4 << 30,
            "destroying a pool returns its memory"
        );
        assert_eq!(
            call!(sim, "cuMemPoolDestroy", fn(u64), pool),
            INVALID_VALUE,
            "the default pool stays"
        );
        assert_eq!(
            call!(
                sim,
                "cuMemAllocAsync",
                fn(*mut u64, usize, u64),
                &mut ptr,
                8 << 30,
                0
            ),
            OUT_OF_MEMORY
        );
    }
);

isolated!(
    arrays_are_charged,
    arrays_are_charged_inner,
    [
        ("VGPU_SIM_GPUS", "1"),
        ("VGPU_SIM_MEMORY", "1GiB"),
        ("VGPU_SIM_CONTEXT_OVERHEAD", "0")
    ],
    {
        #[repr(C)]
        struct Desc {
            width: usize,
            height: usize,
            format: u32,
            channels: u32,
        }
        #[repr(C)]
        struct Desc3 {
            width: usize,
            height: usize,
            depth: usize,
            format: u32,
            channels: u32,
            flags: u32,
        }
        let sim = Sim::load();
        init(&sim);
        create_context(&sim, 0);
        let total = 1u64 << 30;
        let mut array = 0u64;
        // 64 x 64 float4: 64 KiB.
        assert_eq!(
            call!(
                sim,
                "cuArrayCreate_v2",
                fn(*mut u64, *const Desc),
                &mut array,
                &Desc {
                    width: 64,
                    height: 64,
                    format: 0x20,
                    channels: 4
                }
            ),
            SUCCESS
        );
        // Charged in the driver's 2 MiB units, as the H200 with driver 580 does.
        const UNIT: u64 = 2 << 20;
        assert_eq!(mem_info(&sim).0, total - UNIT);
        assert_eq!(
            call!(
                sim,
                "cuArrayCreate_v2",
                fn(*mut u64, *const Desc),
                &mut array,
                &Desc {
                    width: 64,
                    height: 64,
                    format: 0x77,
                    channels: 4
                }
            ),
            INVALID_VALUE,
            "unknown format"
        );
        let mut cube = 0u64;
        // 100 x 10 x 10 of uint16 x2: 40000 bytes, one 2 MiB unit.
        assert_eq!(
            call!(
                sim,
                "cuArray3DCreate_v2",
                fn(*mut u64, *const Desc3),
                &mut cube,
                &Desc3 {
                    width: 100,
                    height: 10,
                    depth: 10,
                    format: 0x02,
                    channels: 2,
                    flags: 0
                }
            ),
            SUCCESS
        );
        assert_eq!(mem_info(&sim).0, total - 2 * UNIT);
        let mut mip = 0u64;
        // 256 x 256 uint8 x1 with 3 levels: 65536 + 16384 + 4096.
        assert_eq!(
            call!(
                sim,
                "cuMipmappedArrayCreate",
                fn(*mut u64, *const Desc3, u32),
                &mut mip,
                &Desc3 {
                    width: 256,
                    height: 256,
                    depth: 0,
                    format: 0x01,
                    channels: 1,
                    flags: 0
                },
                3
            ),
            SUCCESS
        );
        assert_eq!(mem_info(&sim).0, total - 3 * UNIT);
        // A layered mipmap keeps its 64 layers at every level: 1024x1024 float x1 with
        // 3 levels, (1 + 1/4 + 1/16) x 4 MiB per layer = 336 MiB, not the 149.3 MiB
        // of a shrinking depth.
        let mut layered = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMipmappedArrayCreate",
                fn(*mut u64, *const Desc3, u32),
                &mut layered,
                &Desc3 {
                    width: 1024,
                    height: 1024,
                    depth: 64,
                    format: 0x20,
                    channels: 1,
                    flags: 0x01
                },
                3
            ),
            SUCCESS
        );
        assert_eq!(mem_info(&sim).0, total - 3 * UNIT - 336 * (1 << 20));
        assert_eq!(
            call!(sim, "cuMipmappedArrayDestroy", fn(u64), layered),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuArrayDestroy", fn(u64), mip),
            INVALID_HANDLE,
            "a mipmap is not an array"
        );
        assert_eq!(call!(sim, "cuMipmappedArrayDestroy", fn(u64), mip), SUCCESS);
        assert_eq!(call!(sim, "cuArrayDestroy", fn(u64), cube), SUCCESS);
        assert_eq!(call!(sim, "cuArrayDestroy", fn(u64), array), SUCCESS);
        assert_eq!(call!(sim, "cuArrayDestroy", fn(u64), array), INVALID_HANDLE);
        assert_eq!(mem_info(&sim).0, total);
    }
);

const PTX: &[u8] = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k_100us()\n{\n ret;\n}\n.visible .entry k_20ms()\n{\n ret;\n}\n.visible .entry plain()\n{\n ret;\n}\n\0";

fn load_functions(sim: &Sim) -> (u64, u64, u64) {
    let mut module = 0u64;
    assert_eq!(
        call!(
            sim,
            "cuModuleLoadData",
            fn(*mut u64, *const c_void),
            &mut module,
            PTX.as_ptr().cast()
        ),
        SUCCESS
    );
    let get = |name: &CStr| {
        let mut function = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuModuleGetFunction",
                fn(*mut u64, u64, *const c_char),
                &mut function,
                module,
                name.as_ptr()
            ),
            SUCCESS
        );
        function
    };
    let mut missing = 0u64;
    assert_eq!(
        call!(
            sim,
            "cuModuleGetFunction",
            fn(*mut u64, u64, *const c_char),
            &mut missing,
            module,
            c"nope".as_ptr()
        ),
        NOT_FOUND
    );
    (get(c"k_100us"), get(c"k_20ms"), get(c"plain"))
}

fn launch(sim: &Sim, function: u64, stream: u64) -> i32 {
    call!(
        sim,
        "cuLaunchKernel",
        fn(u64, u32, u32, u32, u32, u32, u32, u32, u64, *mut *mut c_void, *mut *mut c_void),
        function,
        8,
        1,
        1,
        128,
        1,
        1,
        0,
        stream,
        std::ptr::null_mut(),
        std::ptr::null_mut()
    )
}

isolated!(
    simulated_kernel_time,
    simulated_kernel_time_inner,
    [("VGPU_SIM_GPUS", "1"), ("VGPU_SIM_KERNEL_NS", "50000")],
    {
        let sim = Sim::load();
        init(&sim);
        create_context(&sim, 0);
        let (k100us, k20ms, plain) = load_functions(&sim);
        let mut stream = 0u64;
        assert_eq!(
            call!(sim, "cuStreamCreate", fn(*mut u64, u32), &mut stream, 1),
            SUCCESS
        );
        let (mut start, mut end) = (0u64, 0u64);
        assert_eq!(
            call!(sim, "cuEventCreate", fn(*mut u64, u32), &mut start, 0),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuEventCreate", fn(*mut u64, u32), &mut end, 0),
            SUCCESS
        );
        let mut ms = 0f32;
        assert_eq!(
            call!(
                sim,
                "cuEventElapsedTime",
                fn(*mut f32, u64, u64),
                &mut ms,
                start,
                end
            ),
            INVALID_HANDLE,
            "not recorded"
        );
        assert_eq!(
            call!(sim, "cuEventQuery", fn(u64), end),
            SUCCESS,
            "an unrecorded event is complete"
        );
        // 100 launches of a 100 us kernel: 10 ms of simulated time. Queued behind
        // 200 ms of 20 ms kernels, so the stream never runs dry while this thread
        // launches (a descheduled test thread on a busy machine would otherwise leave
        // gaps in the timeline and let the work finish before the queries below).
        let wall = Instant::now();
        for _ in 0..10 {
            assert_eq!(launch(&sim, k20ms, stream), SUCCESS);
        }
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), start, stream),
            SUCCESS
        );
        for _ in 0..100 {
            assert_eq!(launch(&sim, k100us, stream), SUCCESS);
        }
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), end, stream),
            SUCCESS
        );
        assert_eq!(
            call!(
                sim,
                "cuEventElapsedTime",
                fn(*mut f32, u64, u64),
                &mut ms,
                start,
                end
            ),
            NOT_READY
        );
        assert_eq!(call!(sim, "cuEventQuery", fn(u64), end), NOT_READY);
        assert_eq!(call!(sim, "cuStreamQuery", fn(u64), stream), NOT_READY);
        assert_eq!(call!(sim, "cuEventSynchronize", fn(u64), end), SUCCESS);
        assert!(
            wall.elapsed().as_secs_f64() >= 0.210,
            "synchronize waits for the simulated work"
        );
        assert_eq!(call!(sim, "cuEventQuery", fn(u64), end), SUCCESS);
        assert_eq!(
            call!(
                sim,
                "cuEventElapsedTime",
                fn(*mut f32, u64, u64),
                &mut ms,
                start,
                end
            ),
            SUCCESS
        );
        assert!(
            (ms - 10.0).abs() < 1.0,
            "elapsed {ms} ms, expected 10 ms within 10%"
        );
        // The env default for unsuffixed names, and a 20 ms kernel on the legacy stream.
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), start, stream),
            SUCCESS
        );
        for _ in 0..20 {
            assert_eq!(launch(&sim, plain, stream), SUCCESS);
        }
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), end, stream),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuStreamSynchronize", fn(u64), stream), SUCCESS);
        assert_eq!(
            call!(
                sim,
                "cuEventElapsedTime",
                fn(*mut f32, u64, u64),
                &mut ms,
                start,
                end
            ),
            SUCCESS
        );
        assert!((ms - 1.0).abs() < 0.1, "20 x 50 us = 1 ms, got {ms}");
        let wall = Instant::now();
        assert_eq!(launch(&sim, k20ms, 0), SUCCESS);
        assert_eq!(call!(sim, "cuCtxSynchronize", fn()), SUCCESS);
        assert!(wall.elapsed().as_secs_f64() >= 0.019);
        // Cross-stream ordering: a stream waiting on an event starts after it.
        let mut other = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuStreamCreateWithPriority",
                fn(*mut u64, u32, i32),
                &mut other,
                1,
                -1
            ),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), start, stream),
            SUCCESS
        );
        assert_eq!(launch(&sim, k20ms, stream), SUCCESS);
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), end, stream),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuStreamWaitEvent", fn(u64, u64, u32), other, end, 0),
            SUCCESS
        );
        assert_eq!(launch(&sim, k100us, other), SUCCESS);
        let mut after = 0u64;
        assert_eq!(
            call!(sim, "cuEventCreate", fn(*mut u64, u32), &mut after, 0),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), after, other),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuEventSynchronize", fn(u64), after), SUCCESS);
        assert_eq!(
            call!(
                sim,
                "cuEventElapsedTime",
                fn(*mut f32, u64, u64),
                &mut ms,
                start,
                after
            ),
            SUCCESS
        );
        assert!((ms - 20.1).abs() < 1.0, "waited then ran: {ms}");
        // Launch validation.
        let bad_block = call!(
            sim,
            "cuLaunchKernel",
            fn(u64, u32, u32, u32, u32, u32, u32, u32, u64, *mut *mut c_void, *mut *mut c_void),
            k100us,
            1,
            1,
            1,
            2048,
            1,
            1,
            0,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        );
        assert_eq!(bad_block, INVALID_VALUE);
        assert_eq!(launch(&sim, 0x1234, 0), INVALID_HANDLE);
        let mut threads = 0;
        assert_eq!(
            call!(
                sim,
                "cuFuncGetAttribute",
                fn(*mut i32, i32, u64),
                &mut threads,
                0,
                k100us
            ),
            SUCCESS
        );
        assert_eq!(threads, 1024);
        // NVML utilization sees the busy card.
        assert_eq!(call!(sim, "nvmlInit_v2", fn()), 0);
        let mut handle: *const c_void = std::ptr::null();
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetHandleByIndex_v2",
                fn(u32, *mut *const c_void),
                0,
                &mut handle
            ),
            0
        );
        let mut rates = [0u32; 2];
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetUtilizationRates",
                fn(*const c_void, *mut [u32; 2]),
                handle,
                &mut rates
            ),
            0
        );
        assert!(
            rates[0] >= 3 && rates[0] <= 100,
            "about 52 ms busy in the last second: {}%",
            rates[0]
        );
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Sample {
            pid: u32,
            ts: u64,
            sm: u32,
            mem: u32,
            enc: u32,
            dec: u32,
        }
        let mut samples = [Sample::default(); 4];
        let mut count = 4u32;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetProcessUtilization",
                fn(*const c_void, *mut Sample, *mut u32, u64),
                handle,
                samples.as_mut_ptr(),
                &mut count,
                0
            ),
            0
        );
        assert_eq!(count, 1);
        assert_eq!(samples[0].pid, std::process::id());
        assert!(samples[0].sm > 0);
    }
);

isolated!(
    kernels_from_libraries,
    kernels_from_libraries_inner,
    [("VGPU_SIM_GPUS", "1")],
    {
        let sim = Sim::load();
        init(&sim);
        create_context(&sim, 0);
        let mut library = 0u64;
        let rc = call!(
            sim,
            "cuLibraryLoadData",
            fn(
                *mut u64,
                *const c_void,
                *mut i32,
                *mut *mut c_void,
                u32,
                *mut i32,
                *mut *mut c_void,
                u32,
            ),
            &mut library,
            PTX.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0
        );
        assert_eq!(rc, SUCCESS);
        let mut kernel = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuLibraryGetKernel",
                fn(*mut u64, u64, *const c_char),
                &mut kernel,
                library,
                c"k_20ms".as_ptr()
            ),
            SUCCESS
        );
        let mut function = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuKernelGetFunction",
                fn(*mut u64, u64),
                &mut function,
                kernel
            ),
            SUCCESS
        );
        let mut name: *const c_char = std::ptr::null();
        assert_eq!(
            call!(
                sim,
                "cuFuncGetName",
                fn(*mut *const c_char, u64),
                &mut name,
                function
            ),
            SUCCESS
        );
        // SAFETY: the sim's kernel name, a static C string.
        assert_eq!(unsafe { CStr::from_ptr(name) }.to_str().unwrap(), "k_20ms");
        // cuLaunchKernelEx with a CUlaunchConfig, and a CUkernel passed as the function.
        #[repr(C)]
        struct Config {
            grid: [u32; 3],
            block: [u32; 3],
            shared: u32,
            stream: u64,
            attrs: *mut c_void,
            num_attrs: u32,
        }
        let config = Config {
            grid: [4, 1, 1],
            block: [256, 1, 1],
            shared: 0,
            stream: 0,
            attrs: std::ptr::null_mut(),
            num_attrs: 0,
        };
        let wall = Instant::now();
        assert_eq!(
            call!(
                sim,
                "cuLaunchKernelEx",
                fn(*const Config, u64, *mut *mut c_void, *mut *mut c_void),
                &config,
                function,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            SUCCESS
        );
        assert_eq!(
            call!(
                sim,
                "cuLaunchKernelEx",
                fn(*const Config, u64, *mut *mut c_void, *mut *mut c_void),
                &config,
                kernel,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuCtxSynchronize", fn()), SUCCESS);
        assert!(
            wall.elapsed().as_secs_f64() >= 0.039,
            "two 20 ms kernels in order"
        );
        let coop = call!(
            sim,
            "cuLaunchCooperativeKernel",
            fn(u64, u32, u32, u32, u32, u32, u32, u32, u64, *mut *mut c_void),
            function,
            100_000,
            1,
            1,
            1024,
            1,
            1,
            0,
            0,
            std::ptr::null_mut()
        );
        assert_eq!(coop, 720, "too many blocks to be co-resident");
        assert_eq!(call!(sim, "cuLibraryUnload", fn(u64), library), SUCCESS);
        assert_eq!(launch(&sim, function, 0), INVALID_HANDLE);
        let mut module = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuModuleLoad",
                fn(*mut u64, *const c_char),
                &mut module,
                c"/nonexistent/k.cubin".as_ptr()
            ),
            301
        );
        assert_eq!(
            call!(
                sim,
                "cuModuleLoadData",
                fn(*mut u64, *const c_void),
                &mut module,
                c"garbage".as_ptr().cast()
            ),
            200
        );
    }
);

isolated!(
    proc_address_rules,
    proc_address_rules_inner,
    [("VGPU_SIM_GPUS", "1")],
    {
        let sim = Sim::load();
        let lookup = |name: &CStr, version: i32, flags: u64| -> (i32, usize, i32) {
            let mut pfn: *mut c_void = std::ptr::dangling_mut::<c_void>();
            let mut status = -1i32;
            let rc = call!(
                sim,
                "cuGetProcAddress_v2",
                fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32),
                name.as_ptr(),
                &mut pfn,
                version,
                flags,
                &mut status
            );
            (rc, pfn as usize, status)
        };
        for (name, version, flags, expected) in [
            (c"cuMemAlloc", 3000, 0, "cuMemAlloc"),
            (c"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
            (c"cuMemGetInfo", 13000, 0, "cuMemGetInfo_v2"),
            (c"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
            (c"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
            (c"cuCtxCreate", 13000, 0, "cuCtxCreate_v4"),
            (c"cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
            (c"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
            (c"cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"),
            (c"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"),
            (c"cuEventDestroy", 3020, 0, "cuEventDestroy"),
            (
                c"cuDevicePrimaryCtxRelease",
                11000,
                0,
                "cuDevicePrimaryCtxRelease_v2",
            ),
            (
                c"cuDevicePrimaryCtxRelease",
                10020,
                0,
                "cuDevicePrimaryCtxRelease",
            ),
            (c"cuLaunchKernel", 13000, 0, "cuLaunchKernel"),
            (c"cuLaunchKernel", 13000, 1, "cuLaunchKernel"),
            (c"cuLaunchKernel", 13000, 2, "cuLaunchKernel_ptsz"),
            (c"cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds"),
            (c"cuMemAlloc", 13000, 2, "cuMemAlloc_v2"),
            (c"cuStreamSynchronize", 13000, 2, "cuStreamSynchronize_ptsz"),
            (c"cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz"),
            (c"cuMemsetD32", 13000, 2, "cuMemsetD32_v2_ptds"),
        ] {
            let (rc, address, status) = lookup(name, version, flags);
            assert_eq!((rc, status), (SUCCESS, 0), "{name:?} {version} {flags}");
            assert_eq!(
                address,
                sim.address(expected),
                "{name:?} {version} {flags} should be {expected}"
            );
        }
        let (rc, address, status) = lookup(c"cuNoSuchFunction", 13000, 0);
        assert_eq!(
            (rc, address, status),
            (SUCCESS, 0, 1),
            "580 answers a miss with success and the status"
        );
        let (rc, address, status) = lookup(c"cuMemAllocAsync", 11000, 0);
        assert_eq!((rc, address, status), (SUCCESS, 0, 2), "introduced in 11.2");
        let (rc, address, status) = lookup(c"cuLaunchKernel", 6000, 2);
        assert_eq!(
            (rc, address, status),
            (SUCCESS, 0, 2),
            "the per-thread variant is from 7.0"
        );
        let mut missing: *mut c_void = std::ptr::dangling_mut::<c_void>();
        let rc = call!(
            sim,
            "cuGetProcAddress",
            fn(*const c_char, *mut *mut c_void, i32, u64),
            c"cuNoSuchFunction".as_ptr(),
            &mut missing,
            13000,
            0
        );
        assert_eq!(
            (rc, missing as usize),
            (NOT_FOUND, 0),
            "the original entry point says NOT_FOUND"
        );
        let (rc, _, _) = lookup(c"cuMemAlloc", 13000, 8);
        assert_eq!(rc, INVALID_VALUE, "unknown flags");
        // The v1 entry point works too, and what it returns is callable.
        let mut pfn: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            call!(
                sim,
                "cuGetProcAddress",
                fn(*const c_char, *mut *mut c_void, i32, u64),
                c"cuInit".as_ptr(),
                &mut pfn,
                13000,
                0
            ),
            SUCCESS
        );
        // SAFETY: cuGetProcAddress handed out cuInit's address.
        let cu_init: unsafe extern "C" fn(u32) -> i32 = unsafe { std::mem::transmute(pfn) };
        // SAFETY: cuInit takes flags only.
        assert_eq!(unsafe { cu_init(0) }, SUCCESS);
        // Error names and strings.
        let mut text: *const c_char = std::ptr::null();
        assert_eq!(
            call!(
                sim,
                "cuGetErrorName",
                fn(i32, *mut *const c_char),
                2,
                &mut text
            ),
            SUCCESS
        );
        assert_eq!(
            // SAFETY: the sim's error name, a static C string.
            unsafe { CStr::from_ptr(text) }.to_str().unwrap(),
            "CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(
            call!(
                sim,
                "cuGetErrorString",
                fn(i32, *mut *const c_char),
                600,
                &mut text
            ),
            SUCCESS
        );
        assert_eq!(
            // SAFETY: the sim's error string, a static C string.
            unsafe { CStr::from_ptr(text) }.to_str().unwrap(),
            "device not ready"
        );
        assert_eq!(
            call!(
                sim,
                "cuGetErrorName",
                fn(i32, *mut *const c_char),
                12345,
                &mut text
            ),
            INVALID_VALUE
        );
        assert!(text.is_null());
        let mut table: *const c_void = std::ptr::dangling::<c_void>();
        assert_eq!(
            call!(
                sim,
                "cuGetExportTable",
                fn(*mut *const c_void, *const c_void),
                &mut table,
                [0u8; 16].as_ptr().cast()
            ),
            801
        );
    }
);

isolated!(
    bad_config_fails_cleanly,
    bad_config_fails_cleanly_inner,
    [("VGPU_SIM_GPUS", "0")],
    {
        let sim = Sim::load();
        assert_eq!(call!(sim, "cuInit", fn(u32), 0), NOT_INITIALIZED);
        assert_eq!(
            call!(sim, "cuInit", fn(u32), 0),
            NOT_INITIALIZED,
            "and again, without a panic"
        );
        assert_eq!(call!(sim, "nvmlInit_v2", fn()), 1);
        let mut count = 0;
        assert_eq!(
            call!(sim, "cuDeviceGetCount", fn(*mut i32), &mut count),
            NOT_INITIALIZED
        );
    }
);

#[test]
fn bad_config_prints_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sim.yaml");
    std::fs::write(&config, "gpus:\n  - memory: 12 parsecs\n").unwrap();
    let output = common::isolated_command(
        "bad_config_fails_cleanly_inner",
        &[("VGPU_SIM_CONFIG", config.to_str().unwrap())],
        dir.path(),
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{stderr}"
    );
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("vgpu-sim:"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("sim.yaml") && lines[0].contains("parsecs"),
        "{}",
        lines[0]
    );
}

isolated!(
    forked_child_starts_fresh,
    forked_child_starts_fresh_inner,
    [
        ("VGPU_SIM_GPUS", "1"),
        ("VGPU_SIM_MEMORY", "4GiB"),
        ("VGPU_SIM_CONTEXT_OVERHEAD", "0")
    ],
    {
        let sim = Sim::load();
        init(&sim);
        create_context(&sim, 0);
        let held = alloc(&sim, 64 << 20).unwrap();
        // SAFETY: the child only calls async-signal-tolerant code paths of the sim and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut count = 0;
            let mut code = 10;
            if call!(sim, "cuDeviceGetCount", fn(*mut i32), &mut count) == NOT_INITIALIZED {
                code = 11;
                if call!(sim, "cuInit", fn(u32), 0) == SUCCESS {
                    code = 12;
                    let mut ctx = 0u64;
                    if call!(
                        sim,
                        "cuCtxCreate_v2",
                        fn(*mut u64, u32, i32),
                        &mut ctx,
                        0,
                        0
                    ) == SUCCESS
                        && alloc(&sim, 32 << 20).is_ok()
                    {
                        let (mut f, mut t) = (0usize, 0usize);
                        call!(
                            sim,
                            "cuMemGetInfo_v2",
                            fn(*mut usize, *mut usize),
                            &mut f,
                            &mut t
                        );
                        code = if f as u64 == (4 << 30) - (96 << 20) {
                            0
                        } else {
                            13
                        };
                    }
                }
            }
            // SAFETY: _exit in the forked child, which must not unwind.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child, with our own status word.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "child saw the parent's 64 MiB plus its own 32 MiB"
        );
        assert_eq!(
            mem_info(&sim).0,
            (4 << 30) - (64 << 20),
            "the child's memory was reclaimed"
        );
        free(&sim, held);
    }
);

fn launch_grid(sim: &Sim, function: u64, blocks: u32, stream: u64) -> i32 {
    call!(
        sim,
        "cuLaunchKernel",
        fn(u64, u32, u32, u32, u32, u32, u32, u32, u64, *mut *mut c_void, *mut *mut c_void),
        function,
        blocks,
        1,
        1,
        128,
        1,
        1,
        0,
        stream,
        std::ptr::null_mut(),
        std::ptr::null_mut()
    )
}

fn new_stream(sim: &Sim) -> u64 {
    let mut stream = 0u64;
    assert_eq!(
        call!(sim, "cuStreamCreate", fn(*mut u64, u32), &mut stream, 1),
        SUCCESS
    );
    stream
}

fn new_event(sim: &Sim) -> u64 {
    let mut event = 0u64;
    assert_eq!(
        call!(sim, "cuEventCreate", fn(*mut u64, u32), &mut event, 0),
        SUCCESS
    );
    event
}

/// A new stream and `N` new events, for a child that times work on that stream.
fn stream_and_events<const N: usize>(sim: &Sim) -> (u64, [u64; N]) {
    (new_stream(sim), std::array::from_fn(|_| new_event(sim)))
}

fn record_event(sim: &Sim, event: u64, stream: u64) {
    assert_eq!(
        call!(sim, "cuEventRecord", fn(u64, u64), event, stream),
        SUCCESS
    );
}

fn elapsed_ms(sim: &Sim, start: u64, end: u64) -> f32 {
    assert_eq!(call!(sim, "cuEventSynchronize", fn(u64), end), SUCCESS);
    let mut ms = 0f32;
    assert_eq!(
        call!(
            sim,
            "cuEventElapsedTime",
            fn(*mut f32, u64, u64),
            &mut ms,
            start,
            end
        ),
        SUCCESS
    );
    ms
}

isolated!(
    kernels_share_the_cards_sms,
    kernels_share_the_cards_sms_inner,
    [("VGPU_SIM_GPUS", "1"), ("VGPU_SIM_SMS", "132")],
    {
        let sim = Sim::load();
        init(&sim);
        create_context(&sim, 0);
        let (_, k20ms, _) = load_functions(&sim);
        // Eight streams of quarter-card (33-block) 20 ms kernels: four fit at once, the
        // other four wait for their SMs, and their events time the wait as well.
        let streams: Vec<u64> = (0..8).map(|_| new_stream(&sim)).collect();
        let events: Vec<(u64, u64)> = (0..8).map(|_| (new_event(&sim), new_event(&sim))).collect();
        let wall = Instant::now();
        for (stream, (start, end)) in streams.iter().zip(&events) {
            assert_eq!(
                call!(sim, "cuEventRecord", fn(u64, u64), *start, *stream),
                SUCCESS
            );
            assert_eq!(launch_grid(&sim, k20ms, 33, *stream), SUCCESS);
            assert_eq!(
                call!(sim, "cuEventRecord", fn(u64, u64), *end, *stream),
                SUCCESS
            );
        }
        let mut times: Vec<f32> = events
            .iter()
            .map(|(s, e)| elapsed_ms(&sim, *s, *e))
            .collect();
        times.sort_by(f32::total_cmp);
        assert!(
            times[..4].iter().all(|ms| (ms - 20.0).abs() < 1.0),
            "{times:?}"
        );
        assert!(
            times[4..].iter().all(|ms| (ms - 40.0).abs() < 1.0),
            "{times:?}"
        );
        assert!(wall.elapsed().as_secs_f64() >= 0.039);
        // Small kernels on several streams still overlap.
        let wall = Instant::now();
        for stream in &streams {
            assert_eq!(launch_grid(&sim, k20ms, 8, *stream), SUCCESS);
        }
        assert_eq!(call!(sim, "cuCtxSynchronize", fn()), SUCCESS);
        let took = wall.elapsed().as_secs_f64();
        assert!((0.019..0.035).contains(&took), "{took} s");
    }
);

isolated!(
    stream_capture_makes_graphs_that_launch,
    stream_capture_makes_graphs_that_launch_inner,
    [("VGPU_SIM_GPUS", "1")],
    {
        const CAPTURE_UNSUPPORTED: i32 = 900;
        const CAPTURE_INVALIDATED: i32 = 901;
        const CAPTURED_EVENT: i32 = 907;
        const ILLEGAL_STATE: i32 = 401;
        let sim = Sim::load();
        init(&sim);
        let ctx = create_context(&sim, 0);
        let (k100us, k20ms, _) = load_functions(&sim);
        let stream = new_stream(&sim);
        let status = |stream: u64| {
            let mut status = 9u32;
            assert_eq!(
                call!(
                    sim,
                    "cuStreamIsCapturing",
                    fn(u64, *mut u32),
                    stream,
                    &mut status
                ),
                SUCCESS
            );
            status
        };
        let mut graph = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuStreamEndCapture",
                fn(u64, *mut u64),
                stream,
                &mut graph
            ),
            ILLEGAL_STATE
        );
        // Relaxed capture: kernels become nodes, nothing runs, events are captured.
        assert_eq!(
            call!(sim, "cuStreamBeginCapture_v2", fn(u64, u32), stream, 2),
            SUCCESS
        );
        assert_eq!(status(stream), 1);
        let event = new_event(&sim);
        for _ in 0..2 {
            assert_eq!(launch(&sim, k20ms, stream), SUCCESS);
        }
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), event, stream),
            SUCCESS
        );
        assert_eq!(call!(sim, "cuEventQuery", fn(u64), event), CAPTURED_EVENT);
        assert_eq!(
            call!(
                sim,
                "cuStreamEndCapture",
                fn(u64, *mut u64),
                stream,
                &mut graph
            ),
            SUCCESS
        );
        // Had the two 20 ms kernels run, the stream would still be busy with them
        // (judged by the sim's own timeline, not by how fast this thread got here).
        assert_eq!(
            call!(sim, "cuStreamQuery", fn(u64), stream),
            SUCCESS,
            "captured kernels do not run"
        );
        assert_eq!(status(stream), 0);
        let mut exec = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuGraphInstantiateWithFlags",
                fn(*mut u64, u64, u64),
                &mut exec,
                graph,
                0
            ),
            SUCCESS
        );
        // A launch runs the graph's kernels one after the other: 40 ms.
        let (start, end) = (new_event(&sim), new_event(&sim));
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), start, stream),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuGraphLaunch", fn(u64, u64), exec, stream),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuEventRecord", fn(u64, u64), end, stream),
            SUCCESS
        );
        let ms = elapsed_ms(&sim, start, end);
        assert!((ms - 40.0).abs() < 1.0, "{ms}");
        // Global capture: another thread's event query is refused and breaks it, unless
        // that thread is in relaxed mode.
        assert_eq!(
            call!(sim, "cuStreamBeginCapture_v2", fn(u64, u32), stream, 0),
            SUCCESS
        );
        assert_eq!(launch(&sim, k100us, stream), SUCCESS);
        let probe = new_event(&sim);
        let query_from_thread = |relaxed: bool| {
            std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        assert_eq!(call!(sim, "cuCtxSetCurrent", fn(u64), ctx), SUCCESS);
                        let mut mode = if relaxed { 2u32 } else { 0 };
                        assert_eq!(
                            call!(
                                sim,
                                "cuThreadExchangeStreamCaptureMode",
                                fn(*mut u32),
                                &mut mode
                            ),
                            SUCCESS
                        );
                        call!(sim, "cuEventQuery", fn(u64), probe)
                    })
                    .join()
                    .expect("thread")
            })
        };
        assert_eq!(query_from_thread(true), SUCCESS);
        assert_eq!(
            status(stream),
            1,
            "a relaxed thread leaves the capture alone"
        );
        assert_eq!(query_from_thread(false), CAPTURE_UNSUPPORTED);
        assert_eq!(status(stream), 2, "invalidated");
        assert_eq!(
            call!(
                sim,
                "cuStreamEndCapture",
                fn(u64, *mut u64),
                stream,
                &mut graph
            ),
            CAPTURE_INVALIDATED
        );
        assert_eq!(graph, 0);
        // Querying the capturing stream itself is refused even in relaxed mode.
        assert_eq!(
            call!(sim, "cuStreamBeginCapture_v2", fn(u64, u32), stream, 2),
            SUCCESS
        );
        assert_eq!(
            call!(sim, "cuStreamQuery", fn(u64), stream),
            CAPTURE_UNSUPPORTED
        );
        assert_eq!(
            call!(
                sim,
                "cuStreamEndCapture",
                fn(u64, *mut u64),
                stream,
                &mut graph
            ),
            CAPTURE_INVALIDATED
        );
        assert_eq!(
            call!(sim, "cuStreamBeginCapture_v2", fn(u64, u32), 0u64, 2),
            CAPTURE_UNSUPPORTED,
            "the legacy stream cannot be captured"
        );
    }
);

/// What the inner test `inner` printed, run in a child process with `env` in `dir`; it
/// must have passed.
fn inner_stdout(inner: &str, env: &[(&str, &str)], dir: &std::path::Path) -> String {
    let output = common::isolated_command(inner, env, dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The child of `an_event_on_an_idle_stream_waits_while_another_process_has_the_card`:
/// queues 4 s of kernels on a stream of its own, says "ready", waits for stdin to close.
#[test]
#[ignore = "child of an_event_on_an_idle_stream_waits_while_another_process_has_the_card"]
fn turn_holder_child() {
    let Some(sim) = child_with_a_context() else {
        return;
    };
    let (_, k_20ms, _) = load_functions(&sim);
    let stream = new_stream(&sim);
    for _ in 0..200 {
        assert_eq!(launch(&sim, k_20ms, stream), SUCCESS);
    }
    println!("ready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// What an event recorded on a stream with nothing queued does while another process
/// has 4 s of kernels queued on the card: `(fired at once, fired after the other's
/// work)`, from a parent process of its own with `VGPU_SIM_EVENT_TURNS` and
/// `VGPU_SIM_MPS` as given.
fn event_beside_a_busy_process(turns: &str, mps: &str) -> (bool, bool) {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("VGPU_SIM_GPUS", "1"),
        ("VGPU_SIM_MEMORY", "8GiB"),
        ("VGPU_SIM_EVENT_TURNS", turns),
        ("VGPU_SIM_MPS", mps),
    ];
    let (mut child, _) = spawn_until_ready(common::isolated_command(
        "turn_holder_child",
        &env,
        dir.path(),
    ));
    // On a panic here the child's stdin closes with it, and it ends.
    let stdout = inner_stdout("event_beside_a_busy_process_inner", &env, dir.path());
    drop(child.stdin.take());
    child.wait().unwrap();
    let flag = |name: &str| stdout.contains(&format!("{name} true"));
    (flag("at-once"), flag("after-the-other"))
}

#[test]
#[ignore = "runs in a child process started by its outer test"]
fn event_beside_a_busy_process_inner() {
    let Some(sim) = child_with_a_context() else {
        return;
    };
    let stream = new_stream(&sim);
    let event = new_event(&sim);
    let recorded = Instant::now();
    record_event(&sim, event, stream);
    let at_once = call!(sim, "cuEventQuery", fn(u64), event) == SUCCESS;
    assert_eq!(call!(sim, "cuEventSynchronize", fn(u64), event), SUCCESS);
    // The other's 4 s less what it took us to start (well under three seconds).
    let after_the_other = recorded.elapsed().as_millis() >= 1000;
    println!("at-once {at_once}");
    println!("after-the-other {after_the_other}");
}

/// A card without MPS runs one context at a time, and an event of a context waiting for
/// its slice waits too (the limiter's GPU clock must not take a reference event as fired
/// at its record: `libcuda-shim`'s `limiter/clock.rs`). Under MPS, and with
/// `VGPU_SIM_EVENT_TURNS=0`, it fires at once.
#[test]
fn an_event_on_an_idle_stream_waits_while_another_process_has_the_card() {
    assert_eq!(
        event_beside_a_busy_process("", "0"),
        (false, true),
        "time-sliced: the event fires after the other process's kernels"
    );
    assert_eq!(
        event_beside_a_busy_process("", "1"),
        (true, false),
        "side by side (MPS): at once"
    );
    assert_eq!(
        event_beside_a_busy_process("0", "0"),
        (true, false),
        "VGPU_SIM_EVENT_TURNS=0: at once"
    );
}

/// What two events around one 100 us kernel, and around two, time on a stream with
/// 200 ms queued ahead: `(ms, ms)`, from a child process with
/// `VGPU_SIM_KERNEL_AFTER_EVENT_NS` as given.
fn bracketed_kernels_ms(after_event_ns: &str) -> (f32, f32) {
    let [one, two] = child_figures(
        "bracketed_kernels_inner",
        ("VGPU_SIM_KERNEL_AFTER_EVENT_NS", after_event_ns),
        ["one", "two"],
    );
    (one, two)
}

/// The figures `names` that the child test `inner` prints (`NAME VALUE`), run on one
/// simulated GPU with `setting` in its environment.
fn child_figures<const N: usize>(inner: &str, setting: (&str, &str), names: [&str; N]) -> [f32; N] {
    let dir = tempfile::tempdir().unwrap();
    let env = [("VGPU_SIM_GPUS", "1"), ("VGPU_SIM_MEMORY", "8GiB"), setting];
    let stdout = inner_stdout(inner, &env, dir.path());
    // libtest may print the child's lines after its own "test ... " on one line.
    names.map(|name| {
        stdout
            .split_whitespace()
            .skip_while(|word| *word != name)
            .nth(1)
            .and_then(|value| value.parse::<f32>().ok())
            .unwrap_or_else(|| panic!("no {name} in {stdout}"))
    })
}

#[test]
#[ignore = "runs in a child process started by its outer test"]
fn bracketed_kernels_inner() {
    let Some(sim) = child_with_a_context() else {
        return;
    };
    let (k_100us, k_20ms, _) = load_functions(&sim);
    let (stream, [a, b, c]) = stream_and_events(&sim);
    let record = |event: u64| record_event(&sim, event, stream);
    // Far enough ahead that the host's own pace cannot show in the events' times.
    for _ in 0..10 {
        assert_eq!(launch(&sim, k_20ms, stream), SUCCESS);
    }
    record(a);
    assert_eq!(launch(&sim, k_100us, stream), SUCCESS);
    record(b);
    assert_eq!(launch(&sim, k_100us, stream), SUCCESS);
    assert_eq!(launch(&sim, k_100us, stream), SUCCESS);
    record(c);
    // Each waits for its end event: b fired before c.
    println!("one {}", elapsed_ms(&sim, a, b));
    println!("two {}", elapsed_ms(&sim, b, c));
}

/// A kernel right after an event waits `VGPU_SIM_KERNEL_AFTER_EVENT_NS` (its set-up,
/// which a real card overlaps with the kernel before it but not with an event): two
/// events around one kernel time the set-up once, around two kernels back to back
/// still once. Unset, the events time the kernels alone.
#[test]
fn a_kernel_right_after_an_event_waits_for_its_set_up_and_one_after_a_kernel_does_not() {
    let near = |(one, two): (f32, f32), (want_one, want_two): (f32, f32)| {
        (one - want_one).abs() < 0.01 && (two - want_two).abs() < 0.01
    };
    let set_up = bracketed_kernels_ms("5000000");
    assert!(near(set_up, (5.1, 5.2)), "5 ms set-up: {set_up:?}");
    let none = bracketed_kernels_ms("0");
    assert!(near(none, (0.1, 0.2)), "no set-up: {none:?}");
}

/// How long (ms of host time) an event recorded on an idle stream takes to fire, a
/// 100 us kernel launched there to finish, and the second of two 100 us kernels
/// launched back to back (queued behind the first: `(ms, ms, ms)`), from a child
/// process with `VGPU_SIM_IDLE_SUBMIT_NS` as given.
fn idle_submit_ms(idle_submit_ns: &str) -> (f32, f32, f32) {
    let [event, kernel, behind] = child_figures(
        "idle_submit_inner",
        ("VGPU_SIM_IDLE_SUBMIT_NS", idle_submit_ns),
        ["event", "kernel", "behind"],
    );
    (event, kernel, behind)
}

#[test]
#[ignore = "runs in a child process started by its outer test"]
fn idle_submit_inner() {
    let Some(sim) = child_with_a_context() else {
        return;
    };
    let (k_100us, _, _) = load_functions(&sim);
    let (stream, [a, b, c]) = stream_and_events(&sim);
    let ms = |since: std::time::Instant| since.elapsed().as_secs_f32() * 1000.0;
    let began = std::time::Instant::now();
    record_event(&sim, a, stream);
    assert_eq!(call!(sim, "cuEventSynchronize", fn(u64), a), SUCCESS);
    println!("event {}", ms(began));
    let began = std::time::Instant::now();
    assert_eq!(launch(&sim, k_100us, stream), SUCCESS);
    assert_eq!(call!(sim, "cuStreamSynchronize", fn(u64), stream), SUCCESS);
    println!("kernel {}", ms(began));
    // Two back to back: the second's end event against the first's.
    assert_eq!(launch(&sim, k_100us, stream), SUCCESS);
    record_event(&sim, b, stream);
    assert_eq!(launch(&sim, k_100us, stream), SUCCESS);
    record_event(&sim, c, stream);
    println!("behind {}", elapsed_ms(&sim, b, c));
}

/// How long (ms of host time) a function's first launch call takes, its second, and
/// another function's first, from a child process with `VGPU_SIM_FIRST_LAUNCH_NS` as
/// given.
fn first_launch_ms(first_launch_ns: &str) -> [f32; 3] {
    child_figures(
        "first_launch_inner",
        ("VGPU_SIM_FIRST_LAUNCH_NS", first_launch_ns),
        ["first", "second", "other"],
    )
}

#[test]
#[ignore = "runs in a child process started by its outer test"]
fn first_launch_inner() {
    let Some(sim) = child_with_a_context() else {
        return;
    };
    let (k_100us, k_20ms, _) = load_functions(&sim);
    let stream = new_stream(&sim);
    let timed = |function: u64| {
        let began = std::time::Instant::now();
        assert_eq!(launch(&sim, function, stream), SUCCESS);
        began.elapsed().as_secs_f32() * 1000.0
    };
    println!("first {}", timed(k_100us));
    println!("second {}", timed(k_100us));
    println!("other {}", timed(k_20ms));
}

/// A function's first launch call spends `VGPU_SIM_FIRST_LAUNCH_NS` before it returns
/// (CUDA 12 loads a kernel's code at its first launch), every function's once; its
/// later launches do not. Unset, none does.
#[test]
fn a_functions_first_launch_call_loads_its_code_and_later_ones_do_not() {
    let [first, second, other] = first_launch_ms("5000000");
    assert!(
        first >= 5.0 && other >= 5.0,
        "first launches: {first} / {other} ms"
    );
    assert!(second < 5.0, "a second launch: {second} ms");
    let [first, _, other] = first_launch_ms("0");
    assert!(first < 5.0 && other < 5.0, "unset: {first} / {other} ms");
}

/// Work submitted to an idle stream starts `VGPU_SIM_IDLE_SUBMIT_NS` after it is
/// submitted (a real card fetches and sets it up first), and work queued behind other
/// work does not wait for it. Unset, neither waits.
#[test]
fn work_on_an_idle_stream_waits_for_its_submission_and_work_behind_other_work_does_not() {
    let (event, kernel, behind) = idle_submit_ms("5000000");
    assert!(event >= 5.0, "an event on an idle stream: {event} ms");
    assert!(
        kernel >= 5.1,
        "a 100 us kernel on an idle stream: {kernel} ms"
    );
    assert!(
        (behind - 0.1).abs() < 0.01,
        "a kernel behind another: {behind} ms"
    );
    let (event, kernel, behind) = idle_submit_ms("0");
    assert!(
        event < 5.0 && kernel < 5.0,
        "no latency: {event} / {kernel} ms"
    );
    assert!((behind - 0.1).abs() < 0.01, "{behind} ms");
}
