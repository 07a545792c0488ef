//! Picking an instance: the one with the fewest requests in flight; ties are broken
//! round-robin by starting the scan at a rotating position. A pure function over the
//! loads the caller reads, so it is tested without sockets or clocks.

/// Load given to an instance that recently refused connections: it is picked only
/// when every other candidate has been tried (its real in-flight count is added, so
/// several such instances are still ordered among themselves).
pub const UNHEALTHY_PENALTY: u64 = 1 << 40;

/// Load given to an ejected instance (`eject.rs`): above every other, so it is picked
/// only when the model has nothing else. Both penalties and the in-flight count add up,
/// so among ejected instances the least bad one is picked.
pub const EJECTED_PENALTY: u64 = 1 << 50;

/// Index of the least-loaded candidate among `len`, scanning from `start % len` so
/// that equal loads take turns. `load(i)` is the load of candidate `i`, or `None` to
/// leave it out (already tried). `None` when every candidate is left out.
pub fn pick_least_loaded(
    len: usize,
    start: usize,
    mut load: impl FnMut(usize) -> Option<u64>,
) -> Option<usize> {
    if len == 0 {
        return None;
    }
    let mut best: Option<(usize, u64)> = None;
    for step in 0..len {
        let index = (start + step) % len;
        let Some(candidate) = load(index) else {
            continue;
        };
        // Strictly smaller only: among equals, the first from `start` wins.
        if best.is_none_or(|(_, lowest)| candidate < lowest) {
            best = Some((index, candidate));
        }
    }
    best.map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(loads: &[Option<u64>], start: usize) -> Option<usize> {
        pick_least_loaded(loads.len(), start, |i| loads[i])
    }

    #[test]
    fn balancer_picks_the_instance_with_fewest_requests_in_flight() {
        assert_eq!(pick(&[Some(3), Some(1), Some(2)], 0), Some(1));
        assert_eq!(pick(&[Some(3), Some(1), Some(2)], 2), Some(1));
        assert_eq!(pick(&[Some(0), Some(5)], 1), Some(0));
    }

    #[test]
    fn balancer_breaks_ties_round_robin() {
        let loads = [Some(0), Some(0), Some(0)];
        let picks: Vec<usize> = (0..6).map(|start| pick(&loads, start).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        // Ties among the least loaded only: the busy one is never picked.
        let loads = [Some(0), Some(4), Some(0)];
        let picks: Vec<usize> = (0..4).map(|start| pick(&loads, start).unwrap()).collect();
        assert_eq!(picks, vec![0, 2, 2, 0]);
    }

    #[test]
    fn balancer_skips_tried_instances_and_answers_none_when_all_are_tried() {
        assert_eq!(pick(&[None, Some(9)], 0), Some(1));
        assert_eq!(pick(&[None, None], 0), None);
        assert_eq!(pick(&[], 0), None);
    }

    #[test]
    fn balancer_prefers_healthy_instances_over_recently_failed_ones() {
        let loads = [Some(UNHEALTHY_PENALTY), Some(50)];
        assert_eq!(pick(&loads, 0), Some(1));
        // With the healthy one tried, the unhealthy one is still a candidate.
        assert_eq!(pick(&[Some(UNHEALTHY_PENALTY), None], 1), Some(0));
    }

    #[test]
    fn balancer_picks_an_ejected_instance_only_when_nothing_else_is_left() {
        let loads = [Some(EJECTED_PENALTY), Some(UNHEALTHY_PENALTY + 100)];
        assert_eq!(pick(&loads, 0), Some(1));
        // Every instance ejected: the least bad one still serves.
        let loads = [
            Some(EJECTED_PENALTY + UNHEALTHY_PENALTY),
            Some(EJECTED_PENALTY + 7),
            Some(EJECTED_PENALTY + 3),
        ];
        assert_eq!(pick(&loads, 0), Some(2));
    }
}
