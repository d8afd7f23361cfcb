//! What a card itself says it spent, for the host-side coordinator to check what the
//! containers measured (the time their kernels ran, and the memory their processes
//! hold: `crate::backstop`): [`CardMeter`], and with the `nvml` feature `NvmlMeter`,
//! which asks the real NVML (the device plugin, the DRA driver and `vgpu run` load it
//! from the driver folder).
//!
//! A container's limiter times its own kernels with CUDA events. On a card that
//! time-slices between processes (no MPS), those events also time the slices other
//! containers' processes ran in; the card's own accounting (NVML's per-process
//! utilization) does not. The coordinator compares the two.

/// What a card says about the last second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CardReading {
    /// Percent of the time one or more kernels ran on the card (NVML's utilization);
    /// `None` where it cannot say.
    pub card_percent: Option<f64>,
    /// Per process (by PID as the caller's namespace sees it), percent of the time its
    /// kernels ran; `None` where the card cannot say per process. Processes with no
    /// work may be missing.
    pub processes: Option<Vec<(u32, f64)>>,
    /// Why the card could not say (`None` when it said all it was asked).
    pub error: Option<String>,
}

/// How fresh a reading the coordinator needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// Several containers are busy on the card: their time-slice correction follows the
    /// card's split, so ask it now.
    Now,
    /// One container at most: the card serves only the slow check of launches that
    /// escape the limiter, and a reading a little old does.
    Relaxed,
}

/// A source of [`CardReading`]s, one card at a time.
pub trait CardMeter: Send {
    /// The reading of the card with UUID `uuid`, as fresh as `freshness` asks.
    fn read(&mut self, uuid: &str, freshness: Freshness) -> CardReading;

    /// What each process holds on card `uuid` now, `(PID as the caller's namespace sees
    /// it, bytes)`, for the memory backstop; `None` where the card cannot say.
    fn memory(&mut self, uuid: &str) -> Option<Vec<(u32, u64)>> {
        let _ = uuid;
        None
    }
}

/// Per-process samples (`(pid, percent)`, any number per process) folded into one
/// figure per process: the mean of its samples.
pub fn per_process(samples: impl IntoIterator<Item = (u32, f64)>) -> Vec<(u32, f64)> {
    let mut sums: Vec<(u32, f64, u32)> = Vec::new();
    for (pid, percent) in samples {
        let percent = percent.clamp(0.0, 100.0);
        match sums.iter_mut().find(|(seen, _, _)| *seen == pid) {
            Some((_, sum, count)) => {
                *sum += percent;
                *count += 1;
            }
            None => sums.push((pid, percent, 1)),
        }
    }
    sums.into_iter()
        .map(|(pid, sum, count)| (pid, sum / count as f64))
        .collect()
}

#[cfg(feature = "nvml")]
pub use nvml::NvmlMeter;

#[cfg(feature = "nvml")]
mod nvml {
    use std::path::Path;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use nvml_wrapper::Nvml;
    use nvml_wrapper::enums::device::UsedGpuMemory;
    use nvml_wrapper::error::NvmlError;

    use super::{CardMeter, CardReading, Freshness, per_process};

    /// Samples newer than this are asked for.
    const WINDOW: Duration = Duration::from_secs(1);
    /// With [`Freshness::Relaxed`], a card is asked at most this often; between, its last
    /// reading is given again. Its per-process query goes to the kernel driver; the
    /// limited launch loops of H200 run 8 read 1.07x and 1.30x bare with the card asked
    /// every 50 ms tick and 1.10x with it asked every 250 ms, noise of that size, so
    /// asking less is a precaution, not a measured gain. With several busy containers the
    /// card is asked every tick: a reading 250 ms old left the sim's soft fallback a
    /// second late.
    pub const RELAXED_EVERY: Duration = Duration::from_millis(500);

    /// A [`CardMeter`] over the real NVML (or the simulator's).
    pub struct NvmlMeter {
        nvml: Nvml,
        /// Per card: when it was last asked, and what it said.
        last: Vec<(String, Instant, CardReading)>,
    }

    impl NvmlMeter {
        /// Loads NVML from `library` (a path, or a name the loader finds).
        pub fn open(library: &Path) -> Result<NvmlMeter, NvmlError> {
            Ok(NvmlMeter {
                nvml: Nvml::builder().lib_path(library.as_os_str()).init()?,
                last: Vec::new(),
            })
        }

        /// What NVML says of card `uuid` now.
        fn ask(&self, uuid: &str) -> CardReading {
            let device = match self.nvml.device_by_uuid(uuid) {
                Ok(device) => device,
                Err(error) => {
                    return CardReading {
                        error: Some(format!("nvmlDeviceGetHandleByUUID: {error}")),
                        ..CardReading::default()
                    };
                }
            };
            let mut errors = Vec::new();
            let card_percent = device
                .utilization_rates()
                .map_err(|error| errors.push(format!("nvmlDeviceGetUtilizationRates: {error}")))
                .ok()
                .map(|rates| rates.gpu as f64);
            // NVML stamps samples with the wall clock, in microseconds.
            let since = SystemTime::now()
                .checked_sub(WINDOW)
                .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |at| at.as_micros() as u64);
            let processes = match device.process_utilization_stats(since) {
                Ok(samples) => Some(per_process(
                    samples
                        .into_iter()
                        .map(|sample| (sample.pid, sample.sm_util as f64)),
                )),
                // No process had work in the window.
                Err(NvmlError::NotFound) => Some(Vec::new()),
                Err(error) => {
                    errors.push(format!("nvmlDeviceGetProcessUtilization: {error}"));
                    None
                }
            };
            CardReading {
                card_percent,
                processes,
                error: (!errors.is_empty()).then(|| errors.join("; ")),
            }
        }
    }

    impl CardMeter for NvmlMeter {
        fn read(&mut self, uuid: &str, freshness: Freshness) -> CardReading {
            let now = Instant::now();
            if freshness == Freshness::Relaxed
                && let Some((_, at, reading)) = self.last.iter().find(|(card, _, _)| card == uuid)
                && now.duration_since(*at) < RELAXED_EVERY
            {
                return reading.clone();
            }
            let reading = self.ask(uuid);
            self.last.retain(|(card, _, _)| card != uuid);
            self.last.push((uuid.to_string(), now, reading.clone()));
            reading
        }

        fn memory(&mut self, uuid: &str) -> Option<Vec<(u32, u64)>> {
            let device = self.nvml.device_by_uuid(uuid).ok()?;
            let processes = device.running_compute_processes().ok()?;
            Some(
                processes
                    .into_iter()
                    .map(|process| {
                        let bytes = match process.used_gpu_memory {
                            UsedGpuMemory::Used(bytes) => bytes,
                            UsedGpuMemory::Unavailable => 0,
                        };
                        (process.pid, bytes)
                    })
                    .collect(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_fold_into_one_mean_per_process() {
        let folded = per_process([(7, 30.0), (9, 10.0), (7, 50.0), (9, 500.0)]);
        assert_eq!(folded, vec![(7, 40.0), (9, 55.0)], "clamped to 100 first");
        assert!(per_process([]).is_empty());
    }
}
