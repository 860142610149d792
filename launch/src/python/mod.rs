//! A user's command that is a Python script (`python train.py args`, `python -m pkg args`):
//! its ranks run through a small runner of ours (`rank.py`, embedded, standard library only),
//! which runs the script as `__main__` as Python itself would, and which can wait as a spare
//! with torch already imported (launch/src/spare.rs's protocol: FERROTRAIN_SPARE, then the
//! round's environment as one JSON line on stdin). Any other command runs as it is, without
//! spares.

/// The runner's source (`python -c`).
pub const RUNNER: &str = include_str!("rank.py");

/// A Python command, as the runner takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonCommand {
    /// The interpreter (`python3`, `/usr/bin/python3.11`, ...).
    pub interpreter: String,
    /// The interpreter's own options before the script (`-u`, `-O`, ...).
    pub options: Vec<String>,
    /// `-m module` rather than a script's path.
    pub module: bool,
    /// The script's path, or the module.
    pub target: String,
    /// The script's arguments.
    pub args: Vec<String>,
}

/// Interpreter options without a value, which the runner's `python -c` takes as well.
const PLAIN_OPTIONS: [&str; 10] = ["-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-P", "-b"];

impl PythonCommand {
    /// `argv` as a Python command, or None: another program, or interpreter options the
    /// runner does not pass on (`-c`, `-X`, `-W`, ...: the command then runs as it is).
    pub fn parse(argv: &[String]) -> Option<PythonCommand> {
        let (interpreter, rest) = argv.split_first()?;
        let name = interpreter.rsplit('/').next().unwrap_or(interpreter);
        let version = name.strip_prefix("python")?;
        if !version.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return None;
        }
        let mut options = Vec::new();
        let mut rest = rest.iter();
        loop {
            let word = rest.next()?;
            if word == "-m" {
                let target = rest.next()?.clone();
                return Some(PythonCommand {
                    interpreter: interpreter.clone(),
                    options,
                    module: true,
                    target,
                    args: rest.cloned().collect(),
                });
            }
            if PLAIN_OPTIONS.contains(&word.as_str()) {
                options.push(word.clone());
                continue;
            }
            if word.starts_with('-') {
                return None;
            }
            return Some(PythonCommand {
                interpreter: interpreter.clone(),
                options,
                module: false,
                target: word.clone(),
                args: rest.cloned().collect(),
            });
        }
    }

    /// The command line of a rank: the runner with the script and its arguments.
    pub fn runner_argv(&self) -> Vec<String> {
        let mut argv = vec![self.interpreter.clone()];
        argv.extend(self.options.iter().cloned());
        argv.push("-c".into());
        argv.push(RUNNER.into());
        argv.push(if self.module { "module" } else { "path" }.into());
        argv.push(self.target.clone());
        argv.extend(self.args.iter().cloned());
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn python_scripts_and_modules_are_recognised_and_other_commands_are_not() {
        let p = PythonCommand::parse(&words("python3 -u train.py --lr 3e-4 -v")).unwrap();
        assert_eq!(
            (p.options, p.module, p.target.as_str(), p.args),
            (words("-u"), false, "train.py", words("--lr 3e-4 -v"))
        );
        let p = PythonCommand::parse(&words("/usr/bin/python3.11 -m pkg.train x")).unwrap();
        assert_eq!(
            (p.module, p.target.as_str(), p.args),
            (true, "pkg.train", words("x"))
        );
        for other in [
            "bash run.sh",
            "torchrun train.py",
            "python3 -c print(1)",
            "python -X dev train.py",
            "python",
            "python -m",
            "pythonista train.py",
        ] {
            assert_eq!(PythonCommand::parse(&words(other)), None, "{other}");
        }
    }

    #[test]
    fn the_runner_gets_the_interpreters_options_then_the_script_and_its_arguments() {
        let p = PythonCommand::parse(&words("python -u train.py --epochs 2")).unwrap();
        let argv = p.runner_argv();
        assert_eq!(&argv[..3], &words("python -u -c"));
        assert_eq!(argv[3], RUNNER);
        assert_eq!(&argv[4..], &words("path train.py --epochs 2"));
    }
}
