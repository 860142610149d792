//! The fleet bench's parts (bench/operator-fleet.sh, `src/bin/operator-fleet.rs`) that the
//! hollow-node test shares: identities and FlowSchemas, the API server's counters, processes
//! and their cost, the watches that time what happens, the hollow jobs.

pub mod access;
pub mod bench;
pub mod disrupt;
pub mod jobs;
pub mod lost;
pub mod metrics;
pub mod observe;
pub mod phases;
pub mod procs;
pub mod recovery;
pub mod report;
pub mod track;
pub mod window;
