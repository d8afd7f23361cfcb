//! What `/healthz` answers, for kubelet's liveness and readiness probes.
//!
//! A daemon (the device plugin or the DRA driver) is healthy when its supervisor is
//! alive (it finished a pass within [`ServingStatus::max_silence`]) and each of its
//! sockets is served and registered with the kubelet now listening (a kubelet restart
//! clears the registrations until the daemon registers again, within a second or so).
//! Anything else is unhealthy, with one line per reason: probes with a few failures of
//! slack ride out a kubelet restart, and a daemon stuck for longer is restarted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One resource's state.
struct ResourceStatus {
    name: String,
    served: AtomicBool,
    registered: AtomicBool,
}

/// The supervisor's view, shared with the metrics server.
pub struct ServingStatus {
    resources: Vec<ResourceStatus>,
    /// Milliseconds since the epoch at the supervisor's last pass (0: none yet).
    last_pass_ms: AtomicU64,
    max_silence: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

impl ServingStatus {
    /// The status of these resources; the supervisor passes every `tick`, so it counts
    /// as stuck after ten ticks, and never before 10 seconds.
    pub fn new(resources: &[String], tick: Duration) -> ServingStatus {
        ServingStatus {
            resources: resources
                .iter()
                .map(|name| ResourceStatus {
                    name: name.clone(),
                    served: AtomicBool::new(false),
                    registered: AtomicBool::new(false),
                })
                .collect(),
            last_pass_ms: AtomicU64::new(0),
            max_silence: (tick * 10).max(Duration::from_secs(10)),
        }
    }

    /// How long the supervisor may stay silent before it counts as stuck.
    pub fn max_silence(&self) -> Duration {
        self.max_silence
    }

    /// Records one supervisor pass: for each resource (in the order given to `new`),
    /// whether it is served and registered.
    pub fn record_pass(&self, states: &[(bool, bool)]) {
        for (status, (served, registered)) in self.resources.iter().zip(states) {
            status.served.store(*served, Ordering::Relaxed);
            status.registered.store(*registered, Ordering::Relaxed);
        }
        self.last_pass_ms.store(now_ms(), Ordering::Release);
    }

    /// `Ok` with a summary when healthy, else the reasons, one per line.
    pub fn verdict(&self) -> Result<String, String> {
        let mut problems = Vec::new();
        let last = self.last_pass_ms.load(Ordering::Acquire);
        let silence = Duration::from_millis(now_ms().saturating_sub(last));
        if last == 0 {
            problems.push("the supervisor has not finished a pass yet".to_string());
        } else if silence > self.max_silence {
            problems.push(format!(
                "the supervisor has been silent for {}s (more than {}s)",
                silence.as_secs(),
                self.max_silence.as_secs()
            ));
        }
        for status in &self.resources {
            if !status.served.load(Ordering::Relaxed) {
                problems.push(format!("{}: not served on its socket", status.name));
            } else if !status.registered.load(Ordering::Relaxed) {
                problems.push(format!("{}: not registered with kubelet", status.name));
            }
        }
        if problems.is_empty() {
            let names: Vec<&str> = self.resources.iter().map(|s| s.name.as_str()).collect();
            Ok(format!("ok: {} served and registered", names.join(", ")))
        } else {
            Err(problems.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_only_when_every_resource_is_served_and_registered() {
        let names = [
            "tencent.com/vcuda-core".to_string(),
            "tencent.com/vcuda-memory".to_string(),
        ];
        let status = ServingStatus::new(&names, Duration::from_millis(50));
        assert_eq!(status.max_silence(), Duration::from_secs(10));
        assert!(
            status
                .verdict()
                .unwrap_err()
                .contains("not finished a pass")
        );
        status.record_pass(&[(true, true), (true, false)]);
        let reasons = status.verdict().unwrap_err();
        assert_eq!(
            reasons,
            "tencent.com/vcuda-memory: not registered with kubelet"
        );
        status.record_pass(&[(false, false), (true, true)]);
        assert_eq!(
            status.verdict().unwrap_err(),
            "tencent.com/vcuda-core: not served on its socket"
        );
        status.record_pass(&[(true, true), (true, true)]);
        assert_eq!(
            status.verdict().unwrap(),
            "ok: tencent.com/vcuda-core, tencent.com/vcuda-memory served and registered"
        );
        // A supervisor silent for longer than allowed.
        status
            .last_pass_ms
            .store(now_ms() - 11_000, Ordering::Release);
        assert!(status.verdict().unwrap_err().contains("silent for 11s"));
    }
}
