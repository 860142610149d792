//! A chaos soak (bench/chaos.sh, tests/chaos.rs): a job in each shape under a seeded schedule
//! of real faults, checked against the same job run without any.
pub mod checks;
pub mod driver;
pub mod fault;
pub mod final_state;
pub mod inject;
pub mod kit;
pub mod ledger;
pub mod observe;
pub mod report;
pub mod rng;
pub mod run;
pub mod schedule;
pub mod shape;
pub mod soak;
