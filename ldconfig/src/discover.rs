//! Finding the host's real NVIDIA user-space driver: its libraries (through the loader
//! cache and caller-given folders, symlinks resolved to the versioned files), its tools
//! (`nvidia-smi`, ...) and its version (`/proc/driver/nvidia/version`, else the
//! versioned file names). Also [`loader_paths`], every path at which the dynamic loader
//! could pick up a library, which is where `vgpu run` mounts the shims.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cache::{CacheEntry, CacheError, read_cache};

/// SONAMEs of the driver libraries collected, in deployment order. `libcuda.so.1` is the
/// one that must exist; the others are taken when present.
pub const DRIVER_SONAMES: &[&str] = &[
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libcudadebugger.so.1",
    "libnvidia-opencl.so.1",
    "libnvidia-encode.so.1",
    "libnvcuvid.so.1",
    "libnvidia-opticalflow.so.1",
    "libnvidia-allocator.so.1",
    "libnvidia-cfg.so.1",
];
/// Libraries whose SONAME carries the full driver version
/// (`libnvidia-gpucomp.so.580.159.04`), matched by this prefix.
pub const VERSIONED_SONAME_PREFIXES: &[&str] =
    &["libnvidia-gpucomp.so.", "libnvidia-glvkspirv.so."];
/// Tools copied next to the libraries when found.
pub const DRIVER_TOOLS: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
/// Where the kernel module reports its version.
pub const PROC_DRIVER_VERSION: &str = "/proc/driver/nvidia/version";
/// Tool folders searched after `PATH`.
pub const DEFAULT_TOOL_DIRS: &[&str] = &["/usr/local/nvidia/bin", "/usr/bin"];

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// The loader cache could not be read.
    #[error(transparent)]
    Cache(#[from] CacheError),
}

/// Where discovery looks.
#[derive(Debug, Clone, Default)]
pub struct DiscoverOptions {
    /// Folders searched first, in order (e.g. `--extra-dir`, then `LD_LIBRARY_PATH`).
    pub extra_dirs: Vec<PathBuf>,
    /// The loader cache entries (only x86-64 ones are used).
    pub cache: Vec<CacheEntry>,
    /// The kernel module's version file; `None` skips it.
    pub proc_version: Option<PathBuf>,
    /// Folders searched for the tools, in order.
    pub tool_dirs: Vec<PathBuf>,
}

impl DiscoverOptions {
    /// The host's view: `cache_path` (usually `/etc/ld.so.cache`), `extra_dirs`, then
    /// each `LD_LIBRARY_PATH` folder; tools from `PATH` then [`DEFAULT_TOOL_DIRS`];
    /// the version from [`PROC_DRIVER_VERSION`].
    pub fn host(cache_path: &Path, extra_dirs: &[PathBuf]) -> Result<Self, DiscoverError> {
        let mut dirs = extra_dirs.to_vec();
        if let Ok(ld_library_path) = std::env::var("LD_LIBRARY_PATH") {
            dirs.extend(split_path_list(&ld_library_path));
        }
        let mut tool_dirs: Vec<PathBuf> = std::env::var("PATH")
            .map(|path| split_path_list(&path))
            .unwrap_or_default();
        tool_dirs.extend(DEFAULT_TOOL_DIRS.iter().map(PathBuf::from));
        Ok(DiscoverOptions {
            extra_dirs: dirs,
            cache: read_cache(cache_path)?,
            proc_version: Some(PathBuf::from(PROC_DRIVER_VERSION)),
            tool_dirs,
        })
    }
}

/// One real driver library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverLibrary {
    /// The SONAME it is looked up by (`libcuda.so.1`).
    pub soname: String,
    /// The path it was found at (cache value or folder entry, often a symlink).
    pub found_at: PathBuf,
    /// `found_at` with every symlink resolved.
    pub real_path: PathBuf,
    /// The real file's name (`libcuda.so.580.159.04`).
    pub file_name: String,
}

/// Where the driver version came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VersionSource {
    /// `/proc/driver/nvidia/version` (the loaded kernel module).
    KernelModule,
    /// The versioned file name of `libcuda.so.1`.
    LibcudaFileName,
    /// The versioned file name of `libnvidia-ml.so.1`.
    NvmlFileName,
}

/// Everything found on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostDriver {
    /// The driver version (`580.159.04`), when it could be told.
    pub version: Option<String>,
    /// Where `version` came from.
    pub version_source: Option<VersionSource>,
    /// The libraries found, in [`DRIVER_SONAMES`] order then versioned ones.
    pub libraries: Vec<DriverLibrary>,
    /// Tools found (real files, symlinks resolved), by tool name.
    pub tools: BTreeMap<String, PathBuf>,
    /// Candidates that were passed over (dangling links, ...), one line each.
    pub skipped: Vec<String>,
}

impl HostDriver {
    /// The library with this SONAME, if found.
    pub fn library(&self, soname: &str) -> Option<&DriverLibrary> {
        self.libraries
            .iter()
            .find(|library| library.soname == soname)
    }
}

/// Looks for the driver as `options` says. Finding nothing is not an error (the result
/// is empty); callers that need `libcuda.so.1` check for it.
pub fn discover(options: &DiscoverOptions) -> Result<HostDriver, DiscoverError> {
    let mut driver = HostDriver::default();
    let mut candidates: Vec<(String, PathBuf)> = Vec::new();
    for dir in &options.extra_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            driver
                .skipped
                .push(format!("{}: not a readable folder", dir.display()));
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names.into_iter().filter(|name| is_wanted_soname(name)) {
            let path = dir.join(&name);
            candidates.push((name, path));
        }
    }
    for entry in options
        .cache
        .iter()
        .filter(|entry| entry.is_x86_64 && !entry.is_hwcaps_subdir())
    {
        if is_wanted_soname(&entry.name) {
            candidates.push((entry.name.clone(), entry.path.clone()));
        }
    }
    for (soname, path) in candidates {
        if driver.library(&soname).is_some() {
            continue;
        }
        match resolve_file(&path) {
            Ok((real_path, file_name)) => driver.libraries.push(DriverLibrary {
                soname,
                found_at: path,
                real_path,
                file_name,
            }),
            Err(reason) => driver.skipped.push(format!("{}: {reason}", path.display())),
        }
    }
    driver.libraries.sort_by_key(|library| {
        let rank = DRIVER_SONAMES
            .iter()
            .position(|name| *name == library.soname)
            .unwrap_or(DRIVER_SONAMES.len());
        (rank, library.soname.clone())
    });

    for tool in DRIVER_TOOLS {
        for dir in &options.tool_dirs {
            let path = dir.join(tool);
            if let Ok((real_path, _)) = resolve_file(&path) {
                driver.tools.insert(tool.to_string(), real_path);
                break;
            }
        }
    }

    let from_proc = options
        .proc_version
        .as_deref()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| parse_proc_version(&text));
    let from_file = |soname: &str| {
        driver
            .library(soname)
            .and_then(|library| version_from_file_name(&library.file_name, soname))
    };
    (driver.version, driver.version_source) = if let Some(version) = from_proc {
        (Some(version), Some(VersionSource::KernelModule))
    } else if let Some(version) = from_file("libcuda.so.1") {
        (Some(version), Some(VersionSource::LibcudaFileName))
    } else if let Some(version) = from_file("libnvidia-ml.so.1") {
        (Some(version), Some(VersionSource::NvmlFileName))
    } else {
        (None, None)
    };
    Ok(driver)
}

/// Every path at which the loader could find `name` for a 64-bit process: each
/// `LD_LIBRARY_PATH` folder that holds it, then every x86-64 cache entry for it, without
/// duplicates, in that order.
pub fn loader_paths(
    name: &str,
    cache: &[CacheEntry],
    ld_library_path: Option<&str>,
) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = Vec::new();
    let from_env = ld_library_path.map(split_path_list).unwrap_or_default();
    let from_env = from_env
        .into_iter()
        .map(|dir| dir.join(name))
        .filter(|path| path.exists());
    let from_cache = cache
        .iter()
        .filter(|entry| entry.is_x86_64 && entry.name == name)
        .map(|entry| entry.path.clone());
    for path in from_env.chain(from_cache) {
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    paths
}

/// The version in `/proc/driver/nvidia/version` text, e.g. `535.261.03` from
/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Thu ...`.
pub fn parse_proc_version(text: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|line| line.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|word| is_version(word))
        .map(str::to_string)
}

/// The version suffix of a versioned file name: `libcuda.so.580.159.04` with SONAME
/// `libcuda.so.1` gives `580.159.04`.
pub fn version_from_file_name(file_name: &str, soname: &str) -> Option<String> {
    let stem = soname.find(".so").map(|at| &soname[..at + 3])?;
    let suffix = file_name.strip_prefix(stem)?.strip_prefix('.')?;
    is_version(suffix).then(|| suffix.to_string())
}

/// `major.minor` or `major.minor.patch`, all decimal digits.
fn is_version(word: &str) -> bool {
    let parts: Vec<&str> = word.split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|part| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit()))
}

fn is_wanted_soname(name: &str) -> bool {
    DRIVER_SONAMES.contains(&name)
        || VERSIONED_SONAME_PREFIXES
            .iter()
            .any(|prefix| name.strip_prefix(prefix).is_some_and(is_version))
}

/// Resolves symlinks; the target must be a regular file.
fn resolve_file(path: &Path) -> Result<(PathBuf, String), String> {
    let real_path =
        std::fs::canonicalize(path).map_err(|error| format!("cannot resolve: {error}"))?;
    let metadata = std::fs::metadata(&real_path).map_err(|error| error.to_string())?;
    if !metadata.is_file() {
        return Err(format!("{} is not a regular file", real_path.display()));
    }
    let file_name = real_path
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| format!("{} has no UTF-8 file name", real_path.display()))?
        .to_string();
    Ok((real_path, file_name))
}

/// Splits a `:`-separated folder list, dropping empty entries.
pub fn split_path_list(list: &str) -> Vec<PathBuf> {
    list.split(':')
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::build::{I386_LIBC6, X86_64_LIBC6, new_format};
    use crate::cache::parse_cache;
    use std::os::unix::fs::symlink;

    /// A fake driver install: versioned files plus SONAME links, as the packages lay it out.
    fn fake_install(dir: &Path, version: &str) {
        for stem in [
            "libcuda.so",
            "libnvidia-ml.so",
            "libnvidia-nvvm.so",
            "libnvidia-ptxjitcompiler.so",
            "libnvidia-gpucomp.so",
        ] {
            std::fs::write(dir.join(format!("{stem}.{version}")), stem).unwrap();
        }
        symlink(format!("libcuda.so.{version}"), dir.join("libcuda.so.1")).unwrap();
        symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
        symlink(
            format!("libnvidia-ml.so.{version}"),
            dir.join("libnvidia-ml.so.1"),
        )
        .unwrap();
        symlink(
            format!("libnvidia-nvvm.so.{version}"),
            dir.join("libnvidia-nvvm.so.4"),
        )
        .unwrap();
        symlink(
            format!("libnvidia-ptxjitcompiler.so.{version}"),
            dir.join("libnvidia-ptxjitcompiler.so.1"),
        )
        .unwrap();
    }

    #[test]
    fn finds_libraries_through_cache_and_resolves_links() {
        let dir = tempfile::tempdir().unwrap();
        fake_install(dir.path(), "580.159.04");
        let at = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let cache = parse_cache(&new_format(&[
            ("libcuda.so.1", &at("libcuda.so.1"), X86_64_LIBC6),
            ("libcuda.so.1", "/nonexistent/i386/libcuda.so.1", I386_LIBC6),
            ("libnvidia-ml.so.1", &at("libnvidia-ml.so.1"), X86_64_LIBC6),
            (
                "libnvidia-nvvm.so.4",
                &at("libnvidia-nvvm.so.4"),
                X86_64_LIBC6,
            ),
            (
                "libnvidia-gpucomp.so.580.159.04",
                &at("libnvidia-gpucomp.so.580.159.04"),
                X86_64_LIBC6,
            ),
            (
                "libnvidia-encode.so.1",
                "/nonexistent/libnvidia-encode.so.1",
                X86_64_LIBC6,
            ),
            ("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", X86_64_LIBC6),
        ]))
        .unwrap();
        let options = DiscoverOptions {
            cache,
            ..DiscoverOptions::default()
        };
        let driver = discover(&options).unwrap();
        let sonames: Vec<&str> = driver
            .libraries
            .iter()
            .map(|library| library.soname.as_str())
            .collect();
        assert_eq!(
            sonames,
            [
                "libcuda.so.1",
                "libnvidia-ml.so.1",
                "libnvidia-nvvm.so.4",
                "libnvidia-gpucomp.so.580.159.04"
            ]
        );
        let cuda = driver.library("libcuda.so.1").unwrap();
        assert_eq!(cuda.file_name, "libcuda.so.580.159.04");
        assert_eq!(
            cuda.real_path,
            std::fs::canonicalize(dir.path())
                .unwrap()
                .join("libcuda.so.580.159.04")
        );
        assert_eq!(driver.version.as_deref(), Some("580.159.04"));
        assert_eq!(driver.version_source, Some(VersionSource::LibcudaFileName));
        assert_eq!(driver.skipped.len(), 1, "{:?}", driver.skipped);
        assert!(driver.skipped[0].contains("libnvidia-encode.so.1"));
    }

    #[test]
    fn extra_dirs_win_over_cache_and_proc_version_wins_over_names() {
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        fake_install(first.path(), "535.261.03");
        fake_install(second.path(), "580.159.04");
        let cache = parse_cache(&new_format(&[(
            "libcuda.so.1",
            &second.path().join("libcuda.so.1").to_string_lossy(),
            X86_64_LIBC6,
        )]))
        .unwrap();
        let proc_version = first.path().join("version");
        std::fs::write(
            &proc_version,
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16-I2-C03-12-4)  Thu Oct 9 2025\nGCC version:  gcc version 12.2.0\n",
        )
        .unwrap();
        let options = DiscoverOptions {
            extra_dirs: vec![
                PathBuf::from("/nonexistent-dir"),
                first.path().to_path_buf(),
            ],
            cache,
            proc_version: Some(proc_version),
            tool_dirs: Vec::new(),
        };
        let driver = discover(&options).unwrap();
        assert_eq!(
            driver.library("libcuda.so.1").unwrap().file_name,
            "libcuda.so.535.261.03"
        );
        assert_eq!(
            driver
                .library("libnvidia-gpucomp.so.535.261.03")
                .unwrap()
                .file_name,
            "libnvidia-gpucomp.so.535.261.03"
        );
        assert_eq!(driver.version.as_deref(), Some("580.159.04"));
        assert_eq!(driver.version_source, Some(VersionSource::KernelModule));
        assert!(
            driver
                .skipped
                .iter()
                .any(|line| line.contains("/nonexistent-dir"))
        );
    }

    #[test]
    fn nvml_name_gives_version_when_libcuda_is_unversioned() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libcuda.so.1"), "x").unwrap();
        std::fs::write(dir.path().join("libnvidia-ml.so.535.261.03"), "x").unwrap();
        symlink(
            "libnvidia-ml.so.535.261.03",
            dir.path().join("libnvidia-ml.so.1"),
        )
        .unwrap();
        let driver = discover(&DiscoverOptions {
            extra_dirs: vec![dir.path().to_path_buf()],
            ..DiscoverOptions::default()
        })
        .unwrap();
        assert_eq!(driver.version.as_deref(), Some("535.261.03"));
        assert_eq!(driver.version_source, Some(VersionSource::NvmlFileName));
    }

    #[test]
    fn finds_tools_in_order() {
        let early = tempfile::tempdir().unwrap();
        let late = tempfile::tempdir().unwrap();
        std::fs::write(late.path().join("nvidia-smi"), "late").unwrap();
        std::fs::write(early.path().join("nvidia-debugdump"), "early").unwrap();
        std::fs::write(late.path().join("nvidia-debugdump"), "late").unwrap();
        let options = DiscoverOptions {
            tool_dirs: vec![early.path().to_path_buf(), late.path().to_path_buf()],
            ..DiscoverOptions::default()
        };
        let driver = discover(&options).unwrap();
        assert!(
            driver.tools["nvidia-smi"].starts_with(std::fs::canonicalize(late.path()).unwrap())
        );
        assert!(
            driver.tools["nvidia-debugdump"]
                .starts_with(std::fs::canonicalize(early.path()).unwrap())
        );
        assert!(!driver.tools.contains_key("nvidia-cuda-mps-control"));
    }

    #[test]
    fn loader_paths_env_first_then_cache_deduplicated() {
        let env_dir = tempfile::tempdir().unwrap();
        std::fs::write(env_dir.path().join("libcuda.so.1"), "x").unwrap();
        let empty_dir = tempfile::tempdir().unwrap();
        let cache = parse_cache(&new_format(&[
            (
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                X86_64_LIBC6,
            ),
            (
                "libcuda.so.1",
                "/usr/lib/i386-linux-gnu/libcuda.so.1",
                I386_LIBC6,
            ),
            ("libcuda.so.1", "/usr/lib64/libcuda.so.1", X86_64_LIBC6),
            (
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                X86_64_LIBC6,
            ),
            (
                "libnvidia-ml.so.1",
                "/usr/lib64/libnvidia-ml.so.1",
                X86_64_LIBC6,
            ),
        ]))
        .unwrap();
        let env = format!(
            "{}::{}:{}",
            empty_dir.path().display(),
            env_dir.path().display(),
            env_dir.path().display()
        );
        let paths = loader_paths("libcuda.so.1", &cache, Some(&env));
        assert_eq!(
            paths,
            [
                env_dir.path().join("libcuda.so.1"),
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                PathBuf::from("/usr/lib64/libcuda.so.1")
            ]
        );
        assert_eq!(
            loader_paths("libnvidia-ml.so.1", &cache, None),
            [PathBuf::from("/usr/lib64/libnvidia-ml.so.1")]
        );
        assert!(loader_paths("libnope.so.1", &cache, None).is_empty());
    }

    #[test]
    fn version_parsing() {
        assert_eq!(
            parse_proc_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Fri Jun 13 2025\n"
            )
            .as_deref(),
            Some("535.261.03")
        );
        assert_eq!(parse_proc_version("garbage\n"), None);
        assert_eq!(
            version_from_file_name("libcuda.so.580.159.04", "libcuda.so.1").as_deref(),
            Some("580.159.04")
        );
        assert_eq!(version_from_file_name("libcuda.so.1", "libcuda.so.1"), None);
        assert_eq!(
            version_from_file_name("libnvidia-ml.so.535.261.03", "libnvidia-ml.so.1").as_deref(),
            Some("535.261.03")
        );
        assert_eq!(
            version_from_file_name("libcuda.so.5x.1", "libcuda.so.1"),
            None
        );
    }
}
