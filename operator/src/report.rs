//! Rank 0's progress report shaped for the status (pure, next to the gang state machine):
//! rates rounded so that noise in the last digits is not a "change" worth a status write, and
//! the ETA for humans. Polling `/progress` over HTTP lives in [`crate::progress`].

use ferrotrain_api::Progress;

/// Rounds to `digits` significant digits (NaN and infinities become absent).
pub fn significant(value: f64, digits: i32) -> Option<f64> {
    if !value.is_finite() {
        return None;
    }
    if value == 0.0 {
        return Some(0.0);
    }
    let magnitude = value.abs().log10().floor() as i32;
    let scale = 10f64.powi(digits - 1 - magnitude);
    Some((value * scale).round() / scale)
}

/// The report as the status shows it: rates and times to 3 significant digits, losses to 4,
/// BLEU to 2 decimals, ETA to whole seconds. Two reports that differ only beyond that are the
/// same to a user, so they cause no status write.
pub fn rounded(report: &Progress) -> Progress {
    let sig = |v: Option<f64>, d: i32| v.and_then(|v| significant(v, d));
    let mut p = report.clone();
    // Counted into restarts and the recovery ledger (gang::in_place), not kept as such.
    p.round_ends.clear();
    p.steps_per_second = sig(p.steps_per_second, 3);
    p.samples_per_second = sig(p.samples_per_second, 3);
    p.tokens_per_second = sig(p.tokens_per_second, 3);
    p.step_time_seconds = sig(p.step_time_seconds, 3);
    p.comm_fraction = p
        .comm_fraction
        .filter(|v| v.is_finite())
        .map(|v| (v.clamp(0.0, 1.0) * 1000.0).round() / 1000.0);
    p.loss = sig(p.loss, 4);
    p.eval_loss = sig(p.eval_loss, 4);
    p.best_eval_loss = sig(p.best_eval_loss, 4);
    p.eval_bleu = p
        .eval_bleu
        .filter(|v| v.is_finite())
        .map(|v| (v * 100.0).round() / 100.0);
    p.learning_rate = sig(p.learning_rate, 3);
    p.eta_seconds = p
        .eta_seconds
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(f64::round);
    if let Some(c) = p.last_checkpoint.as_mut() {
        c.blocking_seconds = c.blocking_seconds.and_then(|v| significant(v, 3));
    }
    p.peak_memory_bytes = p.peak_memory_bytes.map(|v| significant_u64(v, 3));
    if let Some(r) = p.resources.as_mut() {
        r.cpu_seconds = significant(r.cpu_seconds, 3).unwrap_or(0.0);
        r.cpu_utilization = sig(r.cpu_utilization, 2);
        r.rss_bytes = significant_u64(r.rss_bytes, 3);
        r.peak_rss_bytes = significant_u64(r.peak_rss_bytes, 3);
        if let Some(g) = r.gpu.as_mut() {
            g.utilization = (g.utilization.clamp(0.0, 1.0) * 100.0).round() / 100.0;
            g.memory_used_bytes = significant_u64(g.memory_used_bytes, 3);
            g.peak_memory_used_bytes = significant_u64(g.peak_memory_used_bytes, 3);
        }
    }
    if let Some(g) = p.gang_resources.as_mut() {
        let spreads = [
            &mut g.cpu_utilization,
            &mut g.rss_bytes,
            &mut g.gpu_utilization,
            &mut g.gpu_memory_used_bytes,
        ];
        for s in spreads.into_iter().flatten() {
            for v in [&mut s.mean, &mut s.min, &mut s.max] {
                *v = significant(*v, 3).unwrap_or(0.0);
            }
        }
    }
    p
}

fn significant_u64(value: u64, digits: i32) -> u64 {
    significant(value as f64, digits).map_or(value, |v| v as u64)
}

/// True when `new` shows a user something `shown` (the report in the status) does not: a
/// step, a loss, a rate, an eval, a checkpoint, a phase. Rank 0's `resources` are read from
/// /proc and NVML at request time (CPU seconds tick, RSS and GPU use wobble), and the gang's
/// `gangResources` wobble the same way, so they alone never count: they are a snapshot refreshed whenever the report changes for another
/// reason. Without this a running job's status was written at every poll.
pub fn changed_for_a_user(shown: &Progress, new: &Progress) -> bool {
    let without_resources = |p: &Progress| Progress {
        resources: None,
        gang_resources: None,
        ..p.clone()
    };
    without_resources(shown) != without_resources(new)
}

/// Seconds to totalSteps. The trainer owns this number (it knows the evaluation time and the
/// time budget, see trainer/src/train.rs): the operator never estimates it again from the rate,
/// it only says 0 once the final step is reached and turns the seconds into `eta` and
/// `estimatedCompletionTime`. A report without one (a bring-your-own image) shows no ETA.
pub fn eta_seconds(p: &Progress) -> Option<f64> {
    if p.total_steps > 0 && p.step >= p.total_steps {
        return Some(0.0);
    }
    p.eta_seconds.filter(|v| v.is_finite() && *v >= 0.0)
}

/// `45s`, `12m`, `3h05m`, `2d04h`: coarse enough that it changes only when the ETA does.
pub fn human_duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn significant_digits() {
        assert_eq!(significant(1.23456, 3), Some(1.23));
        assert_eq!(significant(0.000123456, 3), Some(0.000123));
        assert_eq!(significant(12345.6, 3), Some(12300.0));
        assert_eq!(significant(0.0, 3), Some(0.0));
        assert_eq!(significant(f64::NAN, 3), None);
        assert_eq!(significant(-5.4321, 2), Some(-5.4));
    }

    #[test]
    fn rounding_hides_noise_but_not_changes() {
        let a = Progress {
            step: 10,
            steps_per_second: Some(4.00012),
            loss: Some(2.345678),
            ..Progress::default()
        };
        let mut b = a.clone();
        b.steps_per_second = Some(4.00049);
        b.loss = Some(2.345702);
        assert_eq!(rounded(&a), rounded(&b));
        b.loss = Some(2.3467);
        assert_ne!(rounded(&a), rounded(&b));
    }

    #[test]
    fn eta_is_the_trainers_estimate_never_recomputed_from_the_rate() {
        let mut p = Progress {
            step: 100,
            total_steps: 1100,
            steps_per_second: Some(2.0),
            ..Progress::default()
        };
        assert_eq!(eta_seconds(&p), None, "no estimate from the rate");
        p.eta_seconds = Some(420.0);
        assert_eq!(eta_seconds(&p), Some(420.0));
        p.eta_seconds = Some(f64::INFINITY);
        assert_eq!(eta_seconds(&p), None);
        p.step = 1100;
        assert_eq!(eta_seconds(&p), Some(0.0));
    }

    #[test]
    fn resources_alone_are_no_change_a_step_is() {
        use ferrotrain_api::progress::ResourceUsage;
        let at = |step: u64, cpu_seconds: f64, rss_bytes: u64| {
            rounded(&Progress {
                step,
                gang_resources: Some(ferrotrain_api::progress::GangResources {
                    ranks: 2,
                    rss_bytes: Some(ferrotrain_api::progress::Spread {
                        mean: rss_bytes as f64,
                        min: rss_bytes as f64 - 1234.0,
                        max: rss_bytes as f64 + 1234.0,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                resources: Some(ResourceUsage {
                    cpu_seconds,
                    cpu_utilization: Some(1.93 + cpu_seconds / 1000.0),
                    rss_bytes,
                    peak_rss_bytes: rss_bytes,
                    threads: 9,
                    gpu: None,
                }),
                ..Progress::default()
            })
        };
        let shown = at(100, 61.0, 812_345_678);
        for (cpu, rss) in [
            (66.0, 812_400_000),
            (71.2, 815_000_000),
            (76.9, 809_999_999),
        ] {
            assert!(
                !changed_for_a_user(&shown, &at(100, cpu, rss)),
                "{cpu} {rss}"
            );
        }
        assert!(changed_for_a_user(&shown, &at(101, 61.0, 812_345_678)));
        assert_eq!(
            at(1, 0.0, 812_345_678).resources.unwrap().rss_bytes,
            812_000_000
        );
        let gang = at(1, 0.0, 812_345_678).gang_resources.unwrap();
        assert_eq!(gang.rss_bytes.unwrap().max, 812_000_000.0);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(0.0), "0s");
        assert_eq!(human_duration(59.4), "59s");
        assert_eq!(human_duration(61.0), "1m");
        assert_eq!(human_duration(3600.0 + 5.0 * 60.0), "1h05m");
        assert_eq!(human_duration(2.0 * 86400.0 + 4.0 * 3600.0 + 59.0), "2d04h");
    }
}
