//! vgpu-mps: the opt-in spatial sharing mode on NVIDIA MPS (Multi-Process Service),
//! beside the default time-sliced one, under the same quotas.
//!
//! * [`sharing`]: the config (`sharing: mps` per node, `card_sharing` per card, the
//!   `mps:` settings), parsed strictly and shared by the device plugin, the DRA driver
//!   and `vgpu run --mps`;
//! * [`daemon`]: one `nvidia-cuda-mps-control` per card, with pipe, log and `/dev/shm`
//!   folders of its own, supervised: started, health-checked, restarted cleanly when it
//!   dies (its pipe folder emptied, its leftover servers killed), stopped on exit;
//! * [`client`]: what makes a container an MPS client of its card's daemon: the pipe and
//!   shm mounts and `CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (from
//!   its cores) and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (from its memory quota), as plain
//!   data the plugin's Allocate answer, the CDI specs and `vgpu run` apply.
//!
//! The shims keep the exact memory quota and the NVML / `nvidia-smi` view on top; MPS's
//! own limits are a second fence. docs/mps.md says what MPS enforces and what it does
//! not (a fatal fault in one client reaches every client of that card).

pub mod client;
pub mod daemon;
pub mod sharing;
mod spawn;

pub use client::{ClientShare, ContainerMount};
pub use daemon::{CardDaemon, CardDirs, DaemonHealth, Supervisor};
pub use sharing::{MpsSettings, Sharing, SharingConfig};
