//! Noticing that the plugin's config file changed (a ConfigMap update: kubelet swaps
//! the volume's `..data` link, so the file's content changes under the same path).
//!
//! What the plugin does about it is to stop cleanly and exit, so kubelet restarts the
//! container with the new config: every setting then takes effect the same way, the
//! allocations survive in the state file, and running containers are untouched. Reloading
//! some keys in place would leave others silently stale. A new config that does not
//! parse is reported and ignored (the plugin keeps running on the one it has), so a bad
//! edit never takes a node's plugin down.

use std::path::{Path, PathBuf};

use vgpu_node_agent::config::NodeConfig;

/// What a look at the file found.
#[derive(Debug)]
pub enum Change {
    /// The file says what the running config says (perhaps with other comments).
    None,
    /// A different valid config.
    Valid(Box<NodeConfig>),
    /// A new text that does not parse: the reason (reported once per text).
    Invalid(String),
    /// The file could not be read (out of descriptors, permissions, I/O): the reason,
    /// reported once until a read succeeds. Never taken for a missing file.
    Unreadable(String),
}

/// Watches one config file.
pub struct ConfigWatch {
    path: PathBuf,
    running: NodeConfig,
    last_text: Option<String>,
    /// The read error last reported, while reads keep failing.
    failing: Option<String>,
}

impl ConfigWatch {
    /// Loads the config at `path` and watches the file from the very text it was
    /// parsed from, so an edit made while the plugin starts is not missed. A missing
    /// file is the built-in defaults only when `missing_is_default` (the default path).
    pub fn load(
        path: &Path,
        missing_is_default: bool,
    ) -> anyhow::Result<(NodeConfig, ConfigWatch)> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && missing_is_default => None,
            Err(err) => anyhow::bail!("cannot read {}: {err}", path.display()),
        };
        let config = match &text {
            Some(text) => NodeConfig::from_yaml(text, path)?,
            None => NodeConfig::default(),
        };
        let watch = ConfigWatch {
            path: path.to_path_buf(),
            running: config.clone(),
            last_text: text,
            failing: None,
        };
        Ok((config, watch))
    }

    /// Reads the file again. Only a file that is not there (a ConfigMap key removed)
    /// means the built-in defaults; any other read error changes nothing.
    pub fn poll(&mut self) -> Change {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => Some(text),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            Err(err) => {
                let reason = format!("cannot read {}: {err}", self.path.display());
                if self.failing.as_ref() == Some(&reason) {
                    return Change::None;
                }
                self.failing = Some(reason.clone());
                return Change::Unreadable(reason);
            }
        };
        self.failing = None;
        if text == self.last_text {
            return Change::None;
        }
        self.last_text = text.clone();
        let parsed = match &text {
            Some(text) => NodeConfig::from_yaml(text, &self.path),
            // A ConfigMap key removed: back to the built-in defaults.
            None => Ok(NodeConfig::default()),
        };
        match parsed {
            Ok(config) if config == self.running => Change::None,
            Ok(config) => Change::Valid(Box::new(config)),
            Err(err) => Change::Invalid(format!("{err:#}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A ConfigMap volume: `plugin.yaml -> ..data/plugin.yaml`, `..data -> ..<stamp>`.
    fn publish(volume: &Path, stamp: &str, text: &str) {
        let folder = volume.join(format!("..{stamp}"));
        std::fs::create_dir_all(&folder).expect("mkdir");
        std::fs::write(folder.join("plugin.yaml"), text).expect("write");
        let staging = volume.join("..data_tmp");
        let _ = std::fs::remove_file(&staging);
        symlink(format!("..{stamp}"), &staging).expect("link");
        std::fs::rename(&staging, volume.join("..data")).expect("swap");
        let file = volume.join("plugin.yaml");
        if std::fs::symlink_metadata(&file).is_err() {
            symlink("..data/plugin.yaml", &file).expect("link");
        }
    }

    #[test]
    fn a_configmap_swap_is_seen_and_bad_or_equal_texts_are_not_changes() {
        let volume = tempfile::tempdir().expect("tempdir");
        publish(volume.path(), "1", "policy: binpack\n");
        let path = volume.path().join("plugin.yaml");
        let (running, mut watch) = ConfigWatch::load(&path, false).expect("valid");
        assert_eq!(running.policy, vgpu_node_agent::config::Policy::Binpack);
        assert!(matches!(watch.poll(), Change::None));
        // Same meaning, other text.
        publish(volume.path(), "2", "# comment\npolicy: binpack\n");
        assert!(matches!(watch.poll(), Change::None));
        // A broken edit: reported once, not acted on.
        publish(volume.path(), "3", "policy: sideways\n");
        match watch.poll() {
            Change::Invalid(reason) => assert!(reason.contains("sideways"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(watch.poll(), Change::None));
        // A real change.
        publish(volume.path(), "4", "policy: spread\n");
        match watch.poll() {
            Change::Valid(config) => {
                assert_eq!(config.policy, vgpu_node_agent::config::Policy::Spread)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_config_that_cannot_be_read_is_not_taken_for_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plugin.yaml");
        std::fs::write(&path, "policy: spread\n").expect("write");
        let (_, mut watch) = ConfigWatch::load(&path, false).expect("valid");
        // A read that fails (here EISDIR; in the field EMFILE when the process is out of
        // descriptors) is reported once and changes nothing.
        std::fs::remove_file(&path).expect("rm");
        std::fs::create_dir(&path).expect("mkdir");
        match watch.poll() {
            Change::Unreadable(reason) => assert!(reason.contains("cannot read"), "{reason}"),
            other => panic!("a read error was taken for a change: {other:?}"),
        }
        assert!(matches!(watch.poll(), Change::None), "reported once");
        // Readable again with the same text: still no change.
        std::fs::remove_dir(&path).expect("rmdir");
        std::fs::write(&path, "policy: spread\n").expect("write");
        assert!(matches!(watch.poll(), Change::None));
    }

    #[test]
    fn a_missing_file_is_the_defaults_only_where_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plugin.yaml");
        let (config, mut watch) = ConfigWatch::load(&path, true).expect("defaults");
        assert_eq!(config, NodeConfig::default());
        assert!(ConfigWatch::load(&path, false).is_err());
        std::fs::write(&path, "policy: spread\n").expect("write");
        assert!(matches!(watch.poll(), Change::Valid(_)));
    }
}
