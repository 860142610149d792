//! A seeded schedule of faults for one job: which faults, in which order, on which pod and
//! rank, how many steps apart, which two overlap, and how long the job must train for all of
//! them to fit. The same seed and mix give the same schedule.

use crate::chaos::fault::{Fault, Kind};
use crate::chaos::rng::Rng;
use crate::chaos::shape::Shape;

/// What to draw from.
#[derive(Clone, Debug)]
pub struct Mix {
    /// The kinds to draw (those the shape cannot take are left out); each comes at least once
    /// when there are enough faults.
    pub kinds: Vec<Kind>,
    /// Faults in all, the overlapping pairs' two each.
    pub faults: usize,
    /// Pairs of faults where the second comes while the gang recovers from the first.
    pub overlaps: usize,
    /// Seconds of training between the gang training whole again and the next fault (drawn
    /// in this range, as steps at the shape's rate).
    pub gap_seconds: (u64, u64),
}

/// One injection: a fault, or two overlapping.
#[derive(Clone, Debug)]
pub struct Event {
    /// Steps rank 0 trains after the gang is whole and settled before it is injected.
    pub gap_steps: u64,
    pub faults: Vec<Fault>,
    /// Milliseconds between the first fault and the second of an overlapping pair.
    pub overlap_ms: u64,
}

/// A job's schedule.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub shape: Shape,
    pub events: Vec<Event>,
    /// The job's `maxSteps`: every gap, the steps a gang may train while a fault takes effect
    /// (a kubelet's eviction comes 30-120 s after the write), and a tail.
    pub max_steps: u64,
}

impl Plan {
    pub fn faults(&self) -> usize {
        self.events.iter().map(|e| e.faults.len()).sum()
    }

    /// The steps the gang may train while `event`'s faults take effect.
    pub fn steps_through(&self, event: &Event) -> u64 {
        let seconds: u64 = event
            .faults
            .iter()
            .map(|f| seconds_trained_through(f.kind, &self.shape))
            .sum();
        seconds * steps_per_second(&self.shape)
    }
}

/// Steps before the first fault: past the first checkpoints.
const WARM_UP: u64 = 150;
/// Steps after the last fault: the gang trains whole to its last checkpoint.
const TAIL: u64 = 250;
/// Seconds the gang trains after each recovery before the next gap counts: the soak makes sure
/// it stays whole (3 s), and after a fault that ends no round waits for a late effect (3 s).
const SETTLE_SECONDS: u64 = 6;

/// Steps a second of training takes in `shape` on this project's 2 cores (the copy job, a
/// little above the rates seen without faults: 2 x 1 23/s, 1 x 2 12.6/s, 2 x 2 8.6/s,
/// 3 x 1 8.8/s).
pub fn steps_per_second(shape: &Shape) -> u64 {
    match (shape.replicas, shape.procs) {
        (2, 1) => 28,
        (1, _) => 15,
        _ => 11,
    }
}

/// Seconds the gang may train on while `kind` takes effect (not counting the recovery, which
/// trains nothing, unless the gang is elastic and trains on without a pod).
fn seconds_trained_through(kind: Kind, shape: &Shape) -> u64 {
    let elastic = !shape.is_fixed();
    let without_a_pod = |seconds| if elastic { seconds } else { 0 };
    match kind {
        // The kubelet sums an emptyDir's use once a minute, then evicts (22-30 s seen).
        Kind::KubeletEvict => 90 + without_a_pod(15),
        // Kubernetes calls the node lost after about 50 s.
        Kind::Partition => without_a_pod(120),
        Kind::ApiServerDown => 20 + 15,
        Kind::DnsDownReplace => without_a_pod(30),
        Kind::OperatorDeleted => 5,
        _ => without_a_pod(15),
    }
}

/// The schedule of `mix` for `shape`, drawn from `seed` (each shape draws its own).
pub fn plan(seed: u64, shape: Shape, mix: &Mix) -> Plan {
    let salt = (shape.replicas as u64) << 32
        | (shape.procs as u64) << 40
        | u64::from(shape.elastic_min.is_some()) << 48;
    let mut rng = Rng::new(seed ^ salt);
    let kinds: Vec<Kind> = mix
        .kinds
        .iter()
        .copied()
        .filter(|k| k.fits(&shape))
        .collect();
    assert!(!kinds.is_empty(), "no fault kind fits {}", shape.name());
    let pairable: Vec<Kind> = kinds
        .iter()
        .copied()
        .filter(|k| Kind::FAST.contains(k) && (shape.replicas > 1 || k.targets_a_trainer()))
        .collect();
    // The first of a pair ends a round; the second may be anything fast (the operator's pod
    // deleted while the gang recovers too).
    let first_of_pair: Vec<Kind> = pairable
        .iter()
        .copied()
        .filter(|k| *k != Kind::OperatorDeleted)
        .collect();
    let overlaps = if first_of_pair.is_empty() {
        0
    } else {
        mix.overlaps.min(mix.faults / 2)
    };
    let singles = mix.faults - 2 * overlaps;

    // Each kind once (as many as fit), then fast kinds drawn at random: a slow fault (a
    // kubelet's eviction, a partition) is a minute or two, so it comes once.
    let mut order = kinds.clone();
    shuffle(&mut rng, &mut order);
    order.truncate(singles);
    let fast: Vec<Kind> = kinds
        .iter()
        .copied()
        .filter(|k| Kind::FAST.contains(k))
        .collect();
    let refill = if fast.is_empty() { &kinds } else { &fast };
    while order.len() < singles {
        order.push(*rng.pick(refill));
    }
    let mut events: Vec<Event> = order
        .into_iter()
        .map(|kind| Event {
            gap_steps: 0,
            faults: vec![target(&mut rng, &shape, kind, None)],
            overlap_ms: 0,
        })
        .collect();
    for _ in 0..overlaps {
        let first_kind = *rng.pick(&first_of_pair);
        let first = target(&mut rng, &shape, first_kind, None);
        let second_kind = *rng.pick(&pairable);
        let second = target(&mut rng, &shape, second_kind, Some(&first));
        let at = rng.below(events.len() as u64 + 1) as usize;
        events.insert(
            at,
            Event {
                gap_steps: 0,
                faults: vec![first, second],
                overlap_ms: rng.between(300, 1500),
            },
        );
    }
    let mut max_steps = WARM_UP + TAIL;
    for event in &mut events {
        let rate = steps_per_second(&shape);
        event.gap_steps = rng.between(mix.gap_seconds.0 * rate, mix.gap_seconds.1 * rate);
        let through: u64 = event
            .faults
            .iter()
            .map(|f| seconds_trained_through(f.kind, &shape))
            .sum();
        max_steps += event.gap_steps + (through + SETTLE_SECONDS) * rate;
    }
    if let Some(first) = events.first_mut() {
        first.gap_steps = first.gap_steps.max(WARM_UP);
    }
    Plan {
        seed,
        shape,
        events,
        max_steps,
    }
}

/// The target of a fault of `kind`: any pod and local rank (a partition never cuts node 0's
/// pod, which serves the rendezvous); the second of an overlapping pair hits another pod than
/// the first when there is one, else another local rank.
fn target(rng: &mut Rng, shape: &Shape, kind: Kind, after: Option<&Fault>) -> Fault {
    let mut node = match kind {
        Kind::Partition => rng.between(1, (shape.replicas - 1) as u64) as i32,
        _ => rng.below(shape.replicas as u64) as i32,
    };
    let mut local = rng.below(shape.procs as u64) as i32;
    if let Some(first) = after {
        if shape.replicas > 1 && node == first.node {
            node = (node + 1) % shape.replicas;
        } else if shape.replicas == 1 && shape.procs > 1 && local == first.local {
            local = (local + 1) % shape.procs;
        }
    }
    let hold_seconds = match kind {
        Kind::ApiServerDown => rng.between(10, 20),
        Kind::DnsDownReplace => rng.between(5, 15),
        _ => 0,
    };
    Fault {
        kind,
        node,
        local,
        hold_seconds,
    }
}

fn shuffle<T>(rng: &mut Rng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_mix() -> Mix {
        Mix {
            kinds: Kind::ALL.to_vec(),
            faults: 15,
            overlaps: 2,
            gap_seconds: (5, 10),
        }
    }

    #[test]
    fn a_seed_names_one_schedule() {
        let shape = Shape::parse("2x2").unwrap();
        let a = plan(57, shape, &long_mix());
        let b = plan(57, shape, &long_mix());
        assert_eq!(format!("{:?}", a.events), format!("{:?}", b.events));
        assert_eq!(a.max_steps, b.max_steps);
        let c = plan(58, shape, &long_mix());
        assert_ne!(format!("{:?}", a.events), format!("{:?}", c.events));
    }

    #[test]
    fn every_kind_that_fits_comes_and_pairs_overlap_on_other_targets() {
        for shape in Shape::all() {
            for seed in 0..20 {
                let p = plan(seed, shape, &long_mix());
                assert_eq!(p.faults(), 15, "{p:?}");
                let kinds: std::collections::BTreeSet<Kind> = p
                    .events
                    .iter()
                    .flat_map(|e| e.faults.iter().map(|f| f.kind))
                    .collect();
                for kind in Kind::ALL.into_iter().filter(|k| k.fits(&shape)) {
                    assert!(kinds.contains(&kind), "{kind:?} missing in {p:?}");
                }
                let pairs: Vec<&Event> = p.events.iter().filter(|e| e.faults.len() == 2).collect();
                assert_eq!(pairs.len(), 2);
                for pair in pairs {
                    let (a, b) = (pair.faults[0], pair.faults[1]);
                    assert!((300..=1500).contains(&pair.overlap_ms));
                    assert!(
                        a.node != b.node || a.local != b.local,
                        "the pair hits two targets: {pair:?}"
                    );
                }
                for f in p.events.iter().flat_map(|e| &e.faults) {
                    assert!(f.node < shape.replicas && f.local < shape.procs, "{f:?}");
                    assert!(f.kind != Kind::Partition || f.node > 0, "{f:?}");
                }
                let gaps: u64 = p.events.iter().map(|e| e.gap_steps).sum();
                assert!(p.max_steps > gaps + TAIL, "{p:?}");
            }
        }
    }

    #[test]
    fn the_short_mix_draws_only_its_kinds() {
        let shape = Shape::parse("2x1").unwrap();
        let mix = Mix {
            kinds: vec![
                Kind::KillTrainer,
                Kind::StopTrainer,
                Kind::DeletePod,
                Kind::EvictPod,
                Kind::OperatorDeleted,
            ],
            faults: 7,
            overlaps: 1,
            gap_seconds: (5, 8),
        };
        let p = plan(1, shape, &mix);
        assert_eq!(p.events.len(), 6);
        for f in p.events.iter().flat_map(|e| &e.faults) {
            assert!(mix.kinds.contains(&f.kind), "{f:?}");
        }
    }
}
