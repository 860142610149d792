//! Losing nothing when a rank fails: every rank left alive when a round ends leaves its state
//! (the step it completed, its parameters and optimizer moments) in its pod
//! ([`snapshot`]), and the next round starts from the freshest state any rank holds
//! ([`plan`]): only the step in flight is trained again. Checkpoint files are for durability,
//! read when no rank holds a state as new (the whole gang lost, a suspend, a new attempt).
//! docs/losing-nothing.md says why this design.

mod plan;
mod snapshot;

pub use plan::{ConfigMismatch, Offer, Source, plan};
pub use snapshot::{HealState, digest, layout_of, load, newest, write};
