//! Container-side paths of the mount layout, and the host-side defaults they come from.
//!
//! This is a local copy: `vgpu_ldconfig::layout` (being written alongside) will own the
//! layout; when it lands, these constants should be replaced by its `LayoutPaths`.

/// Where the real driver folder (host: `host_driver_dir`) appears in the container.
pub const CONTAINER_DRIVER_DIR: &str = "/usr/local/vgpu/driver";
/// The `driver_dir` written into the container config (the libraries inside the mount).
pub const CONTAINER_DRIVER_LIB_DIR: &str = "/usr/local/vgpu/driver/lib64";
/// Folders in which the shims are mounted over `libcuda.so.1` and `libnvidia-ml.so.1`.
pub const CONTAINER_LIBRARY_DIRS: [&str; 3] = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64"];
/// Where NVIDIA's real `nvidia-smi` is mounted (as gpu-manager did).
pub const CONTAINER_NVIDIA_SMI: &str = "/usr/local/nvidia/bin/nvidia-smi";
/// The container config (read-only).
pub const CONTAINER_CONFIG: &str = "/etc/vgpu/vgpu.yaml";
/// The usage region (read-write).
pub const CONTAINER_REGION: &str = "/etc/vgpu/usage.region";
/// `LD_LIBRARY_PATH` set in the container.
pub const CONTAINER_LD_LIBRARY_PATH: &str = "/usr/local/nvidia/lib64";

/// The prepared driver folder on the host (`vgpu-ldconfig prepare` output).
pub const HOST_DRIVER_DIR: &str = "/var/lib/vgpu/driver";
/// Inside the host driver folder: the real libraries.
pub const HOST_DRIVER_LIB_SUBDIR: &str = "lib64";
/// Inside the host driver folder: the real tools (`nvidia-smi`).
pub const HOST_DRIVER_BIN_SUBDIR: &str = "bin";
/// Inside the host driver folder: the shims.
pub const HOST_SHIM_SUBDIR: &str = "shim";
/// File name of the CUDA shim as built (`target/<profile>/libcuda_shim.so`).
pub const CUDA_SHIM_FILE: &str = "libcuda_shim.so";
/// File name of the NVML shim as built.
pub const NVML_SHIM_FILE: &str = "libnvml_shim.so";

/// Host device nodes every container gets, when they exist.
pub const CONTROL_DEVICES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];
