//! How a rank's process ends: its typed end record for the launcher (FERROTRAIN_END_FILE), its
//! message on stderr and in the termination log, and then `_exit`, without libc's exit
//! handlers: they run libtorch's static destructors and give the allocator's arenas back
//! (0.3 s of munmap per rank, strace), and the next round starts once every rank of this one
//! has exited.
//!
//! And one wait that nothing else interrupts: while a rank meets its gang (the store's GETs of
//! its peers' addresses, the ring's connections, NCCL's init), each waiting up to the
//! rendezvous timeout, a round its agent abandons (ABANDON: a peer failed, froze or was lost
//! before the round's first step) kept the rank waiting until the launcher's stop grace ran
//! out and it was killed: 10 s on the kit instead of 2. A rank that is still meeting has no
//! state of its own to leave, so [`Meeting`] ends its process as soon as the round is
//! abandoned, with the record an abandoned collective leaves.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use ferrotrain_api::{RankEnd, env};
use ferrotrain_launch::signals;
use ferrotrain_launch::termination::write_termination_message;

use crate::error::{CollectiveFault, TrainError};

/// Leaves `end` where the launcher reads why this rank ended (FERROTRAIN_END_FILE; none
/// outside a launcher).
pub fn leave_end_record(end: &RankEnd) {
    let Some(path) = std::env::var_os(env::FERROTRAIN_END_FILE).filter(|p| !p.is_empty()) else {
        return;
    };
    if let Err(e) = end.write(Path::new(&path)) {
        tracing::warn!("cannot leave the end record for the launcher: {e}");
    }
}

/// Says why the command failed (stderr and the termination log); returns its exit code.
pub fn report_error(e: &TrainError) -> u8 {
    eprintln!("ferrotrain: error: {e}");
    write_termination_message(&e.to_string());
    e.exit_code() as u8
}

/// Ends the process with `code` at once; what it wrote is flushed first.
pub fn exit_now(code: u8) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: fflush(NULL) flushes every C stdio stream (libtorch's prints); _exit ends the
    // process without the atexit handlers, which nothing of an ended rank needs.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(i32::from(code))
    }
}

/// Ends a rank that failed with `error` at `step`: its record, its message, its exit code.
pub fn fail(error: &TrainError, step: Option<u64>) -> ! {
    leave_end_record(&error.rank_end(step));
    exit_now(report_error(error))
}

/// How often a meeting rank looks whether its round was abandoned.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// While it lives, a round abandoned by the agent ends this process at once (see the module's
/// documentation). Dropped once the rank has met its gang: from then on its collectives look
/// for the abandon themselves, and leave the rank's state first.
pub struct Meeting {
    met: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

impl Meeting {
    pub fn start() -> Self {
        let met = Arc::new(AtomicBool::new(false));
        let watching = met.clone();
        let watcher = std::thread::Builder::new()
            .name("meeting".into())
            .spawn(move || {
                while !watching.load(Ordering::SeqCst) {
                    if signals::abandoned() {
                        let fault = CollectiveFault::abandoned(
                            "the round ended elsewhere: abandoned while meeting the gang".into(),
                        );
                        fail(&TrainError::Collective(fault), None);
                    }
                    std::thread::sleep(CHECK_EVERY);
                }
            })
            .inspect_err(|e| tracing::warn!("no watch of the round while meeting: {e}"))
            .ok();
        Meeting { met, watcher }
    }
}

impl Drop for Meeting {
    fn drop(&mut self) {
        self.met.store(true, Ordering::SeqCst);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}
