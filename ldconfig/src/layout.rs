//! The container side of the driver folder, as data: which host paths are mounted at
//! which container paths, and the env a container gets. The device plugin and `vgpu
//! run` turn a [`ContainerLayout`] into their own mount and env types.
//!
//! Defaults ([`LayoutPaths::default`]): the prepared folder `/var/lib/vgpu/driver`
//! appears read-only at `/usr/local/vgpu/driver`; the shims are mounted over
//! `libcuda.so.1` / `libnvidia-ml.so.1` in `/usr/lib/x86_64-linux-gnu`, `/usr/lib64`
//! and `/usr/local/nvidia/lib64`; the real `nvidia-smi` at `/usr/local/nvidia/bin` and
//! `/usr/bin`; `LD_LIBRARY_PATH` gains `/usr/local/nvidia/lib64` and
//! `VGPU_DRIVER_DIR` points at the real libraries inside the mount.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::prepare::{BIN_SUBDIR, LIB_SUBDIR, SHIM_SUBDIR, SHIMS};

/// The configurable paths of the layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayoutPaths {
    /// The prepared driver folder on the host (`vgpu-ldconfig prepare --dest`).
    pub host_driver_dir: PathBuf,
    /// Where the shims are on the host; `None` is `host_driver_dir/shim`, where
    /// `prepare` deploys them.
    pub host_shim_dir: Option<PathBuf>,
    /// Where that folder appears in the container.
    pub container_driver_dir: PathBuf,
    /// Container folders in which each shim is mounted over its real SONAME.
    pub container_library_dirs: Vec<PathBuf>,
    /// Container paths at which `nvidia-smi` is mounted.
    pub container_nvidia_smi: Vec<PathBuf>,
    /// Folders put in front of the container's `LD_LIBRARY_PATH`.
    pub ld_library_path: Vec<PathBuf>,
}

impl Default for LayoutPaths {
    fn default() -> Self {
        LayoutPaths {
            host_driver_dir: PathBuf::from("/var/lib/vgpu/driver"),
            host_shim_dir: None,
            container_driver_dir: PathBuf::from("/usr/local/vgpu/driver"),
            container_library_dirs: [
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/usr/local/nvidia/lib64",
            ]
            .map(PathBuf::from)
            .to_vec(),
            container_nvidia_smi: ["/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi"]
                .map(PathBuf::from)
                .to_vec(),
            ld_library_path: vec![PathBuf::from("/usr/local/nvidia/lib64")],
        }
    }
}

/// One bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// Source on the host.
    pub host_path: PathBuf,
    /// Target in the container.
    pub container_path: PathBuf,
    /// Mounted read-only (all of the driver layout is).
    pub read_only: bool,
}

/// Mounts and env for one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerLayout {
    /// In mount order: the driver folder, the shims, the tools.
    pub mounts: Vec<Mount>,
    /// Env to set (`LD_LIBRARY_PATH` holds only the layout's folders; callers append the
    /// image's own value).
    pub env: BTreeMap<String, String>,
}

/// Env var the shims read for the real driver folder.
pub const DRIVER_DIR_ENV: &str = "VGPU_DRIVER_DIR";

impl LayoutPaths {
    /// The container folder holding the real libraries (`VGPU_DRIVER_DIR`).
    pub fn container_driver_lib_dir(&self) -> PathBuf {
        self.container_driver_dir.join(LIB_SUBDIR)
    }

    /// The host path of a deployed shim.
    pub fn host_shim(&self, shim_file_name: &str) -> PathBuf {
        match &self.host_shim_dir {
            Some(dir) => dir.join(shim_file_name),
            None => self.host_driver_dir.join(SHIM_SUBDIR).join(shim_file_name),
        }
    }

    /// The whole layout.
    pub fn layout(&self) -> ContainerLayout {
        let read_only = |host_path: PathBuf, container_path: PathBuf| Mount {
            host_path,
            container_path,
            read_only: true,
        };
        let mut mounts = vec![read_only(
            self.host_driver_dir.clone(),
            self.container_driver_dir.clone(),
        )];
        for spec in SHIMS {
            for dir in &self.container_library_dirs {
                mounts.push(read_only(
                    self.host_shim(spec.file_name),
                    dir.join(spec.real_soname),
                ));
            }
        }
        let host_smi = self.host_driver_dir.join(BIN_SUBDIR).join("nvidia-smi");
        for path in &self.container_nvidia_smi {
            mounts.push(read_only(host_smi.clone(), path.clone()));
        }
        let ld_library_path = self
            .ld_library_path
            .iter()
            .map(|dir| dir.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        let env = BTreeMap::from([
            ("LD_LIBRARY_PATH".to_string(), ld_library_path),
            (
                DRIVER_DIR_ENV.to_string(),
                self.container_driver_lib_dir().display().to_string(),
            ),
        ]);
        ContainerLayout { mounts, env }
    }

    /// The layout without mounts whose host source does not exist (e.g. no
    /// `nvidia-smi` was found when the folder was prepared).
    pub fn layout_existing(&self) -> ContainerLayout {
        let mut layout = self.layout();
        layout
            .mounts
            .retain(|mount| Path::new(&mount.host_path).exists());
        layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_mounts_shims_over_every_library_dir() {
        let layout = LayoutPaths::default().layout();
        let target = |container: &str| {
            layout
                .mounts
                .iter()
                .find(|mount| mount.container_path == Path::new(container))
                .map(|mount| mount.host_path.clone())
        };
        assert_eq!(
            target("/usr/local/vgpu/driver"),
            Some(PathBuf::from("/var/lib/vgpu/driver"))
        );
        for dir in [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/local/nvidia/lib64",
        ] {
            assert_eq!(
                target(&format!("{dir}/libcuda.so.1")),
                Some(PathBuf::from("/var/lib/vgpu/driver/shim/libcuda_shim.so"))
            );
            assert_eq!(
                target(&format!("{dir}/libnvidia-ml.so.1")),
                Some(PathBuf::from("/var/lib/vgpu/driver/shim/libnvml_shim.so"))
            );
        }
        for smi in ["/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi"] {
            assert_eq!(
                target(smi),
                Some(PathBuf::from("/var/lib/vgpu/driver/bin/nvidia-smi"))
            );
        }
        assert_eq!(layout.mounts.len(), 1 + 6 + 2);
        assert!(layout.mounts.iter().all(|mount| mount.read_only));
        assert_eq!(layout.env["LD_LIBRARY_PATH"], "/usr/local/nvidia/lib64");
        assert_eq!(
            layout.env["VGPU_DRIVER_DIR"],
            "/usr/local/vgpu/driver/lib64"
        );
        // The container-side folder must agree with the shims' built-in default.
        assert_eq!(
            layout.env["VGPU_DRIVER_DIR"],
            vgpu_common::config::DEFAULT_DRIVER_DIR
        );
        assert_eq!(DRIVER_DIR_ENV, vgpu_common::config::DRIVER_DIR_ENV);
    }

    #[test]
    fn custom_paths_flow_through_and_missing_sources_can_be_dropped() {
        let host = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(host.path().join("shim")).unwrap();
        std::fs::write(host.path().join("shim/libcuda_shim.so"), "x").unwrap();
        let paths = LayoutPaths {
            host_driver_dir: host.path().to_path_buf(),
            host_shim_dir: None,
            container_driver_dir: PathBuf::from("/opt/drv"),
            container_library_dirs: vec![PathBuf::from("/lib")],
            container_nvidia_smi: vec![PathBuf::from("/bin/nvidia-smi")],
            ld_library_path: vec![PathBuf::from("/a"), PathBuf::from("/b")],
        };
        let layout = paths.layout();
        assert_eq!(layout.env["LD_LIBRARY_PATH"], "/a:/b");
        assert_eq!(layout.env["VGPU_DRIVER_DIR"], "/opt/drv/lib64");
        assert_eq!(layout.mounts.len(), 1 + 2 + 1);
        let existing = paths.layout_existing();
        let targets: Vec<&Path> = existing
            .mounts
            .iter()
            .map(|mount| mount.container_path.as_path())
            .collect();
        assert_eq!(
            targets,
            [Path::new("/opt/drv"), Path::new("/lib/libcuda.so.1")]
        );
        let json = serde_json::to_value(&layout).unwrap();
        assert_eq!(json["mounts"][1]["container_path"], "/lib/libcuda.so.1");
    }
}
