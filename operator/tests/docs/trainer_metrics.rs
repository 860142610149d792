//! The pod's exposition (`ferrotrain_launch::endpoint`, which node 0's launcher and a rank run
//! alone both serve) of the launcher's own fixture: a progress report with every field set.
//! The fixture is compiled here as it is (`launch/src/endpoint/fixtures.rs`: only the api
//! crate), so the docs check and the exposition's own tests read the same report.

#[path = "../../../launch/src/endpoint/fixtures.rs"]
mod fixtures;

/// The exposition of a progress report with every field set (the launcher's own fixture).
pub fn full_exposition() -> String {
    ferrotrain_launch::endpoint::prometheus_text(&fixtures::full_progress())
}
