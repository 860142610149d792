//! Which checkpoints are kept: the newest `keepLatest`, the `keepBest` by eval loss, and
//! always the newest. A dropped one is renamed back to a temporary name before it is removed,
//! so a crash mid-delete never leaves a half-empty `step-*` directory.

use std::fs;
use std::path::Path;

use ferrotrain_api::config::CheckpointPolicy;

use super::io::{io_err, sync_dir};
use super::layout::{TEMP_PREFIX, complete_checkpoints};
use crate::error::Result;

/// Which steps retention keeps: the newest `keep_latest`, the `keep_best` with the lowest
/// eval loss (a checkpoint without one, or with NaN, is never "best"), and always the newest.
/// `checkpoints` is (step, eval loss), in any order.
pub fn retained_steps(
    checkpoints: &[(u64, Option<f64>)],
    keep_latest: u32,
    keep_best: u32,
) -> std::collections::BTreeSet<u64> {
    let mut by_step: Vec<u64> = checkpoints.iter().map(|c| c.0).collect();
    by_step.sort_unstable_by(|a, b| b.cmp(a));
    let mut keep: std::collections::BTreeSet<u64> = by_step
        .iter()
        .take(keep_latest.max(1) as usize)
        .copied()
        .collect();
    let mut scored: Vec<(f64, u64)> = checkpoints
        .iter()
        .filter_map(|&(step, loss)| loss.filter(|l| !l.is_nan()).map(|l| (l, step)))
        .collect();
    // Lowest loss first; among equal losses the newer checkpoint wins.
    scored.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    keep.extend(scored.iter().take(keep_best as usize).map(|s| s.1));
    keep
}

pub(super) fn apply_retention(root: &Path, policy: &CheckpointPolicy) -> Result<()> {
    let complete = complete_checkpoints(root)?;
    let scored: Vec<(u64, Option<f64>)> = complete
        .iter()
        .map(|(_, s)| (s.step, s.eval_loss))
        .collect();
    let keep = retained_steps(&scored, policy.keep_latest, policy.keep_best);
    for (dir, state) in complete {
        if keep.contains(&state.step) {
            continue;
        }
        // Rename first: a crash mid-delete then leaves a temp dir, not a broken step-* one.
        let doomed = root.join(format!(
            "{TEMP_PREFIX}{:08}-{}-deleted",
            state.step,
            std::process::id()
        ));
        fs::rename(&dir, &doomed).map_err(|e| io_err("moving aside", &dir, e))?;
        fs::remove_dir_all(&doomed).map_err(|e| io_err("removing", &doomed, e))?;
        tracing::info!(step = state.step, "removed checkpoint (retention)");
    }
    sync_dir(root)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::checkpoint::fixtures::*;
    use crate::checkpoint::store::CheckpointStore;

    #[test]
    fn retention_table() {
        let l = |v: &[(u64, Option<f64>)], k: u32, b: u32| {
            retained_steps(v, k, b).into_iter().collect::<Vec<_>>()
        };
        let five = [
            (100, Some(3.0)),
            (200, Some(2.0)),
            (300, Some(2.5)),
            (400, Some(2.2)),
            (500, Some(2.4)),
        ];
        type Case = (&'static str, Vec<(u64, Option<f64>)>, u32, u32, Vec<u64>);
        let cases: Vec<Case> = vec![
            ("nothing saved", vec![], 2, 1, vec![]),
            ("one", vec![(100, None)], 1, 1, vec![100]),
            ("latest only", five.to_vec(), 2, 0, vec![400, 500]),
            (
                "latest + best older",
                five.to_vec(),
                2,
                1,
                vec![200, 400, 500],
            ),
            (
                "best already among latest",
                five.to_vec(),
                4,
                1,
                vec![200, 300, 400, 500],
            ),
            ("two best", five.to_vec(), 1, 2, vec![200, 400, 500]),
            (
                "keep more than exist",
                five.to_vec(),
                10,
                10,
                vec![100, 200, 300, 400, 500],
            ),
            (
                "keepLatest 0 still keeps the newest",
                five.to_vec(),
                0,
                1,
                vec![200, 500],
            ),
            (
                "None never best",
                vec![(100, None), (200, Some(9.0)), (300, None)],
                1,
                1,
                vec![200, 300],
            ),
            (
                "NaN never best",
                vec![(100, Some(f64::NAN)), (200, Some(9.0)), (300, None)],
                1,
                2,
                vec![200, 300],
            ),
            (
                "no eval at all",
                vec![(100, None), (200, None), (300, None)],
                1,
                3,
                vec![300],
            ),
            (
                "tie goes to newer",
                vec![(100, Some(1.0)), (200, Some(1.0)), (300, Some(5.0))],
                1,
                1,
                vec![200, 300],
            ),
            (
                "unordered input",
                vec![(500, None), (100, Some(0.5)), (300, None)],
                2,
                1,
                vec![100, 300, 500],
            ),
        ];
        for (name, input, k, b, want) in cases {
            assert_eq!(l(&input, k, b), want, "{name}");
        }
    }

    #[test]
    fn retention_on_disk_deletes_only_dropped_complete_checkpoints() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir(root).ok();
        fs::create_dir(root.join("tokenizer")).unwrap();
        fs::create_dir(root.join("step-00000001")).unwrap(); // broken: left for a human
        let mut store = CheckpointStore::new(root, policy(2, 1)).unwrap();
        for (step, loss) in [
            (100, Some(3.0)),
            (200, Some(1.5)),
            (300, Some(2.0)),
            (400, None),
            (500, Some(2.5)),
        ] {
            save_now(&mut store, step, loss);
        }
        assert_eq!(
            names(root),
            [
                "step-00000001",
                "step-00000200",
                "step-00000400",
                "step-00000500",
                "tokenizer"
            ]
        );
    }
}
