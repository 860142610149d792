//! The restart budget: how many restarts a job may spend (`restartPolicy.maxRestarts`, or
//! `ferrotrain launch --max-restarts`) and how many it has spent, worked out here once for
//! the operator's gang restarts and the launchers' in-place rounds. A disruption (a pod taken
//! away) spends none; each side says which failures are disruptions.

/// `restartPolicy.maxRestarts` and `--max-restarts` when none is given.
pub const DEFAULT_MAX_RESTARTS: u32 = 10;

/// Restarts allowed and spent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestartBudget {
    pub max: u32,
    pub spent: u32,
}

impl RestartBudget {
    /// The budget of a spec's `max` (negative: none) of which `spent` are spent.
    pub fn of(max: i32, spent: i32) -> Self {
        RestartBudget {
            max: max.max(0) as u32,
            spent: spent.max(0) as u32,
        }
    }

    /// Restarts not spent yet: what a launcher started now may spend in place.
    pub fn left(self) -> u32 {
        self.max.saturating_sub(self.spent)
    }

    /// Whether one more failure may be restarted.
    pub fn allows_another(self) -> bool {
        self.spent < self.max
    }

    /// Spends one restart.
    pub fn spend(&mut self) {
        self.spent += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_down_to_none_and_never_below() {
        let mut b = RestartBudget::of(2, 0);
        assert_eq!((b.left(), b.allows_another()), (2, true));
        b.spend();
        b.spend();
        assert_eq!((b.left(), b.allows_another()), (0, false));
        b.spend();
        assert_eq!(
            b.left(),
            0,
            "overspent (a restart raced the count): none left"
        );
        assert_eq!(RestartBudget::of(-1, 5).left(), 0);
        assert!(!RestartBudget::of(0, 0).allows_another());
    }
}
