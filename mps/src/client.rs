//! What makes a container an MPS client of its card's daemon, as plain data: the mounts
//! (the card's pipe folder, and its `/dev/shm`, which MPS clients share with their
//! server) and the env. The device plugin puts them in its Allocate answer and CDI spec,
//! the DRA driver in its CDI spec, `vgpu run --mps` in its own namespace.
//!
//! * `CUDA_MPS_PIPE_DIRECTORY`: where the client finds the card's control daemon. The
//!   folder is also mounted at MPS's default (`/tmp/nvidia-mps`), so a process that
//!   lost its env still reaches its own card's daemon, never another.
//! * `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: the container's cores (percent of the card);
//!   MPS caps the SMs each of its contexts may use at that share.
//! * `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: `0=<MiB>M`, the container's memory quota rounded
//!   up to a MiB, on the client's device 0 (the daemon sees one card): MPS refuses
//!   allocations beyond it. A second fence only: the shims' quota is exact and counts
//!   what the driver holds beside the allocations.

use std::path::{Path, PathBuf};

/// The pipe folder's path in the container (MPS's default, see the module docs).
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// Where the card's shm folder is mounted in the container.
pub const CONTAINER_SHM_DIR: &str = "/dev/shm";
/// The env var naming the pipe folder.
pub const PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The env var of the SM share, percent.
pub const THREAD_PERCENTAGE_ENV: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// The env var of the device memory limit.
pub const PINNED_MEMORY_ENV: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// One bind mount of a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMount {
    /// The host folder.
    pub host: PathBuf,
    /// Where the container sees it.
    pub container: String,
    /// Read-only.
    pub read_only: bool,
}

/// A container's share of one MPS card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientShare {
    /// Percent of the card's SMs (1-100); `None`: the whole card.
    pub cores: Option<u32>,
    /// The memory quota, bytes; `None`: no MPS memory limit.
    pub memory: Option<u64>,
}

/// The mounts that connect a container to the card whose folders are `pipe` and `shm`:
/// both read-write (clients create their own pipes and shared memory there).
pub fn mounts(pipe: &Path, shm: &Path) -> Vec<ContainerMount> {
    vec![
        ContainerMount {
            host: pipe.to_path_buf(),
            container: CONTAINER_PIPE_DIR.into(),
            read_only: false,
        },
        ContainerMount {
            host: shm.to_path_buf(),
            container: CONTAINER_SHM_DIR.into(),
            read_only: false,
        },
    ]
}

/// `CUDA_MPS_PIPE_DIRECTORY` for a client whose pipe folder is at `container_pipe`.
pub fn pipe_env(container_pipe: &str) -> (String, String) {
    (PIPE_ENV.into(), container_pipe.into())
}

/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for `cores` percent (clamped to 1-100).
pub fn thread_percentage_env(cores: u32) -> (String, String) {
    (
        THREAD_PERCENTAGE_ENV.into(),
        cores.clamp(1, 100).to_string(),
    )
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for `bytes` on device 0, in MiB rounded up (never
/// below the quota, never 0).
pub fn pinned_memory_env(bytes: u64) -> (String, String) {
    let mib = bytes.div_ceil(1 << 20).max(1);
    (PINNED_MEMORY_ENV.into(), format!("0={mib}M"))
}

impl ClientShare {
    /// Every env var of this share, for a client whose pipe folder is at
    /// `container_pipe`: the pipe, the thread percentage (100 for a whole card), and the
    /// memory limit when there is a quota.
    pub fn env(&self, container_pipe: &str) -> Vec<(String, String)> {
        let mut env = vec![
            pipe_env(container_pipe),
            thread_percentage_env(self.cores.unwrap_or(100)),
        ];
        if let Some(bytes) = self.memory {
            env.push(pinned_memory_env(bytes));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_becomes_its_env() {
        let share = ClientShare {
            cores: Some(30),
            memory: Some(5 << 30),
        };
        assert_eq!(
            share.env(CONTAINER_PIPE_DIR),
            vec![
                (PIPE_ENV.to_string(), "/tmp/nvidia-mps".to_string()),
                (THREAD_PERCENTAGE_ENV.to_string(), "30".to_string()),
                (PINNED_MEMORY_ENV.to_string(), "0=5120M".to_string()),
            ]
        );
        let whole = ClientShare {
            cores: None,
            memory: None,
        };
        assert_eq!(
            whole.env("/p"),
            vec![
                (PIPE_ENV.to_string(), "/p".to_string()),
                (THREAD_PERCENTAGE_ENV.to_string(), "100".to_string()),
            ]
        );
    }

    #[test]
    fn limits_round_up_and_clamp() {
        assert_eq!(pinned_memory_env(1).1, "0=1M", "never below the quota");
        assert_eq!(pinned_memory_env((256 << 20) + 1).1, "0=257M");
        assert_eq!(pinned_memory_env(0).1, "0=1M", "never 0 (MPS: no limit)");
        assert_eq!(thread_percentage_env(0).1, "1");
        assert_eq!(thread_percentage_env(250).1, "100");
    }

    #[test]
    fn mounts_cover_the_pipe_and_shm_folders() {
        let mounts = mounts(
            Path::new("/s/mps/GPU-a/pipe"),
            Path::new("/s/mps/GPU-a/shm"),
        );
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].container, "/tmp/nvidia-mps");
        assert_eq!(mounts[1].container, "/dev/shm");
        assert!(mounts.iter().all(|m| !m.read_only));
    }
}
