//! The container side of the driver folder, as data: which host paths are mounted at
//! which container paths, and the env a container gets. The device plugin and `vgpu
//! run` turn a [`ContainerLayout`] into their own mount and env types.
//!
//! Defaults ([`LayoutPaths::default`]): the prepared folder `/var/lib/vgpu/driver`
//! appears read-only at `/usr/local/vgpu/driver`; the shims are mounted over
//! `libcuda.so.1` / `libnvidia-ml.so.1` in `/usr/lib/x86_64-linux-gnu`, `/usr/lib64`
//! and `/usr/local/nvidia/lib64`; the real `nvidia-smi` at `/usr/local/nvidia/bin` and
//! `/usr/bin`; `VGPU_DRIVER_DIR` points at the real libraries inside the mount.
//!
//! The real `libcuda` is loaded by path from that folder, but it `dlopen`s its helper
//! libraries (`libnvidia-ptxjitcompiler.so.1` for PTX JIT, `libnvidia-nvvm.so.4`,
//! `libnvidia-gpucomp.so.<version>`, ...) by name, and the loader looks for a name in
//! the caller's search path, never beside the caller. So every other library of the
//! prepared folder is mounted, under its SONAME, into the same three folders as the
//! shims: the first two are the loader's default folders on Debian/Ubuntu (multiarch)
//! and RHEL, the third is on the `LD_LIBRARY_PATH` of NGC images. That is what
//! NVIDIA's container toolkit does, and it leaves the image's own `LD_LIBRARY_PATH`
//! alone: the layout sets none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::exports::soname;
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
    /// In mount order: the driver folder, the shims, the helper libraries, the tools.
    pub mounts: Vec<Mount>,
    /// Env to set (never `LD_LIBRARY_PATH`: the image keeps its own).
    pub env: BTreeMap<String, String>,
}

/// A library of the prepared folder that the real driver loads by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HelperLibrary {
    /// The name it is loaded under (`libnvidia-ptxjitcompiler.so.1`).
    pub soname: String,
    /// The file in the prepared folder.
    pub host_path: PathBuf,
}

/// Every ELF file of `lib_dir` with a SONAME that no shim covers, by SONAME (links and
/// temp files are skipped; a missing folder has none).
pub fn helper_libraries(lib_dir: &Path) -> Vec<HelperLibrary> {
    let Ok(entries) = std::fs::read_dir(lib_dir) else {
        return Vec::new();
    };
    let mut helpers: Vec<HelperLibrary> = entries
        .flatten()
        .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
        .filter_map(|entry| {
            let host_path = entry.path();
            let name = soname(&host_path).ok().flatten()?;
            let shimmed = SHIMS.iter().any(|spec| spec.real_soname == name);
            let plain = !name.is_empty() && !name.contains('/');
            (!shimmed && plain).then_some(HelperLibrary {
                soname: name,
                host_path,
            })
        })
        .collect();
    helpers.sort_by(|a, b| a.soname.cmp(&b.soname));
    helpers.dedup_by(|a, b| a.soname == b.soname);
    helpers
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

    /// The whole layout (reads the prepared folder's `lib64` for the helper libraries).
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
        for helper in helper_libraries(&self.host_driver_dir.join(LIB_SUBDIR)) {
            for dir in &self.container_library_dirs {
                mounts.push(read_only(
                    helper.host_path.clone(),
                    dir.join(&helper.soname),
                ));
            }
        }
        let host_smi = self.host_driver_dir.join(BIN_SUBDIR).join("nvidia-smi");
        for path in &self.container_nvidia_smi {
            mounts.push(read_only(host_smi.clone(), path.clone()));
        }
        let env = BTreeMap::from([(
            DRIVER_DIR_ENV.to_string(),
            self.container_driver_lib_dir().display().to_string(),
        )]);
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
        assert!(
            !layout.env.contains_key("LD_LIBRARY_PATH"),
            "the image keeps its own LD_LIBRARY_PATH"
        );
        assert_eq!(
            layout.env["VGPU_DRIVER_DIR"],
            "/usr/local/vgpu/driver/lib64"
        );
        // The container-side folder must agree with the shims' built-in default.
        assert_eq!(
            layout.env["VGPU_DRIVER_DIR"],
            vgpu_contract::config::DEFAULT_DRIVER_DIR
        );
        assert_eq!(DRIVER_DIR_ENV, vgpu_contract::config::DRIVER_DIR_ENV);
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
        };
        let layout = paths.layout();
        assert_eq!(layout.env.len(), 1);
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

    /// A shared object named `file` with SONAME `soname` (or none), built with `cc`.
    fn shared_object(dir: &Path, file: &str, soname: Option<&str>) -> PathBuf {
        let source = dir.join(".fixture.c");
        std::fs::write(&source, "int vgpu_fixture(void) { return 7; }\n").unwrap();
        let out = dir.join(file);
        let mut cc = std::process::Command::new("cc");
        cc.args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&source);
        if let Some(soname) = soname {
            cc.arg(format!("-Wl,-soname,{soname}"));
        }
        let status = cc.status().expect("cc runs");
        assert!(status.success(), "cc built {file}");
        std::fs::remove_file(&source).unwrap();
        out
    }

    #[test]
    fn every_helper_library_is_mounted_under_its_soname_beside_the_shims() {
        let host = tempfile::tempdir().unwrap();
        let lib64 = host.path().join("lib64");
        std::fs::create_dir_all(&lib64).unwrap();
        // A prepared folder: versioned files, SONAME links, a dev link, a shimmed
        // library, one whose SONAME is its versioned name, one without a SONAME, a file
        // that is not ELF and a leftover temp file of `prepare`.
        let ptxjit = shared_object(
            &lib64,
            "libnvidia-ptxjitcompiler.so.580.159.04",
            Some("libnvidia-ptxjitcompiler.so.1"),
        );
        std::os::unix::fs::symlink(
            "libnvidia-ptxjitcompiler.so.580.159.04",
            lib64.join("libnvidia-ptxjitcompiler.so.1"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "libnvidia-ptxjitcompiler.so.1",
            lib64.join("libnvidia-ptxjitcompiler.so"),
        )
        .unwrap();
        let gpucomp = shared_object(
            &lib64,
            "libnvidia-gpucomp.so.580.159.04",
            Some("libnvidia-gpucomp.so.580.159.04"),
        );
        shared_object(&lib64, "libcuda.so.580.159.04", Some("libcuda.so.1"));
        shared_object(&lib64, "libnosoname.so", None);
        std::fs::write(lib64.join("README"), "not a library").unwrap();
        shared_object(
            &lib64,
            ".libnvidia-nvvm.so.4.tmp-1",
            Some("libnvidia-nvvm.so.4"),
        );
        let helpers = helper_libraries(&lib64);
        assert_eq!(
            helpers,
            [
                HelperLibrary {
                    soname: "libnvidia-gpucomp.so.580.159.04".into(),
                    host_path: gpucomp.clone()
                },
                HelperLibrary {
                    soname: "libnvidia-ptxjitcompiler.so.1".into(),
                    host_path: ptxjit.clone()
                },
            ]
        );
        let paths = LayoutPaths {
            host_driver_dir: host.path().to_path_buf(),
            ..LayoutPaths::default()
        };
        let layout = paths.layout();
        for dir in [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/local/nvidia/lib64",
        ] {
            for helper in &helpers {
                let at = Path::new(dir).join(&helper.soname);
                let mount = layout
                    .mounts
                    .iter()
                    .find(|mount| mount.container_path == at)
                    .unwrap_or_else(|| panic!("no mount at {}", at.display()));
                assert_eq!(mount.host_path, helper.host_path);
                assert!(mount.read_only);
            }
        }
        assert_eq!(layout.mounts.len(), 1 + 6 + 2 * 3 + 2);
        assert!(
            !layout
                .mounts
                .iter()
                .any(|mount| mount.container_path.ends_with("libcuda.so.580.159.04")),
            "the real libcuda is never put where the loader finds it by name"
        );
        assert!(helper_libraries(&host.path().join("none")).is_empty());
    }
}
