//! The launcher's and the trainers' processes of a pod: found among this machine's processes
//! (the cluster kit runs its nodes' containers here) and killed from outside the pod, or
//! signalled from inside it (a trainer of a round, a spare waiting for the next).

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::pods::exec;
use crate::wait::{WAIT, wait_for};

/// Kills (SIGKILL) the launcher of the pod with UID `uid`, the container's first process,
/// from this machine: the cluster kit's kubelets run here, so its containers' processes are
/// this machine's (found by the POD_UID the operator gives them). A process cannot SIGKILL
/// its own container's init from inside; the node's OOM killer or an operator can.
pub fn kill_launcher_from_host(uid: &str) -> u32 {
    let pid = launcher_pid(uid);
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill -KILL {pid}");
    pid
}

/// The launcher processes (`ferrotrain launch`) of the pod with UID `uid` among this
/// machine's processes: the cluster kit runs its nodes' containers here.
pub fn launchers_of(uid: &str) -> Vec<u32> {
    processes_of(uid, "launch")
}

/// The trainer processes (`ferrotrain run`) of the pod with UID `uid` that train or wait in
/// a round: not the spares waiting for the next one (process name ft-spare).
pub fn trainers_of(uid: &str) -> Vec<u32> {
    processes_of(uid, "run")
        .into_iter()
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            comm.trim() != "ft-spare"
        })
        .collect()
}

/// This machine's `ferrotrain <subcommand>` processes of the pod with UID `uid` (found by
/// the POD_UID the operator gives its container, which its launcher's ranks inherit).
fn processes_of(uid: &str, subcommand: &str) -> Vec<u32> {
    let wanted = format!("POD_UID={uid}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let read = |f: &str| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
        let cmdline = read("cmdline");
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_it = argv.first().is_some_and(|a| a.ends_with(b"ferrotrain"))
            && argv.get(1) == Some(&subcommand.as_bytes());
        let environ = read("environ");
        let of_pod = environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes());
        if is_it && of_pod {
            found.push(pid);
        }
    }
    found
}

/// The one launcher of the pod with UID `uid` (see [`launchers_of`]).
pub fn launcher_pid(uid: &str) -> u32 {
    let found = launchers_of(uid);
    assert_eq!(
        found.len(),
        1,
        "the launcher of pod {uid} among this machine's processes (the kit runs its nodes here)"
    );
    found[0]
}

/// The pid of the spare trainer (process name ft-spare, launch/spare.rs) waiting in `pod`'s
/// trainer container for the next round, once its agent has started one (bounded wait).
pub async fn wait_spare(pods: &Api<Pod>, pod: &str) -> u32 {
    let script = "for d in /proc/[0-9]*; do \
                    [ \"$(cat $d/comm 2>/dev/null)\" = ft-spare ] && echo ${d#/proc/}; \
                  done; true";
    wait_for(&format!("a spare trainer in {pod}"), WAIT, || async {
        let out = exec(pods, pod, script).await;
        (
            out.trim()
                .lines()
                .next()
                .and_then(|l| l.trim().parse().ok()),
            out,
        )
    })
    .await
}

/// Sends `signal` (KILL, STOP, ...) to the trainer process (`ferrotrain run`) of the pod, not
/// to its launcher; returns the pid it signalled.
pub async fn signal_trainer(pods: &Api<Pod>, pod: &str, signal: &str) -> u32 {
    signal_local_rank(pods, pod, None, signal).await
}

/// Sends `signal` to the trainer of local rank `local_rank` of the pod (its LOCAL_RANK; any
/// trainer when none), not to its launcher nor a spare; returns the pid it signalled.
pub async fn signal_local_rank(
    pods: &Api<Pod>,
    pod: &str,
    local_rank: Option<usize>,
    signal: &str,
) -> u32 {
    // argv[0] a ferrotrain binary and argv[1] `run`: the launcher (`launch`) and this very
    // shell (whose script names the pattern) are left alone, and so are spares waiting for
    // the next round (process name ft-spare, launch/spare.rs). A round's trainer that was a
    // spare keeps the environment it started with, its LOCAL_RANK among it.
    let rank_test = match local_rank {
        Some(r) => format!("&& tr '\\0' '\\n' < $d/environ | grep -qx LOCAL_RANK={r} "),
        None => String::new(),
    };
    let script = format!(
        "for d in /proc/[0-9]*; do \
           set -- $(tr '\\0' ' ' < $d/cmdline 2>/dev/null); \
           if [ \"${{1##*/}}\" = ferrotrain ] && [ \"$2\" = run ] \
              && [ \"$(cat $d/comm 2>/dev/null)\" != ft-spare ] {rank_test}; then \
             kill -{signal} ${{d#/proc/}} && echo ${{d#/proc/}}; \
           fi; \
         done"
    );
    signalled_pid(pods, pod, &script, "trainer process").await
}

/// Sends `signal` to the rank of a Python script that `ferrotrain-launch` runs in `pod`
/// (spec.pytorch: `python3 -c <runner> path script.py ...`, launch/src/python/rank.py), not to
/// the launcher nor to a spare waiting for the next round (process name ft-spare); returns
/// the pid it signalled: the first rank found (the pod's one rank, with one per pod).
pub async fn signal_python_rank(pods: &Api<Pod>, pod: &str, signal: &str) -> u32 {
    // argv[0] a Python interpreter and argv[1] `-c` (the runner): this shell and the launcher
    // are left alone; a round's rank that was a spare took its interpreter's name back.
    let script = format!(
        "for d in /proc/[0-9]*; do \
           a0=$(tr '\\0' '\\n' < $d/cmdline 2>/dev/null | head -n 2 | tr '\\n' ' '); \
           case \"${{a0##*/}}\" in python*' -c ') ;; *) continue ;; esac; \
           [ \"$(cat $d/comm 2>/dev/null)\" = ft-spare ] && continue; \
           kill -{signal} ${{d#/proc/}} && echo ${{d#/proc/}} && break; \
         done"
    );
    signalled_pid(pods, pod, &script, "Python rank").await
}

/// Runs `script` (which prints the pid of each process it signalled) in `pod`; the first pid,
/// or a panic naming `what` was not found.
async fn signalled_pid(pods: &Api<Pod>, pod: &str, script: &str, what: &str) -> u32 {
    let out = exec(pods, pod, script).await;
    out.trim()
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {what} to signal in {pod}: {out:?}"))
}
