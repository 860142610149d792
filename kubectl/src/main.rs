//! `kubectl-ferrotrain`, run by kubectl as `kubectl ferrotrain` (kubectl finds plugins by
//! their name on PATH). The binary's edge: parse, run, print the error, exit with a code.

use std::process::ExitCode;

use clap::Parser;
use kubectl_ferrotrain::cli::Cli;
use kubectl_ferrotrain::{EXIT_ERROR, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let outcome = runtime
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(cli)).map_err(anyhow::Error::from));
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}
