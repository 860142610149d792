//! What a page runs against: the repository's root, a kubeconfig whose namespace is the
//! test's, the tag of the images the chart runs.

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ is in the repository")
        .to_path_buf()
}

/// A copy of `$KUBECONFIG` (its current context alone) whose context's namespace is the
/// test's, so that a page's `kubectl` commands without `-n` work there; removed on drop.
pub struct NamespacedKubeconfig {
    pub path: PathBuf,
}

impl NamespacedKubeconfig {
    pub fn create(namespace: &str) -> NamespacedKubeconfig {
        let path = std::env::temp_dir().join(format!("{namespace}.kubeconfig"));
        let view = std::process::Command::new("kubectl")
            .args(["config", "view", "--raw", "--flatten", "--minify"])
            .output()
            .expect("kubectl config view (kubectl on PATH)");
        assert!(
            view.status.success(),
            "kubectl config view: {}",
            String::from_utf8_lossy(&view.stderr)
        );
        // Owner-only, or helm warns that the file is readable by others on every command.
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            file.write_all(&view.stdout)
                .expect("writing the kubeconfig");
        }
        let set = std::process::Command::new("kubectl")
            .args(["config", "set-context", "--current"])
            .arg(format!("--namespace={namespace}"))
            .env("KUBECONFIG", &path)
            .output()
            .expect("kubectl config set-context");
        assert!(
            set.status.success(),
            "kubectl config set-context: {}",
            String::from_utf8_lossy(&set.stderr)
        );
        NamespacedKubeconfig { path }
    }
}

impl Drop for NamespacedKubeconfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The tag of the images the installed chart runs: `$FERROTRAIN_E2E_IMAGE`'s (what
/// scripts/e2e.sh sets), else `$TAG`.
pub fn image_tag() -> String {
    crate::jobs::trainer_image()
        .and_then(|image| image.rsplit_once(':').map(|(_, tag)| tag.to_string()))
        .or_else(|| std::env::var("TAG").ok().filter(|t| !t.is_empty()))
        .expect("set FERROTRAIN_E2E_IMAGE (ferrotrain/trainer:TAG) or TAG: the tag of the images the chart runs")
}
