//! A block run with bash, strictly, within a time limit.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

/// What a block did: its exit status (None when it ran past the limit) and its output.
pub struct Ran {
    pub status: Option<i32>,
    pub output: String,
    pub seconds: f64,
}

/// Runs `script` with bash (`set -euo pipefail`, stderr into stdout) in `dir` with `env`,
/// for at most `limit`: past it the whole process group is killed.
pub async fn run_script(
    script: &str,
    dir: &Path,
    env: &[(String, String)],
    limit: Duration,
) -> Ran {
    let started = Instant::now();
    let mut child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(format!("exec 2>&1\nset -euo pipefail\n{script}"))
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("starting bash");
    let pid = child.id();
    let mut stdout = child.stdout.take().expect("bash's stdout");
    let mut bytes = Vec::new();
    let finished = tokio::time::timeout(limit, async {
        let _ = stdout.read_to_end(&mut bytes).await;
        child.wait().await
    })
    .await;
    let status = match finished {
        Ok(Ok(status)) => Some(status.code().unwrap_or(-1)),
        Ok(Err(e)) => panic!("waiting for bash: {e}"),
        Err(_) => {
            if let Some(pid) = pid {
                // The block's commands (kubectl wait, ...) are in bash's process group.
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
            None
        }
    };
    Ran {
        status,
        output: String::from_utf8_lossy(&bytes).into_owned(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_block_runs_with_bash_strictly_and_within_its_limit() {
        let root = crate::pages::repo_root();
        let env = vec![("GREETING".to_string(), "hello".to_string())];
        let ran = run_script(
            "echo \"$GREETING\"; echo oops >&2; test -f examples/copy-dt.yaml",
            &root,
            &env,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(
            (ran.status, ran.output.as_str()),
            (Some(0), "hello\noops\n")
        );
        // -u: an unset variable fails the block; pipefail: so does a failed pipe.
        let ran = run_script(
            "echo \"$NOT_SET_ANYWHERE\"",
            &root,
            &[],
            Duration::from_secs(30),
        )
        .await;
        assert_ne!(ran.status, Some(0));
        let ran = run_script(
            "false | cat\necho after",
            &root,
            &[],
            Duration::from_secs(30),
        )
        .await;
        assert_ne!(ran.status, Some(0));
        assert!(!ran.output.contains("after"));
        let ran = run_script("echo started; sleep 30", &root, &[], Duration::from_secs(1)).await;
        assert_eq!((ran.status, ran.output.as_str()), (None, "started\n"));
    }
}
