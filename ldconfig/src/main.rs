//! `vgpu-ldconfig`: the command-line face of `vgpu_ldconfig`.
//!
//! * `check --real LIB|--real-list FILE --shim LIB`: exports the shim lacks, exit 1 if any;
//! * `exports LIB [--soname]`: a library's defined dynamic symbols (symbols/*.txt format);
//! * `scan [--cache PATH] [--extra-dir DIR]... [--json]`: the host driver found;
//! * `prepare --dest DIR --shim-dir DIR [--cache PATH] [--extra-dir DIR]... [--force] [--verify]`;
//! * `layout [--host-driver-dir DIR] [--json]`: the container mounts and env.
//!
//! Errors are one line on stderr and exit status 2 (1 is reserved for "check found
//! missing exports").

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use vgpu_ldconfig::check::CheckReport;
use vgpu_ldconfig::discover::{DiscoverOptions, discover};
use vgpu_ldconfig::exports::{defined_functions, read_symbol_list, soname};
use vgpu_ldconfig::layout::LayoutPaths;
use vgpu_ldconfig::prepare::{PrepareOptions, prepare};

#[derive(Parser)]
#[command(
    name = "vgpu-ldconfig",
    version,
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
        /// Replace a folder prepared for another driver version.
        #[arg(long)]
        force: bool,
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
    /// The loader cache to read.
    #[arg(long, default_value = "/etc/ld.so.cache")]
    cache: PathBuf,
    /// Folders searched before the cache (LD_LIBRARY_PATH folders are added after these).
    #[arg(long = "extra-dir")]
    extra_dirs: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(error) => {
            // The library's errors already name their cause, so only the top is printed.
            eprintln!("vgpu-ldconfig: {error}");
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
            let driver = discover(&DiscoverOptions::host(&source.cache, &source.extra_dirs)?)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&driver)?);
            } else {
                println!(
                    "driver version: {}",
                    driver.version.as_deref().unwrap_or("unknown")
                );
                if let Some(source) = driver.version_source {
                    println!(
                        "version from: {}",
                        serde_json::to_value(source)?.as_str().unwrap_or("?")
                    );
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
                for line in &driver.skipped {
                    println!("skipped {line}");
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
        } => {
            let driver = discover(&DiscoverOptions::host(&source.cache, &source.extra_dirs)?)?;
            let outcome = prepare(&PrepareOptions {
                dest: dest.clone(),
                shim_dir,
                driver,
                force,
                verify,
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&outcome)?);
            } else {
                for report in &outcome.checks {
                    println!("check: {report}");
                }
                for path in &outcome.removed {
                    println!("removed {path}");
                }
                for path in &outcome.changed {
                    println!("wrote {path}");
                }
                let state = if outcome.changed.is_empty() && outcome.removed.is_empty() {
                    "already up to date"
                } else {
                    "prepared"
                };
                println!(
                    "{}: driver {} {state} ({} files, {} links)",
                    dest.display(),
                    outcome.manifest.version,
                    outcome.manifest.files.len(),
                    outcome.manifest.links.len()
                );
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
