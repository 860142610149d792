//! The reference generated from the code (docs/reference/): the markdown its pages are
//! written in, a program's command line read from its clap `Command`, and the check that a
//! committed page is current. The `reference` feature: the operator's tests write most pages,
//! the `ferrotrain` binary its own command line (`ferrotrain reference cli`).

pub mod cli;
pub mod generated;
pub mod markdown;
