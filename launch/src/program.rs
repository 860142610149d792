//! What each local rank runs: ferrotrain's trainer (`ferrotrain launch`), or a command of the
//! user's, such as a PyTorch script (`ferrotrain-launch`, spec.pytorch), which gets
//! torchrun's environment (torchrun.rs). Both are restarted in place, blamed and reported the
//! same way; what differs is the command line, the environment beyond the common contract,
//! where the ranks' rendezvous is (the trainer's meets in the launcher's store; a script's
//! rank 0 serves its own TCPStore on a port of each round's own) and what a spare is.

use std::path::PathBuf;
use std::process::Command;

use crate::python::PythonCommand;

/// What each local rank runs.
#[derive(Clone, Debug)]
pub enum RankProgram {
    /// `<program> run --config <config> [args]`.
    Trainer(Trainer),
    /// The user's command as it is (a Python script through the runner, python/rank.py).
    Command(UserCommand),
}

/// ferrotrain's trainer.
#[derive(Clone, Debug)]
pub struct Trainer {
    pub program: PathBuf,
    pub config: PathBuf,
    /// Extra arguments after `run --config <path>`.
    pub args: Vec<String>,
    /// The program is the launcher's own executable (not --rank-program): it can be a spare.
    pub own_binary: bool,
}

/// A command of the user's.
#[derive(Clone, Debug)]
pub struct UserCommand {
    pub argv: Vec<String>,
    /// Modules a Python spare imports while it waits, besides torch.
    pub pre_import: Vec<String>,
}

impl RankProgram {
    /// The command line of a rank (without its environment).
    pub fn command(&self) -> Command {
        match self {
            RankProgram::Trainer(t) => {
                let mut cmd = Command::new(&t.program);
                cmd.arg("run").arg("--config").arg(&t.config).args(&t.args);
                cmd
            }
            RankProgram::Command(c) => {
                let argv = match PythonCommand::parse(&c.argv) {
                    Some(python) => python.runner_argv(),
                    None => c.argv.clone(),
                };
                let mut cmd = Command::new(&argv[0]);
                cmd.args(&argv[1..]);
                if !c.pre_import.is_empty() {
                    cmd.env(
                        ferrotrain_api::env::FERROTRAIN_PRE_IMPORT,
                        c.pre_import.join(","),
                    );
                }
                cmd
            }
        }
    }

    /// Whether a rank can wait as a spare: the launcher's own trainer, or a Python command.
    pub fn can_have_spares(&self) -> bool {
        match self {
            RankProgram::Trainer(t) => t.own_binary,
            RankProgram::Command(c) => PythonCommand::parse(&c.argv).is_some(),
        }
    }

    /// Whether the ranks meet on their own (a script's rank 0 serves its TCPStore on a port
    /// of the round's own) rather than in the launcher's store.
    pub fn is_command(&self) -> bool {
        matches!(self, RankProgram::Command(_))
    }

    /// For people: what the ranks run.
    pub fn describe(&self) -> String {
        match self {
            RankProgram::Trainer(t) => t.program.display().to_string(),
            RankProgram::Command(c) => c.argv.join(" "),
        }
    }
}
