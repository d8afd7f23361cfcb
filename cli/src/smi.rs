//! `vgpu smi`: a virtual nvidia-smi. It reads the GPUs through whatever
//! `libnvidia-ml.so.1` this process loads (inside a container, the vgpu NVML shim, so
//! it shows the quota-limited view; env `VGPU_NVML_LIBRARY` may name another library)
//! and prints nvidia-smi's table, `-L` list or `--query-*` CSV.
//!
//! Gathering (`snapshot`) is kept apart from rendering (`table`, `csv`), which are pure
//! functions of a `Snapshot`.

mod clock;
mod csv;
mod legacy;
mod snapshot;
mod table;

use std::ffi::OsString;
use std::io::Write;

use anyhow::{Context, bail};

use self::csv::{
    CsvFormat, CsvQuery, parse_app_fields, parse_format, parse_gpu_fields, render_csv,
};
use self::snapshot::{gather, open_nvml, parse_selectors};
use self::table::{render_list, render_table};

/// Env var naming the NVML library to load instead of `libnvidia-ml.so.1`.
pub const NVML_LIBRARY_ENV: &str = "VGPU_NVML_LIBRARY";
/// What is loaded by default: found through the dynamic linker's search path, so in a
/// container it is the bind-mounted shim.
pub const DEFAULT_NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Options of `vgpu smi`, spelled like nvidia-smi's.
#[derive(clap::Args, Debug, Default)]
pub struct SmiArgs {
    /// List each GPU with its UUID.
    #[arg(short = 'L', long = "list-gpus", conflicts_with_all = ["query_gpu", "query_compute_apps"])]
    pub list_gpus: bool,

    /// Show only these GPUs: comma-separated indexes, UUIDs or PCI bus ids.
    #[arg(short = 'i', long = "id", value_name = "ID[,ID...]")]
    pub id: Option<String>,

    /// Print these GPU fields as CSV (index, name, uuid, driver_version, memory.total,
    /// memory.used, memory.free, utilization.gpu, utilization.memory, temperature.gpu,
    /// pci.bus_id, count, ...).
    #[arg(
        long = "query-gpu",
        value_name = "FIELD[,FIELD...]",
        conflicts_with = "query_compute_apps"
    )]
    pub query_gpu: Option<String>,

    /// Print these fields of each compute process as CSV (pid, process_name,
    /// used_memory, gpu_uuid, gpu_name, gpu_bus_id).
    #[arg(long = "query-compute-apps", value_name = "FIELD[,FIELD...]")]
    pub query_compute_apps: Option<String>,

    /// Output format of a --query-*: csv, optionally with noheader and/or nounits.
    #[arg(long = "format", value_name = "csv[,noheader][,nounits]")]
    pub format: Option<String>,
}

/// What one invocation prints.
#[derive(Debug, Clone, PartialEq, Eq)]
enum View {
    Table,
    List,
    Csv(CsvQuery, CsvFormat),
}

fn parse_view(args: &SmiArgs) -> anyhow::Result<View> {
    if let Some(fields) = &args.query_gpu {
        return Ok(View::Csv(
            CsvQuery::Gpus(parse_gpu_fields(fields)?),
            parse_format(args.format.as_deref())?,
        ));
    }
    if let Some(fields) = &args.query_compute_apps {
        return Ok(View::Csv(
            CsvQuery::ComputeApps(parse_app_fields(fields)?),
            parse_format(args.format.as_deref())?,
        ));
    }
    if args.format.is_some() {
        bail!("--format needs --query-gpu or --query-compute-apps");
    }
    Ok(if args.list_gpus {
        View::List
    } else {
        View::Table
    })
}

/// The NVML library to load: `$VGPU_NVML_LIBRARY`, else `libnvidia-ml.so.1`.
fn nvml_library() -> OsString {
    match std::env::var_os(NVML_LIBRARY_ENV) {
        Some(path) if !path.is_empty() => path,
        _ => OsString::from(DEFAULT_NVML_LIBRARY),
    }
}

/// Runs `vgpu smi`: validates the options, gathers a snapshot and prints one view.
pub fn run(args: &SmiArgs) -> anyhow::Result<()> {
    let view = parse_view(args)?;
    let selectors = match &args.id {
        Some(text) => parse_selectors(text)?,
        None => Vec::new(),
    };
    let library = nvml_library();
    let nvml = open_nvml(&library)?;
    let include_processes = matches!(view, View::Table | View::Csv(CsvQuery::ComputeApps(_), _));
    let snapshot = gather(&nvml, &library, &selectors, include_processes)?;
    let text = match &view {
        View::Table | View::List if snapshot.gpus.is_empty() => bail!("No devices were found"),
        View::Table => render_table(&snapshot),
        View::List => render_list(&snapshot),
        View::Csv(query, format) => render_csv(&snapshot, query, *format),
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        // `vgpu smi | head` closing the pipe early is not an error.
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(err) => Err(err).context("writing to stdout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smi::csv::{AppField, GpuField};
    use clap::Parser;

    #[derive(Parser)]
    struct Harness {
        #[command(flatten)]
        smi: SmiArgs,
    }

    fn args(argv: &[&str]) -> Result<SmiArgs, clap::Error> {
        Harness::try_parse_from(std::iter::once("smi").chain(argv.iter().copied()))
            .map(|harness| harness.smi)
    }

    #[test]
    fn nvidia_smi_spellings_parse() {
        let parsed = args(&[
            "--query-gpu=name,memory.total",
            "--format=csv,noheader",
            "-i",
            "0",
        ])
        .unwrap();
        assert_eq!(
            parse_view(&parsed).unwrap(),
            View::Csv(
                CsvQuery::Gpus(vec![GpuField::Name, GpuField::MemoryTotal]),
                CsvFormat {
                    header: false,
                    units: true
                }
            )
        );
        assert_eq!(parsed.id.as_deref(), Some("0"));
        assert_eq!(parse_view(&args(&["-L"]).unwrap()).unwrap(), View::List);
        assert_eq!(
            parse_view(&args(&["--list-gpus"]).unwrap()).unwrap(),
            View::List
        );
        assert_eq!(parse_view(&args(&[]).unwrap()).unwrap(), View::Table);
        assert_eq!(
            parse_view(&args(&["--query-compute-apps=pid,used_memory", "--format=csv"]).unwrap())
                .unwrap(),
            View::Csv(
                CsvQuery::ComputeApps(vec![AppField::Pid, AppField::UsedMemory]),
                CsvFormat::default()
            )
        );
    }

    #[test]
    fn contradictory_options_are_refused() {
        assert!(args(&["-L", "--query-gpu=name"]).is_err());
        assert!(args(&["--query-gpu=name", "--query-compute-apps=pid"]).is_err());
        let err = parse_view(&args(&["--format=csv"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("--query-gpu"), "{err}");
    }

    #[test]
    fn bad_fields_fail_before_nvml_is_touched() {
        let err = parse_view(&args(&["--query-gpu=name,bogus"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"bogus\""), "{err}");
    }
}
