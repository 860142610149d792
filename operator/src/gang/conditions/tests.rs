//! Conditions keep their transition times.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::fixtures::t;
use crate::gang::*;

#[test]
fn conditions_keep_their_transition_time_while_unchanged() {
    let mut conditions = vec![];
    set_condition(
        &mut conditions,
        "Running",
        true,
        "A",
        "x".into(),
        t(1),
        Some(1),
    );
    set_condition(
        &mut conditions,
        "Running",
        true,
        "B",
        "y".into(),
        t(5),
        Some(2),
    );
    assert_eq!(conditions[0].last_transition_time, Time(t(1)));
    assert_eq!(
        (
            conditions[0].reason.as_str(),
            conditions[0].observed_generation
        ),
        ("B", Some(2))
    );
    set_condition(
        &mut conditions,
        "Running",
        false,
        "C",
        String::new(),
        t(9),
        Some(2),
    );
    assert_eq!(conditions[0].last_transition_time, Time(t(9)));
    assert_eq!(conditions.len(), 1);
}
