//! The simulated NVML through raw symbols: init counting, device lookup, memory info v1
//! and v2 (version checked), the two-call process-list protocol with the v1 and v3
//! struct layouts, PCI info, static strings and refused foreign handles.

mod common;

use std::ffi::{CStr, c_char, c_void};

use common::Sim;

macro_rules! call {
    ($sim:expr, $name:literal, fn($($t:ty),* $(,)?) $(, $a:expr)* $(,)?) => {
        // SAFETY: the test names the export's C signature with the arguments it passes.
        unsafe { ($sim.sym::<unsafe extern "C" fn($($t),*) -> i32>($name))($($a),*) }
    };
}

const MIB: u64 = 1 << 20;

isolated!(
    nvml_queries,
    nvml_queries_inner,
    [
        ("VGPU_SIM_GPUS", "3"),
        ("VGPU_SIM_MEMORY", "2GiB"),
        ("VGPU_SIM_CONTEXT_OVERHEAD", "128MiB")
    ],
    {
        let sim = Sim::load();
        let mut count = 0u32;
        assert_eq!(
            call!(sim, "nvmlDeviceGetCount_v2", fn(*mut u32), &mut count),
            1,
            "uninitialized"
        );
        assert_eq!(call!(sim, "nvmlShutdown", fn()), 1);
        assert_eq!(call!(sim, "nvmlInitWithFlags", fn(u32), 0), 0);
        assert_eq!(call!(sim, "nvmlInit_v2", fn()), 0);
        assert_eq!(
            call!(sim, "nvmlDeviceGetCount_v2", fn(*mut u32), &mut count),
            0
        );
        assert_eq!(count, 3);
        let mut text = [0 as c_char; 96];
        let read = |buffer: &[c_char]| {
            // SAFETY: the sim NUL-terminates within the buffer.
            unsafe { CStr::from_ptr(buffer.as_ptr()) }
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            call!(
                sim,
                "nvmlSystemGetDriverVersion",
                fn(*mut c_char, u32),
                text.as_mut_ptr(),
                96
            ),
            0
        );
        assert_eq!(read(&text), "580.159.04");
        assert_eq!(
            call!(
                sim,
                "nvmlSystemGetDriverVersion",
                fn(*mut c_char, u32),
                text.as_mut_ptr(),
                5
            ),
            7,
            "insufficient size"
        );
        assert_eq!(
            call!(
                sim,
                "nvmlSystemGetNVMLVersion",
                fn(*mut c_char, u32),
                text.as_mut_ptr(),
                96
            ),
            0
        );
        assert_eq!(read(&text), "13.580.159.04");
        let mut cuda = 0i32;
        assert_eq!(
            call!(
                sim,
                "nvmlSystemGetCudaDriverVersion_v2",
                fn(*mut i32),
                &mut cuda
            ),
            0
        );
        assert_eq!(cuda, 13000);

        let mut handle: *const c_void = std::ptr::null();
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetHandleByUUID",
                fn(*const c_char, *mut *const c_void),
                c"GPU-51d00000-0000-4000-8000-000000000003".as_ptr(),
                &mut handle
            ),
            0
        );
        let mut index = 9u32;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetIndex",
                fn(*const c_void, *mut u32),
                handle,
                &mut index
            ),
            0
        );
        assert_eq!(index, 2);
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetHandleByUUID",
                fn(*const c_char, *mut *const c_void),
                c"GPU-nope".as_ptr(),
                &mut handle
            ),
            6
        );
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetHandleByPciBusId_v2",
                fn(*const c_char, *mut *const c_void),
                c"0000:12:00.0".as_ptr(),
                &mut handle
            ),
            0
        );
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetIndex",
                fn(*const c_void, *mut u32),
                handle,
                &mut index
            ),
            0
        );
        assert_eq!(index, 1);
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetSerial",
                fn(*const c_void, *mut c_char, u32),
                handle,
                text.as_mut_ptr(),
                96
            ),
            0
        );
        let serial = read(&text);
        let mut by_serial: *const c_void = std::ptr::null();
        let serial_c = std::ffi::CString::new(serial).unwrap();
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetHandleBySerial",
                fn(*const c_char, *mut *const c_void),
                serial_c.as_ptr(),
                &mut by_serial
            ),
            0
        );
        assert_eq!(by_serial, handle);
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetHandleByIndex_v2",
                fn(u32, *mut *const c_void),
                3,
                &mut handle
            ),
            2
        );
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
        let foreign = 0x1234usize as *const c_void;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetIndex",
                fn(*const c_void, *mut u32),
                foreign,
                &mut index
            ),
            2,
            "foreign handle"
        );
        let stack_value = 0u64;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetIndex",
                fn(*const c_void, *mut u32),
                (&stack_value as *const u64).cast(),
                &mut index
            ),
            2
        );

        #[repr(C)]
        struct Pci {
            legacy: [u8; 16],
            domain: u32,
            bus: u32,
            device: u32,
            device_id: u32,
            subsystem: u32,
            bus_id: [u8; 32],
        }
        // SAFETY: an all-zero nvmlPciInfo_t is valid.
        let mut pci: Pci = unsafe { std::mem::zeroed() };
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetPciInfo_v3",
                fn(*const c_void, *mut Pci),
                handle,
                &mut pci
            ),
            0
        );
        assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x11, 0));
        assert_eq!(
            CStr::from_bytes_until_nul(&pci.bus_id)
                .unwrap()
                .to_str()
                .unwrap(),
            "00000000:11:00.0"
        );
        assert_eq!(
            CStr::from_bytes_until_nul(&pci.legacy)
                .unwrap()
                .to_str()
                .unwrap(),
            "0000:11:00.0"
        );
        assert_eq!(pci.device_id & 0xffff, 0x10de);

        // Memory: nothing used yet; then a context and 512 MiB through the CUDA half.
        let mut memory = [0u64; 3];
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetMemoryInfo",
                fn(*const c_void, *mut [u64; 3]),
                handle,
                &mut memory
            ),
            0
        );
        assert_eq!(memory, [2 << 30, 2 << 30, 0]);
        assert_eq!(call!(sim, "cuInit", fn(u32), 0), 0);
        let mut ctx = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuCtxCreate_v2",
                fn(*mut u64, u32, i32),
                &mut ctx,
                0,
                0
            ),
            0
        );
        let mut ptr = 0u64;
        assert_eq!(
            call!(
                sim,
                "cuMemAlloc_v2",
                fn(*mut u64, usize),
                &mut ptr,
                512 << 20
            ),
            0
        );
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetMemoryInfo",
                fn(*const c_void, *mut [u64; 3]),
                handle,
                &mut memory
            ),
            0
        );
        assert_eq!(memory, [2 << 30, (2 << 30) - 640 * MIB, 640 * MIB]);
        #[repr(C)]
        struct MemoryV2 {
            version: u32,
            total: u64,
            reserved: u64,
            free: u64,
            used: u64,
        }
        let mut v2 = MemoryV2 {
            version: 1,
            total: 1,
            reserved: 1,
            free: 1,
            used: 1,
        };
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetMemoryInfo_v2",
                fn(*const c_void, *mut MemoryV2),
                handle,
                &mut v2
            ),
            25,
            "version mismatch"
        );
        v2.version = 40 | (2 << 24);
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetMemoryInfo_v2",
                fn(*const c_void, *mut MemoryV2),
                handle,
                &mut v2
            ),
            0
        );
        assert_eq!(
            (v2.total, v2.reserved, v2.free, v2.used),
            (2 << 30, 0, (2 << 30) - 640 * MIB, 640 * MIB)
        );

        // Process lists: count first, then the v1 (16-byte) and v3 (24-byte) layouts.
        let mut n = 0u32;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetComputeRunningProcesses_v3",
                fn(*const c_void, *mut u32, *mut c_void),
                handle,
                &mut n,
                std::ptr::null_mut()
            ),
            7
        );
        assert_eq!(n, 1);
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct V1 {
            pid: u32,
            used: u64,
        }
        let mut v1 = [V1::default(); 2];
        n = 2;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetComputeRunningProcesses",
                fn(*const c_void, *mut u32, *mut V1),
                handle,
                &mut n,
                v1.as_mut_ptr()
            ),
            0
        );
        assert_eq!(
            (n, v1[0].pid, v1[0].used),
            (1, std::process::id(), 640 * MIB)
        );
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct V3 {
            pid: u32,
            used: u64,
            gi: u32,
            ci: u32,
        }
        let mut v3 = [V3::default(); 1];
        n = 1;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetComputeRunningProcesses_v2",
                fn(*const c_void, *mut u32, *mut V3),
                handle,
                &mut n,
                v3.as_mut_ptr()
            ),
            0
        );
        assert_eq!(
            (v3[0].pid, v3[0].used, v3[0].gi, v3[0].ci),
            (std::process::id(), 640 * MIB, u32::MAX, u32::MAX)
        );
        n = 0;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetGraphicsRunningProcesses_v3",
                fn(*const c_void, *mut u32, *mut c_void),
                handle,
                &mut n,
                std::ptr::null_mut()
            ),
            0
        );
        assert_eq!(n, 0);
        let mut other: *const c_void = std::ptr::null();
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetHandleByIndex_v2",
                fn(u32, *mut *const c_void),
                2,
                &mut other
            ),
            0
        );
        n = 0;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetComputeRunningProcesses_v3",
                fn(*const c_void, *mut u32, *mut c_void),
                other,
                &mut n,
                std::ptr::null_mut()
            ),
            0,
            "no processes on GPU 2"
        );

        // Fixed facts of the card.
        let (mut major, mut minor) = (0i32, 0i32);
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetCudaComputeCapability",
                fn(*const c_void, *mut i32, *mut i32),
                handle,
                &mut major,
                &mut minor
            ),
            0
        );
        assert_eq!((major, minor), (9, 0));
        let mut value = 0u32;
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetArchitecture",
                fn(*const c_void, *mut u32),
                handle,
                &mut value
            ),
            0
        );
        assert_eq!(value, 9);
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetTemperature",
                fn(*const c_void, u32, *mut u32),
                handle,
                0,
                &mut value
            ),
            0
        );
        assert!((30..=70).contains(&value));
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetTemperature",
                fn(*const c_void, u32, *mut u32),
                handle,
                5,
                &mut value
            ),
            2
        );
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetFanSpeed",
                fn(*const c_void, *mut u32),
                handle,
                &mut value
            ),
            3
        );
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetMaxClockInfo",
                fn(*const c_void, u32, *mut u32),
                handle,
                1,
                &mut value
            ),
            0
        );
        assert_eq!(value, 1980);
        assert_eq!(
            call!(
                sim,
                "nvmlDeviceGetName",
                fn(*const c_void, *mut c_char, u32),
                handle,
                text.as_mut_ptr(),
                96
            ),
            0
        );
        assert_eq!(read(&text), "NVIDIA H200 (simulated)");
        assert_eq!(
            call!(
                sim,
                "nvmlSystemGetProcessName",
                fn(u32, *mut c_char, u32),
                std::process::id(),
                text.as_mut_ptr(),
                96
            ),
            0
        );
        assert!(read(&text).contains("nvml-"), "{}", read(&text));

        let error_string: unsafe extern "C" fn(i32) -> *const c_char = sim.sym("nvmlErrorString");
        assert_eq!(
            // SAFETY: the sim's error string, a static C string.
            unsafe { CStr::from_ptr(error_string(7)) }.to_str().unwrap(),
            "Insufficient Size"
        );
        assert_eq!(
            // SAFETY: the sim's error string, a static C string.
            unsafe { CStr::from_ptr(error_string(12345)) }
                .to_str()
                .unwrap(),
            "Unknown Error"
        );
        assert_eq!(call!(sim, "nvmlShutdown", fn()), 0);
        assert_eq!(
            call!(sim, "nvmlDeviceGetCount_v2", fn(*mut u32), &mut count),
            0,
            "one init still open"
        );
        assert_eq!(call!(sim, "nvmlShutdown", fn()), 0);
        assert_eq!(
            call!(sim, "nvmlDeviceGetCount_v2", fn(*mut u32), &mut count),
            1
        );
    }
);
