//! `VGPU_LOG`, the one logging setting of every vgpu-shim component, and its one parser.
//! The shims and the simulated driver write lines to stderr at the level it names (and
//! nothing when it names none); the daemons hand the level to their tracing subscriber
//! as its filter directive (`Level::directive`).
//!
//! A value is one of `off` (also `0`, `none`), `error`, `warn` (`warning`), `info`,
//! `debug` (`1`) or `trace`, in any case, blanks around it ignored. Anything else, the
//! empty string included, names no level: each component then keeps its default (the
//! shims and the sim: off; the daemons: info).

/// The environment variable.
pub const VARIABLE: &str = "VGPU_LOG";

/// How much to log, from nothing to everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Nothing.
    Off,
    /// Failures only.
    Error,
    /// Failures and conditions worth a look.
    Warn,
    /// What a daemon does, one line per event.
    Info,
    /// What a shim decides, call by call.
    Debug,
    /// Everything the components can say.
    Trace,
}

impl Level {
    /// The level a `VGPU_LOG` value names, or `None` when it names none.
    pub fn parse(value: &str) -> Option<Level> {
        let value = value.trim();
        let named = |names: &[&str]| names.iter().any(|name| value.eq_ignore_ascii_case(name));
        if named(&["off", "0", "none"]) {
            Some(Level::Off)
        } else if named(&["error"]) {
            Some(Level::Error)
        } else if named(&["warn", "warning"]) {
            Some(Level::Warn)
        } else if named(&["info"]) {
            Some(Level::Info)
        } else if named(&["debug", "1"]) {
            Some(Level::Debug)
        } else if named(&["trace"]) {
            Some(Level::Trace)
        } else {
            None
        }
    }

    /// The level `VGPU_LOG` names in this process's environment, or `default` when it is
    /// unset or names none.
    pub fn from_env(default: Level) -> Level {
        std::env::var(VARIABLE)
            .ok()
            .and_then(|value| Level::parse(&value))
            .unwrap_or(default)
    }

    /// Whether a message of level `message` is written under this level.
    pub fn shows(self, message: Level) -> bool {
        message != Level::Off && message <= self
    }

    /// The level as a tracing filter directive (`off`, `error`, ... `trace`).
    pub fn directive(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_parses_and_anything_else_names_no_level() {
        for (value, level) in [
            ("off", Level::Off),
            ("0", Level::Off),
            ("None", Level::Off),
            ("error", Level::Error),
            ("WARN", Level::Warn),
            ("warning", Level::Warn),
            (" info\n", Level::Info),
            ("Debug", Level::Debug),
            ("1", Level::Debug),
            ("trace", Level::Trace),
        ] {
            assert_eq!(Level::parse(value), Some(level), "{value:?}");
        }
        for value in ["", "  ", "yes", "2", "vgpu_plugin=debug", "debug,info"] {
            assert_eq!(Level::parse(value), None, "{value:?}");
        }
    }

    #[test]
    fn a_level_shows_itself_and_everything_more_severe() {
        assert!(Level::Debug.shows(Level::Debug));
        assert!(Level::Debug.shows(Level::Error));
        assert!(!Level::Info.shows(Level::Debug));
        assert!(Level::Trace.shows(Level::Debug));
        assert!(!Level::Off.shows(Level::Error));
        assert!(
            !Level::Trace.shows(Level::Off),
            "nothing is logged at `off`"
        );
    }

    #[test]
    fn directives_round_trip() {
        for level in [
            Level::Off,
            Level::Error,
            Level::Warn,
            Level::Info,
            Level::Debug,
            Level::Trace,
        ] {
            assert_eq!(Level::parse(level.directive()), Some(level));
        }
    }
}
