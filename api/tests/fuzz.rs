//! Generated input against what the api crate parses (issue 44): the final progress report
//! carried in a termination message (the operator parses whatever a container wrote there)
//! and the trainer config a user writes. Property tests of their round trips, and two fuzz
//! targets, `termination_message` and `trainer_config` (`bench/fuzz.sh` runs them longer).

use ferrotrain_api::config::TrainerConfig;
use ferrotrain_api::progress::{Progress, TERMINATION_MESSAGE_LIMIT};
use ferrotrain_fuzz::{CountingAlloc, Verdict, largest_allocation_since, reset_largest_allocation};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Seconds per target in the test suite (`FERROTRAIN_FUZZ_SECONDS` overrides).
const SHORT_RUN: f64 = 3.0;

/// A round's end as the launcher records it.
fn round_end(round: u64, message: &str, reason: &str) -> serde_json::Value {
    serde_json::json!({
        "round": round,
        "cause": "Failure",
        "reason": reason,
        "rank": 1,
        "exitCode": 137,
        "node": "node-a",
        "failedAt": "2025-01-01T00:00:00Z",
        "detectedAt": "2025-01-01T00:00:01Z",
        "message": message,
        "lastStep": round * 10,
    })
}

prop_compose! {
    /// A final report with what can make it long: round ends, refusals by reason, a
    /// checkpoint, rates.
    fn progress()(
        step in any::<u64>(),
        loss in proptest::option::of(-1e9f64..1e9),
        rounds in 0usize..60,
        message in "\\PC{0,200}",
        reason in "[A-Za-z]{0,40}",
        refusals in proptest::collection::btree_map("[a-z_]{1,30}", any::<u64>(), 0..20),
    ) -> Progress {
        let ends: Vec<serde_json::Value> = (0..rounds as u64)
            .map(|r| round_end(r, &message, &reason))
            .collect();
        let mut p: Progress = serde_json::from_value(serde_json::json!({
            "phase": "finished", "step": step, "totalSteps": step, "epoch": 1, "samples": step,
            "worldSize": 2, "stepsPerSecond": 3.5, "learningRate": 1e-4,
            "lastCheckpoint": {"step": step, "sizeBytes": 1024, "time": "2025-01-01T00:00:00Z"},
            "roundEnds": ends,
        }))
        .expect("a valid report");
        p.loss = loss;
        p.rejected_connections = refusals;
        p
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Whatever the report holds, its termination message fits what the kubelet keeps and
    /// parses back with the step, loss and checkpoint intact.
    #[test]
    fn a_final_report_fits_its_termination_message_and_parses_back(p in progress()) {
        let message = p.to_termination_message();
        prop_assert!(message.len() <= TERMINATION_MESSAGE_LIMIT, "{} bytes", message.len());
        let back = Progress::from_termination_message(&message);
        prop_assert!(back.is_some(), "{message}");
        let back = back.unwrap();
        prop_assert_eq!(back.step, p.step);
        // serde_json parses floats to within one ulp unless its `float_roundtrip` feature is
        // on (it is not: it would rebuild every crate's serde_json for one digit of a loss).
        let ulp = |a: f64, b: f64| a == b || (a - b).abs() <= a.abs() * f64::EPSILON;
        prop_assert!(
            matches!((back.loss, p.loss), (Some(a), Some(b)) if ulp(a, b)) || back.loss == p.loss,
            "{:?} != {:?}", back.loss, p.loss
        );
        prop_assert_eq!(&back.last_checkpoint, &p.last_checkpoint);
        if serde_json::to_string(&p).unwrap().len() < 3000 {
            prop_assert_eq!(back.round_ends, p.round_ends);
            prop_assert_eq!(back.rejected_connections, p.rejected_connections);
        }
    }

    /// A config that validates survives its YAML (what the operator puts in a ConfigMap).
    #[test]
    fn a_config_round_trips_through_yaml(
        steps in 1u64..10_000_000,
        lr in 1e-7f64..1.0,
        warmup in 0u64..10_000,
        every in 0u64..100_000,
        seed in any::<u64>(),
    ) {
        let text = format!(
            "task: copy\nseed: {seed}\nmaxSteps: {steps}\noptimizer: {{lr: {lr}}}\n\
             schedule: {{warmupSteps: {warmup}}}\ncheckpoint: {{everySteps: {every}}}\n"
        );
        let config = TrainerConfig::from_yaml(&text, "generated");
        prop_assume!(config.is_ok());
        let config = config.unwrap();
        let again = TrainerConfig::from_yaml(&config.to_yaml(), "round trip").unwrap();
        prop_assert_eq!(again.to_yaml(), config.to_yaml());
        prop_assert_eq!(again.digest(), config.digest());
    }
}

/// The `termination_message` target: what the operator does with a container's message.
fn termination(input: &[u8]) -> Verdict {
    let text = String::from_utf8_lossy(input);
    reset_largest_allocation();
    let parsed = Progress::from_termination_message(&text);
    let largest = largest_allocation_since();
    // A message is at most 4 KiB; parsing it may not cost more than a few times that.
    if largest > 64 * input.len().max(1024) {
        return Err(format!(
            "{largest} bytes allocated at once for {} bytes",
            input.len()
        ));
    }
    Ok(match parsed {
        Some(p) if p.to_termination_message().len() > TERMINATION_MESSAGE_LIMIT => {
            return Err("a parsed report no longer fits its message".into());
        }
        Some(_) => "a report".into(),
        None => "not a report".into(),
    })
}

#[test]
fn fuzz_termination_message() {
    ferrotrain_fuzz::check("termination_message", SHORT_RUN, termination);
}

/// The `trainer_config` target: a user's config file.
fn config(input: &[u8]) -> Verdict {
    let text = String::from_utf8_lossy(input);
    Ok(match TrainerConfig::from_yaml(&text, "fuzz") {
        Ok(c) => {
            // What validates must survive the operator's ConfigMap round trip.
            let again = TrainerConfig::from_yaml(&c.to_yaml(), "round trip")
                .map_err(|e| format!("a valid config fails after its own YAML: {e}"))?;
            if again.digest() != c.digest() {
                return Err("a valid config changes through its own YAML".into());
            }
            "valid".into()
        }
        Err(e) => format!("{:.24}", e.to_string()),
    })
}

#[test]
fn fuzz_trainer_config() {
    ferrotrain_fuzz::check("trainer_config", SHORT_RUN, config);
}

#[test]
fn deeply_nested_yaml_is_an_error_not_a_stack_overflow() {
    for open in ["[", "{a: ", "- "] {
        let text = format!("model: {}", open.repeat(100_000));
        assert!(TrainerConfig::from_yaml(&text, "nested").is_err());
    }
}
