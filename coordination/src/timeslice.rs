//! What a time-sliced card gave each container, from figures that do not jump: each
//! container's own busy time (its events, over the coordinator's window) and the card's
//! utilization (the time one or more kernels ran).
//!
//! A card without MPS runs one context at a time. While two containers both have work
//! queued, each one's events time the whole stretch, and the card gives each half of it
//! in turns. So the containers' own figures add up to more than the card was busy, by
//! exactly the stretches they shared, and each got the same part of what it shared:
//! for two, `got = own - (own_a + own_b - card) / 2`.
//!
//! NVML's per-process figures say the same per process but, on the H200, as one sample
//! every 0.2-1 s swung between 2 and 92 % for a steady 50 % (BENCHMARKS run 9): a charge
//! factor that follows them swings too, and a hard container takes up to 17 points over
//! its limit in a second. The split here moves as smoothly as its inputs.
//!
//! Where it errs, it errs towards charging more: a process on the card the host does not
//! measure (a container without a compute limit, a process outside any container) adds
//! its time to the card's figure and not to the sum, so the shared stretches look
//! shorter, and the containers are given less back. The coordinator uses the split only
//! where every process the card lists with work belongs to a measured container.
//!
//! The containers' own figures are their tenants' word. A tenant that claims busy time
//! it did not have would make the stretches its neighbours shared look longer, and buy
//! them a discount (two containers of one owner: one lies, the other runs beyond its
//! hard limit). So no container is given back more than the card itself showed of the
//! others' work (`seen`, from its per-process figures): what it waited for must have
//! run.

/// What each of the containers on one card got of it, percent of the card, in the order
/// of `own` (each container's own measured busy time, percent of the card over the same
/// window), when the card was busy `card` percent of the time and its per-process
/// figures showed at most `seen` of each container's processes (same order).
///
/// The excess of the sum over `card` is the time they shared; it is taken back in equal
/// parts (turns of equal length), but never more from one container than `1 - 1/n` of
/// its own figure, `n` the number of containers with work (however many share a
/// stretch, each gets at least its turn of it), nor more than the card showed of all
/// the others together (what it waited for must have run). What one container cannot
/// give back is taken from the others in equal parts; what none can is left (the card's
/// figure then reads low, and the containers are charged more, not less).
///
/// ```
/// use vgpu_coordination::timeslice::split;
/// // A hard 40 beside a busy neighbour: its events covered 80 % of the second, the
/// // neighbour's 100 %, the card was busy all of it: each got half of the 80 % shared.
/// assert_eq!(split(100.0, &[80.0, 100.0], &[45.0, 70.0]), vec![40.0, 60.0]);
/// // Nothing shared: each got what it measured.
/// assert_eq!(split(70.0, &[30.0, 40.0], &[30.0, 40.0]), vec![30.0, 40.0]);
/// // A neighbour that claims to have been busy while the card saw 2 % of it: the
/// // honest 40 is given back at most those 2.
/// assert_eq!(split(40.0, &[40.0, 100.0], &[40.0, 2.0]), vec![38.0, 60.0]);
/// ```
pub fn split(card: f64, own: &[f64], seen: &[f64]) -> Vec<f64> {
    let figure = |percent: f64| {
        if percent.is_finite() {
            percent.clamp(0.0, 100.0)
        } else {
            0.0
        }
    };
    let own: Vec<f64> = own.iter().map(|&percent| figure(percent)).collect();
    let seen: Vec<f64> = (0..own.len())
        .map(|i| seen.get(i).map_or(0.0, |&percent| figure(percent)))
        .collect();
    let seen_total: f64 = seen.iter().sum();
    let card = if card.is_finite() {
        card.clamp(0.0, 100.0)
    } else {
        100.0
    };
    let mut excess = own.iter().sum::<f64>() - card;
    let busy = own.iter().filter(|&&percent| percent > 0.0).count();
    if excess <= 0.0 || busy < 2 {
        return own;
    }
    let keep = 1.0 / busy as f64;
    let mut given = vec![0.0; own.len()];
    let mut open: Vec<usize> = (0..own.len()).filter(|&i| own[i] > 0.0).collect();
    // Each round gives every open container an equal part, or what it has left to give;
    // a round that closes nobody gives all that was asked, so at most `busy` rounds.
    while excess > 1e-9 && !open.is_empty() {
        let part = excess / open.len() as f64;
        let mut still = Vec::with_capacity(open.len());
        for &i in &open {
            let most = (own[i] * (1.0 - keep)).min(seen_total - seen[i]);
            let room = most - given[i];
            let take = part.min(room).max(0.0);
            given[i] += take;
            excess -= take;
            if room > part {
                still.push(i);
            }
        }
        if still.len() == open.len() {
            break;
        }
        open = still;
    }
    own.iter()
        .zip(&given)
        .map(|(own, given)| own - given)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The card saw each container's processes at their fullest.
    const ALL: [f64; 3] = [100.0; 3];

    fn close(got: &[f64], want: &[f64]) -> bool {
        got.len() == want.len() && got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-9)
    }

    #[test]
    fn two_containers_sharing_a_stretch_each_got_half_of_it() {
        // Hard 30 held to its share beside a busy 60: it has work 60 % of the time,
        // all of it shared; the 60 has work always.
        assert!(close(&split(100.0, &[60.0, 100.0], &ALL), &[30.0, 70.0]));
        // Switching between them costs the card a little: the card busy less than the
        // union: that time neither got is taken from both, down to each one's turn.
        assert!(
            close(&split(96.0, &[60.0, 100.0], &ALL), &[30.0, 66.0]),
            "the 60 keeps its turn"
        );
    }

    #[test]
    fn nothing_shared_is_nothing_taken() {
        assert_eq!(split(100.0, &[40.0, 60.0], &ALL), vec![40.0, 60.0]);
        assert_eq!(split(90.0, &[40.0, 30.0], &ALL), vec![40.0, 30.0]);
        // One container alone: its figure, whatever the card says.
        assert_eq!(split(20.0, &[80.0], &ALL), vec![80.0]);
        assert_eq!(split(20.0, &[80.0, 0.0], &ALL), vec![80.0, 0.0]);
    }

    #[test]
    fn a_container_keeps_at_least_its_turn_of_what_it_measured() {
        // Three with work; the small one can give at most two thirds of its 9.
        let got = split(60.0, &[9.0, 60.0, 60.0], &ALL);
        assert!((got[0] - 3.0).abs() < 1e-9, "{got:?}");
        // The rest of the 69 shared is taken from the other two in equal parts.
        assert!(close(&got, &[3.0, 28.5, 28.5]), "{got:?}");
        assert!((got.iter().sum::<f64>() - 60.0).abs() < 1e-9);
    }

    #[test]
    fn more_overlap_than_turns_allow_is_left_in_the_charge() {
        // Each can give at most half of its own: 50 + 50 of 200 shared over a card of
        // 50 % is not possible with equal turns; the figures stay at half.
        assert!(close(&split(50.0, &[100.0, 100.0], &ALL), &[50.0, 50.0]));
        assert!(close(&split(0.0, &[100.0, 100.0], &ALL), &[50.0, 50.0]));
    }

    #[test]
    fn no_container_is_given_back_more_than_the_card_saw_of_the_others() {
        // A liar with no work on the card buys its neighbour nothing.
        assert_eq!(split(40.0, &[40.0, 100.0], &[40.0, 0.0]), vec![40.0, 60.0]);
        // Two liars: the honest one gets back what the card saw of both together.
        let got = split(30.0, &[30.0, 100.0, 100.0], &[30.0, 1.0, 2.0]);
        assert!((got[0] - 27.0).abs() < 1e-9, "{got:?}");
        // Honest neighbours the card saw working: the split as without the bound.
        assert!(close(
            &split(100.0, &[80.0, 100.0], &[45.0, 50.0]),
            &[40.0, 60.0]
        ));
        // No figures: nobody is given anything back.
        assert_eq!(split(40.0, &[40.0, 100.0], &[]), vec![40.0, 100.0]);
    }

    #[test]
    fn hostile_or_broken_figures_stay_within_the_card() {
        for own in [
            vec![f64::NAN, 50.0],
            vec![f64::INFINITY, -3.0],
            vec![1e300, 1e300, 1e300],
            vec![-1.0, -1.0],
        ] {
            for card in [f64::NAN, -5.0, 0.0, 55.0, 1e9] {
                let got = split(card, &own, &[f64::NAN, 1e9, -2.0]);
                assert_eq!(got.len(), own.len());
                assert!(
                    got.iter()
                        .all(|p| p.is_finite() && (0.0..=100.0).contains(p)),
                    "{card} {own:?} -> {got:?}"
                );
            }
        }
    }

    #[test]
    fn the_split_never_gives_more_than_measured_nor_less_than_a_turn() {
        // Every combination of a small grid: each got within [own / n, own], and the
        // total never below the card's figure unless every container is at its floor.
        let steps = [0.0, 5.0, 30.0, 55.0, 80.0, 100.0];
        for &card in &steps {
            for &a in &steps {
                for &b in &steps {
                    for &c in &steps {
                        let own = [a, b, c];
                        let got = split(card, &own, &ALL);
                        let n = own.iter().filter(|&&p| p > 0.0).count().max(1) as f64;
                        for (g, o) in got.iter().zip(&own) {
                            assert!(
                                *g <= o + 1e-9 && *g >= o / n - 1e-9,
                                "{card} {own:?} -> {got:?}"
                            );
                        }
                        let total: f64 = got.iter().sum();
                        let floors = got.iter().zip(&own).all(|(g, o)| (g - o / n).abs() < 1e-9);
                        assert!(
                            total >= card.min(a + b + c) - 1e-9 || floors,
                            "{card} {own:?} -> {got:?}"
                        );
                    }
                }
            }
        }
    }
}
