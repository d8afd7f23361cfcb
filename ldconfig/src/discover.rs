//! Finding the host's real NVIDIA user-space driver: its libraries, its tools
//! (`nvidia-smi`, ...) and its version. Also [`loader_paths`], every path at which the
//! dynamic loader could pick up a library, which is where `vgpu run` mounts the shims.
//!
//! The host's file system may be this process's own (`/`) or a folder (`/host` in the
//! init container); every path the host itself holds (loader cache entries, links,
//! `--extra-dir` folders) is read inside that root ([`crate::root::Root`]). The driver
//! itself may live in a root of its own inside the host: the GPU Operator's driver
//! container puts one at `/run/nvidia/driver`. Driver roots are tried in order and the
//! first that holds a `libcuda.so.1` wins. Inside a driver root, libraries are looked
//! for in the extra folders, then the root's loader cache (`/etc/ld.so.cache`), then
//! the well-known folders (`/usr/local/nvidia/lib64` and the distributions' library
//! folders); of several candidates for one SONAME the first whose file-name version is
//! the loaded kernel module's is taken, else the first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cache::{CacheEntry, CacheError, read_cache};
use crate::root::Root;

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
/// Where the kernel module reports its version (global: every PID namespace's `/proc`
/// shows it).
pub const PROC_DRIVER_VERSION: &str = "/proc/driver/nvidia/version";
/// The GPU Operator's driver root on the host.
pub const GPU_OPERATOR_DRIVER_ROOT: &str = "/run/nvidia/driver";
/// The loader cache inside a root.
pub const ROOT_CACHE: &str = "/etc/ld.so.cache";
/// Library folders searched inside a driver root after its loader cache: the
/// `/usr/local/nvidia` layout (GKE, gpu-manager, NVIDIA's CUDA images), Debian's and
/// Ubuntu's multiarch folders (Debian's driver lives in `nvidia/current`), the
/// RHEL-style folders.
pub const DEFAULT_LIBRARY_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
];
/// Tool folders searched inside a driver root (after this process's `PATH` when the
/// host root is `/`). Debian's `nvidia-smi` lives in `/usr/lib/nvidia/current`.
pub const DEFAULT_TOOL_DIRS: &[&str] = &[
    "/usr/local/nvidia/bin",
    "/usr/bin",
    "/usr/sbin",
    "/bin",
    "/usr/lib/nvidia/current",
];

/// Why discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// The loader cache named explicitly could not be read.
    #[error(transparent)]
    Cache(#[from] CacheError),
}

/// Which loader cache a driver root's libraries are looked up in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CacheSource {
    /// None.
    #[default]
    None,
    /// The root's own `/etc/ld.so.cache` when it has one (a corrupt one is noted in
    /// [`HostDriver::skipped`], not an error).
    Auto,
    /// This file (a path of this process), for every driver root; unreadable is an error.
    File(PathBuf),
    /// These entries (paths of the driver root).
    Entries(Vec<CacheEntry>),
}

/// Where discovery looks. `Default` looks nowhere automatic: only what is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverOptions {
    /// The folder at which this process sees the host's `/` (`/host` in the init
    /// container).
    pub host_root: PathBuf,
    /// Driver roots, host paths, tried in order; missing ones are skipped.
    pub driver_roots: Vec<PathBuf>,
    /// The loader cache.
    pub cache: CacheSource,
    /// Library folders searched first, paths of the driver root, in order (e.g.
    /// `--extra-dir`, then this process's `LD_LIBRARY_PATH` on its own host).
    pub extra_dirs: Vec<PathBuf>,
    /// Library folders searched after the cache, paths of the driver root.
    pub library_dirs: Vec<PathBuf>,
    /// Tool folders, paths of the driver root, in order.
    pub tool_dirs: Vec<PathBuf>,
    /// The kernel module's version file (a path of this process); `None` skips it.
    pub proc_version: Option<PathBuf>,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            host_root: PathBuf::from("/"),
            driver_roots: vec![PathBuf::from("/")],
            cache: CacheSource::None,
            extra_dirs: Vec::new(),
            library_dirs: Vec::new(),
            tool_dirs: Vec::new(),
            proc_version: None,
        }
    }
}

impl DiscoverOptions {
    /// Everything automatic, for the host whose `/` this process sees at `host_root`:
    /// driver roots [`GPU_OPERATOR_DRIVER_ROOT`] then `/`; each root's own loader
    /// cache; [`DEFAULT_LIBRARY_DIRS`] and [`DEFAULT_TOOL_DIRS`]; the version from
    /// [`PROC_DRIVER_VERSION`]. On this process's own host (`host_root` is `/`) its
    /// `LD_LIBRARY_PATH` folders come first among the libraries and its `PATH` among
    /// the tools; a mounted host's environment is not ours to know.
    pub fn host(host_root: &Path) -> Self {
        let own = Root::new(host_root).is_own();
        let from_env = |name: &str| -> Vec<PathBuf> {
            if !own {
                return Vec::new();
            }
            std::env::var(name)
                .map(|list| split_path_list(&list))
                .unwrap_or_default()
        };
        let mut tool_dirs = from_env("PATH");
        tool_dirs.extend(DEFAULT_TOOL_DIRS.iter().map(PathBuf::from));
        DiscoverOptions {
            host_root: host_root.to_path_buf(),
            driver_roots: vec![PathBuf::from(GPU_OPERATOR_DRIVER_ROOT), PathBuf::from("/")],
            cache: CacheSource::Auto,
            extra_dirs: from_env("LD_LIBRARY_PATH"),
            library_dirs: DEFAULT_LIBRARY_DIRS.iter().map(PathBuf::from).collect(),
            tool_dirs,
            proc_version: Some(PathBuf::from(PROC_DRIVER_VERSION)),
        }
    }
}

/// One real driver library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverLibrary {
    /// The SONAME it is looked up by (`libcuda.so.1`).
    pub soname: String,
    /// Where the host's loader finds it (cache value or folder entry, often a symlink),
    /// as a path of the driver root.
    pub found_at: PathBuf,
    /// The regular file `found_at` names, every link resolved, as this process opens it.
    pub real_path: PathBuf,
    /// The real file's name (`libcuda.so.580.159.04`).
    pub file_name: String,
}

/// Where the driver version came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VersionSource {
    /// `/proc/driver/nvidia/version` (the loaded kernel module), when the library file
    /// names carry no version.
    KernelModule,
    /// The versioned file name of `libcuda.so.1`.
    LibcudaFileName,
    /// The versioned file name of `libnvidia-ml.so.1`.
    NvmlFileName,
}

/// Everything found on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostDriver {
    /// The driver version (`580.159.04`), when it could be told: the version the
    /// libraries' file names carry, else the kernel module's.
    pub version: Option<String>,
    /// Where `version` came from.
    pub version_source: Option<VersionSource>,
    /// The loaded kernel module's version, when known.
    pub kernel_version: Option<String>,
    /// The driver root the libraries came from, as a host path (`/`,
    /// `/run/nvidia/driver`).
    pub driver_root: PathBuf,
    /// The loader cache that was read, as this process opened it.
    pub cache_file: Option<PathBuf>,
    /// The libraries found, in [`DRIVER_SONAMES`] order then versioned ones.
    pub libraries: Vec<DriverLibrary>,
    /// Tools found (regular files, links resolved, as this process opens them), by name.
    pub tools: BTreeMap<String, PathBuf>,
    /// Candidates that were passed over (dangling links, other versions, ...), one
    /// line each.
    pub skipped: Vec<String>,
    /// What looks wrong but did not stop discovery, one line each.
    pub warnings: Vec<String>,
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
    let host = Root::new(&options.host_root);
    let kernel_version = options
        .proc_version
        .as_deref()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| parse_proc_version(&text));
    let mut passed_over: Vec<String> = Vec::new();
    let mut fallback: Option<HostDriver> = None;
    for inner in &options.driver_roots {
        let root = host.join(inner);
        if !root.dir().is_dir() {
            continue;
        }
        let mut found = discover_in(&root, inner, options, kernel_version.as_deref())?;
        if found.library("libcuda.so.1").is_some() {
            found.skipped.splice(0..0, passed_over);
            return Ok(found);
        }
        passed_over.push(format!(
            "driver root {}: no libcuda.so.1",
            root.dir().display()
        ));
        fallback.get_or_insert(found);
    }
    let mut driver = fallback.unwrap_or_default();
    driver.kernel_version = kernel_version;
    driver.skipped.extend(passed_over);
    Ok(driver)
}

/// Discovery inside one driver root (`inner` is its host path).
fn discover_in(
    root: &Root,
    inner: &Path,
    options: &DiscoverOptions,
    kernel_version: Option<&str>,
) -> Result<HostDriver, DiscoverError> {
    let mut driver = HostDriver {
        driver_root: inner.to_path_buf(),
        kernel_version: kernel_version.map(str::to_string),
        ..HostDriver::default()
    };
    let cache = match &options.cache {
        CacheSource::None => Vec::new(),
        CacheSource::Entries(entries) => entries.clone(),
        CacheSource::File(path) => {
            driver.cache_file = Some(path.clone());
            read_cache(path)?
        }
        CacheSource::Auto => {
            let path = root.outer(Path::new(ROOT_CACHE));
            if path.exists() {
                match read_cache(&path) {
                    Ok(entries) => {
                        driver.cache_file = Some(path);
                        entries
                    }
                    Err(error) => {
                        driver.skipped.push(error.to_string());
                        Vec::new()
                    }
                }
            } else {
                Vec::new()
            }
        }
    };

    // Candidates in search order: extra folders, the cache, the well-known folders
    // (only the extra folders, which someone named, are reported when unreadable).
    let (mut candidates, unreadable) = folder_candidates(root, &options.extra_dirs);
    driver.skipped.extend(
        unreadable
            .iter()
            .map(|dir| format!("{}: not a readable folder", dir.display())),
    );
    candidates.extend(
        cache
            .iter()
            .filter(|entry| entry.is_x86_64 && !entry.is_hwcaps_subdir())
            .filter(|entry| is_wanted_soname(&entry.name))
            .map(|entry| (entry.name.clone(), entry.path.clone())),
    );
    candidates.extend(folder_candidates(root, &options.library_dirs).0);

    // Per SONAME: every candidate resolved once, in order; the kernel's version wins.
    let mut by_soname: Vec<(String, Vec<DriverLibrary>)> = Vec::new();
    let mut seen: Vec<(String, PathBuf)> = Vec::new();
    for (soname, path) in candidates {
        if seen.iter().any(|(name, at)| *name == soname && *at == path) {
            continue;
        }
        seen.push((soname.clone(), path.clone()));
        let library = match root.resolve_file(&path) {
            Ok(resolved) => DriverLibrary {
                file_name: resolved
                    .inner
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                soname: soname.clone(),
                found_at: path,
                real_path: resolved.outer,
            },
            Err(reason) => {
                driver.skipped.push(format!("{}: {reason}", path.display()));
                continue;
            }
        };
        match by_soname.iter_mut().find(|(name, _)| *name == soname) {
            Some((_, found)) => found.push(library),
            None => by_soname.push((soname, vec![library])),
        }
    }
    for (soname, found) in by_soname {
        let matches_kernel = |library: &DriverLibrary| {
            kernel_version.is_some()
                && version_from_file_name(&library.file_name, &library.soname).as_deref()
                    == kernel_version
        };
        let chosen = found.iter().position(matches_kernel).unwrap_or(0);
        for (index, other) in found.iter().enumerate() {
            if index != chosen && other.real_path != found[chosen].real_path {
                driver.skipped.push(format!(
                    "{}: another {soname} ({}), not taken",
                    other.found_at.display(),
                    other.file_name
                ));
            }
        }
        driver.libraries.push(found[chosen].clone());
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
            if let Ok(resolved) = root.resolve_file(&dir.join(tool)) {
                driver.tools.insert(tool.to_string(), resolved.outer);
                break;
            }
        }
    }

    let from_file = |soname: &str| {
        driver
            .library(soname)
            .and_then(|library| version_from_file_name(&library.file_name, soname))
    };
    (driver.version, driver.version_source) = if let Some(version) = from_file("libcuda.so.1") {
        (Some(version), Some(VersionSource::LibcudaFileName))
    } else if let Some(version) = from_file("libnvidia-ml.so.1") {
        (Some(version), Some(VersionSource::NvmlFileName))
    } else if let Some(version) = kernel_version {
        (Some(version.to_string()), Some(VersionSource::KernelModule))
    } else {
        (None, None)
    };
    if let (Some(kernel), Some(version)) = (kernel_version, &driver.version)
        && kernel != version
    {
        driver.warnings.push(format!(
            "the loaded kernel module is driver {kernel} but the libraries found are {version}: \
             CUDA will fail with \"driver/library version mismatch\" until they agree (reboot, or reinstall the driver)"
        ));
    }
    Ok(driver)
}

/// The wanted libraries in `dirs` (paths of `root`), as (SONAME, path) in folder order
/// and name order within a folder; and the folders that could not be read.
fn folder_candidates(root: &Root, dirs: &[PathBuf]) -> (Vec<(String, PathBuf)>, Vec<PathBuf>) {
    let mut found = Vec::new();
    let mut unreadable = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(root.outer(dir)) else {
            unreadable.push(dir.clone());
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| is_wanted_soname(name))
            .collect();
        names.sort();
        found.extend(names.into_iter().map(|name| (name.clone(), dir.join(name))));
    }
    (found, unreadable)
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
pub(crate) fn is_version(word: &str) -> bool {
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
            cache: CacheSource::Entries(cache),
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

    const KERNEL_580: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16-I2-C03-12-4)  Thu Oct 9 2025\nGCC version:  gcc version 12.2.0\n";

    #[test]
    fn extra_dirs_win_over_cache_unless_the_kernel_module_says_otherwise() {
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
        let mut options = DiscoverOptions {
            extra_dirs: vec![
                PathBuf::from("/nonexistent-dir"),
                first.path().to_path_buf(),
            ],
            cache: CacheSource::Entries(cache),
            ..DiscoverOptions::default()
        };
        // No kernel module: the first candidate, the extra folder's.
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
        assert_eq!(driver.version.as_deref(), Some("535.261.03"));
        assert!(
            driver
                .skipped
                .iter()
                .any(|line| line.contains("/nonexistent-dir"))
        );
        assert!(
            driver
                .skipped
                .iter()
                .any(|line| line.contains("libcuda.so.580.159.04") && line.contains("not taken")),
            "{:?}",
            driver.skipped
        );
        assert!(driver.warnings.is_empty());

        // The loaded kernel module is 580: its libraries win wherever they are.
        let proc_version = first.path().join("version");
        std::fs::write(&proc_version, KERNEL_580).unwrap();
        options.proc_version = Some(proc_version);
        let driver = discover(&options).unwrap();
        assert_eq!(
            driver.library("libcuda.so.1").unwrap().file_name,
            "libcuda.so.580.159.04"
        );
        assert_eq!(driver.version.as_deref(), Some("580.159.04"));
        assert_eq!(driver.version_source, Some(VersionSource::LibcudaFileName));
        assert_eq!(driver.kernel_version.as_deref(), Some("580.159.04"));
        assert!(driver.warnings.is_empty(), "{:?}", driver.warnings);

        // Only 535 libraries under a 580 module: found, named by their own version, and
        // the mismatch is said.
        options.cache = CacheSource::None;
        let driver = discover(&options).unwrap();
        assert_eq!(driver.version.as_deref(), Some("535.261.03"));
        assert_eq!(driver.warnings.len(), 1);
        assert!(
            driver.warnings[0].contains("kernel module is driver 580.159.04"),
            "{:?}",
            driver.warnings
        );
    }

    #[test]
    fn unversioned_files_take_the_kernel_version() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libcuda.so.1"), "x").unwrap();
        let proc_version = dir.path().join("version");
        std::fs::write(&proc_version, KERNEL_580).unwrap();
        let driver = discover(&DiscoverOptions {
            extra_dirs: vec![dir.path().to_path_buf()],
            proc_version: Some(proc_version),
            ..DiscoverOptions::default()
        })
        .unwrap();
        assert_eq!(driver.version.as_deref(), Some("580.159.04"));
        assert_eq!(driver.version_source, Some(VersionSource::KernelModule));
    }

    #[test]
    fn the_gpu_operator_driver_root_is_found_inside_a_mounted_host() {
        let host = tempfile::tempdir().unwrap();
        let driver_root = host.path().join("run/nvidia/driver");
        let lib_dir = driver_root.join("usr/lib/x86_64-linux-gnu");
        let bin_dir = driver_root.join("usr/bin");
        std::fs::create_dir_all(&lib_dir).unwrap();
        std::fs::create_dir_all(&bin_dir).unwrap();
        fake_install(&lib_dir, "580.159.04");
        std::fs::write(bin_dir.join("nvidia-smi"), "smi").unwrap();
        // The host's own folders hold an older driver: the operator's root goes first.
        let host_lib = host.path().join("usr/lib64");
        std::fs::create_dir_all(&host_lib).unwrap();
        fake_install(&host_lib, "535.261.03");
        let mut options = DiscoverOptions::host(host.path());
        options.proc_version = None;
        let driver = discover(&options).unwrap();
        assert_eq!(driver.driver_root, Path::new(GPU_OPERATOR_DRIVER_ROOT));
        let cuda = driver.library("libcuda.so.1").unwrap();
        assert_eq!(
            cuda.found_at,
            Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        );
        assert_eq!(cuda.real_path, lib_dir.join("libcuda.so.580.159.04"));
        assert_eq!(driver.tools["nvidia-smi"], bin_dir.join("nvidia-smi"));
        assert_eq!(driver.version.as_deref(), Some("580.159.04"));

        // Without it, the host's own /usr/lib64 (a well-known folder, no cache).
        std::fs::remove_dir_all(host.path().join("run")).unwrap();
        let driver = discover(&options).unwrap();
        assert_eq!(driver.driver_root, Path::new("/"));
        assert_eq!(driver.version.as_deref(), Some("535.261.03"));
        assert_eq!(
            driver.library("libcuda.so.1").unwrap().found_at,
            Path::new("/usr/lib64/libcuda.so.1")
        );
        assert!(driver.tools.is_empty());
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
