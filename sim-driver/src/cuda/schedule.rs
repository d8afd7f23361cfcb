//! When a simulated kernel gets the SMs it needs.
//!
//! The simulated card gives each block of a kernel one SM for the kernel's whole
//! duration (as a block that takes most of an SM's shared memory would on a real card),
//! so a kernel of `B` blocks occupies `min(B, SMs)` SMs. A kernel whose SMs are not free
//! when its stream reaches it waits until they are: kernels on several streams overlap
//! while they fit on the card and queue behind each other when they do not, and events
//! around a kernel that waited time the wait too, as on a real card. The schedule is per
//! process and device (different processes' contexts share a real card by time slices,
//! which the sim does not model: their timelines stay independent).

/// The kernels of one device that have not finished yet.
#[derive(Debug, Default)]
pub struct SmSchedule {
    placed: Vec<Placed>,
}

#[derive(Clone, Copy, Debug)]
struct Placed {
    start: u64,
    end: u64,
    sms: u32,
}

/// Beyond this many unfinished kernels a new one is simply queued after all of them
/// (the exact search is quadratic in their number).
const MAX_TRACKED: usize = 1024;

impl SmSchedule {
    /// Places a kernel of `duration_ns` that needs `sms` of the card's `card_sms` SMs and
    /// may start at `ready_ns` (its stream's turn) at the earliest; returns its start.
    pub fn place(
        &mut self,
        ready_ns: u64,
        duration_ns: u64,
        sms: u32,
        card_sms: u32,
        now_ns: u64,
    ) -> u64 {
        self.placed.retain(|kernel| kernel.end > now_ns);
        let card_sms = card_sms.max(1);
        let want = sms.clamp(1, card_sms);
        if duration_ns == 0 {
            return ready_ns;
        }
        let start = if self.placed.len() >= MAX_TRACKED {
            self.placed
                .iter()
                .map(|kernel| kernel.end)
                .max()
                .unwrap_or(ready_ns)
                .max(ready_ns)
        } else {
            self.earliest_fit(ready_ns, duration_ns, want, card_sms)
        };
        self.placed.push(Placed {
            start,
            end: start.saturating_add(duration_ns),
            sms: want,
        });
        start
    }

    /// The earliest time from `ready` at which `want` SMs stay free for `duration`: the
    /// answer is `ready` or the end of some placed kernel, and within a window the use
    /// is highest at its start or where a placed kernel starts.
    fn earliest_fit(&self, ready: u64, duration: u64, want: u32, card_sms: u32) -> u64 {
        let mut candidates: Vec<u64> = std::iter::once(ready)
            .chain(
                self.placed
                    .iter()
                    .map(|kernel| kernel.end)
                    .filter(|end| *end > ready),
            )
            .collect();
        candidates.sort_unstable();
        for &start in &candidates {
            let end = start.saturating_add(duration);
            let fits = std::iter::once(start)
                .chain(
                    self.placed
                        .iter()
                        .map(|kernel| kernel.start)
                        .filter(|at| *at > start && *at < end),
                )
                .all(|at| self.used_at(at) + want <= card_sms);
            if fits {
                return start;
            }
        }
        // Unreachable (after the last end nothing is in use), kept total.
        candidates.last().copied().unwrap_or(ready)
    }

    fn used_at(&self, at: u64) -> u32 {
        self.placed
            .iter()
            .filter(|kernel| kernel.start <= at && at < kernel.end)
            .map(|kernel| kernel.sms)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_that_fit_overlap_and_the_rest_wait_for_free_sms() {
        let mut card = SmSchedule::default();
        // Four quarter-card kernels fit at once.
        for _ in 0..4 {
            assert_eq!(card.place(1000, 100, 33, 132, 0), 1000);
        }
        // The next four wait for them.
        for _ in 0..4 {
            assert_eq!(card.place(1000, 100, 33, 132, 0), 1100);
        }
        // A full-card kernel waits for all of those.
        assert_eq!(card.place(1000, 50, 500, 132, 0), 1200);
        // A small one fits into no gap before that, and finished kernels are forgotten.
        assert_eq!(card.place(1000, 10, 1, 132, 0), 1250);
        assert_eq!(card.place(5000, 10, 132, 132, 2000), 5000);
        assert_eq!(card.placed.len(), 1);
    }

    #[test]
    fn a_kernel_only_starts_where_it_fits_for_its_whole_duration() {
        let mut card = SmSchedule::default();
        assert_eq!(card.place(0, 100, 100, 132, 0), 0);
        assert_eq!(card.place(50, 100, 100, 132, 0), 100);
        // 32 SMs are free over [0, 100) but a 200-long kernel would meet the one at 100.
        assert_eq!(card.place(0, 200, 40, 132, 0), 200);
        assert_eq!(card.place(0, 100, 32, 132, 0), 0);
        assert_eq!(
            card.place(7, 0, 132, 132, 0),
            7,
            "zero-length work needs no SMs"
        );
    }
}
