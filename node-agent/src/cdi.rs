//! CDI (Container Device Interface) specs for what a daemon (the device plugin or the
//! DRA driver) hands a container: one
//! spec file per allocation, holding one device whose container edits are the
//! allocation's mounts, env and device nodes, so a CDI-aware runtime (containerd,
//! CRI-O, podman) applies exactly what the Allocate response would otherwise carry.
//!
//! * [`SpecWriter`] owns the spec files of one kind (`vendor/class`) in one folder
//!   (default [`DEFAULT_SPEC_DIR`]): [`SpecWriter::write`] replaces a device's file
//!   atomically (temp file, fsync, rename: a runtime's spec cache never reads half a
//!   file, and ignores the temp name, which ends neither `.json` nor `.yaml`) and
//!   returns the fully-qualified name `vendor/class=name`; [`SpecWriter::remove`]
//!   deletes it; [`SpecWriter::names`] lists the devices that have a file (for GC).
//! * [`ContainerEdits`], [`DeviceNode`] and [`Mount`] are the CDI document's own
//!   shapes; [`DeviceNode::from_host`] fills type, major and minor from the host node.
//! * The file's `cdiVersion` is the lowest version that covers what it uses (0.3.0, or
//!   0.5.0 once a device node's host path differs from its container path or a name
//!   starts with a digit), as the CDI library's minimum-version rule computes it: a
//!   runtime whose CDI library predates a newer version (podman 4.3 reads up to 0.5.0)
//!   refuses a spec that names one, even when it uses nothing of it.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where runtimes look for generated (dynamic) specs.
pub const DEFAULT_SPEC_DIR: &str = "/var/run/cdi";

/// How spec files are encoded (CDI readers take both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecFormat {
    /// `<name>.json` (config value `json`); the default.
    #[default]
    Json,
    /// `<name>.yaml` (config value `yaml`).
    Yaml,
}

impl SpecFormat {
    fn extension(self) -> &'static str {
        match self {
            SpecFormat::Json => "json",
            SpecFormat::Yaml => "yaml",
        }
    }
}

/// Why a spec could not be written, removed or named.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// The kind is not `vendor/class` as CDI names them.
    #[error("CDI kind `{kind}`: {reason}")]
    BadKind {
        /// The kind as given.
        kind: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The device name is empty or has characters CDI does not allow.
    #[error("CDI device name `{name}`: {reason}")]
    BadName {
        /// The name as given.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The container edits are invalid (a relative path, a malformed env entry).
    #[error("CDI edits of `{name}`: {reason}")]
    BadEdits {
        /// The device whose edits they are.
        name: String,
        /// The offending entry.
        reason: String,
    },
    /// A path given as a device node is neither a character nor a block device.
    #[error("{0} is not a device node")]
    NotDevice(PathBuf),
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done (`cannot read`, `cannot stat device node`, ...).
        action: &'static str,
        /// The file it was done to.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// One device node of a spec (`containerEdits.deviceNodes[]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host, when it differs from `path` (CDI 0.5.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` or `b`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    /// The device's major number; `None`: the runtime reads it from the host node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// The device's minor number; `None` as for `major`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Cgroup access: some of `r`, `w`, `m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

impl DeviceNode {
    /// The host node at `host_path`, seen at `container_path`: its type and numbers
    /// come from the host (runtimes then need not stat it again).
    pub fn from_host(
        container_path: &str,
        host_path: &Path,
        permissions: &str,
    ) -> Result<DeviceNode, CdiError> {
        let meta = std::fs::metadata(host_path).map_err(|source| CdiError::Io {
            action: "cannot stat device node",
            path: host_path.to_path_buf(),
            source,
        })?;
        let node_type = if meta.file_type().is_char_device() {
            "c"
        } else if meta.file_type().is_block_device() {
            "b"
        } else {
            return Err(CdiError::NotDevice(host_path.to_path_buf()));
        };
        let rdev = meta.rdev();
        let host = host_path.to_string_lossy().into_owned();
        Ok(DeviceNode {
            path: container_path.to_string(),
            host_path: (host != container_path).then_some(host),
            node_type: Some(node_type.into()),
            major: Some(i64::from(libc::major(rdev))),
            minor: Some(i64::from(libc::minor(rdev))),
            permissions: Some(permissions.into()),
        })
    }
}

/// One bind mount of a spec (`containerEdits.mounts[]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// `hostPath`: the absolute host path mounted.
    pub host_path: String,
    /// `containerPath`: the absolute path it appears at in the container.
    pub container_path: String,
    /// `options`: mount(8) options (`ro`/`rw`, `nosuid`, `nodev`, `bind`); empty leaves
    /// the runtime's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Mount {
    /// A bind mount of `host_path` at `container_path`, without setuid or device files.
    pub fn bind(host_path: &Path, container_path: &str, read_only: bool) -> Mount {
        let mut options = vec![if read_only { "ro" } else { "rw" }.to_string()];
        options.extend(["nosuid", "nodev", "bind"].map(String::from));
        Mount {
            host_path: host_path.to_string_lossy().into_owned(),
            container_path: container_path.to_string(),
            options,
        }
    }

    /// Whether the mount is read-only.
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|option| option == "ro")
    }
}

/// What a runtime changes in the container (`containerEdits`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `KEY=VALUE`, sorted by key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// `deviceNodes`: nodes the runtime creates in the container and allows in its
    /// device cgroup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// `mounts`: bind mounts the runtime adds (it replaces one at the same container
    /// path).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    /// Sets `env` from a map (one entry per key, sorted).
    pub fn set_env(&mut self, env: &BTreeMap<String, String>) {
        self.env = env
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
    }

    /// The env as a map.
    pub fn env_map(&self) -> BTreeMap<String, String> {
        self.env
            .iter()
            .filter_map(|entry| entry.split_once('='))
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    fn check(&self, name: &str) -> Result<(), CdiError> {
        let bad = |reason: String| CdiError::BadEdits {
            name: name.to_string(),
            reason,
        };
        for entry in &self.env {
            match entry.split_once('=') {
                Some((key, _)) if !key.is_empty() => {}
                _ => return Err(bad(format!("env entry `{entry}` is not KEY=VALUE"))),
            }
        }
        let absolute = |path: &str| path.starts_with('/');
        for node in &self.device_nodes {
            if !absolute(&node.path) || node.host_path.as_deref().is_some_and(|p| !absolute(p)) {
                return Err(bad(format!(
                    "device node `{}` needs absolute paths",
                    node.path
                )));
            }
        }
        for mount in &self.mounts {
            if !absolute(&mount.container_path) || !absolute(&mount.host_path) {
                return Err(bad(format!(
                    "mount `{}` => `{}` needs absolute paths",
                    mount.host_path, mount.container_path
                )));
            }
        }
        Ok(())
    }
}

/// One device of a spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// `devices[].name`: the device's name within its kind (the allocation or container
    /// id), the part after `=` of the fully-qualified name.
    pub name: String,
    /// `devices[].containerEdits`: what naming this device does to a container.
    pub container_edits: ContainerEdits,
}

/// A whole spec file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// `cdiVersion`: the lowest CDI version whose schema covers the spec (see
    /// [`Spec::minimum_version`]), so older runtimes read it.
    pub cdi_version: String,
    /// `kind`: `vendor/class`, the part before `=` of every device's qualified name.
    pub kind: String,
    /// `devices`: the spec's devices (one per file here).
    pub devices: Vec<Device>,
}

impl Spec {
    /// The lowest `cdiVersion` whose schema covers this spec.
    pub fn minimum_version(&self) -> &'static str {
        let needs_0_5 = self.devices.iter().any(|device| {
            device.name.starts_with(|c: char| c.is_ascii_digit())
                || device.container_edits.device_nodes.iter().any(|node| {
                    node.host_path
                        .as_ref()
                        .is_some_and(|host| *host != node.path)
                })
        });
        if needs_0_5 { "0.5.0" } else { "0.3.0" }
    }

    /// Reads a spec file (JSON or YAML, by its extension).
    pub fn load(path: &Path) -> Result<Spec, CdiError> {
        let text = std::fs::read_to_string(path).map_err(|source| CdiError::Io {
            action: "cannot read",
            path: path.to_path_buf(),
            source,
        })?;
        let parsed = if path.extension().is_some_and(|ext| ext == "yaml") {
            serde_saphyr::from_str(&text).map_err(|err| err.without_snippet().to_string())
        } else {
            serde_json::from_str(&text).map_err(|err| err.to_string())
        };
        parsed.map_err(|reason| CdiError::Io {
            action: "cannot parse",
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
        })
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// CDI's rule for a vendor (`tencent.com`) or class (`vcuda`) segment: starts with a
/// letter, ends with a letter or digit, and holds letters, digits and `extra` between.
/// One-character classes are refused as well: podman 4.3's parser crashes on them.
fn check_segment(segment: &str, extra: &[char], what: &str) -> Result<(), String> {
    let mut chars = segment.chars();
    let first = chars.next().ok_or_else(|| format!("empty {what}"))?;
    if !first.is_ascii_alphabetic() {
        return Err(format!("{what} `{segment}` must start with a letter"));
    }
    if segment.len() < 2 {
        return Err(format!(
            "{what} `{segment}` must be at least two characters"
        ));
    }
    if !segment.ends_with(is_alnum) {
        return Err(format!(
            "{what} `{segment}` must end with a letter or digit"
        ));
    }
    if let Some(bad) = segment
        .chars()
        .find(|c| !is_alnum(*c) && !extra.contains(c))
    {
        return Err(format!("{what} `{segment}` may not contain `{bad}`"));
    }
    Ok(())
}

/// Checks a CDI kind `vendor/class`; returns (vendor, class).
pub fn parse_kind(kind: &str) -> Result<(String, String), CdiError> {
    let bad = |reason: String| CdiError::BadKind {
        kind: kind.to_string(),
        reason,
    };
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| bad("must be vendor/class, e.g. tencent.com/vcuda".into()))?;
    check_segment(vendor, &['.', '-', '_'], "vendor").map_err(bad)?;
    check_segment(class, &['-', '_'], "class").map_err(bad)?;
    Ok((vendor.to_string(), class.to_string()))
}

/// Checks a CDI device name: letters, digits, `_ . : -`, starting and ending with a
/// letter or digit.
pub fn check_device_name(name: &str) -> Result<(), CdiError> {
    let bad = |reason: &str| CdiError::BadName {
        name: name.to_string(),
        reason: reason.into(),
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if !name.starts_with(is_alnum) || !name.ends_with(is_alnum) {
        return Err(bad("must start and end with a letter or digit"));
    }
    if name
        .chars()
        .any(|c| !is_alnum(c) && !matches!(c, '_' | '.' | ':' | '-'))
    {
        return Err(bad("may hold only letters, digits and _ . : -"));
    }
    Ok(())
}

/// The spec files of one kind in one folder.
#[derive(Clone, Debug)]
pub struct SpecWriter {
    dir: PathBuf,
    kind: String,
    file_prefix: String,
    format: SpecFormat,
}

impl SpecWriter {
    /// A writer for `kind` (`vendor/class`) in `dir`.
    pub fn new(dir: &Path, kind: &str, format: SpecFormat) -> Result<SpecWriter, CdiError> {
        let (vendor, class) = parse_kind(kind)?;
        Ok(SpecWriter {
            dir: dir.to_path_buf(),
            kind: kind.to_string(),
            file_prefix: format!("{vendor}-{class}_"),
            format,
        })
    }

    /// The kind, `vendor/class`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// `vendor/class=name`.
    pub fn qualified_name(&self, name: &str) -> String {
        format!("{}={name}", self.kind)
    }

    /// The spec file of device `name`: `<dir>/<vendor>-<class>_<name>.<json|yaml>`.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(format!(
            "{}{name}.{}",
            self.file_prefix,
            self.format.extension()
        ))
    }

    /// Writes (or replaces) the spec of device `name`; returns its qualified name.
    pub fn write(&self, name: &str, edits: &ContainerEdits) -> Result<String, CdiError> {
        check_device_name(name)?;
        edits.check(name)?;
        let mut spec = Spec {
            cdi_version: String::new(),
            kind: self.kind.clone(),
            devices: vec![Device {
                name: name.to_string(),
                container_edits: edits.clone(),
            }],
        };
        spec.cdi_version = spec.minimum_version().to_string();
        let bytes = match self.format {
            SpecFormat::Json => serde_json::to_vec_pretty(&spec).map_err(|err| err.to_string()),
            SpecFormat::Yaml => serde_saphyr::to_string(&spec)
                .map(String::into_bytes)
                .map_err(|err| err.to_string()),
        }
        .map_err(|reason| CdiError::BadEdits {
            name: name.to_string(),
            reason,
        })?;
        let path = self.path_of(name);
        crate::persist::write_atomically(&path, &bytes).map_err(|err| CdiError::Io {
            action: "cannot write",
            path: path.clone(),
            source: std::io::Error::other(err.to_string()),
        })?;
        Ok(self.qualified_name(name))
    }

    /// Removes the spec of device `name`; false when there was none.
    pub fn remove(&self, name: &str) -> Result<bool, CdiError> {
        if check_device_name(name).is_err() {
            return Ok(false);
        }
        let path = self.path_of(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(CdiError::Io {
                action: "cannot remove",
                path,
                source,
            }),
        }
    }

    /// Devices of this writer's kind that have a spec file in the folder (in either
    /// format); a missing folder has none.
    pub fn names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter_map(|file| {
                let rest = file.strip_prefix(&self.file_prefix)?;
                let name = rest
                    .strip_suffix(".json")
                    .or_else(|| rest.strip_suffix(".yaml"))?;
                check_device_name(name).is_ok().then(|| name.to_string())
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edits(host: &Path) -> ContainerEdits {
        let mut edits = ContainerEdits {
            mounts: vec![
                Mount::bind(&host.join("vgpu.yaml"), "/etc/vgpu/vgpu.yaml", true),
                Mount::bind(&host.join("usage.region"), "/etc/vgpu/usage.region", false),
            ],
            ..ContainerEdits::default()
        };
        edits.set_env(&BTreeMap::from([
            ("VGPU_CONFIG".to_string(), "/etc/vgpu/vgpu.yaml".to_string()),
            ("A".to_string(), "b=c".to_string()),
        ]));
        edits
    }

    #[test]
    fn writes_one_spec_per_device_atomically_and_removes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec_dir = dir.path().join("cdi");
        let writer =
            SpecWriter::new(&spec_dir, "tencent.com/vcuda", SpecFormat::Json).expect("kind");
        let name = writer.write("a18f-3", &edits(dir.path())).expect("write");
        assert_eq!(name, "tencent.com/vcuda=a18f-3");
        let path = spec_dir.join("tencent.com-vcuda_a18f-3.json");
        assert_eq!(writer.path_of("a18f-3"), path);
        let spec = Spec::load(&path).expect("parse");
        assert_eq!(spec.kind, "tencent.com/vcuda");
        assert_eq!(
            spec.cdi_version, "0.3.0",
            "nothing here needs a newer schema"
        );
        assert_eq!(spec.devices.len(), 1);
        let device = &spec.devices[0];
        assert_eq!(device.name, "a18f-3");
        assert_eq!(
            device.container_edits.env,
            ["A=b=c", "VGPU_CONFIG=/etc/vgpu/vgpu.yaml"]
        );
        assert_eq!(device.container_edits.env_map()["A"], "b=c");
        let mounts = &device.container_edits.mounts;
        assert_eq!(mounts[0].options, ["ro", "nosuid", "nodev", "bind"]);
        assert!(mounts[0].read_only() && !mounts[1].read_only());
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        assert_eq!(raw["cdiVersion"], "0.3.0");
        assert_eq!(
            raw["devices"][0]["containerEdits"]["mounts"][1]["containerPath"],
            "/etc/vgpu/usage.region"
        );
        assert_eq!(
            raw["devices"][0]["containerEdits"]["mounts"][1]["hostPath"],
            dir.path().join("usage.region").to_str().unwrap()
        );
        let leftovers: Vec<_> = std::fs::read_dir(&spec_dir)
            .expect("dir")
            .flatten()
            .collect();
        assert_eq!(leftovers.len(), 1, "no temp file is left behind");
        writer.write("a18f-4", &edits(dir.path())).expect("second");
        assert_eq!(writer.names(), ["a18f-3", "a18f-4"]);
        assert!(writer.remove("a18f-3").expect("remove"));
        assert!(!writer.remove("a18f-3").expect("already gone"));
        assert_eq!(writer.names(), ["a18f-4"]);
        let other =
            SpecWriter::new(&spec_dir, "example.com/other", SpecFormat::Json).expect("kind");
        assert!(
            other.names().is_empty(),
            "another kind's files are not ours"
        );
    }

    #[test]
    fn yaml_specs_and_host_device_nodes_need_cdi_0_5() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writer =
            SpecWriter::new(dir.path(), "tencent.com/vcuda", SpecFormat::Yaml).expect("kind");
        let mut with_node = edits(dir.path());
        with_node.device_nodes.push(
            DeviceNode::from_host("/dev/nvidia0", Path::new("/dev/null"), "rw").expect("node"),
        );
        writer.write("a1-1", &with_node).expect("write");
        let spec = Spec::load(&dir.path().join("tencent.com-vcuda_a1-1.yaml")).expect("yaml");
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(node.host_path.as_deref(), Some("/dev/null"));
        assert_eq!(
            (node.node_type.as_deref(), node.major, node.minor),
            (Some("c"), Some(1), Some(3))
        );
        assert_eq!(spec.cdi_version, "0.5.0", "hostPath arrived in CDI 0.5.0");
        let same = DeviceNode::from_host("/dev/null", Path::new("/dev/null"), "rw").expect("node");
        assert_eq!(
            same.host_path, None,
            "no hostPath when it is the container path"
        );
        assert!(
            DeviceNode::from_host("/dev/x", dir.path(), "rw").is_err(),
            "a folder is no device"
        );
        assert_eq!(writer.names(), ["a1-1"]);
    }

    #[test]
    fn bad_kinds_names_and_edits_are_refused() {
        for kind in [
            "vcuda",
            "tencent.com/",
            "/vcuda",
            "tencent.com/x",
            "1tencent.com/vcuda",
            "tencent.com/v.cuda",
            "tencent.com-/vcuda",
        ] {
            assert!(
                matches!(
                    SpecWriter::new(Path::new("/tmp"), kind, SpecFormat::Json),
                    Err(CdiError::BadKind { .. })
                ),
                "{kind}"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let writer =
            SpecWriter::new(dir.path(), "tencent.com/vcuda", SpecFormat::Json).expect("kind");
        for name in ["", "-a", "a-", "a/b", "a=b", "a b"] {
            assert!(
                matches!(
                    writer.write(name, &ContainerEdits::default()),
                    Err(CdiError::BadName { .. })
                ),
                "{name:?}"
            );
        }
        let relative = ContainerEdits {
            mounts: vec![Mount::bind(Path::new("rel"), "/x", true)],
            ..ContainerEdits::default()
        };
        assert!(matches!(
            writer.write("a1", &relative),
            Err(CdiError::BadEdits { .. })
        ));
        let bad_env = ContainerEdits {
            env: vec!["=x".into()],
            ..ContainerEdits::default()
        };
        assert!(matches!(
            writer.write("a1", &bad_env),
            Err(CdiError::BadEdits { .. })
        ));
        assert!(writer.names().is_empty(), "refused specs leave no file");
        assert!(
            !writer
                .remove("../escape")
                .expect("bad names are never removed")
        );
    }
}
