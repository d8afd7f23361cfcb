//! `vgpu-ldconfig`: the command-line face of `vgpu_ldconfig`.
//!
//! * `check --real LIB|--real-list FILE --shim LIB`: exports the shim lacks, exit 1 if any;
//! * `exports LIB [--soname]`: a library's defined dynamic symbols (symbols/*.txt format);
//! * `scan [SOURCE] [--json]`: the host driver found;
//! * `prepare --dest DIR --shim-dir DIR [SOURCE] [--allow-missing-exports] [--keep-previous N] [--force] [--verify]`;
//! * `layout [--host-driver-dir DIR] [--json]`: the container mounts and env.
//!
//! SOURCE is where the driver is looked for: `--host-root DIR` (the host's `/` as this
//! process sees it, `/host` in the init container), `--driver-root DIR` (a host path:
//! the GPU Operator's `/run/nvidia/driver`; by default that when it holds a driver,
//! else `/`), `--cache FILE`, `--extra-dir DIR`..., `--tool-dir DIR`...,
//! `--proc-version FILE`.
//!
//! Errors are one line on stderr and exit status 2 (1 is reserved for "check found
//! missing exports"); a refused deployment prints one line per missing export and the
//! fix.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use vgpu_ldconfig::check::CheckReport;
use vgpu_ldconfig::discover::{
    CacheSource, DiscoverOptions, HostDriver, PROC_DRIVER_VERSION, discover,
};
use vgpu_ldconfig::exports::{defined_functions, read_symbol_list, soname};
use vgpu_ldconfig::layout::LayoutPaths;
use vgpu_ldconfig::prepare::{
    DEFAULT_KEEP_PREVIOUS, PrepareError, PrepareOptions, PrepareOutcome, prepare,
};
use vgpu_ldconfig::versions::{CURRENT_LINK, prepared_dir};

#[derive(Parser)]
#[command(
    name = "vgpu-ldconfig",
    version = vgpu_build_info::VERSION_LINE,
    about = "Host NVIDIA driver discovery, driver folder preparation and the shim export check"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print each export of the real library that the shim lacks; exit 1 if any.
    Check {
        /// The real library (e.g. libcuda.so.580.159.04).
        #[arg(
            long,
            conflicts_with = "real_list",
            required_unless_present = "real_list"
        )]
        real: Option<PathBuf>,
        /// A symbols/*.txt export list instead of a real library.
        #[arg(long)]
        real_list: Option<PathBuf>,
        /// The shim library.
        #[arg(long)]
        shim: PathBuf,
    },
    /// Print the defined dynamic symbols of a library, sorted, one per line (the
    /// format of symbols/*.txt), or its SONAME with --soname.
    Exports {
        /// The library.
        lib: PathBuf,
        /// Print the SONAME instead (empty line when it has none).
        #[arg(long)]
        soname: bool,
    },
    /// Show the real driver libraries, tools and version found on this host.
    Scan {
        #[command(flatten)]
        source: Source,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Fill the driver folder the shims forward to, after checking the shims' exports.
    Prepare {
        /// The driver folder (e.g. /var/lib/vgpu/driver).
        #[arg(long)]
        dest: PathBuf,
        /// Folder with the built shims (libcuda_shim.so, libnvml_shim.so).
        #[arg(long)]
        shim_dir: PathBuf,
        #[command(flatten)]
        source: Source,
        /// Rebuild a version folder whose manifest is corrupt.
        #[arg(long)]
        force: bool,
        /// Deploy even when a shim lacks exports of the host driver (programs that look
        /// a missing name up directly will not find it).
        #[arg(long)]
        allow_missing_exports: bool,
        /// Version folders kept besides the current one (the one in use before first).
        #[arg(long, default_value_t = DEFAULT_KEEP_PREVIOUS)]
        keep_previous: usize,
        /// Rehash every file instead of trusting size and modification time.
        #[arg(long)]
        verify: bool,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the container-side mounts and env.
    Layout {
        /// The prepared driver folder on the host.
        #[arg(long)]
        host_driver_dir: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Where to look for the driver.
#[derive(Args)]
struct Source {
    /// The host's `/` as this process sees it (`/host` when the host is mounted there).
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// The driver's own root, a host path (default: /run/nvidia/driver when it holds a
    /// driver, else /).
    #[arg(long)]
    driver_root: Option<PathBuf>,
    /// The loader cache to read, a path of this process (default: the driver root's
    /// /etc/ld.so.cache, when it has one); its entries are paths of the driver root.
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Library folders searched before the cache, host paths (this process's
    /// LD_LIBRARY_PATH folders follow when the host root is /).
    #[arg(long = "extra-dir")]
    extra_dirs: Vec<PathBuf>,
    /// Tool folders searched first, host paths.
    #[arg(long = "tool-dir")]
    tool_dirs: Vec<PathBuf>,
    /// The kernel module's version file.
    #[arg(long, default_value = PROC_DRIVER_VERSION)]
    proc_version: PathBuf,
}

impl Source {
    fn options(&self) -> DiscoverOptions {
        let mut options = DiscoverOptions::host(&self.host_root);
        if let Some(root) = &self.driver_root {
            options.driver_roots = vec![root.clone()];
        }
        if let Some(cache) = &self.cache {
            options.cache = CacheSource::File(cache.clone());
        }
        options
            .extra_dirs
            .splice(0..0, self.extra_dirs.iter().cloned());
        options
            .tool_dirs
            .splice(0..0, self.tool_dirs.iter().cloned());
        options.proc_version = Some(self.proc_version.clone());
        options
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(error) => {
            // The library's errors already name their cause, so only the top is printed
            // (a refused deployment: one line per missing export, then the fix).
            match error.downcast_ref::<PrepareError>() {
                Some(refused) => {
                    for line in refused.lines() {
                        eprintln!("vgpu-ldconfig: {line}");
                    }
                }
                None => eprintln!("vgpu-ldconfig: {error}"),
            }
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Check {
            real,
            real_list,
            shim,
        } => check(real.as_deref(), real_list.as_deref(), &shim),
        Command::Exports {
            lib,
            soname: want_soname,
        } => {
            if want_soname {
                println!("{}", soname(&lib)?.unwrap_or_default());
            } else {
                for name in defined_functions(&lib)? {
                    println!("{name}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Scan { source, json } => {
            let driver = discover(&source.options())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&driver)?);
            } else {
                print_driver(&driver);
                for line in &driver.skipped {
                    println!("skipped {line}");
                }
                for line in &driver.warnings {
                    println!("warning: {line}");
                }
                if driver.library("libcuda.so.1").is_none() {
                    println!("no libcuda.so.1 found");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Prepare {
            dest,
            shim_dir,
            source,
            force,
            verify,
            json,
            allow_missing_exports,
            keep_previous,
        } => {
            if !json {
                println!("{}", vgpu_build_info::banner("vgpu-ldconfig"));
            }
            let driver = discover(&source.options())?;
            for line in &driver.warnings {
                eprintln!("vgpu-ldconfig: warning: {line}");
            }
            if !json {
                print_driver(&driver);
            }
            let outcome = prepare(&PrepareOptions {
                dest: dest.clone(),
                shim_dir,
                driver,
                force,
                verify,
                allow_missing_exports,
                keep_previous,
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&outcome)?);
            } else {
                print_outcome(&dest, &outcome);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Layout {
            host_driver_dir,
            json,
        } => {
            let mut paths = LayoutPaths::default();
            if let Some(dir) = host_driver_dir {
                paths.host_driver_dir = dir;
            }
            // What a container started now mounts: the version `current` names.
            paths.host_driver_dir = prepared_dir(&paths.host_driver_dir);
            let layout = paths.layout();
            if json {
                println!("{}", serde_json::to_string_pretty(&layout)?);
            } else {
                for mount in &layout.mounts {
                    println!(
                        "mount {} => {}{}",
                        mount.host_path.display(),
                        mount.container_path.display(),
                        if mount.read_only { " (ro)" } else { "" }
                    );
                }
                for (name, value) in &layout.env {
                    println!("env {name}={value}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// What discovery found, for a person.
fn print_driver(driver: &HostDriver) {
    println!(
        "driver version: {} (driver root {})",
        driver.version.as_deref().unwrap_or("unknown"),
        driver.driver_root.display()
    );
    if let Some(source) = driver.version_source {
        println!(
            "version from: {}",
            serde_json::to_value(source)
                .ok()
                .and_then(|value| value.as_str().map(str::to_string))
                .unwrap_or_default()
        );
    }
    if let Some(cache) = &driver.cache_file {
        println!("loader cache: {}", cache.display());
    }
    for library in &driver.libraries {
        println!(
            "library {} => {} ({})",
            library.soname,
            library.found_at.display(),
            library.real_path.display()
        );
    }
    for (tool, path) in &driver.tools {
        println!("tool {tool} => {}", path.display());
    }
}

/// What `prepare` did, for a person; the last line says where `current` points.
fn print_outcome(dest: &Path, outcome: &PrepareOutcome) {
    for report in &outcome.checks {
        if report.is_complete() {
            println!("check: {report}");
        } else {
            println!(
                "check: deploying anyway (--allow-missing-exports): {}",
                report
            );
        }
    }
    for path in &outcome.removed {
        println!("removed {path}");
    }
    for path in &outcome.changed {
        println!("wrote {path}");
    }
    if let Some(replaced) = &outcome.replaced {
        println!("replaced driver {replaced} (kept for containers that still use it)");
    }
    for version in &outcome.pruned {
        println!("removed the folder of driver {version}");
    }
    let state =
        if outcome.changed.is_empty() && outcome.removed.is_empty() && outcome.replaced.is_none() {
            "already up to date"
        } else {
            "prepared"
        };
    println!(
        "{} -> {}: driver {} {state} ({} files, {} links)",
        dest.join(CURRENT_LINK).display(),
        outcome.version_dir.display(),
        outcome.manifest.version,
        outcome.manifest.files.len(),
        outcome.manifest.links.len()
    );
}

fn check(real: Option<&Path>, real_list: Option<&Path>, shim: &Path) -> Result<ExitCode> {
    let (label, real_exports) = match (real, real_list) {
        (Some(real), _) => (real, defined_functions(real)?),
        (None, Some(list)) => (list, read_symbol_list(list)?),
        (None, None) => anyhow::bail!("give --real LIB or --real-list FILE"),
    };
    let shim_exports = defined_functions(shim)?;
    let report = CheckReport::compare(
        label.display().to_string(),
        &real_exports,
        shim.display().to_string(),
        &shim_exports,
    );
    if report.is_complete() {
        println!("{report}");
        Ok(ExitCode::SUCCESS)
    } else {
        for name in &report.missing {
            println!("{name}");
        }
        eprintln!(
            "{} lacks {} of {} exports of {}",
            report.shim,
            report.missing.len(),
            report.real_count,
            report.real
        );
        Ok(ExitCode::from(1))
    }
}
