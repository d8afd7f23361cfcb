//! Publishing: every `PUBLISH_NS` one thread of the process stamps its heartbeat, adds
//! its measured busy time and launches to the usage region for the host's coordinator,
//! and reads the host's card view (again only once the coordinator replaced it): the
//! charge factor for this container, and in soft mode the rate the card's contention
//! allows. The tick also steers the fast path's clock (`super::fast_clock`) and points
//! launches at the process's one device again where they may skip asking
//! (`lifecycle::refresh_sole_device`).

use std::path::Path;
use std::sync::atomic::Ordering;

use vgpu_contract::cardview::{self, CardView, ViewReader};
use vgpu_contract::limiter_words::slot as slot_words;

use super::lifecycle::{self, SWITCHES};
use super::trace::{self, Counter, Part};
use super::{BUSY_BITS, DeviceLimiter, PUBLISH_NS, duty};
use crate::debug;

impl DeviceLimiter {
    /// The publish tick (one thread at a time) and reading finished samples.
    pub(super) fn maintain(&self, now_ns: u64) {
        let due = self.next_publish_ns.load(Ordering::Acquire);
        if now_ns >= due
            && self
                .next_publish_ns
                .compare_exchange(
                    due,
                    now_ns + PUBLISH_NS,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            let started = trace::ticks();
            self.publish(now_ns);
            trace::part(Part::Publish, started);
            trace::count(Counter::Publishes);
        }
        if let Ok(mut slow) = self.slow.try_lock() {
            self.settle(&mut slow, now_ns, false);
        }
    }

    /// Adds `busy_ns` of measured busy time and `launches` to what the next tick gives
    /// the region (`unpublished`: busy ns in the low `BUSY_BITS`, launches above).
    pub(super) fn add_unpublished(&self, busy_ns: u64, launches: u64) {
        self.unpublished.fetch_add(
            busy_ns.min((1 << BUSY_BITS) - 1) + (launches << BUSY_BITS),
            Ordering::Relaxed,
        );
    }

    /// Stamps this process's heartbeat, adds its busy time (as measured, net of what
    /// settled samples gave back) and launches to the region, and reads the card's view:
    /// the host's correction factor for this container's charges (1 without a fresh view
    /// that names it), and in soft mode the rate it grants (the limit without one).
    pub(super) fn publish(&self, now_ns: u64) {
        SWITCHES.clock.steer();
        lifecycle::refresh_sole_device();
        if let Some(words) = self.mine {
            words[slot_words::HEARTBEAT_NS].store(now_ns, Ordering::Relaxed);
        }
        let unpublished = self.unpublished.swap(0, Ordering::AcqRel);
        let busy = unpublished & ((1 << BUSY_BITS) - 1);
        let back = self.given_back.swap(0, Ordering::AcqRel);
        let net = busy.saturating_sub(back);
        if back > busy {
            // More given back than measured since: the rest comes off the next publish.
            self.given_back.fetch_add(back - busy, Ordering::AcqRel);
        }
        if (net != 0 || unpublished >> BUSY_BITS != 0)
            && let Some(slot) = self.slot
        {
            self.region.add_busy(
                slot,
                self.visible.region_index,
                net,
                unpublished >> BUSY_BITS,
            );
        }
        let Some(dir) = self.card_dir.as_deref() else {
            return;
        };
        let id = self.container_id.as_deref();
        let (neighbours_active, factor, allowed) = self.with_view(dir, |view| {
            (
                cardview::neighbours_active(view, id, now_ns),
                cardview::charge_permille(view, id, now_ns),
                cardview::allowed_percent(
                    view,
                    id,
                    now_ns,
                    (self.limit_ppm / 10_000) as u32,
                    self.ceiling,
                ),
            )
        });
        self.neighbours_active
            .store(neighbours_active, Ordering::Relaxed);
        let before = self.charge_permille.swap(factor, Ordering::Relaxed);
        if factor != before {
            debug!(
                "charge factor on {}: {before} -> {factor} per mille",
                self.visible.uuid
            );
        }
        if !self.soft {
            return;
        }
        let wanted = duty::percent_ppm(allowed);
        let before = self.rate();
        if wanted != before {
            debug!(
                "soft limit on {}: {}% -> {allowed}%",
                self.visible.uuid,
                before / 10_000
            );
            self.shared.set_rate(wanted, now_ns, self.limit_ppm);
        }
    }

    /// Runs `judge` on the card's view in `dir` (`None`: none to be had, which means
    /// "assume contended"), read again only when the coordinator replaced it
    /// (`cardview::ViewReader`: one `lstat` a tick for a view already read).
    fn with_view<R>(&self, dir: &Path, judge: impl FnOnce(Option<&CardView>) -> R) -> R {
        let unreadable = |error: cardview::ViewError| {
            debug!("{error}; assuming the card is contended");
        };
        // Never waits: publish ticks come one at a time, and a forked child builds its
        // limiter afresh; a reader busy all the same is read around.
        let Ok(mut reader) = self.card_view.try_lock() else {
            let view = CardView::read(dir, &self.visible.uuid)
                .map_err(unreadable)
                .ok();
            return judge(view.as_ref());
        };
        if reader.is_none() {
            *reader = ViewReader::new(dir, &self.visible.uuid)
                .map_err(unreadable)
                .ok();
        }
        let view = reader
            .as_mut()
            .and_then(|reader| reader.read().map_err(unreadable).ok());
        judge(view)
    }
}
