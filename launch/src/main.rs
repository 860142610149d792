//! `ferrotrain-launch`: the launcher alone, for images of your own. It runs your command (a
//! PyTorch script written for torchrun: `ferrotrain-launch --nproc-per-node 2 python
//! train.py`) as the pod's local ranks with torchrun's environment, restarts every rank in
//! place as a new round when one fails (from spares that have Python started and torch
//! imported), and on node 0 serves the gang's /progress and /metrics on
//! FERROTRAIN_METRICS_PORT. The operator makes it the entrypoint of spec.pytorch's pods.
//! No libtorch: it is this crate and its small dependencies (docs/pytorch.md).

use std::process::ExitCode;

use clap::Parser;
use ferrotrain_launch::termination::write_termination_message;
use ferrotrain_launch::{CommandLaunchArgs, endpoint};

fn main() -> ExitCode {
    let args = CommandLaunchArgs::parse();
    ferrotrain_launch::logging::init("info");
    let program = args.program();
    match ferrotrain_launch::run(args.launch, program, endpoint::port_from_env()) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            tracing::error!("launch: {e}");
            write_termination_message(&e.to_string());
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
