//! The CUDA driver API (`cuda.h`, CUDA 13.0) facts vgpu-shim needs: handle and scalar
//! types, `CUresult` codes, the device attributes it reads, the array descriptors and
//! the bytes per element of every `CUarray_format`, and the leading fields of
//! `CUmemAllocationProp`.

use core::ffi::c_void;

/// `CUresult`: what every driver call returns (`CUDA_SUCCESS` or an error).
pub type CUresult = u32;
/// `CUdevice`: a device handle (an ordinal in the real driver).
pub type CUdevice = i32;
/// `CUdeviceptr`: a device address.
pub type CUdeviceptr = u64;
/// `CUcontext`: an opaque context handle.
pub type CUcontext = *mut c_void;
/// `CUstream`: an opaque stream handle (null: the default stream).
pub type CUstream = *mut c_void;
/// `CUevent`: an opaque event handle.
pub type CUevent = *mut c_void;
/// `CUfunction`: an opaque kernel handle.
pub type CUfunction = *mut c_void;
/// `CUmodule`: an opaque module handle.
pub type CUmodule = *mut c_void;
/// `CUarray`: an opaque array handle.
pub type CUarray = *mut c_void;
/// `CUmipmappedArray`: an opaque mipmapped-array handle.
pub type CUmipmappedArray = *mut c_void;
/// `CUmemoryPool`: an opaque memory-pool handle.
pub type CUmemoryPool = *mut c_void;
/// `CUgraphExec`: an opaque executable-graph handle.
pub type CUgraphExec = *mut c_void;
/// `CUmemGenericAllocationHandle`: a VMM physical allocation (`cuMemCreate`).
pub type CUmemGenericAllocationHandle = u64;

// --- CUresult ----------------------------------------------------------------------

/// The call succeeded.
pub const CUDA_SUCCESS: CUresult = 0;
/// A parameter is out of range (a null out-pointer, say).
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
/// The allocation does not fit (the card, or the container's quota).
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `cuInit` has not run (or the driver could not be loaded).
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
/// The driver is shutting down.
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
/// No CUDA device is visible (what a fail-closed shim answers).
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
/// The device is not one the caller may use.
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
/// The module image is not valid for the device.
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
/// No valid context is current.
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
/// PTX could not be compiled: the JIT compiler is missing.
pub const CUDA_ERROR_JIT_COMPILER_NOT_FOUND: CUresult = 221;
/// A file named to the driver (a module path) does not exist.
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
/// A handle (stream, event, function, ...) is not valid.
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
/// The call is not allowed in the object's current state.
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
/// A named symbol or entry was not found.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// Asynchronous work has not completed yet (`cuEventQuery`, `cuStreamQuery`).
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
/// A launch asked for more resources (registers, shared memory) than the device has.
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
/// The primary context is already active with other flags.
pub const CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
/// A cooperative launch asked for more blocks than can be resident at once.
pub const CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;
/// The operation is not permitted (a VMM handle exported with the wrong type, say).
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
/// The operation (or the export: the real driver lacks it) is not supported.
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, the first of the stream-capture errors.
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
/// The stream's capture was invalidated by an earlier error.
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`, the last of the contiguous capture errors.
pub const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: CUresult = 908;
/// The operation is not allowed on an event recorded in a capture.
pub const CUDA_ERROR_CAPTURED_EVENT: CUresult = 907;
/// An unknown internal error (what a hook answers for a caught panic).
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

// --- CUdevice_attribute --------------------------------------------------------------

/// The number of SMs.
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: i32 = 16;
/// The most threads resident on one SM.
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
/// The PCI bus.
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: i32 = 33;
/// The PCI device (slot).
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: i32 = 34;
/// The PCI domain.
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: i32 = 50;
/// The compute capability's major number.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: i32 = 75;
/// The compute capability's minor number.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: i32 = 76;

// --- CUfunction_attribute ------------------------------------------------------------

/// Bytes of local memory one thread of the function needs; past the stack limit, the
/// driver grows the local memory it backs for every resident thread at the launch.
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: i32 = 3;

// --- CUlimit (cuCtxSetLimit, cuCtxGetLimit) -------------------------------------------

/// `CUlimit`: what `cuCtxSetLimit` sets.
pub type CUlimit = u32;
/// Bytes of stack per GPU thread; the driver backs it for every thread the card can
/// hold at once.
pub const CU_LIMIT_STACK_SIZE: CUlimit = 0x00;
/// Bytes of the FIFO that device-side `printf` writes into.
pub const CU_LIMIT_PRINTF_FIFO_SIZE: CUlimit = 0x01;
/// Bytes of the heap that device-side `malloc` allocates from.
pub const CU_LIMIT_MALLOC_HEAP_SIZE: CUlimit = 0x02;
/// Depth to which the device runtime may synchronise on child grids.
pub const CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: CUlimit = 0x03;
/// Launches from the device that may be pending at once.
pub const CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: CUlimit = 0x04;
/// The L2 fetch granularity (no device memory).
pub const CU_LIMIT_MAX_L2_FETCH_GRANULARITY: CUlimit = 0x05;
/// The persisting L2 cache size (a carve-out of L2, no device memory).
pub const CU_LIMIT_PERSISTING_L2_CACHE_SIZE: CUlimit = 0x06;

// --- streams -------------------------------------------------------------------------

/// `CU_STREAM_LEGACY`.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CUstreamCaptureStatus`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: u32 = 0;
/// The stream is capturing.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: u32 = 1;
/// The stream was capturing, and the capture was invalidated.
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: u32 = 2;
/// `CUstreamCaptureMode`.
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: u32 = 0;
/// Unsafe calls are refused only on the capturing thread.
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: u32 = 1;
/// No call is refused for a capture under way.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;

// --- launches ------------------------------------------------------------------------

/// `CUlaunchConfig` (CUDA 12.0+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    /// `gridDimX`, `gridDimY`, `gridDimZ`: blocks in the grid.
    pub grid_dim: [core::ffi::c_uint; 3],
    /// `blockDimX`, `blockDimY`, `blockDimZ`: threads in a block.
    pub block_dim: [core::ffi::c_uint; 3],
    /// `sharedMemBytes`: dynamic shared memory per block.
    pub shared_mem_bytes: core::ffi::c_uint,
    /// `hStream`: the stream the launch goes to.
    pub stream: CUstream,
    /// `attrs`: the launch attributes.
    pub attrs: *mut c_void,
    /// `numAttrs`: how many attributes.
    pub num_attrs: core::ffi::c_uint,
}

/// `CUDA_LAUNCH_PARAMS` (`cuLaunchCooperativeKernelMultiDevice`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaLaunchParams {
    /// `function`: the kernel.
    pub function: CUfunction,
    /// `gridDimX`, `gridDimY`, `gridDimZ`: blocks in the grid.
    pub grid_dim: [core::ffi::c_uint; 3],
    /// `blockDimX`, `blockDimY`, `blockDimZ`: threads in a block.
    pub block_dim: [core::ffi::c_uint; 3],
    /// `sharedMemBytes`: dynamic shared memory per block.
    pub shared_mem_bytes: core::ffi::c_uint,
    /// `hStream`: the stream the launch goes to.
    pub stream: CUstream,
    /// `kernelParams`: the kernel's arguments.
    pub kernel_params: *mut *mut c_void,
}

const _: () = assert!(core::mem::size_of::<CUlaunchConfig>() == 56);
const _: () = assert!(core::mem::size_of::<CudaLaunchParams>() == 56);

/// `CU_STREAM_NON_BLOCKING` (`cuStreamCreate` flags).
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;

// --- memory --------------------------------------------------------------------------

/// `CUmemLocationType`.
pub const CU_MEM_LOCATION_TYPE_INVALID: u32 = 0;
/// Device memory; the id is a device ordinal.
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
/// Host memory.
pub const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;
/// Host memory on a NUMA node; the id is the node.
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: u32 = 3;
/// Host memory on the calling thread's NUMA node.
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: u32 = 4;

/// `CUmemPool_attribute`.
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
/// Reuse freed blocks whose free has completed.
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: i32 = 2;
/// Reuse freed blocks by inserting dependencies.
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
/// Bytes the pool keeps reserved at a synchronisation.
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: i32 = 4;
/// Bytes the pool has reserved from the card now (`cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: i32 = 5;
/// The high-water mark of the reserved bytes.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: i32 = 6;
/// Bytes of the pool that allocations use now (`cuuint64_t`).
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: i32 = 7;
/// The high-water mark of the used bytes.
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: i32 = 8;

/// `CUmemAllocationProp` (CUDA 12+ layout; the shim reads only the location).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `type`: the allocation type (pinned).
    pub kind: u32,
    /// `requestedHandleTypes`: the shareable handle types asked for.
    pub requested_handle_types: u32,
    /// `location.type`: where the memory lives (`CU_MEM_LOCATION_TYPE_*`).
    pub location_type: u32,
    /// `location.id`: the device ordinal (or NUMA node).
    pub location_id: i32,
    /// `win32HandleMetaData`: Windows only.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags.compressionType`.
    pub compression_type: u8,
    /// `allocFlags.gpuDirectRDMACapable`.
    pub gpu_direct_rdma_capable: u8,
    /// `usage` flags.
    pub usage: u16,
    /// Reserved by the header.
    pub reserved: [u8; 4],
}

/// `CUmemPoolProps` (the shim reads only the location).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    /// `allocType`: the allocation type (pinned).
    pub alloc_type: u32,
    /// `handleTypes`: the shareable handle types.
    pub handle_types: u32,
    /// `location.type`: where the memory lives (`CU_MEM_LOCATION_TYPE_*`).
    pub location_type: u32,
    /// `location.id`: the device ordinal (or NUMA node).
    pub location_id: i32,
    /// `win32SecurityAttributes`: Windows only.
    pub win32_security_attributes: *mut c_void,
    /// `maxSize`: the most the pool may reserve (0: no limit).
    pub max_size: usize,
    /// `usage` flags.
    pub usage: u16,
    /// Reserved by the header.
    pub reserved: [u8; 54],
}

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CUuuid {
    /// The 16 bytes.
    pub bytes: [u8; 16],
}

// --- arrays --------------------------------------------------------------------------

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`: size_t extents).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaArrayDescriptor {
    /// `Width` in elements.
    pub width: usize,
    /// `Height` in elements (0 for 1D).
    pub height: usize,
    /// `Format`: a `CUarray_format` (see `array_format`).
    pub format: u32,
    /// `NumChannels`: 1, 2 or 4.
    pub num_channels: u32,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (the pre-3.2 ABI: 32-bit extents).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaArrayDescriptorV1 {
    /// `Width` in elements.
    pub width: u32,
    /// `Height` in elements (0 for 1D).
    pub height: u32,
    /// `Format`: a `CUarray_format` (see `array_format`).
    pub format: u32,
    /// `NumChannels`: 1, 2 or 4.
    pub num_channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaArray3dDescriptor {
    /// `Width` in elements.
    pub width: usize,
    /// `Height` in elements (0 for 1D).
    pub height: usize,
    /// `Depth` in elements, layers or cubemap faces (0 for 1D and 2D).
    pub depth: usize,
    /// `Format`: a `CUarray_format` (see `array_format`).
    pub format: u32,
    /// `NumChannels`: 1, 2 or 4.
    pub num_channels: u32,
    /// `Flags`: `CUDA_ARRAY3D_*`.
    pub flags: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaArray3dDescriptorV1 {
    /// `Width` in elements.
    pub width: u32,
    /// `Height` in elements (0 for 1D).
    pub height: u32,
    /// `Depth` in elements, layers or cubemap faces (0 for 1D and 2D).
    pub depth: u32,
    /// `Format`: a `CUarray_format` (see `array_format`).
    pub format: u32,
    /// `NumChannels`: 1, 2 or 4.
    pub num_channels: u32,
    /// `Flags`: `CUDA_ARRAY3D_*`.
    pub flags: u32,
}

const _: () = assert!(core::mem::size_of::<CudaArrayDescriptor>() == 24);
const _: () = assert!(core::mem::size_of::<CudaArrayDescriptorV1>() == 16);
const _: () = assert!(core::mem::size_of::<CudaArray3dDescriptor>() == 40);
const _: () = assert!(core::mem::size_of::<CudaArray3dDescriptorV1>() == 24);
const _: () = assert!(core::mem::size_of::<CUmemAllocationProp>() == 32);
const _: () = assert!(core::mem::size_of::<CUmemPoolProps>() == 88);

/// `CUarray_format` values, as `cuda.h` (CUDA 12.8-13.0) numbers them.
pub mod array_format {
    /// `CU_AD_FORMAT_UNSIGNED_INT8`.
    pub const UNSIGNED_INT8: u32 = 0x01;
    /// `CU_AD_FORMAT_UNSIGNED_INT16`.
    pub const UNSIGNED_INT16: u32 = 0x02;
    /// `CU_AD_FORMAT_UNSIGNED_INT32`.
    pub const UNSIGNED_INT32: u32 = 0x03;
    /// `CU_AD_FORMAT_SIGNED_INT8`.
    pub const SIGNED_INT8: u32 = 0x08;
    /// `CU_AD_FORMAT_SIGNED_INT16`.
    pub const SIGNED_INT16: u32 = 0x09;
    /// `CU_AD_FORMAT_SIGNED_INT32`.
    pub const SIGNED_INT32: u32 = 0x0a;
    /// `CU_AD_FORMAT_HALF`.
    pub const HALF: u32 = 0x10;
    /// `CU_AD_FORMAT_FLOAT`.
    pub const FLOAT: u32 = 0x20;
    /// `CU_AD_FORMAT_UNORM_INT_101010_2`.
    pub const UNORM_INT_101010_2: u32 = 0x50;
    /// `CU_AD_FORMAT_BC1_UNORM`.
    pub const BC1_UNORM: u32 = 0x91;
    /// `CU_AD_FORMAT_BC1_UNORM_SRGB`.
    pub const BC1_UNORM_SRGB: u32 = 0x92;
    /// `CU_AD_FORMAT_BC2_UNORM`.
    pub const BC2_UNORM: u32 = 0x93;
    /// `CU_AD_FORMAT_BC2_UNORM_SRGB`.
    pub const BC2_UNORM_SRGB: u32 = 0x94;
    /// `CU_AD_FORMAT_BC3_UNORM`.
    pub const BC3_UNORM: u32 = 0x95;
    /// `CU_AD_FORMAT_BC3_UNORM_SRGB`.
    pub const BC3_UNORM_SRGB: u32 = 0x96;
    /// `CU_AD_FORMAT_BC4_UNORM`.
    pub const BC4_UNORM: u32 = 0x97;
    /// `CU_AD_FORMAT_BC4_SNORM`.
    pub const BC4_SNORM: u32 = 0x98;
    /// `CU_AD_FORMAT_BC5_UNORM`.
    pub const BC5_UNORM: u32 = 0x99;
    /// `CU_AD_FORMAT_BC5_SNORM`.
    pub const BC5_SNORM: u32 = 0x9a;
    /// `CU_AD_FORMAT_BC6H_UF16`.
    pub const BC6H_UF16: u32 = 0x9b;
    /// `CU_AD_FORMAT_BC6H_SF16`.
    pub const BC6H_SF16: u32 = 0x9c;
    /// `CU_AD_FORMAT_BC7_UNORM`.
    pub const BC7_UNORM: u32 = 0x9d;
    /// `CU_AD_FORMAT_BC7_UNORM_SRGB`.
    pub const BC7_UNORM_SRGB: u32 = 0x9e;
    /// `CU_AD_FORMAT_P010`.
    pub const P010: u32 = 0x9f;
    /// `CU_AD_FORMAT_P016`.
    pub const P016: u32 = 0xa1;
    /// `CU_AD_FORMAT_NV16`.
    pub const NV16: u32 = 0xa2;
    /// `CU_AD_FORMAT_P210`.
    pub const P210: u32 = 0xa3;
    /// `CU_AD_FORMAT_P216`.
    pub const P216: u32 = 0xa4;
    /// `CU_AD_FORMAT_YUY2`.
    pub const YUY2: u32 = 0xa5;
    /// `CU_AD_FORMAT_Y210`.
    pub const Y210: u32 = 0xa6;
    /// `CU_AD_FORMAT_Y216`.
    pub const Y216: u32 = 0xa7;
    /// `CU_AD_FORMAT_AYUV`.
    pub const AYUV: u32 = 0xa8;
    /// `CU_AD_FORMAT_Y410`.
    pub const Y410: u32 = 0xa9;
    /// `CU_AD_FORMAT_NV12`.
    pub const NV12: u32 = 0xb0;
    /// `CU_AD_FORMAT_Y416`.
    pub const Y416: u32 = 0xb1;
    /// `CU_AD_FORMAT_Y444_PLANAR8`.
    pub const Y444_PLANAR8: u32 = 0xb2;
    /// `CU_AD_FORMAT_Y444_PLANAR10`.
    pub const Y444_PLANAR10: u32 = 0xb3;
    /// `CU_AD_FORMAT_YUV444_8BIT_SEMIPLANAR`.
    pub const YUV444_8BIT_SEMIPLANAR: u32 = 0xb4;
    /// `CU_AD_FORMAT_YUV444_16BIT_SEMIPLANAR`.
    pub const YUV444_16BIT_SEMIPLANAR: u32 = 0xb5;
    /// `CU_AD_FORMAT_UNORM_INT8X1`.
    pub const UNORM_INT8X1: u32 = 0xc0;
    /// `CU_AD_FORMAT_UNORM_INT8X2`.
    pub const UNORM_INT8X2: u32 = 0xc1;
    /// `CU_AD_FORMAT_UNORM_INT8X4`.
    pub const UNORM_INT8X4: u32 = 0xc2;
    /// `CU_AD_FORMAT_UNORM_INT16X1`.
    pub const UNORM_INT16X1: u32 = 0xc3;
    /// `CU_AD_FORMAT_UNORM_INT16X2`.
    pub const UNORM_INT16X2: u32 = 0xc4;
    /// `CU_AD_FORMAT_UNORM_INT16X4`.
    pub const UNORM_INT16X4: u32 = 0xc5;
    /// `CU_AD_FORMAT_SNORM_INT8X1`.
    pub const SNORM_INT8X1: u32 = 0xc6;
    /// `CU_AD_FORMAT_SNORM_INT8X2`.
    pub const SNORM_INT8X2: u32 = 0xc7;
    /// `CU_AD_FORMAT_SNORM_INT8X4`.
    pub const SNORM_INT8X4: u32 = 0xc8;
    /// `CU_AD_FORMAT_SNORM_INT16X1`.
    pub const SNORM_INT16X1: u32 = 0xc9;
    /// `CU_AD_FORMAT_SNORM_INT16X2`.
    pub const SNORM_INT16X2: u32 = 0xca;
    /// `CU_AD_FORMAT_SNORM_INT16X4`.
    pub const SNORM_INT16X4: u32 = 0xcb;
}

/// How one texel of a `CUarray_format` is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Texel {
    /// `bytes` per channel, times the descriptor's `NumChannels` (1, 2 or 4).
    PerChannel {
        /// Bytes of one channel.
        bytes: u64,
    },
    /// A fixed size per texel whatever `NumChannels` says: `numerator / denominator`
    /// bytes (4:2:0 video formats store 1.5 bytes per pixel, say).
    Fixed {
        /// Bytes per `denominator` texels.
        numerator: u64,
        /// Texels per `numerator` bytes.
        denominator: u64,
    },
    /// Block-compressed: `bytes` per 4×4 block.
    Block4x4 {
        /// Bytes of one 4×4 block.
        bytes: u64,
    },
}

/// The storage of one texel of `format`, or `None` for a value `cuda.h` does not define.
pub const fn texel(format: u32) -> Option<Texel> {
    use array_format::*;
    const fn fixed(numerator: u64, denominator: u64) -> Option<Texel> {
        Some(Texel::Fixed {
            numerator,
            denominator,
        })
    }
    match format {
        UNSIGNED_INT8 | SIGNED_INT8 => Some(Texel::PerChannel { bytes: 1 }),
        UNSIGNED_INT16 | SIGNED_INT16 | HALF => Some(Texel::PerChannel { bytes: 2 }),
        UNSIGNED_INT32 | SIGNED_INT32 | FLOAT => Some(Texel::PerChannel { bytes: 4 }),
        // Four channels packed into 32 bits.
        UNORM_INT_101010_2 => fixed(4, 1),
        UNORM_INT8X1 | SNORM_INT8X1 => fixed(1, 1),
        UNORM_INT8X2 | SNORM_INT8X2 => fixed(2, 1),
        UNORM_INT8X4 | SNORM_INT8X4 => fixed(4, 1),
        UNORM_INT16X1 | SNORM_INT16X1 => fixed(2, 1),
        UNORM_INT16X2 | SNORM_INT16X2 => fixed(4, 1),
        UNORM_INT16X4 | SNORM_INT16X4 => fixed(8, 1),
        // BC1 and BC4: 8 bytes per block; the others: 16.
        BC1_UNORM | BC1_UNORM_SRGB | BC4_UNORM | BC4_SNORM => Some(Texel::Block4x4 { bytes: 8 }),
        BC2_UNORM | BC2_UNORM_SRGB | BC3_UNORM | BC3_UNORM_SRGB | BC5_UNORM | BC5_SNORM
        | BC6H_UF16 | BC6H_SF16 | BC7_UNORM | BC7_UNORM_SRGB => Some(Texel::Block4x4 { bytes: 16 }),
        // 4:2:0, 8-bit luma plus half-size interleaved chroma.
        NV12 => fixed(3, 2),
        // 4:2:0 with 16-bit samples (10 or 16 significant bits).
        P010 | P016 => fixed(3, 1),
        // 4:2:2 semi-planar, 8-bit and 16-bit.
        NV16 => fixed(2, 1),
        P210 | P216 => fixed(4, 1),
        // 4:2:2 packed, 8-bit and 16-bit.
        YUY2 => fixed(2, 1),
        Y210 | Y216 => fixed(4, 1),
        // 4:4:4 packed.
        AYUV | Y410 => fixed(4, 1),
        Y416 => fixed(8, 1),
        // 4:4:4 planar / semi-planar, 8-bit and 16-bit storage.
        Y444_PLANAR8 | YUV444_8BIT_SEMIPLANAR => fixed(3, 1),
        Y444_PLANAR10 | YUV444_16BIT_SEMIPLANAR => fixed(6, 1),
        _ => None,
    }
}

/// Bytes of a `width × height × depth` array level of `format` with `channels`
/// (extents of 0 count as 1), rounded up to whole bytes; `None` for an unknown format
/// or a size that overflows.
pub const fn array_level_bytes(
    format: u32,
    channels: u32,
    width: u64,
    height: u64,
    depth: u64,
) -> Option<u64> {
    let width = if width == 0 { 1 } else { width };
    let height = if height == 0 { 1 } else { height };
    let depth = if depth == 0 { 1 } else { depth };
    let Some(texel) = texel(format) else {
        return None;
    };
    let (per_plane, denominator) = match texel {
        Texel::PerChannel { bytes } => {
            let channels = if channels == 0 { 1 } else { channels as u64 };
            match width.checked_mul(height) {
                Some(texels) => match texels.checked_mul(bytes * channels) {
                    Some(bytes) => (bytes, 1),
                    None => return None,
                },
                None => return None,
            }
        }
        Texel::Fixed {
            numerator,
            denominator,
        } => match width.checked_mul(height) {
            Some(texels) => match texels.checked_mul(numerator) {
                Some(bytes) => (bytes, denominator),
                None => return None,
            },
            None => return None,
        },
        Texel::Block4x4 { bytes } => match width.div_ceil(4).checked_mul(height.div_ceil(4)) {
            Some(blocks) => match blocks.checked_mul(bytes) {
                Some(bytes) => (bytes, 1),
                None => return None,
            },
            None => return None,
        },
    };
    per_plane.div_ceil(denominator).checked_mul(depth)
}

/// `CUDA_ARRAY3D_LAYERED`: the depth is a number of layers.
pub const CUDA_ARRAY3D_LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_CUBEMAP`: six faces (times the layers, when layered) in the depth.
pub const CUDA_ARRAY3D_CUBEMAP: u32 = 0x04;

/// What the driver spends an array in: 2 MiB units (measured on an H200 with driver
/// 580.159.04: a 64×64 FLOAT×4 array, 64 KiB of texels, took 2 MiB).
pub const ARRAY_CHARGE_GRANULARITY: u64 = 2 << 20;

/// Bytes of an array (`levels` mip levels; 1 for a plain array) of `width × height ×
/// depth` (0 meaning absent, as in the descriptors), summed over its levels. Width and
/// height halve per level (never below 1); the depth halves too, unless `flags` make
/// it a layer or cubemap-face count, which every level keeps. `None` for an unknown
/// format or a size that overflows.
pub const fn array_bytes(
    format: u32,
    channels: u32,
    extent: [u64; 3],
    flags: u32,
    levels: u32,
) -> Option<u64> {
    let [mut width, mut height, mut depth] = extent;
    let layered = flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let levels = if levels == 0 { 1 } else { levels };
    let mut total = 0u64;
    let mut level = 0;
    while level < levels && level < 64 {
        let Some(bytes) = array_level_bytes(format, channels, width, height, depth) else {
            return None;
        };
        total = match total.checked_add(bytes) {
            Some(sum) => sum,
            None => return None,
        };
        width = if width > 1 { width / 2 } else { width };
        height = if height > 1 { height / 2 } else { height };
        if !layered {
            depth = if depth > 1 { depth / 2 } else { depth };
        }
        level += 1;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::array_format::*;
    use super::*;

    #[test]
    fn formats_match_cuda_h() {
        // Spot checks of values a past table got wrong: 0x50 is the 10:10:10:2 format,
        // not UNORM_INT8X1, which is 0xc0.
        assert_eq!(UNORM_INT_101010_2, 0x50);
        assert_eq!(UNORM_INT8X1, 0xc0);
        assert_eq!(SNORM_INT8X1, 0xc6);
        assert_eq!(SNORM_INT16X4, 0xcb);
        assert_eq!(NV12, 0xb0);
        assert_eq!(
            texel(0x50),
            Some(Texel::Fixed {
                numerator: 4,
                denominator: 1
            })
        );
        assert_eq!(texel(0x51), None, "0x51 is no CUarray_format");
        assert_eq!(texel(0xcc), None, "0xcc is past SNORM_INT16X4");
    }

    #[test]
    fn level_bytes() {
        assert_eq!(array_level_bytes(FLOAT, 4, 1024, 1024, 0), Some(16 << 20));
        assert_eq!(array_level_bytes(UNSIGNED_INT8, 1, 100, 0, 0), Some(100));
        assert_eq!(array_level_bytes(UNORM_INT16X4, 1, 10, 10, 1), Some(800));
        assert_eq!(
            array_level_bytes(UNORM_INT16X4, 4, 10, 10, 1),
            Some(800),
            "channels come from the format"
        );
        assert_eq!(
            array_level_bytes(NV12, 3, 1920, 1080, 0),
            Some(1920 * 1080 * 3 / 2)
        );
        assert_eq!(
            array_level_bytes(BC1_UNORM, 4, 5, 5, 0),
            Some(4 * 8),
            "2×2 blocks of 8 bytes"
        );
        assert_eq!(
            array_level_bytes(BC7_UNORM, 4, 4096, 4096, 0),
            Some(16 << 20)
        );
        assert_eq!(array_level_bytes(FLOAT, 4, 8, 8, 6), Some(8 * 8 * 16 * 6));
        assert_eq!(array_level_bytes(0x51, 1, 1, 1, 1), None);
        assert_eq!(array_level_bytes(FLOAT, 4, u64::MAX, 2, 1), None);
    }

    #[test]
    fn mip_chains_keep_layers_and_cube_faces() {
        // 8×8×8 FLOAT×1, 4 levels: 8³ + 4³ + 2³ + 1 texels.
        assert_eq!(
            array_bytes(FLOAT, 1, [8, 8, 8], 0, 4),
            Some((512 + 64 + 8 + 1) * 4)
        );
        // The same as a 2D layered array of 8 layers: every level keeps 8 layers.
        assert_eq!(
            array_bytes(FLOAT, 1, [8, 8, 8], CUDA_ARRAY3D_LAYERED, 4),
            Some((64 + 16 + 4 + 1) * 8 * 4)
        );
        // A cubemap: six faces at every level.
        assert_eq!(
            array_bytes(UNSIGNED_INT8, 4, [16, 16, 6], CUDA_ARRAY3D_CUBEMAP, 5),
            Some((256 + 64 + 16 + 4 + 1) * 6 * 4)
        );
        // 1D (height and depth 0) and 1D layered.
        assert_eq!(array_bytes(HALF, 2, [1000, 0, 0], 0, 1), Some(4000));
        assert_eq!(
            array_bytes(HALF, 2, [1000, 0, 3], CUDA_ARRAY3D_LAYERED, 2),
            Some((1000 + 500) * 4 * 3)
        );
        // Levels past where every side reached 1 still count one texel each.
        assert_eq!(
            array_bytes(FLOAT, 1, [2, 2, 0], 0, 3),
            Some((4 + 1 + 1) * 4)
        );
        assert_eq!(
            array_bytes(FLOAT, 1, [1, 1, 1], 0, 0),
            Some(4),
            "0 levels is a plain array"
        );
        assert_eq!(array_bytes(0x51, 1, [1, 1, 1], 0, 1), None);
        assert_eq!(array_bytes(FLOAT, 4, [1 << 40, 1 << 20, 0], 0, 2), None);
    }

    #[test]
    fn odd_sizes_round_up_and_chains_stop_at_64_levels() {
        // An absurd level count costs at most 64 levels, never a loop of billions.
        assert_eq!(array_bytes(FLOAT, 1, [1, 1, 0], 0, u32::MAX), Some(64 * 4));
        // Odd sides halve down (7 → 3 → 1) and odd 4:2:0 planes round up to a byte.
        assert_eq!(
            array_bytes(UNSIGNED_INT8, 1, [7, 7, 0], 0, 3),
            Some(49 + 9 + 1)
        );
        assert_eq!(array_level_bytes(NV12, 1, 3, 3, 0), Some(14), "13.5 bytes");
        // 0 channels count as one; blocks cover partial 4×4 tiles.
        assert_eq!(array_level_bytes(FLOAT, 0, 2, 2, 0), Some(16));
        assert_eq!(array_level_bytes(BC4_UNORM, 1, 1, 1, 0), Some(8));
    }
}
