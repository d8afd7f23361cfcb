//! Pure renderers of the human views: the nvidia-smi table (the 91-column layout of
//! drivers 580+) and the `-L` list. They take a `Snapshot` and return the text.

use super::snapshot::{ComputeMode, EccStatus, GpuInfo, GpuProcess, Snapshot};

/// The label in the header box where nvidia-smi writes `NVIDIA-SMI`.
pub const SMI_LABEL: &str = "VGPU-SMI";
/// What unsupported values print as.
const NOT_AVAILABLE: &str = "N/A";
const MIB: u64 = 1024 * 1024;

/// Inner widths of the three GPU cells (between the `|` borders).
const CELL_WIDTHS: [usize; 3] = [41, 24, 22];
/// Inner width of the full-width boxes (header, processes).
const INNER_WIDTH: usize = 89;
/// Longest GPU name that fits its column; longer ones end in `...`.
const NAME_WIDTH: usize = 28;
/// Longest process name that fits its column; longer ones start with `...`.
const PROCESS_NAME_WIDTH: usize = 36;

/// The full nvidia-smi-like table: timestamp, header box, GPU box, processes box.
pub fn render_table(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    out.push_str(&snapshot.timestamp);
    out.push_str("       \n");
    push_header_box(&mut out, snapshot);
    push_gpu_box(&mut out, &snapshot.gpus);
    out.push('\n');
    push_process_box(&mut out, &snapshot.processes);
    out
}

/// `-L`: `GPU 0: NAME (UUID: GPU-...)`, one line per GPU.
pub fn render_list(snapshot: &Snapshot) -> String {
    snapshot
        .gpus
        .iter()
        .map(|gpu| {
            format!(
                "GPU {}: {} (UUID: {})\n",
                gpu.index,
                gpu.name.as_deref().unwrap_or(NOT_AVAILABLE),
                gpu.uuid.as_deref().unwrap_or(NOT_AVAILABLE)
            )
        })
        .collect()
}

/// `12020` to `12.2`, as NVML encodes CUDA driver versions.
pub fn cuda_version_text(encoded: i32) -> String {
    format!("{}.{}", encoded / 1000, encoded % 1000 / 10)
}

fn full_rule() -> String {
    format!("+{}+\n", "-".repeat(INNER_WIDTH))
}

fn cell_rule(fill: char) -> String {
    let cells: Vec<String> = CELL_WIDTHS
        .iter()
        .map(|width| fill.to_string().repeat(*width))
        .collect();
    let edge = if fill == '=' { '|' } else { '+' };
    format!("{edge}{}{edge}\n", cells.join("+"))
}

/// One `| ... |` line of the full-width boxes, padded to the box width.
fn full_line(content: &str) -> String {
    format!("|{content:<INNER_WIDTH$}|\n")
}

fn cell_line(cells: [String; 3]) -> String {
    let [first, second, third] = cells;
    format!(
        "|{first:<w0$}|{second:<w1$}|{third:<w2$}|\n",
        w0 = CELL_WIDTHS[0],
        w1 = CELL_WIDTHS[1],
        w2 = CELL_WIDTHS[2]
    )
}

fn push_header_box(out: &mut String, snapshot: &Snapshot) {
    let smi = format!("{SMI_LABEL} {}", env!("CARGO_PKG_VERSION"));
    let driver = snapshot.driver_version.as_deref().unwrap_or(NOT_AVAILABLE);
    let cuda = snapshot
        .cuda_version
        .map(cuda_version_text)
        .unwrap_or_else(|| NOT_AVAILABLE.into());
    out.push_str(&full_rule());
    out.push_str(&full_line(&format!(
        " {smi:<34}Driver Version: {driver:<15}CUDA Version: {cuda:<9}"
    )));
    out.push_str(&cell_rule('-'));
    out.push_str(&cell_line([
        " GPU  Name                 Persistence-M ".into(),
        " Bus-Id          Disp.A ".into(),
        " Volatile Uncorr. ECC ".into(),
    ]));
    out.push_str(&cell_line([
        " Fan  Temp   Perf          Pwr:Usage/Cap ".into(),
        "           Memory-Usage ".into(),
        " GPU-Util  Compute M. ".into(),
    ]));
    out.push_str(&cell_line([
        String::new(),
        String::new(),
        "               MIG M. ".into(),
    ]));
    out.push_str(&cell_rule('='));
}

fn push_gpu_box(out: &mut String, gpus: &[GpuInfo]) {
    for (position, gpu) in gpus.iter().enumerate() {
        if position > 0 {
            out.push_str(&cell_rule('-'));
        }
        for line in gpu_lines(gpu) {
            out.push_str(&cell_line(line));
        }
    }
    out.push_str(&cell_rule('-'));
}

/// The three table lines of one GPU, as cell texts.
fn gpu_lines(gpu: &GpuInfo) -> [[String; 3]; 3] {
    let name = truncate_end(gpu.name.as_deref().unwrap_or(NOT_AVAILABLE), NAME_WIDTH);
    let persistence = on_off(gpu.persistence_mode);
    let bus_id = gpu.bus_id.as_deref().unwrap_or(NOT_AVAILABLE);
    let display = on_off(gpu.display_active);
    let ecc = match gpu.ecc {
        EccStatus::Unknown
        | EccStatus::Enabled {
            volatile_uncorrected: None,
        } => NOT_AVAILABLE.into(),
        EccStatus::Disabled => "Off".into(),
        EccStatus::Enabled {
            volatile_uncorrected: Some(count),
        } => count.to_string(),
    };
    let fan = or_na(gpu.fan_percent.map(|percent| format!("{percent}%")));
    let temperature = or_na(gpu.temperature_celsius.map(|celsius| format!("{celsius}C")));
    let perf = or_na(gpu.performance_state.map(|state| format!("P{state}")));
    let power_usage = or_na(gpu.power_usage_milliwatts.map(watts_text));
    let power_limit = or_na(gpu.power_limit_milliwatts.map(watts_text));
    let (memory_used, memory_total) = match gpu.memory {
        Some(memory) => (
            format!("{}MiB", mebibytes(memory.used_bytes)),
            format!("{}MiB", mebibytes(memory.total_bytes)),
        ),
        None => (NOT_AVAILABLE.into(), NOT_AVAILABLE.into()),
    };
    let utilization = or_na(
        gpu.utilization
            .map(|rates| format!("{}%", rates.gpu_percent)),
    );
    let compute_mode = match gpu.compute_mode {
        Some(ComputeMode::Default) => "Default",
        Some(ComputeMode::ExclusiveThread) => "E. Thread",
        Some(ComputeMode::ExclusiveProcess) => "E. Process",
        Some(ComputeMode::Prohibited) => "Prohibited",
        None => NOT_AVAILABLE,
    };
    let mig = match gpu.mig_enabled {
        Some(true) => "Enabled",
        Some(false) => "Disabled",
        None => NOT_AVAILABLE,
    };
    [
        [
            format!("{:>4}  {name:<NAME_WIDTH$}{persistence:>5}  ", gpu.index),
            format!("{bus_id:>19} {display:>3} "),
            format!("{ecc:>21} "),
        ],
        [
            format!("{fan:>4}  {temperature:>4}    {perf:<3}{power_usage:>15} / {power_limit:>5} "),
            format!("{memory_used:>11} / {memory_total:>9} "),
            format!("{utilization:>8}{compute_mode:>13} "),
        ],
        [String::new(), String::new(), format!("{mig:>21} ")],
    ]
}

fn push_process_box(out: &mut String, processes: &[GpuProcess]) {
    out.push_str(&full_rule());
    out.push_str(&full_line(" Processes:"));
    out.push_str(&full_line(
        "  GPU   GI   CI              PID   Type   Process name                        GPU Memory ",
    ));
    out.push_str(&full_line(
        "        ID   ID                                                               Usage      ",
    ));
    out.push_str(&format!("|{}|\n", "=".repeat(INNER_WIDTH)));
    if processes.is_empty() {
        out.push_str(&full_line("  No running processes found"));
    }
    for process in processes {
        let gpu_instance = or_na(process.gpu_instance_id.map(|id| id.to_string()));
        let compute_instance = or_na(process.compute_instance_id.map(|id| id.to_string()));
        let name = truncate_start(
            process.name.as_deref().unwrap_or(NOT_AVAILABLE),
            PROCESS_NAME_WIDTH,
        );
        let memory = or_na(
            process
                .used_memory_bytes
                .map(|bytes| format!("{}MiB", mebibytes(bytes))),
        );
        out.push_str(&full_line(&format!(
            "{:>5}   {gpu_instance:>3}  {compute_instance:>3}{:>16}{:>7}   {name:<37}{memory:>9} ",
            process.gpu_index,
            process.pid,
            process.kind.label(),
        )));
    }
    out.push_str(&full_rule());
}

/// Bytes to MiB, rounded up as nvidia-smi does (1550.81 MiB used shows as 1551MiB).
pub fn mebibytes(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

fn watts_text(milliwatts: u32) -> String {
    format!("{}W", (u64::from(milliwatts) + 500) / 1000)
}

fn on_off(flag: Option<bool>) -> &'static str {
    match flag {
        Some(true) => "On",
        Some(false) => "Off",
        None => NOT_AVAILABLE,
    }
}

fn or_na(value: Option<String>) -> String {
    value.unwrap_or_else(|| NOT_AVAILABLE.into())
}

/// Keeps the start of `text`, ending in `...` when it is longer than `width` chars.
fn truncate_end(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let kept: String = text.chars().take(width.saturating_sub(3)).collect();
    format!("{kept}...")
}

/// Keeps the end of `text` (the binary name of a path), starting with `...`.
fn truncate_start(text: &str, width: usize) -> String {
    let length = text.chars().count();
    if length <= width {
        return text.to_owned();
    }
    let kept: String = text
        .chars()
        .skip(length - width.saturating_sub(3))
        .collect();
    format!("...{kept}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smi::snapshot::{MemoryUsage, ProcessKind, Utilization};

    const GIB: u64 = 1024 * MIB;

    fn h200() -> GpuInfo {
        GpuInfo {
            index: 0,
            name: Some("NVIDIA H200".into()),
            uuid: Some("GPU-a2772633-adc4-1d01-4c60-2b74302a7a2a".into()),
            persistence_mode: Some(true),
            bus_id: Some("00000000:00:06.0".into()),
            display_active: Some(false),
            ecc: EccStatus::Enabled {
                volatile_uncorrected: Some(0),
            },
            fan_percent: None,
            temperature_celsius: Some(41),
            performance_state: Some(0),
            power_usage_milliwatts: Some(120_449),
            power_limit_milliwatts: Some(700_000),
            memory: Some(MemoryUsage {
                total_bytes: 143_771 * MIB,
                used_bytes: 1_626_144_768, // 1550.81 MiB, measured on an H200
                free_bytes: 142_220 * MIB,
            }),
            utilization: Some(Utilization {
                gpu_percent: 0,
                memory_percent: 0,
            }),
            compute_mode: Some(ComputeMode::Default),
            mig_enabled: Some(false),
        }
    }

    fn python_process() -> GpuProcess {
        GpuProcess {
            gpu_index: 0,
            gpu_uuid: Some("GPU-a2772633-adc4-1d01-4c60-2b74302a7a2a".into()),
            gpu_name: Some("NVIDIA H200".into()),
            gpu_bus_id: Some("00000000:00:06.0".into()),
            pid: 471,
            kind: ProcessKind::Compute,
            gpu_instance_id: None,
            compute_instance_id: None,
            name: Some("python3".into()),
            used_memory_bytes: Some(1_542 * MIB),
        }
    }

    fn snapshot(gpus: Vec<GpuInfo>, processes: Vec<GpuProcess>) -> Snapshot {
        Snapshot {
            timestamp: "Wed Dec  2 15:49:22 2026".into(),
            driver_version: Some("580.159.04".into()),
            cuda_version: Some(13000),
            device_count: gpus.len() as u32,
            gpus,
            processes,
        }
    }

    /// nvidia-smi 580.159.04's output on an H200 with one CUDA process, with the
    /// `NVIDIA-SMI 580.159.04` label swapped for ours.
    fn expected_h200_table() -> String {
        let smi = format!("{SMI_LABEL} {}", env!("CARGO_PKG_VERSION"));
        let header = format!("| {smi:<34}Driver Version: 580.159.04     CUDA Version: 13.0     |");
        [
            "Wed Dec  2 15:49:22 2026       ",
            "+-----------------------------------------------------------------------------------------+",
            &header,
            "+-----------------------------------------+------------------------+----------------------+",
            "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
            "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
            "|                                         |                        |               MIG M. |",
            "|=========================================+========================+======================|",
            "|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |                    0 |",
            "| N/A   41C    P0            120W /  700W |    1551MiB / 143771MiB |      0%      Default |",
            "|                                         |                        |             Disabled |",
            "+-----------------------------------------+------------------------+----------------------+",
            "",
            "+-----------------------------------------------------------------------------------------+",
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|=========================================================================================|",
            "|    0   N/A  N/A             471      C   python3                                1542MiB |",
            "+-----------------------------------------------------------------------------------------+",
            "",
        ]
        .join("\n")
    }

    #[test]
    fn table_matches_nvidia_smi_580_layout() {
        let table = render_table(&snapshot(vec![h200()], vec![python_process()]));
        assert_eq!(table, expected_h200_table());
    }

    #[test]
    fn header_uses_vgpu_label_not_nvidia() {
        let table = render_table(&snapshot(vec![h200()], vec![]));
        let header = table.lines().nth(2).unwrap();
        assert!(
            header.starts_with(&format!("| VGPU-SMI {} ", env!("CARGO_PKG_VERSION"))),
            "{header}"
        );
        assert!(!table.contains("NVIDIA-SMI"));
    }

    #[test]
    fn every_line_but_the_timestamp_is_91_columns() {
        let mut long = h200();
        long.name = Some("NVIDIA GeForce RTX 4060 Laptop GPU".into());
        let mut process = python_process();
        process.name = Some("/opt/conda/envs/training-environment/bin/python3.11".into());
        process.used_memory_bytes = Some(143_000 * MIB);
        let table = render_table(&snapshot(vec![long, h200()], vec![process]));
        for line in table.lines().skip(1).filter(|line| !line.is_empty()) {
            assert_eq!(line.chars().count(), 91, "{line:?}");
        }
    }

    #[test]
    fn long_gpu_names_are_cut_with_an_ellipsis() {
        let mut gpu = h200();
        gpu.name = Some("NVIDIA GeForce RTX 4060 Laptop GPU".into());
        gpu.persistence_mode = Some(false);
        let table = render_table(&snapshot(vec![gpu], vec![]));
        assert!(
            table
                .contains("\n|   0  NVIDIA GeForce RTX 4060 L...  Off  |   00000000:00:06.0 Off |"),
            "{table}"
        );
    }

    #[test]
    fn long_process_names_keep_their_end() {
        let mut process = python_process();
        process.name = Some("/opt/conda/envs/training-environment/bin/python3.11".into());
        process.kind = ProcessKind::ComputeAndGraphics;
        process.gpu_instance_id = Some(1);
        process.compute_instance_id = Some(0);
        let table = render_table(&snapshot(vec![h200()], vec![process]));
        assert!(
            table.contains(
                "\n|    0     1    0             471    C+G   ...aining-environment/bin/python3.11   1542MiB |\n"
            ),
            "{table}"
        );
    }

    #[test]
    fn unsupported_fields_print_na() {
        let bare = GpuInfo {
            index: 3,
            name: Some("Simulated GPU".into()),
            ..GpuInfo::default()
        };
        let mut bare_snapshot = snapshot(vec![bare], vec![]);
        bare_snapshot.driver_version = None;
        bare_snapshot.cuda_version = None;
        let lines: Vec<String> = render_table(&bare_snapshot)
            .lines()
            .map(str::to_owned)
            .collect();
        assert!(
            lines[2].contains("Driver Version: N/A            CUDA Version: N/A      "),
            "{}",
            lines[2]
        );
        assert_eq!(
            lines[8],
            "|   3  Simulated GPU                 N/A  |                N/A N/A |                  N/A |"
        );
        assert_eq!(
            lines[9],
            "| N/A   N/A    N/A            N/A /   N/A |        N/A /       N/A |     N/A          N/A |"
        );
        assert_eq!(
            lines[10],
            "|                                         |                        |                  N/A |"
        );
        assert!(
            !lines
                .iter()
                .any(|line| line.contains("Not Found") || line.contains("rror"))
        );
    }

    #[test]
    fn ecc_off_and_other_modes_use_nvidia_words() {
        let mut gpu = h200();
        gpu.ecc = EccStatus::Disabled;
        gpu.compute_mode = Some(ComputeMode::ExclusiveProcess);
        gpu.mig_enabled = Some(true);
        gpu.fan_percent = Some(30);
        gpu.performance_state = Some(8);
        gpu.memory = Some(MemoryUsage {
            total_bytes: 4 * GIB,
            used_bytes: GIB,
            free_bytes: 3 * GIB,
        });
        let lines: Vec<String> = render_table(&snapshot(vec![gpu], vec![]))
            .lines()
            .map(str::to_owned)
            .collect();
        assert!(
            lines[8].ends_with("|                  Off |"),
            "{}",
            lines[8]
        );
        assert_eq!(
            lines[9],
            "| 30%   41C    P8            120W /  700W |    1024MiB /   4096MiB |      0%   E. Process |"
        );
        assert!(
            lines[10].ends_with("|              Enabled |"),
            "{}",
            lines[10]
        );
    }

    #[test]
    fn no_processes_says_so() {
        let table = render_table(&snapshot(vec![h200()], vec![]));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[lines.len() - 2],
            "|  No running processes found                                                             |"
        );
    }

    #[test]
    fn two_gpus_are_separated_by_a_rule() {
        let mut second = h200();
        second.index = 1;
        second.bus_id = Some("00000000:00:07.0".into());
        let table = render_table(&snapshot(vec![h200(), second], vec![]));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[11], lines[3]);
        assert!(lines[12].starts_with("|   1  NVIDIA H200"), "{}", lines[12]);
        assert_eq!(lines[15], lines[3]);
        assert_eq!(lines[16], "");
    }

    #[test]
    fn list_names_each_gpu_with_uuid() {
        let mut second = h200();
        second.index = 1;
        second.uuid = None;
        assert_eq!(
            render_list(&snapshot(vec![h200(), second], vec![])),
            "GPU 0: NVIDIA H200 (UUID: GPU-a2772633-adc4-1d01-4c60-2b74302a7a2a)\n\
             GPU 1: NVIDIA H200 (UUID: N/A)\n"
        );
    }

    #[test]
    fn mebibytes_round_up_like_nvidia_smi() {
        // Measured on driver 580: reserved 644939776 B shows as 616 MiB, free
        // 148483735552 B as 141606 MiB; whole MiB stay exact.
        assert_eq!(mebibytes(644_939_776), 616);
        assert_eq!(mebibytes(148_483_735_552), 141_606);
        assert_eq!(mebibytes(150_754_820_096), 143_771);
        assert_eq!(mebibytes(0), 0);
    }

    #[test]
    fn cuda_versions_decode() {
        assert_eq!(cuda_version_text(12020), "12.2");
        assert_eq!(cuda_version_text(13000), "13.0");
        assert_eq!(cuda_version_text(11080), "11.8");
    }
}
