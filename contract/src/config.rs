//! The per-container quota config: one YAML file, found through `VGPU_CONFIG`
//! (default `/etc/vgpu/vgpu.yaml`).
//!
//! ```yaml
//! container_id: alloc-3f2a9c                 # who this container is (1-64 of [A-Za-z0-9._-])
//! driver_dir: /usr/local/vgpu/driver/lib64   # where the real libcuda.so.1 / libnvidia-ml.so.1 are
//! usage_region: /var/lib/vgpu/usage.region   # default: `usage.region` beside this file
//! card_state_dir: /etc/vgpu/cards            # the host's per-card compute views, read-only (optional)
//! memory_oversubscribe: false                # see docs/quota-config.md before turning this on
//! utilization_scale: limit                   # `limit` (30 cores busy reads 100%) or `card` (reads 30%)
//! warn_on_refusal: false                     # one stderr line per refusal (at most one a second), whatever VGPU_LOG says
//! over_quota: report                         # the host's backstop: `report` (default) or `kill` the newest process
//! devices:
//!   - uuid: GPU-5e0f0c5a-...                 # or `index: 0` (host index)
//!     memory_limit: 7680MiB                  # bytes, or a number with a unit
//!     core_limit: 30                         # percent of one card, 1-100
//!     core_mode: hard                        # `hard` or `soft`
//!     core_ceiling: 50                       # soft mode only: the most it may take when the card is idle
//! ```
//!
//! Unknown keys and bad values are errors that name the key. The schema is the one
//! source of truth for the shims, the device plugin and `vgpu run`.
//!
//! The file is read as hostile input: only a regular file is read (a FIFO or device is
//! refused without blocking on it), at most [`MAX_CONFIG_BYTES`], nested at most
//! [`MAX_CONFIG_DEPTH`] levels (the YAML parser takes quadratic time in the nesting), and
//! an empty file is an error (a half-written config must not read as "no devices").

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::size::ByteSize;

/// Env var naming the config file.
pub const CONFIG_ENV: &str = "VGPU_CONFIG";
/// Where the config lives when `VGPU_CONFIG` is not set.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vgpu/vgpu.yaml";
/// Env var that overrides `driver_dir`.
pub const DRIVER_DIR_ENV: &str = "VGPU_DRIVER_DIR";
/// Where the real driver libraries are when neither the config nor the env says.
pub const DEFAULT_DRIVER_DIR: &str = "/usr/local/vgpu/driver/lib64";
/// File name of the usage region when the config does not name one.
pub const DEFAULT_REGION_NAME: &str = "usage.region";
/// The largest config file read (1 MiB; a real one is a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The deepest nesting accepted: flow collections (`[`, `{`) inside each other, and block
/// indentation in columns (four levels of the schema take 4).
pub const MAX_CONFIG_DEPTH: usize = 32;
/// The widest block indentation accepted, in columns.
pub const MAX_CONFIG_INDENT: usize = 128;

/// The most devices one container config may list.
pub const MAX_DEVICES: usize = 16;

/// How the compute limit treats idle capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CoreMode {
    /// Never above `core_limit`, even on an idle card.
    #[default]
    Hard,
    /// Up to `core_ceiling` while the card has idle capacity; `core_limit` under contention.
    Soft,
}

/// What 100% utilization means inside the container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UtilizationScale {
    /// Scaled to the core limit: a container at 30 cores that uses all 30 reads 100%.
    #[default]
    Limit,
    /// Percent of the whole card: the same container reads 30%.
    Card,
}

/// What the host does about a container whose processes hold more device memory than
/// its quota (the card's own per-process figures, checked by the coordinator each tick).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverQuota {
    /// A metric, a log line, a record for a Kubernetes Event; nothing is stopped.
    #[default]
    Report,
    /// That, and its newest process is killed (SIGKILL), as the kernel's OOM killer
    /// does, once the container has been over its quota for a second.
    Kill,
}

impl OverQuota {
    fn is_report(&self) -> bool {
        *self == OverQuota::Report
    }
}

/// Which physical card a config entry means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSelector {
    /// By UUID (`GPU-...`), as NVML and nvidia-smi print it.
    Uuid(String),
    /// By host index, counted in PCI order as nvidia-smi does.
    Index(u32),
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Uuid(uuid) => f.write_str(uuid),
            DeviceSelector::Index(index) => write!(f, "index {index}"),
        }
    }
}

/// One visible device and its quota, as written in YAML.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceQuota {
    /// The card by UUID (wins over `index`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The card by host index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Device memory the container may hold; `None` is the whole card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<ByteSize>,
    /// Percent of one card's SMs; `None` or 100 is no throttling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_limit: Option<u32>,
    /// `hard` (never above the limit) or `soft` (may use what the card has idle).
    #[serde(default)]
    pub core_mode: CoreMode,
    /// Soft mode's ceiling when the card is idle (gpu-manager's `vcuda-core-limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_ceiling: Option<u32>,
}

impl DeviceQuota {
    /// A device with no limits, selected by host index.
    pub fn unlimited_index(index: u32) -> DeviceQuota {
        DeviceQuota {
            uuid: None,
            index: Some(index),
            memory_limit: None,
            core_limit: None,
            core_mode: CoreMode::Hard,
            core_ceiling: None,
        }
    }

    /// The selector; valid after `Config::validate`.
    pub fn selector(&self) -> DeviceSelector {
        match (&self.uuid, self.index) {
            (Some(uuid), _) => DeviceSelector::Uuid(uuid.clone()),
            (None, Some(index)) => DeviceSelector::Index(index),
            (None, None) => DeviceSelector::Index(0),
        }
    }

    /// The effective core limit: `None` when compute is not throttled.
    pub fn effective_core_limit(&self) -> Option<u32> {
        self.core_limit.filter(|limit| *limit < 100)
    }
}

/// The whole container config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The container's identity (1-64 characters of `[A-Za-z0-9._-]`): the device plugin
    /// writes the allocation id, the DRA driver the claim uid and request, `vgpu run` a
    /// name derived from `--state-dir`. Compute coordination identifies a container by
    /// it, never by a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The folder of the real driver libraries (`VGPU_DRIVER_DIR` and a default
    /// otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_dir: Option<PathBuf>,
    /// The container's usage region (relative: beside the config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_region: Option<PathBuf>,
    /// The host-owned folder of card views the compute limiter reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card_state_dir: Option<PathBuf>,
    /// Count allocations past the quota instead of refusing them.
    #[serde(default)]
    pub memory_oversubscribe: bool,
    /// How NVML's utilization is scaled for the container.
    #[serde(default)]
    pub utilization_scale: UtilizationScale,
    /// The shims write one warning line to stderr when they refuse an allocation at the
    /// quota (the quota, the size asked, what the container holds; at most one line a
    /// second per process), whatever `VGPU_LOG` says. The device plugin sets it for the
    /// namespaces its `warn_on_refusal_namespaces` names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warn_on_refusal: bool,
    /// What the host does when the container's processes hold more than its quota
    /// (`report`, the default, or `kill`); the shims do not read it.
    #[serde(default, skip_serializing_if = "OverQuota::is_report")]
    pub over_quota: OverQuota,
    /// The devices the container may use, in the order it sees them.
    #[serde(default)]
    pub devices: Vec<DeviceQuota>,
}

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (or is not a regular file of a sane size).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not YAML of the config's schema.
    #[error("{path}: {message}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// The config parses but a value is out of range.
    #[error("{path}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// Which value, and why.
        message: String,
    },
}

/// What `Config::load_from_env` found.
#[derive(Debug)]
pub enum Loaded {
    /// A valid config, and the file it came from.
    Found(Config, PathBuf),
    /// No `VGPU_CONFIG` and nothing at the default path: the shims forward with no quota.
    Absent,
}

impl Config {
    /// Parses and validates YAML text; `path` only labels errors.
    pub fn from_yaml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = serde_saphyr::from_str(text).map_err(|err| ConfigError::Parse {
            path: path.to_path_buf(),
            // One line (a location, no source snippet): it goes to a tenant's stderr.
            message: err.without_snippet().to_string(),
        })?;
        config.validate().map_err(|message| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        })?;
        Ok(config)
    }

    /// Reads one file: a regular file (refused without blocking otherwise), at most
    /// [`MAX_CONFIG_BYTES`], not empty, nested at most [`MAX_CONFIG_DEPTH`] levels.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let read_error = |source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let access = crate::mapped::Access {
            write: false,
            create: false,
            follow_links: true,
        };
        let file = crate::mapped::open_regular(path, access).map_err(read_error)?;
        let mut bytes = Vec::new();
        std::io::Read::take(&file, MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(invalid(format!(
                "more than {MAX_CONFIG_BYTES} bytes; a config is a few hundred"
            )));
        }
        let text = String::from_utf8(bytes).map_err(|_| invalid("not UTF-8 text".into()))?;
        if text.trim().is_empty() {
            return Err(invalid("the file is empty".into()));
        }
        check_nesting(&text).map_err(invalid)?;
        Config::from_yaml(&text, path)
    }

    /// Reads the file named by `VGPU_CONFIG`, or the default path.
    ///
    /// A `VGPU_CONFIG` that names a missing file is an error; a missing default file is
    /// `Loaded::Absent`.
    pub fn load_from_env() -> Result<Loaded, ConfigError> {
        match std::env::var_os(CONFIG_ENV).filter(|value| !value.is_empty()) {
            Some(path) => {
                let path = PathBuf::from(path);
                Config::load(&path).map(|config| Loaded::Found(config, path))
            }
            None => {
                let path = PathBuf::from(DEFAULT_CONFIG_PATH);
                match std::fs::metadata(&path) {
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Loaded::Absent),
                    _ => Config::load(&path).map(|config| Loaded::Found(config, path)),
                }
            }
        }
    }

    /// Checks the values serde cannot: ranges, exactly one selector, no duplicates.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(id) = &self.container_id {
            validate_container_id(id).map_err(|why| format!("container_id: {why}"))?;
        }
        if self.devices.len() > MAX_DEVICES {
            return Err(format!(
                "devices: {} listed, at most {MAX_DEVICES} are supported",
                self.devices.len()
            ));
        }
        for (position, device) in self.devices.iter().enumerate() {
            let at = format!("devices[{position}]");
            match (&device.uuid, device.index) {
                (Some(_), Some(_)) => {
                    return Err(format!("{at}: give `uuid` or `index`, not both"));
                }
                (None, None) => return Err(format!("{at}: needs `uuid` or `index`")),
                (Some(uuid), None) if uuid.trim().is_empty() => {
                    return Err(format!("{at}.uuid: empty"));
                }
                _ => {}
            }
            if let Some(limit) = device.memory_limit
                && limit.bytes() == 0
            {
                return Err(format!("{at}.memory_limit: must be more than 0 bytes"));
            }
            if let Some(limit) = device.core_limit
                && !(1..=100).contains(&limit)
            {
                return Err(format!("{at}.core_limit: {limit} is outside 1-100"));
            }
            if let Some(ceiling) = device.core_ceiling {
                if !(1..=100).contains(&ceiling) {
                    return Err(format!("{at}.core_ceiling: {ceiling} is outside 1-100"));
                }
                if device.core_mode != CoreMode::Soft {
                    return Err(format!(
                        "{at}.core_ceiling: only meaningful with core_mode: soft"
                    ));
                }
                if ceiling < device.core_limit.unwrap_or(100) {
                    return Err(format!("{at}.core_ceiling: {ceiling} is below core_limit"));
                }
            }
            let selector = device.selector();
            if self.devices[..position]
                .iter()
                .any(|other| other.selector() == selector)
            {
                return Err(format!("{at}: {selector} is listed twice"));
            }
        }
        Ok(())
    }

    /// The config as YAML, for writers (`vgpu run`, the device plugin).
    pub fn to_yaml(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_saphyr::to_string(self).unwrap_or_default()
    }

    /// The real driver folder: `VGPU_DRIVER_DIR`, else `driver_dir`, else the default.
    pub fn resolved_driver_dir(config: Option<&Config>) -> PathBuf {
        if let Some(dir) = std::env::var_os(DRIVER_DIR_ENV).filter(|value| !value.is_empty()) {
            return PathBuf::from(dir);
        }
        config
            .and_then(|config| config.driver_dir.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DRIVER_DIR))
    }

    /// The devices as the usage region records them (the same for every writer, so the
    /// CUDA shim, the NVML shim and the host daemon all attach to one region).
    pub fn region_devices(&self) -> Vec<crate::region::RegionDevice> {
        self.devices
            .iter()
            .map(|device| crate::region::RegionDevice {
                id: match device.selector() {
                    DeviceSelector::Uuid(uuid) => uuid,
                    DeviceSelector::Index(index) => format!("index:{index}"),
                },
                memory_limit: device.memory_limit.map(|limit| limit.bytes()).unwrap_or(0),
                core_limit: device.effective_core_limit().unwrap_or(0),
                core_mode: (device.core_mode == CoreMode::Soft) as u32,
            })
            .collect()
    }

    /// The usage region's path: `usage_region`, else `usage.region` beside the config file.
    pub fn resolved_region_path(&self, config_path: &Path) -> PathBuf {
        self.usage_region.clone().unwrap_or_else(|| {
            config_path
                .parent()
                .unwrap_or_else(|| Path::new("/"))
                .join(DEFAULT_REGION_NAME)
        })
    }
}

/// Refuses YAML nested deeper than [`MAX_CONFIG_DEPTH`] flow levels or indented more
/// than [`MAX_CONFIG_INDENT`] columns (counting `- ` markers that open a block sequence
/// on the same line), before the parser spends quadratic time on it. Quoted scalars and
/// comments are skipped.
fn check_nesting(text: &str) -> Result<(), String> {
    let mut flow = 0usize;
    for (number, line) in text.lines().enumerate() {
        let at = || format!("line {}", number + 1);
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let mut rest = &line[indent..];
        let mut columns = indent;
        while let Some(after) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("? ")) {
            columns += 2;
            rest = after.trim_start_matches(' ');
        }
        if columns > MAX_CONFIG_INDENT {
            return Err(format!(
                "{}: nested {columns} columns deep, more than {MAX_CONFIG_INDENT}",
                at()
            ));
        }
        let mut quote: Option<char> = None;
        let mut previous = ' ';
        for c in line.chars() {
            match (quote, c) {
                (Some(open), c) if c == open => quote = None,
                (Some(_), _) => {}
                (None, '#') if previous.is_whitespace() => break,
                (None, '"' | '\'') => quote = Some(c),
                (None, '[' | '{') => {
                    flow += 1;
                    if flow > MAX_CONFIG_DEPTH {
                        return Err(format!(
                            "{}: nested more than {MAX_CONFIG_DEPTH} levels deep",
                            at()
                        ));
                    }
                }
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
            previous = c;
        }
    }
    Ok(())
}

/// The longest `container_id`.
pub const MAX_CONTAINER_ID_LEN: usize = 64;

/// Whether `id` is a valid `container_id`: 1-64 characters of `[A-Za-z0-9._-]`.
pub fn validate_container_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_CONTAINER_ID_LEN {
        return Err(format!(
            "`{id}` has {} characters, expected 1-{MAX_CONTAINER_ID_LEN}",
            id.len()
        ));
    }
    match id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(bad) => Err(format!(
            "`{id}` holds {bad:?}; only A-Z, a-z, 0-9, `.`, `_` and `-` are allowed"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(text, Path::new("test.yaml"))
    }

    #[test]
    fn full_schema_round_trips() {
        let config = parse(
            "driver_dir: /drv\nutilization_scale: card\ndevices:\n  - uuid: GPU-1\n    memory_limit: 7680MiB\n    core_limit: 30\n    core_mode: soft\n    core_ceiling: 50\n  - index: 1\n    memory_limit: 1073741824\n",
        )
        .expect("valid config");
        assert_eq!(config.driver_dir.as_deref(), Some(Path::new("/drv")));
        assert_eq!(config.devices[0].memory_limit, Some(ByteSize::mib(7680)));
        assert_eq!(config.devices[0].core_mode, CoreMode::Soft);
        assert_eq!(config.devices[1].selector(), DeviceSelector::Index(1));
        assert_eq!(config.devices[1].memory_limit, Some(ByteSize::gib(1)));
        assert_eq!(config.utilization_scale, UtilizationScale::Card);
        let again = parse(&config.to_yaml()).expect("re-parse");
        assert_eq!(again, config);
    }

    #[test]
    fn container_ids_are_checked() {
        let config = parse("container_id: alloc-12.a_b\n").expect("valid id");
        assert_eq!(config.container_id.as_deref(), Some("alloc-12.a_b"));
        for bad in ["\"\"", "a/b", "\"with space\"", &"x".repeat(65)] {
            let err = parse(&format!("container_id: {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("container_id"), "{bad}: {err}");
        }
        assert!(validate_container_id(&"x".repeat(64)).is_ok());
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse("devices:\n  - index: 0\n    memory_limt: 1GiB\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory_limt"), "{err}");
        let err = parse("drivr_dir: /x\n").unwrap_err().to_string();
        assert!(err.contains("drivr_dir"), "{err}");
    }

    #[test]
    fn bad_values_are_refused() {
        for (text, needle) in [
            ("devices:\n  - index: 0\n    core_limit: 0\n", "core_limit"),
            (
                "devices:\n  - index: 0\n    core_limit: 101\n",
                "core_limit",
            ),
            ("devices:\n  - index: 0\n    core_mode: medium\n", "medium"),
            (
                "devices:\n  - index: 0\n    memory_limit: 4 parsecs\n",
                "parsecs",
            ),
            (
                "devices:\n  - index: 0\n    memory_limit: 0\n",
                "memory_limit",
            ),
            ("devices:\n  - {}\n", "uuid"),
            ("devices:\n  - index: 0\n    uuid: GPU-1\n", "not both"),
            ("devices:\n  - index: 0\n  - index: 0\n", "twice"),
            ("devices:\n  - index: 0\n    core_ceiling: 50\n", "soft"),
        ] {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(needle), "{text:?} gave {err}");
        }
    }

    #[test]
    fn container_id_is_validated() {
        let config = parse("container_id: alloc-3f2a.9c_1\n").expect("valid id");
        assert_eq!(config.container_id.as_deref(), Some("alloc-3f2a.9c_1"));
        assert_eq!(parse(&config.to_yaml()).expect("re-parse"), config);
        let long = format!("container_id: {}\n", "a".repeat(65));
        for text in [
            "container_id: \"\"\n",
            "container_id: a/b\n",
            "container_id: \"a b\"\n",
            long.as_str(),
        ] {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains("container_id"), "{text:?} gave {err}");
        }
        assert!(parse(&format!("container_id: {}\n", "a".repeat(64))).is_ok());
    }

    #[test]
    fn files_are_read_as_hostile_input() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo.yaml");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        let err = Config::load(&fifo)
            .expect_err("a FIFO is refused")
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "no hang"
        );
        let empty = dir.path().join("empty.yaml");
        std::fs::write(&empty, "  \n\n").expect("write");
        let err = Config::load(&empty).expect_err("empty").to_string();
        assert!(err.contains("empty") && err.contains("empty.yaml"), "{err}");
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, format!("devices: []\n#{}\n", "x".repeat(1 << 20))).expect("write");
        let err = Config::load(&big).expect_err("too big").to_string();
        assert!(err.contains("more than 1048576 bytes"), "{err}");
        let good = dir.path().join("good.yaml");
        std::fs::write(&good, "devices:\n  - index: 0\n    memory_limit: 1Gi\n").expect("write");
        assert_eq!(Config::load(&good).expect("valid").devices.len(), 1);
    }

    #[test]
    fn deep_nesting_is_refused_before_the_parser_sees_it() {
        let deep_flow = format!("devices: {}{}\n", "[".repeat(200_000), "]".repeat(200_000));
        let started = std::time::Instant::now();
        let err = parse_checked(&deep_flow).expect_err("deep flow");
        assert!(err.contains("nested more than 32 levels"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_millis(500));
        let dashes = format!("devices:\n{}x\n", "- ".repeat(100));
        assert!(
            parse_checked(&dashes)
                .expect_err("dashes")
                .contains("columns deep")
        );
        let mut block = String::from("devices:\n");
        for level in 1..200 {
            block.push_str(&" ".repeat(level));
            block.push_str("a:\n");
        }
        assert!(
            parse_checked(&block)
                .expect_err("block")
                .contains("columns deep")
        );
        // Brackets in quotes and comments do not count; a normal config passes.
        let fine = "devices: # [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n  - uuid: \"GPU-[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"\n    memory_limit: 1Gi\n";
        assert!(check_nesting(fine).is_ok());
        assert!(check_nesting("devices: [{index: 0, memory_limit: 1Gi}]\n").is_ok());
    }

    /// `check_nesting` then `from_yaml`, as `load` does.
    fn parse_checked(text: &str) -> Result<Config, String> {
        check_nesting(text)?;
        parse(text).map_err(|err| err.to_string())
    }

    #[test]
    fn region_defaults_beside_config() {
        let config = Config::default();
        assert_eq!(
            config.resolved_region_path(Path::new("/etc/vgpu/vgpu.yaml")),
            PathBuf::from("/etc/vgpu/usage.region")
        );
    }
}
