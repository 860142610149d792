//! A small tmpfs for the tests of a full disk: the checkpoint volume or a memory-backed
//! /dev/shm that fills up, answering ENOSPC as the real ones do. Mounting needs root
//! (CAP_SYS_ADMIN), which CI has: a test that needs one skips, saying so loudly, only when it
//! does not run as root. Unit tests use it as `crate::tmpfs`, the cross-process tests through
//! `tests/common`.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a fresh directory; unmounted (lazily: a child may still hold a file
/// open) and removed when dropped.
pub struct Tmpfs {
    dir: Option<tempfile::TempDir>,
}

impl Tmpfs {
    /// A tmpfs of `bytes` (rounded up to pages), or None when this process is not root
    /// (`test` names what is skipped).
    pub fn mount(bytes: u64, test: &str) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!(
                "\n!!!!!!!! SKIPPED {test}: mounting a tmpfs (a disk that fills up) needs root; \
                 it runs in CI !!!!!!!!\n"
            );
            return None;
        }
        let dir = tempfile::tempdir().expect("a directory to mount on");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t tmpfs failed, as root");
        Some(Tmpfs { dir: Some(dir) })
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("mounted").path()
    }

    /// Bytes free for an unprivileged writer.
    pub fn free(&self) -> u64 {
        free_bytes(self.path())
    }

    /// Writes a file `name` that leaves `left` bytes free: what some other writer took.
    pub fn fill(&self, name: &str, left: u64) -> PathBuf {
        let path = self.path().join(name);
        let mut file = std::fs::File::create(&path).expect("the ballast file");
        let chunk = vec![0x5au8; 64 * 1024];
        while self.free() > left {
            let n = (self.free() - left).min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..n]).expect("write ballast");
            file.flush().unwrap();
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// Bytes free under `path` (statvfs's f_bavail).
pub fn free_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
    // SAFETY: a valid C string and a zeroed statvfs for the call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bavail as u64 * st.f_frsize as u64
}
