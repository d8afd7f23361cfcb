//! Assembling the driver folder the shims forward to, one folder per driver version
//! under DEST ([`crate::versions`]: `DEST/current` names the one in use):
//!
//! ```text
//! DEST/580.159.04/lib64/libcuda.so.580.159.04          real file, copied
//! DEST/580.159.04/lib64/libcuda.so.1 -> libcuda.so.580.159.04
//! DEST/580.159.04/lib64/libcuda.so   -> libcuda.so.1   (same for NVML and the others)
//! DEST/580.159.04/bin/nvidia-smi                       real tools, when found
//! DEST/580.159.04/shim/libcuda_shim.so                 the checked shims
//! DEST/580.159.04/shim/libnvml_shim.so
//! DEST/580.159.04/driver.json                          manifest: version, files, sha256
//! DEST/current -> 580.159.04
//! ```
//!
//! Before anything is written, each shim is checked against the real library it
//! replaces: a shim that lacks an export of the host driver is refused (an application
//! resolving that name would fail with "function not found"), unless the caller allows
//! it. Each shim is judged on its own API's names ([`ShimSpec::judged`]). The step is idempotent (unchanged files are not rewritten; a copy whose size and
//! modification time match the manifest's record is trusted without rehashing unless
//! `verify`). Another driver version gets a folder of its own and `current` is switched
//! once that folder is complete, so a host driver upgrade replaces the prepared driver
//! at the next start while containers keep the folder they mounted; the previous
//! version is kept, older ones are removed. Files are written to a temporary name and
//! renamed into place, so a container never sees a half-copied library.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::check::CheckReport;
use crate::discover::{HostDriver, is_version};
use crate::exports::{ExportError, defined_functions};
use crate::sha256::file_digest_hex;
use crate::versions;

/// Subfolder of the real libraries.
pub const LIB_SUBDIR: &str = "lib64";
/// Subfolder of the real tools.
pub const BIN_SUBDIR: &str = "bin";
/// Subfolder of the shims.
pub const SHIM_SUBDIR: &str = "shim";
/// The manifest's file name.
pub const MANIFEST_FILE: &str = "driver.json";
/// Manifest schema version.
pub const MANIFEST_SCHEMA: u32 = 1;

/// A shim and the real library it replaces.
#[derive(Debug, Clone, Copy)]
pub struct ShimSpec {
    /// SONAME of the real library (`libcuda.so.1`).
    pub real_soname: &'static str,
    /// The shim's file name as built and as deployed under `DEST/shim`.
    pub file_name: &'static str,
    /// The prefix of the other library's API. A real libcuda exports `cu*` names only
    /// and a real libnvidia-ml `nvml*` only (symbols/); a library in both places (the
    /// simulated driver) exports both, and the other API's names are not this shim's
    /// to cover ([`ShimSpec::judged`]).
    pub other_api_prefix: &'static str,
}

impl ShimSpec {
    /// The real library's exports this shim must cover: all but the other API's.
    pub fn judged(&self, real_exports: BTreeSet<String>) -> BTreeSet<String> {
        real_exports
            .into_iter()
            .filter(|name| !name.starts_with(self.other_api_prefix))
            .collect()
    }
}

/// The shims `prepare` deploys. In the shim folder each is looked up by its built name
/// (`libcuda_shim.so`), then by the real SONAME (`libcuda.so.1`).
pub const SHIMS: &[ShimSpec] = &[
    ShimSpec {
        real_soname: "libcuda.so.1",
        file_name: "libcuda_shim.so",
        other_api_prefix: "nvml",
    },
    ShimSpec {
        real_soname: "libnvidia-ml.so.1",
        file_name: "libnvml_shim.so",
        other_api_prefix: "cu",
    },
];

/// Why the folder was not prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// No real `libcuda.so.1` was discovered.
    #[error(
        "no real libcuda.so.1 found on this host (looked in the loader cache and the extra folders)"
    )]
    NoLibcuda,
    /// The driver version could not be told.
    #[error(
        "cannot tell the driver version: no /proc/driver/nvidia/version and no versioned libcuda/libnvidia-ml file name"
    )]
    NoVersion,
    /// A shim for a discovered real library is not in the shim folder.
    #[error("shim for {real_soname} not found: looked for {looked_for}")]
    MissingShim {
        /// The real library.
        real_soname: String,
        /// Paths tried.
        looked_for: String,
    },
    /// A shim lacks exports of the real library.
    #[error("{}", shim_lacks_summary(.0))]
    ShimLacksExports(Vec<CheckReport>),
    /// The existing manifest is unreadable.
    #[error("existing manifest {path} is corrupt ({reason}); pass --force to replace it")]
    BadManifest {
        /// The manifest.
        path: PathBuf,
        /// The parse error.
        reason: String,
    },
    /// Reading exports failed.
    #[error(transparent)]
    Exports(#[from] ExportError),
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn shim_lacks_summary(reports: &[CheckReport]) -> String {
    let lines: Vec<String> = reports
        .iter()
        .map(|report| {
            format!(
                "{} lacks {} of the {} exports of {}",
                report.shim,
                report.missing.len(),
                report.real_count,
                report.real
            )
        })
        .collect();
    format!("refusing to deploy: {}", lines.join("; "))
}

/// What an operator does about shims that lack exports of the host driver.
pub const MISSING_EXPORTS_FIX: &str = "fix: use a vgpu-shim image built for this driver (add its export lists with `symbols/add-driver.sh LIBCUDA LIBNVML` and rebuild), or pass --allow-missing-exports to deploy anyway (programs that look a missing name up directly will not find it)";

impl PrepareError {
    /// The error as lines for an operator: one line for most errors; for shims that
    /// lack exports the summary, one line per missing name, and the fix.
    pub fn lines(&self) -> Vec<String> {
        match self {
            PrepareError::ShimLacksExports(reports) => {
                let mut lines = vec![self.to_string()];
                for report in reports {
                    for name in &report.missing {
                        lines.push(format!("missing in {}: {name}", report.shim));
                    }
                }
                lines.push(MISSING_EXPORTS_FIX.to_string());
                lines
            }
            other => vec![other.to_string()],
        }
    }
}

/// What to prepare.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// The driver folder to fill (e.g. `/var/lib/vgpu/driver`).
    pub dest: PathBuf,
    /// Folder holding the built shims (`libcuda_shim.so`, `libnvml_shim.so`).
    pub shim_dir: PathBuf,
    /// What discovery found.
    pub driver: HostDriver,
    /// Rebuild a version folder whose manifest is corrupt.
    pub force: bool,
    /// Deploy shims that lack exports of the real libraries (the check is still run and
    /// reported in [`PrepareOutcome::checks`]).
    pub allow_missing_exports: bool,
    /// Version folders kept besides the current one (the previous current first).
    pub keep_previous: usize,
    /// Hash every source and copy even when size and modification time say a copy is
    /// current (the default trusts them, as make and rsync do).
    pub verify: bool,
}

/// One copied file in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Path relative to the folder (`lib64/libcuda.so.580.159.04`).
    pub path: String,
    /// Where it was copied from.
    pub source: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Lower-case hex SHA-256.
    pub sha256: String,
    /// The source's modification time (ns since the epoch) when it was hashed.
    #[serde(default)]
    pub source_mtime_ns: u128,
    /// The copy's modification time (ns since the epoch) after it was written.
    #[serde(default)]
    pub mtime_ns: u128,
}

/// One symlink in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestLink {
    /// Path relative to the folder (`lib64/libcuda.so.1`).
    pub path: String,
    /// The link's target, relative to its folder (`libcuda.so.580.159.04`).
    pub target: String,
}

/// `DEST/driver.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_SCHEMA`].
    pub schema: u32,
    /// The driver version.
    pub version: String,
    /// Copied files, in deployment order.
    pub files: Vec<ManifestFile>,
    /// Symlinks created.
    pub links: Vec<ManifestLink>,
}

impl Manifest {
    /// Reads `DEST/driver.json`; `Ok(None)` when there is none.
    pub fn read(dest: &Path) -> Result<Option<Manifest>, PrepareError> {
        let path = dest.join(MANIFEST_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(PrepareError::Io {
                    action: "cannot read",
                    path,
                    source,
                });
            }
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| PrepareError::BadManifest {
                path,
                reason: error.to_string(),
            })
    }
}

/// Version folders kept besides the current one unless told otherwise.
pub const DEFAULT_KEEP_PREVIOUS: usize = 1;

/// What `prepare` did.
#[derive(Debug, Clone, Serialize)]
pub struct PrepareOutcome {
    /// The manifest now in the version folder.
    pub manifest: Manifest,
    /// The version folder (`DEST/<version>`), which `DEST/current` now names.
    pub version_dir: PathBuf,
    /// The version `DEST/current` named before, when it was another one.
    pub replaced: Option<String>,
    /// Version folders removed this run.
    pub pruned: Vec<String>,
    /// Paths (relative to the version folder) written or re-linked this run; empty when
    /// nothing changed.
    pub changed: Vec<String>,
    /// Paths (relative) of an earlier preparation of this version removed this run.
    pub removed: Vec<String>,
    /// The export checks (all complete, unless missing exports were allowed).
    pub checks: Vec<CheckReport>,
}

/// Checks the shims, then fills `options.dest`.
pub fn prepare(options: &PrepareOptions) -> Result<PrepareOutcome, PrepareError> {
    let driver = &options.driver;
    if driver.library("libcuda.so.1").is_none() {
        return Err(PrepareError::NoLibcuda);
    }
    let version = driver.version.clone().ok_or(PrepareError::NoVersion)?;

    let mut checks = Vec::new();
    let mut shims = Vec::new();
    for spec in SHIMS {
        let Some(real) = driver.library(spec.real_soname) else {
            continue;
        };
        let candidates = [
            options.shim_dir.join(spec.file_name),
            options.shim_dir.join(spec.real_soname),
        ];
        let Some(shim_path) = candidates.iter().find(|path| path.is_file()) else {
            let looked_for = candidates
                .iter()
                .map(|path| path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(PrepareError::MissingShim {
                real_soname: spec.real_soname.to_string(),
                looked_for,
            });
        };
        let report = CheckReport::compare(
            real.real_path.display().to_string(),
            &spec.judged(defined_functions(&real.real_path)?),
            shim_path.display().to_string(),
            &defined_functions(shim_path)?,
        );
        checks.push(report);
        shims.push((spec, shim_path.clone()));
    }
    let failed: Vec<CheckReport> = checks
        .iter()
        .filter(|report| !report.is_complete())
        .cloned()
        .collect();
    if !failed.is_empty() && !options.allow_missing_exports {
        return Err(PrepareError::ShimLacksExports(failed));
    }
    if !is_version(&version) {
        return Err(PrepareError::NoVersion);
    }

    let base = &options.dest;
    let dest = &base.join(&version);
    let previous = match Manifest::read(dest) {
        Ok(previous) => previous,
        Err(PrepareError::BadManifest { .. }) if options.force => None,
        Err(error) => return Err(error),
    };

    // Plan: (relative destination, source) for files; (relative link, target) for links.
    let mut file_plan: Vec<(String, PathBuf)> = Vec::new();
    let mut link_plan: Vec<ManifestLink> = Vec::new();
    for library in &driver.libraries {
        file_plan.push((
            format!("{LIB_SUBDIR}/{}", library.file_name),
            library.real_path.clone(),
        ));
        if library.soname != library.file_name {
            link_plan.push(ManifestLink {
                path: format!("{LIB_SUBDIR}/{}", library.soname),
                target: library.file_name.clone(),
            });
        }
        if let Some(at) = library.soname.find(".so") {
            let dev_name = &library.soname[..at + 3];
            if dev_name != library.soname && dev_name != library.file_name {
                link_plan.push(ManifestLink {
                    path: format!("{LIB_SUBDIR}/{dev_name}"),
                    target: library.soname.clone(),
                });
            }
        }
    }
    for (tool, path) in &driver.tools {
        file_plan.push((format!("{BIN_SUBDIR}/{tool}"), path.clone()));
    }
    for (spec, path) in &shims {
        file_plan.push((format!("{SHIM_SUBDIR}/{}", spec.file_name), path.clone()));
    }

    for subdir in [LIB_SUBDIR, BIN_SUBDIR, SHIM_SUBDIR] {
        let path = dest.join(subdir);
        std::fs::create_dir_all(&path).map_err(|source| PrepareError::Io {
            action: "cannot create",
            path,
            source,
        })?;
    }

    let mut changed = Vec::new();
    let mut files = Vec::new();
    for (relative, source) in file_plan {
        let target = dest.join(&relative);
        let source_meta =
            std::fs::metadata(&source).map_err(|error| io("cannot stat", &source, error))?;
        let (size, source_mtime_ns) = (source_meta.len(), mtime_ns(&source_meta));
        let target_meta = std::fs::symlink_metadata(&target)
            .ok()
            .filter(|meta| meta.is_file());
        // Fast path: the previous run recorded this very source and copy, and neither
        // changed size or modification time since.
        let recorded = previous
            .as_ref()
            .and_then(|manifest| manifest.files.iter().find(|file| file.path == relative))
            .filter(|file| {
                !options.verify
                    && file.source == source
                    && file.size == size
                    && file.source_mtime_ns == source_mtime_ns
                    && target_meta
                        .as_ref()
                        .is_some_and(|meta| meta.len() == size && mtime_ns(meta) == file.mtime_ns)
            });
        if let Some(file) = recorded {
            files.push(file.clone());
            continue;
        }
        let sha256 = digest(&source)?;
        let same = target_meta.as_ref().is_some_and(|meta| meta.len() == size)
            && digest(&target).is_ok_and(|existing| existing == sha256);
        if !same {
            copy_atomically(&source, &target)?;
            changed.push(relative.clone());
        }
        let copy_meta =
            std::fs::metadata(&target).map_err(|error| io("cannot stat", &target, error))?;
        files.push(ManifestFile {
            path: relative,
            source,
            size,
            sha256,
            source_mtime_ns,
            mtime_ns: mtime_ns(&copy_meta),
        });
    }
    for link in &link_plan {
        let path = dest.join(&link.path);
        let current = std::fs::read_link(&path).ok();
        if current.as_deref() != Some(Path::new(&link.target)) {
            link_atomically(&link.target, &path)?;
            changed.push(link.path.clone());
        }
    }

    let manifest = Manifest {
        schema: MANIFEST_SCHEMA,
        version,
        files,
        links: link_plan,
    };
    let mut removed = Vec::new();
    if let Some(previous) = &previous {
        let kept = |relative: &str| {
            manifest.files.iter().any(|file| file.path == relative)
                || manifest.links.iter().any(|link| link.path == relative)
        };
        let stale = previous
            .files
            .iter()
            .map(|file| &file.path)
            .chain(previous.links.iter().map(|link| &link.path));
        for relative in stale.filter(|relative| !kept(relative)) {
            if !is_inside(relative) {
                continue;
            }
            let path = dest.join(relative);
            match std::fs::remove_file(&path) {
                Ok(()) => removed.push(relative.clone()),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(io("cannot remove", &path, error)),
            }
        }
    }
    if previous.as_ref() != Some(&manifest) {
        let text = serde_json::to_string_pretty(&manifest).map_err(|error| {
            io(
                "cannot encode",
                &dest.join(MANIFEST_FILE),
                std::io::Error::other(error),
            )
        })?;
        write_atomically(&dest.join(MANIFEST_FILE), format!("{text}\n").as_bytes())?;
        changed.push(MANIFEST_FILE.to_string());
    }
    // The version folder is complete: switch to it, then drop what is no longer needed.
    let before = versions::switch_current(base, &manifest.version)
        .map_err(|error| io("cannot switch", &base.join(versions::CURRENT_LINK), error))?;
    let replaced = before.filter(|before| *before != manifest.version);
    let pruned = versions::prune(base, replaced.as_deref(), options.keep_previous)
        .map_err(|error| io("cannot remove an old version in", base, error))?;
    Ok(PrepareOutcome {
        manifest,
        version_dir: dest.clone(),
        replaced,
        pruned,
        changed,
        removed,
        checks,
    })
}

/// A manifest path is only acted on when it is a plain relative path below the folder.
fn is_inside(relative: &str) -> bool {
    let path = Path::new(relative);
    path.is_relative()
        && path
            .components()
            .all(|component| matches!(component, std::path::Component::Normal(_)))
}

fn io(action: &'static str, path: &Path, source: std::io::Error) -> PrepareError {
    PrepareError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn mtime_ns(meta: &std::fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |since| since.as_nanos())
}

fn digest(path: &Path) -> Result<String, PrepareError> {
    file_digest_hex(path).map_err(|error| io("cannot read", path, error))
}

fn temporary_sibling(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.vgpu-tmp-{}", std::process::id()))
}

fn copy_atomically(source: &Path, target: &Path) -> Result<(), PrepareError> {
    let temporary = temporary_sibling(target);
    let _ = std::fs::remove_file(&temporary);
    std::fs::copy(source, &temporary).map_err(|error| io("cannot copy to", &temporary, error))?;
    std::fs::rename(&temporary, target).map_err(|error| io("cannot rename into", target, error))
}

fn link_atomically(link_target: &str, path: &Path) -> Result<(), PrepareError> {
    let temporary = temporary_sibling(path);
    let _ = std::fs::remove_file(&temporary);
    std::os::unix::fs::symlink(link_target, &temporary)
        .map_err(|error| io("cannot create link", &temporary, error))?;
    std::fs::rename(&temporary, path).map_err(|error| io("cannot rename into", path, error))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), PrepareError> {
    let temporary = temporary_sibling(path);
    std::fs::write(&temporary, bytes).map_err(|error| io("cannot write", &temporary, error))?;
    std::fs::rename(&temporary, path).map_err(|error| io("cannot rename into", path, error))
}

#[cfg(test)]
mod judged_tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn a_library_of_both_apis_is_judged_on_each_shims_own_names() {
        // The simulated driver: one library in both places, exporting both APIs.
        let both = names(&["cuInit", "cuMemAlloc_v2", "nvmlInit_v2", "nvmlShutdown"]);
        let cuda = &SHIMS[0];
        let nvml = &SHIMS[1];
        assert_eq!(
            cuda.judged(both.clone()),
            names(&["cuInit", "cuMemAlloc_v2"])
        );
        assert_eq!(nvml.judged(both), names(&["nvmlInit_v2", "nvmlShutdown"]));
        // A real library's own names are all judged, even those of no known prefix.
        let odd = names(&["cuInit", "somethingNew"]);
        assert_eq!(cuda.judged(odd.clone()), odd);
        let check = CheckReport::compare(
            "real",
            &nvml.judged(names(&["nvmlInit_v2", "nvmlNew"])),
            "shim",
            &names(&["nvmlInit_v2"]),
        );
        assert_eq!(check.missing, ["nvmlNew"]);
    }
}
