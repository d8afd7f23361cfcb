//! The sharing config, the same keys in the device plugin's and the DRA driver's YAML:
//!
//! ```yaml
//! sharing: mps                  # this node's cards: time-slicing (default) or mps
//! card_sharing:                 # per card, by UUID or host index; overrides `sharing`
//!   GPU-5f1c9a8e-0000-4000-8000-000000000001: time-slicing
//!   "1": mps
//! mps:                          # used only where a card is in mps mode
//!   control: null               # nvidia-cuda-mps-control; default: <host_driver_dir>/current/bin, then PATH
//!   root: null                  # per-card folders; default: <state_dir>/mps
//!   compute_limiter: false      # the shims' time limiter on top of the MPS thread percentage
//!   multiuser: false            # start the daemons with --multiuser-server (drivers whose MPS has it)
//!   health_interval_ms: 2000    # how often each daemon is asked for its server list
//! ```
//!
//! Unknown keys and values are errors that name them. A `card_sharing` key that names
//! no card of the node is logged, not refused: one ConfigMap serves many nodes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How the containers on one card share it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// The driver time-slices between the containers' contexts (the default); the
    /// shims' limiter holds each container to its cores.
    #[default]
    TimeSlicing,
    /// The containers are clients of one MPS server per card and run at the same time
    /// on their share of the SMs (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`).
    Mps,
}

impl Sharing {
    /// The config spelling (`time-slicing`, `mps`).
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::TimeSlicing => "time-slicing",
            Sharing::Mps => "mps",
        }
    }
}

/// The `mps:` settings.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MpsSettings {
    /// `control`: the `nvidia-cuda-mps-control` binary; `None`: the prepared driver's
    /// `bin/`, then `PATH`.
    pub control: Option<PathBuf>,
    /// `root`: the folder of the per-card folders; `None`: `<state_dir>/mps`.
    pub root: Option<PathBuf>,
    /// `compute_limiter`: keep the shims' time-based compute limiter on top of the MPS
    /// thread percentage (default off: the percentage is the compute share, and the
    /// limiter's pauses are the latency this mode exists to remove).
    pub compute_limiter: bool,
    /// `multiuser`: start each daemon with `--multiuser-server`, so one server serves clients of
    /// every user (only drivers whose MPS knows the flag; the daemon then refuses to
    /// start on others, which the card's health shows).
    pub multiuser: bool,
    /// `health_interval_ms`: how often each daemon must answer `get_server_list`.
    pub health_interval_ms: u64,
}

impl Default for MpsSettings {
    fn default() -> MpsSettings {
        MpsSettings {
            control: None,
            root: None,
            compute_limiter: false,
            multiuser: false,
            health_interval_ms: 2000,
        }
    }
}

/// The node's sharing: the default and the per-card choices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharingConfig {
    /// `sharing`: every card not named in `cards`.
    pub default: Sharing,
    /// `card_sharing`: by UUID (`GPU-…`) or host index (`"0"`).
    pub cards: BTreeMap<String, Sharing>,
    /// `mps`.
    pub mps: MpsSettings,
}

impl SharingConfig {
    /// How the card `uuid` at host index `index` is shared: its UUID's entry, else its
    /// index's, else the node's default.
    pub fn of(&self, uuid: &str, index: u32) -> Sharing {
        self.cards
            .get(uuid)
            .or_else(|| self.cards.get(&index.to_string()))
            .copied()
            .unwrap_or(self.default)
    }

    /// Whether any card may be in MPS mode.
    pub fn any_mps(&self) -> bool {
        self.default == Sharing::Mps || self.cards.values().any(|s| *s == Sharing::Mps)
    }

    /// Checks the keys and values; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        for key in self.cards.keys() {
            let is_index = !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit());
            let is_uuid = (key.starts_with("GPU-") || key.starts_with("MIG-")) && key.len() > 4;
            if !is_index && !is_uuid {
                return Err(format!(
                    "card_sharing: `{key}` is neither a card UUID (GPU-…) nor a host index (\"0\")"
                ));
            }
        }
        if self.mps.health_interval_ms == 0 {
            return Err("mps.health_interval_ms: must be more than 0".into());
        }
        if let Some(control) = &self.mps.control
            && !control.is_absolute()
        {
            return Err(format!(
                "mps.control: `{}` must be an absolute path",
                control.display()
            ));
        }
        if let Some(root) = &self.mps.root
            && !root.is_absolute()
        {
            return Err(format!(
                "mps.root: `{}` must be an absolute path",
                root.display()
            ));
        }
        Ok(())
    }

    /// The `card_sharing` keys that name none of `cards` (UUID, index): to be logged.
    pub fn unknown_cards<'a>(&'a self, cards: &[(String, u32)]) -> Vec<&'a str> {
        self.cards
            .keys()
            .filter(|key| {
                !cards
                    .iter()
                    .any(|(uuid, index)| *key == uuid || **key == index.to_string())
            })
            .map(String::as_str)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        sharing: Sharing,
        #[serde(default)]
        card_sharing: BTreeMap<String, Sharing>,
        #[serde(default)]
        mps: MpsSettings,
    }

    fn parse(text: &str) -> Result<SharingConfig, String> {
        let doc: Doc = serde_saphyr::from_str(text).map_err(|err| err.to_string())?;
        let config = SharingConfig {
            default: doc.sharing,
            cards: doc.card_sharing,
            mps: doc.mps,
        };
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn the_module_example_parses_and_resolves_per_card() {
        let text: String = include_str!("sharing.rs")
            .lines()
            .skip_while(|line| !line.starts_with("//! ```yaml"))
            .skip(1)
            .take_while(|line| !line.starts_with("//! ```"))
            .map(|line| format!("{}\n", line.strip_prefix("//! ").unwrap_or("")))
            .collect();
        let config = parse(&text).expect("the documented example parses");
        assert_eq!(config.default, Sharing::Mps);
        assert_eq!(
            config.of("GPU-5f1c9a8e-0000-4000-8000-000000000001", 0),
            Sharing::TimeSlicing,
            "a UUID entry beats the default"
        );
        assert_eq!(config.of("GPU-other", 1), Sharing::Mps, "index entry");
        assert_eq!(config.of("GPU-other", 2), Sharing::Mps, "node default");
        assert!(!config.mps.compute_limiter);
        assert_eq!(config.mps.health_interval_ms, 2000);
        assert!(config.any_mps());
    }

    #[test]
    fn default_is_time_slicing_everywhere() {
        let config = parse("{}").expect("empty");
        assert_eq!(config.of("GPU-a", 0), Sharing::TimeSlicing);
        assert!(!config.any_mps());
        let config = parse("card_sharing: {\"3\": mps}").expect("one card");
        assert!(config.any_mps());
        assert_eq!(config.of("GPU-a", 3), Sharing::Mps);
        assert_eq!(config.of("GPU-a", 0), Sharing::TimeSlicing);
        assert_eq!(
            config.unknown_cards(&[("GPU-a".into(), 0)]),
            vec!["3"],
            "a key of another node's card is reported, not refused"
        );
    }

    #[test]
    fn bad_sharing_configs_name_the_key() {
        for (text, needle) in [
            ("sharing: spatial\n", "spatial"),
            ("sharing: MPS\n", "MPS"),
            ("card_sharing: {gpu0: mps}\n", "gpu0"),
            ("card_sharing: {\"0\": exclusive}\n", "exclusive"),
            ("mps: {limiter: true}\n", "limiter"),
            ("mps: {health_interval_ms: 0}\n", "health_interval_ms"),
            ("mps: {control: bin/mps}\n", "mps.control"),
            ("mps: {root: rel}\n", "mps.root"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(needle), "{text:?} gave {err}");
        }
    }
}
