//! `--query-gpu` / `--query-compute-apps` with `--format=csv[,noheader][,nounits]`:
//! field-list and format parsing, and the pure CSV renderer, matching nvidia-smi's
//! spelling (`memory.total [MiB]` in the header, `4096 MiB` as a value, `[N/A]` for
//! unsupported values, `, ` between columns).

use anyhow::bail;

use super::snapshot::{ComputeMode, GpuInfo, GpuProcess, Snapshot};
use super::table::{cuda_version_text, mebibytes};

const NOT_AVAILABLE: &str = "[N/A]";

/// A `--query-gpu` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuField {
    Index,
    Name,
    Uuid,
    DriverVersion,
    CudaVersion,
    Count,
    MemoryTotal,
    MemoryUsed,
    MemoryFree,
    UtilizationGpu,
    UtilizationMemory,
    TemperatureGpu,
    PciBusId,
    FanSpeed,
    PerformanceState,
    PowerDraw,
    PowerLimit,
    ComputeMode,
    PersistenceMode,
    DisplayActive,
    MigModeCurrent,
}

/// Every `--query-gpu` field with the names nvidia-smi accepts; the first name is the
/// one the header prints.
const GPU_FIELDS: &[(GpuField, &[&str], Unit)] = &[
    (GpuField::Index, &["index"], Unit::None),
    (GpuField::Name, &["name", "gpu_name"], Unit::None),
    (GpuField::Uuid, &["uuid", "gpu_uuid"], Unit::None),
    (GpuField::DriverVersion, &["driver_version"], Unit::None),
    (GpuField::CudaVersion, &["cuda_version"], Unit::None),
    (GpuField::Count, &["count"], Unit::None),
    (GpuField::MemoryTotal, &["memory.total"], Unit::Mib),
    (GpuField::MemoryUsed, &["memory.used"], Unit::Mib),
    (GpuField::MemoryFree, &["memory.free"], Unit::Mib),
    (
        GpuField::UtilizationGpu,
        &["utilization.gpu"],
        Unit::Percent,
    ),
    (
        GpuField::UtilizationMemory,
        &["utilization.memory"],
        Unit::Percent,
    ),
    (GpuField::TemperatureGpu, &["temperature.gpu"], Unit::None),
    (
        GpuField::PciBusId,
        &["pci.bus_id", "gpu_bus_id"],
        Unit::None,
    ),
    (GpuField::FanSpeed, &["fan.speed"], Unit::Percent),
    (GpuField::PerformanceState, &["pstate"], Unit::None),
    (GpuField::PowerDraw, &["power.draw"], Unit::Watt),
    (GpuField::PowerLimit, &["power.limit"], Unit::Watt),
    (GpuField::ComputeMode, &["compute_mode"], Unit::None),
    (GpuField::PersistenceMode, &["persistence_mode"], Unit::None),
    (GpuField::DisplayActive, &["display_active"], Unit::None),
    (GpuField::MigModeCurrent, &["mig.mode.current"], Unit::None),
];

/// A `--query-compute-apps` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppField {
    Pid,
    ProcessName,
    UsedMemory,
    GpuUuid,
    GpuName,
    GpuBusId,
}

const APP_FIELDS: &[(AppField, &[&str], Unit)] = &[
    (AppField::Pid, &["pid"], Unit::None),
    (AppField::ProcessName, &["process_name", "name"], Unit::None),
    (
        AppField::UsedMemory,
        &["used_gpu_memory", "used_memory"],
        Unit::Mib,
    ),
    (AppField::GpuUuid, &["gpu_uuid"], Unit::None),
    (AppField::GpuName, &["gpu_name"], Unit::None),
    (AppField::GpuBusId, &["gpu_bus_id"], Unit::None),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    None,
    Mib,
    Percent,
    Watt,
}

impl Unit {
    fn header_suffix(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Mib => " [MiB]",
            Unit::Percent => " [%]",
            Unit::Watt => " [W]",
        }
    }

    fn value_suffix(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Mib => " MiB",
            Unit::Percent => " %",
            Unit::Watt => " W",
        }
    }
}

/// `--format=csv[,noheader][,nounits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvFormat {
    pub header: bool,
    pub units: bool,
}

impl Default for CsvFormat {
    fn default() -> Self {
        CsvFormat {
            header: true,
            units: true,
        }
    }
}

/// Parses `--format`; `None` (no `--format`) is plain `csv`, as nvidia-smi treats it.
pub fn parse_format(text: Option<&str>) -> anyhow::Result<CsvFormat> {
    let mut format = CsvFormat::default();
    let Some(text) = text else {
        return Ok(format);
    };
    let mut saw_csv = false;
    for modifier in text.split(',').map(str::trim) {
        match modifier {
            "csv" => saw_csv = true,
            "noheader" => format.header = false,
            "nounits" => format.units = false,
            other => bail!(
                "--format: modifier {other:?} is not recognized; use csv[,noheader][,nounits]"
            ),
        }
    }
    if !saw_csv {
        bail!("--format {text:?}: only csv output is supported; use csv[,noheader][,nounits]");
    }
    Ok(format)
}

fn parse_fields<F: Copy>(
    text: &str,
    known: &[(F, &'static [&'static str], Unit)],
    option: &str,
) -> anyhow::Result<Vec<F>> {
    let mut fields = Vec::new();
    for name in text.split(',').map(str::trim) {
        if name.is_empty() {
            bail!("{option}={text}: empty field name");
        }
        match known
            .iter()
            .find(|(_, names, _)| names.iter().any(|known| known.eq_ignore_ascii_case(name)))
        {
            Some((field, _, _)) => fields.push(*field),
            None => {
                let valid: Vec<&str> = known.iter().map(|(_, names, _)| names[0]).collect();
                bail!(
                    "Field \"{name}\" is not a valid field to query. Valid {option} fields: {}",
                    valid.join(", ")
                );
            }
        }
    }
    Ok(fields)
}

/// Parses a `--query-gpu` field list; an unknown field is an error naming it.
pub fn parse_gpu_fields(text: &str) -> anyhow::Result<Vec<GpuField>> {
    parse_fields(text, GPU_FIELDS, "--query-gpu")
}

/// Parses a `--query-compute-apps` field list; an unknown field is an error naming it.
pub fn parse_app_fields(text: &str) -> anyhow::Result<Vec<AppField>> {
    parse_fields(text, APP_FIELDS, "--query-compute-apps")
}

/// What a CSV query asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsvQuery {
    Gpus(Vec<GpuField>),
    ComputeApps(Vec<AppField>),
}

fn describe<F: PartialEq + Copy>(
    field: F,
    known: &[(F, &'static [&'static str], Unit)],
) -> (&'static str, Unit) {
    known
        .iter()
        .find(|(candidate, _, _)| *candidate == field)
        .map(|(_, names, unit)| (names[0], *unit))
        .unwrap_or(("?", Unit::None))
}

/// Renders one CSV query over a snapshot: an optional header row, then one row per
/// selected GPU (`Gpus`) or per compute process (`ComputeApps`).
pub fn render_csv(snapshot: &Snapshot, query: &CsvQuery, format: CsvFormat) -> String {
    let mut out = String::new();
    match query {
        CsvQuery::Gpus(fields) => {
            let described: Vec<_> = fields
                .iter()
                .map(|field| (*field, describe(*field, GPU_FIELDS)))
                .collect();
            if format.header {
                push_header(&mut out, described.iter().map(|(_, described)| *described));
            }
            for gpu in &snapshot.gpus {
                let row: Vec<String> = described
                    .iter()
                    .map(|(field, (_, unit))| {
                        with_unit(gpu_value(snapshot, gpu, *field), *unit, format)
                    })
                    .collect();
                push_row(&mut out, &row);
            }
        }
        CsvQuery::ComputeApps(fields) => {
            let described: Vec<_> = fields
                .iter()
                .map(|field| (*field, describe(*field, APP_FIELDS)))
                .collect();
            if format.header {
                push_header(&mut out, described.iter().map(|(_, described)| *described));
            }
            for process in snapshot
                .processes
                .iter()
                .filter(|process| process.kind.has_compute())
            {
                let row: Vec<String> = described
                    .iter()
                    .map(|(field, (_, unit))| with_unit(app_value(process, *field), *unit, format))
                    .collect();
                push_row(&mut out, &row);
            }
        }
    }
    out
}

fn push_header(out: &mut String, columns: impl Iterator<Item = (&'static str, Unit)>) {
    let names: Vec<String> = columns
        .map(|(name, unit)| format!("{name}{}", unit.header_suffix()))
        .collect();
    push_row(out, &names);
}

fn push_row(out: &mut String, cells: &[String]) {
    out.push_str(&cells.join(", "));
    out.push('\n');
}

fn with_unit(value: Option<String>, unit: Unit, format: CsvFormat) -> String {
    match value {
        Some(value) if format.units => format!("{value}{}", unit.value_suffix()),
        Some(value) => value,
        None => NOT_AVAILABLE.to_owned(),
    }
}

fn enabled_disabled(flag: Option<bool>) -> Option<String> {
    flag.map(|on| if on { "Enabled" } else { "Disabled" }.to_owned())
}

fn gpu_value(snapshot: &Snapshot, gpu: &GpuInfo, field: GpuField) -> Option<String> {
    match field {
        GpuField::Index => Some(gpu.index.to_string()),
        GpuField::Name => gpu.name.clone(),
        GpuField::Uuid => gpu.uuid.clone(),
        GpuField::DriverVersion => snapshot.driver_version.clone(),
        GpuField::CudaVersion => snapshot.cuda_version.map(cuda_version_text),
        GpuField::Count => Some(snapshot.device_count.to_string()),
        GpuField::MemoryTotal => gpu
            .memory
            .map(|memory| mebibytes(memory.total_bytes).to_string()),
        GpuField::MemoryUsed => gpu
            .memory
            .map(|memory| mebibytes(memory.used_bytes).to_string()),
        GpuField::MemoryFree => gpu
            .memory
            .map(|memory| mebibytes(memory.free_bytes).to_string()),
        GpuField::UtilizationGpu => gpu.utilization.map(|rates| rates.gpu_percent.to_string()),
        GpuField::UtilizationMemory => gpu
            .utilization
            .map(|rates| rates.memory_percent.to_string()),
        GpuField::TemperatureGpu => gpu.temperature_celsius.map(|celsius| celsius.to_string()),
        GpuField::PciBusId => gpu.bus_id.clone(),
        GpuField::FanSpeed => gpu.fan_percent.map(|percent| percent.to_string()),
        GpuField::PerformanceState => gpu.performance_state.map(|state| format!("P{state}")),
        GpuField::PowerDraw => gpu.power_usage_milliwatts.map(watts_with_decimals),
        GpuField::PowerLimit => gpu.power_limit_milliwatts.map(watts_with_decimals),
        GpuField::ComputeMode => gpu.compute_mode.map(|mode| {
            match mode {
                ComputeMode::Default => "Default",
                ComputeMode::ExclusiveThread => "Exclusive_Thread",
                ComputeMode::Prohibited => "Prohibited",
                ComputeMode::ExclusiveProcess => "Exclusive_Process",
            }
            .to_owned()
        }),
        GpuField::PersistenceMode => enabled_disabled(gpu.persistence_mode),
        GpuField::DisplayActive => enabled_disabled(gpu.display_active),
        GpuField::MigModeCurrent => enabled_disabled(gpu.mig_enabled),
    }
}

fn app_value(process: &GpuProcess, field: AppField) -> Option<String> {
    match field {
        AppField::Pid => Some(process.pid.to_string()),
        AppField::ProcessName => process.name.clone(),
        AppField::UsedMemory => process
            .used_memory_bytes
            .map(|bytes| mebibytes(bytes).to_string()),
        AppField::GpuUuid => process.gpu_uuid.clone(),
        AppField::GpuName => process.gpu_name.clone(),
        AppField::GpuBusId => process.gpu_bus_id.clone(),
    }
}

fn watts_with_decimals(milliwatts: u32) -> String {
    let centiwatts = (u64::from(milliwatts) + 5) / 10;
    format!("{}.{:02}", centiwatts / 100, centiwatts % 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smi::snapshot::{EccStatus, MemoryUsage, ProcessKind, Utilization};

    const MIB: u64 = 1024 * 1024;

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            name: Some("NVIDIA H200".into()),
            uuid: Some(format!("GPU-0000000{index}-adc4-1d01-4c60-2b74302a7a2a")),
            persistence_mode: Some(true),
            bus_id: Some(format!("00000000:00:0{}.0", 6 + index)),
            display_active: Some(false),
            ecc: EccStatus::Disabled,
            fan_percent: None,
            temperature_celsius: Some(41),
            performance_state: Some(0),
            power_usage_milliwatts: Some(120_554),
            power_limit_milliwatts: Some(700_000),
            memory: Some(MemoryUsage {
                total_bytes: 143_771 * MIB,
                used_bytes: 1_551 * MIB,
                free_bytes: 142_220 * MIB,
            }),
            utilization: Some(Utilization {
                gpu_percent: 30,
                memory_percent: 5,
            }),
            compute_mode: Some(ComputeMode::Default),
            mig_enabled: Some(false),
        }
    }

    fn process(pid: u32, kind: ProcessKind, name: Option<&str>) -> GpuProcess {
        GpuProcess {
            gpu_index: 0,
            gpu_uuid: Some("GPU-00000000-adc4-1d01-4c60-2b74302a7a2a".into()),
            gpu_name: Some("NVIDIA H200".into()),
            gpu_bus_id: Some("00000000:00:06.0".into()),
            pid,
            kind,
            gpu_instance_id: None,
            compute_instance_id: None,
            name: name.map(str::to_owned),
            used_memory_bytes: Some(1_542 * MIB),
        }
    }

    fn snapshot() -> Snapshot {
        let mut bare = GpuInfo {
            index: 1,
            name: Some("Simulated GPU".into()),
            ..GpuInfo::default()
        };
        bare.uuid = Some("GPU-sim-1".into());
        Snapshot {
            timestamp: "Wed Dec  2 15:49:22 2026".into(),
            driver_version: Some("580.159.04".into()),
            cuda_version: Some(13000),
            device_count: 2,
            gpus: vec![gpu(0), bare],
            processes: vec![
                process(471, ProcessKind::Compute, Some("python3")),
                process(472, ProcessKind::Graphics, Some("Xorg")),
                process(473, ProcessKind::ComputeAndGraphics, None),
            ],
        }
    }

    #[test]
    fn gpu_query_matches_nvidia_smi_spelling() {
        let fields = parse_gpu_fields(
            "index,name,uuid,driver_version,memory.total,memory.used,memory.free,utilization.gpu,\
             utilization.memory,temperature.gpu,pci.bus_id,count",
        )
        .unwrap();
        let csv = render_csv(&snapshot(), &CsvQuery::Gpus(fields), CsvFormat::default());
        assert_eq!(
            csv,
            "index, name, uuid, driver_version, memory.total [MiB], memory.used [MiB], memory.free [MiB], \
             utilization.gpu [%], utilization.memory [%], temperature.gpu, pci.bus_id, count\n\
             0, NVIDIA H200, GPU-00000000-adc4-1d01-4c60-2b74302a7a2a, 580.159.04, 143771 MiB, 1551 MiB, \
             142220 MiB, 30 %, 5 %, 41, 00000000:00:06.0, 2\n\
             1, Simulated GPU, GPU-sim-1, 580.159.04, [N/A], [N/A], [N/A], [N/A], [N/A], [N/A], [N/A], 2\n"
        );
    }

    #[test]
    fn noheader_and_nounits_drop_what_they_say() {
        let fields = parse_gpu_fields("memory.total,name").unwrap();
        let format = parse_format(Some("csv,noheader,nounits")).unwrap();
        let csv = render_csv(&snapshot(), &CsvQuery::Gpus(fields.clone()), format);
        assert_eq!(csv, "143771, NVIDIA H200\n[N/A], Simulated GPU\n");

        // nounits keeps the units in the header, as nvidia-smi does.
        let format = parse_format(Some("csv,nounits")).unwrap();
        let csv = render_csv(&snapshot(), &CsvQuery::Gpus(fields), format);
        assert_eq!(
            csv,
            "memory.total [MiB], name\n143771, NVIDIA H200\n[N/A], Simulated GPU\n"
        );
    }

    #[test]
    fn extra_gpu_fields_render() {
        let fields = parse_gpu_fields(
            "power.draw,power.limit,pstate,fan.speed,compute_mode,persistence_mode,cuda_version",
        )
        .unwrap();
        let csv = render_csv(&snapshot(), &CsvQuery::Gpus(fields), CsvFormat::default());
        let first_row = csv.lines().nth(1).unwrap();
        assert_eq!(
            first_row,
            "120.55 W, 700.00 W, P0, [N/A], Default, Enabled, 13.0"
        );
        assert_eq!(
            csv.lines().next().unwrap(),
            "power.draw [W], power.limit [W], pstate, fan.speed [%], compute_mode, persistence_mode, cuda_version"
        );
    }

    #[test]
    fn compute_apps_list_only_compute_contexts() {
        let fields = parse_app_fields("pid,process_name,used_memory,gpu_uuid").unwrap();
        let csv = render_csv(
            &snapshot(),
            &CsvQuery::ComputeApps(fields),
            CsvFormat::default(),
        );
        assert_eq!(
            csv,
            "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n\
             471, python3, 1542 MiB, GPU-00000000-adc4-1d01-4c60-2b74302a7a2a\n\
             473, [N/A], 1542 MiB, GPU-00000000-adc4-1d01-4c60-2b74302a7a2a\n"
        );
    }

    #[test]
    fn compute_apps_with_no_processes_is_just_the_header() {
        let mut empty = snapshot();
        empty.processes.clear();
        let fields = parse_app_fields("pid,used_memory").unwrap();
        let csv = render_csv(
            &empty,
            &CsvQuery::ComputeApps(fields.clone()),
            CsvFormat::default(),
        );
        assert_eq!(csv, "pid, used_gpu_memory [MiB]\n");
        let csv = render_csv(
            &empty,
            &CsvQuery::ComputeApps(fields),
            CsvFormat {
                header: false,
                units: true,
            },
        );
        assert_eq!(csv, "");
    }

    #[test]
    fn unknown_fields_are_named_in_the_error() {
        let err = parse_gpu_fields("name,bogus").unwrap_err().to_string();
        assert!(
            err.starts_with("Field \"bogus\" is not a valid field to query."),
            "{err}"
        );
        assert!(err.contains("memory.total"), "{err}");
        let err = parse_app_fields("pid,memory.total")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("Field \"memory.total\" is not a valid field to query."),
            "{err}"
        );
        assert!(parse_gpu_fields("name,,index").is_err());
    }

    #[test]
    fn format_accepts_only_csv_modifiers() {
        assert_eq!(
            parse_format(None).unwrap(),
            CsvFormat {
                header: true,
                units: true
            }
        );
        assert_eq!(
            parse_format(Some("csv,noheader")).unwrap(),
            CsvFormat {
                header: false,
                units: true
            }
        );
        let err = parse_format(Some("xml")).unwrap_err().to_string();
        assert!(err.contains("\"xml\""), "{err}");
        assert!(parse_format(Some("noheader")).is_err());
    }

    #[test]
    fn watts_round_to_centiwatts() {
        assert_eq!(watts_with_decimals(120_554), "120.55");
        assert_eq!(watts_with_decimals(120_556), "120.56");
        assert_eq!(watts_with_decimals(70_000), "70.00");
        assert_eq!(watts_with_decimals(999), "1.00");
        assert_eq!(watts_with_decimals(4), "0.00");
    }
}
