//! The checkpoints of one job: the newest complete one, loading, and saving in the
//! background (one save in flight at a time; its error surfaces at the next call, unless the
//! disk refused it: then the next save tries again).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use ferrotrain_api::config::CheckpointPolicy;
use ferrotrain_api::recovery::Timestamp;
use ferrotrain_api::{CheckpointError, CheckpointInfo, DurableCheckpoint};

use super::bucket::{self, Bucket, Uploader};
use super::fence::{WriterId, claim_fence, sweep_temporaries};
use super::io::io_err;
use super::layout::{
    MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, complete_checkpoints, dir_size, newest_complete,
    parse_step_dir_name, read_state, step_dir_name,
};
use super::safetensors::{Named, read_safetensors, shallow, snapshot};
use super::save::{SaveHook, SaveJob};
use super::state::TrainerState;
use crate::error::{Reason, Result, TrainError};
use crate::lock::lock;
use crate::rfc3339::{self, Resolution};

/// A checkpoint read back.
pub struct Loaded {
    pub dir: PathBuf,
    pub model: Named,
    pub optimizer: Named,
    pub state: TrainerState,
}

/// The saves that failed, as the background thread found them.
#[derive(Debug, Default)]
struct Failures {
    /// Since the last save that completed.
    current: Option<CheckpointError>,
    /// Every save of this store that failed.
    total: u64,
}

impl Failures {
    fn record(&mut self, step: u64, error: &TrainError) {
        self.total += 1;
        let (since, failed_saves) = match &self.current {
            Some(c) => (c.since, c.failed_saves + 1),
            None => (Timestamp::now(), 1),
        };
        self.current = Some(CheckpointError {
            step,
            message: error.to_string(),
            since,
            failed_saves,
        });
    }
}

/// The checkpoints of one job.
/// The last save's copy of the tensors: done once the writer sent on `done`; `blocked` the
/// seconds the training waited for it (in `save`, and in [`CheckpointStore::copied`]).
struct Copying {
    step: u64,
    done: std::sync::mpsc::Receiver<()>,
    blocked: f64,
    copied: Option<Instant>,
}

pub struct CheckpointStore {
    root: PathBuf,
    policy: CheckpointPolicy,
    in_flight: Option<JoinHandle<Result<CheckpointInfo>>>,
    copying: Option<Copying>,
    /// Written by the background thread when a save completes; read by progress reports.
    last: Arc<Mutex<Option<CheckpointInfo>>>,
    /// Written by the background thread when a save fails or completes; read likewise.
    failures: Arc<Mutex<Failures>>,
    hook: Option<SaveHook>,
    /// Set by `open_writer`: every commit is checked against the fence.
    pub(super) writer: Option<WriterId>,
    /// With `checkpoint.store`: uploads each committed checkpoint (the writer's only).
    uploader: Option<Arc<Uploader>>,
}

impl CheckpointStore {
    /// `root` is `<checkpoint dir>/<job>`; created if missing. Reads without claiming the
    /// directory and deletes nothing (a `translate` next to a running job must not touch its
    /// in-flight saves); its saves are not fenced. Training opens with [`Self::open_writer`].
    pub fn new(root: &Path, policy: CheckpointPolicy) -> Result<Self> {
        fs::create_dir_all(root).map_err(|e| io_err("creating", root, e))?;
        let store = CheckpointStore {
            root: root.to_path_buf(),
            policy,
            in_flight: None,
            copying: None,
            last: Arc::new(Mutex::new(None)),
            failures: Default::default(),
            hook: None,
            writer: None,
            uploader: None,
        };
        if let Some((dir, state)) = store.latest()? {
            let info = CheckpointInfo {
                step: state.step,
                size_bytes: dir_size(&dir),
                time: fs::metadata(dir.join(STATE_FILE))
                    .and_then(|m| m.modified())
                    .map(|t| rfc3339::format(t, Resolution::Second))
                    .unwrap_or(state.time),
                blocking_seconds: None,
                save_seconds: None,
            };
            *lock(&store.last) = Some(info);
        }
        Ok(store)
    }

    /// Opens `root` as its one writer: claims the fence for `writer` (an error when a later
    /// attempt of the same job holds it: this rank 0 is stale and must not write), then
    /// removes what earlier writers left half done. Their in-flight temporary directories
    /// are first renamed aside, so a stale writer still running cannot commit them.
    ///
    /// With `checkpoint.store` it also claims the bucket, downloads the bucket's newest
    /// checkpoint when the directory has nothing as new (a fresh node, a lost claim), and
    /// uploads the directory's newest when the bucket lacks it.
    pub fn open_writer(root: &Path, policy: CheckpointPolicy, writer: WriterId) -> Result<Self> {
        let job = root
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let bucket = match &policy.store {
            Some(config) => Some(Bucket::connect(config, job)?),
            None => None,
        };
        Self::open_writer_with(root, policy, writer, bucket)
    }

    /// [`Self::open_writer`] with the bucket given (tests give an in-memory one).
    #[doc(hidden)]
    pub fn open_writer_with(
        root: &Path,
        policy: CheckpointPolicy,
        writer: WriterId,
        bucket: Option<Bucket>,
    ) -> Result<Self> {
        fs::create_dir_all(root).map_err(|e| io_err("creating", root, e))?;
        claim_fence(root, &writer)?;
        sweep_temporaries(root, &writer);
        let uploader = match bucket {
            Some(b) => Some(Arc::new(bucket::attach(root, b, &policy, &writer)?)),
            None => None,
        };
        let mut store = Self::new(root, policy)?;
        store.writer = Some(writer);
        // The newest local checkpoint `new` found (every byte checked there): its trainer.json
        // alone says what the bucket's retention needs.
        if let Some(up) = &uploader
            && let Some(step) = store.last_completed().map(|c| c.step)
            && up.durable().is_none_or(|d| d.step < step)
        {
            let dir = root.join(step_dir_name(step));
            let eval_loss = read_state(&dir).ok().and_then(|s| s.eval_loss);
            tracing::info!(step, bucket = %up.bucket().url(), "the bucket lacks the newest local checkpoint: uploading it");
            up.enqueue(&dir, step, eval_loss, Instant::now());
        }
        store.uploader = uploader;
        Ok(store)
    }

    /// Uploads the job's own files `names` (config, vocabulary) from its directory to the
    /// bucket, if there is one: `select` and `translate` read them from there.
    pub fn put_job_files(&self, names: &[&str]) -> Result<()> {
        match &self.uploader {
            Some(up) => up.bucket().put_job_files(&self.root, names),
            None => Ok(()),
        }
    }

    /// The newest checkpoint complete in the bucket (none without `checkpoint.store`).
    pub fn durable(&self) -> Option<DurableCheckpoint> {
        self.uploader.as_ref().and_then(|u| u.durable())
    }

    /// Waits for the save in flight, then for its upload, at most `limit` for the upload;
    /// true when every committed checkpoint is in the bucket (or there is no bucket).
    pub fn flush_uploads(&mut self, limit: std::time::Duration) -> Result<bool> {
        self.wait()?;
        Ok(self.uploader.as_ref().is_none_or(|u| u.flush(limit)))
    }

    /// The directory this store writes into.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The newest complete checkpoint's directory and state (ignores temporary and
    /// unreadable directories, with a warning).
    pub fn latest(&self) -> Result<Option<(PathBuf, TrainerState)>> {
        newest_complete(&self.root)
    }

    /// Every complete checkpoint, oldest first.
    pub fn complete(&self) -> Result<Vec<(PathBuf, TrainerState)>> {
        complete_checkpoints(&self.root)
    }

    /// Reads a checkpoint directory.
    pub fn load(dir: &Path) -> Result<Loaded> {
        let step = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_step_dir_name);
        let state = read_state(dir).map_err(|e| TrainError::Other(e.into()))?;
        if let Some(step) = step
            && step != state.step
        {
            return Err(TrainError::Other(
                format!(
                    "checkpoint {}: trainer.json says step {} but the directory is step {step}",
                    dir.display(),
                    state.step
                )
                .into(),
            ));
        }
        let model =
            read_safetensors(&dir.join(MODEL_FILE)).map_err(|e| TrainError::Other(e.into()))?;
        let optimizer =
            read_safetensors(&dir.join(OPTIMIZER_FILE)).map_err(|e| TrainError::Other(e.into()))?;
        Ok(Loaded {
            dir: dir.to_path_buf(),
            model,
            optimizer,
            state,
        })
    }

    /// Starts saving: copies the tensors to CPU memory now (the only part that blocks the
    /// training thread) and writes them on a background thread. Waits for the previous save
    /// first. Returns the seconds the caller was blocked.
    ///
    /// If the previous save failed, its error is returned and this save is not started;
    /// unless the disk refused it ([`TrainError::disk_refused`]): that failure was logged
    /// and recorded when it happened ([`Self::save_error`]), and this save tries again.
    pub fn save(&mut self, model: &Named, optimizer: &Named, state: TrainerState) -> Result<f64> {
        let started = Instant::now();
        if let Err(e) = self.wait()
            && !e.disk_refused()
        {
            return Err(e);
        }
        // The tensors themselves, not copies: the writer copies them out while the next step's
        // forward and backward read them, and the step's update waits for that copy
        // ([`CheckpointStore::copied`]).
        let model = shallow(model);
        let optimizer = shallow(optimizer);
        let (copied, copying) = std::sync::mpsc::channel();
        let (last, failures) = (self.last.clone(), self.failures.clone());
        let uploader = self.uploader.clone();
        let step = state.step;
        let (root, eval_loss) = (self.root.clone(), state.eval_loss);
        let (policy, hook, writer) = (self.policy.clone(), self.hook.clone(), self.writer.clone());
        let blocking = started.elapsed().as_secs_f64();
        let handle = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || -> Result<CheckpointInfo> {
                let copy = snapshot(&model).and_then(|m| Ok((m, snapshot(&optimizer)?)));
                drop((model, optimizer));
                let _ = copied.send(());
                let job = copy.map(|(model, optimizer)| SaveJob {
                    root: root.clone(),
                    policy,
                    model,
                    optimizer,
                    state,
                    blocking,
                    started,
                    hook,
                    writer,
                });
                let info = job.and_then(SaveJob::run).inspect_err(|e| {
                    lock(&failures).record(step, e);
                    if e.disk_refused() {
                        tracing::error!(
                            step,
                            error = %e,
                            "checkpoint of step {step} not saved: the disk refused the write \
                             (its temporary directory is removed; the next save tries again)"
                        );
                    }
                })?;
                *lock(&last) = Some(info.clone());
                lock(&failures).current = None;
                if let Some(up) = uploader {
                    up.enqueue(
                        &root.join(step_dir_name(info.step)),
                        info.step,
                        eval_loss,
                        started,
                    );
                }
                Ok(info)
            })
            .map_err(|e| {
                TrainError::Other(Reason::caused("cannot start the checkpoint writer", e))
            })?;
        self.in_flight = Some(handle);
        self.copying = Some(Copying {
            step,
            done: copying,
            blocked: blocking,
            copied: None,
        });
        Ok(blocking)
    }

    /// Waits until the save in flight has copied the tensors out (at once when it has): what
    /// the training must do before it changes them (the optimizer's update). The wait counts
    /// in the save's `blockingSeconds`.
    pub fn copied(&mut self) {
        let Some(c) = self.copying.as_mut() else {
            return;
        };
        if c.copied.is_none() {
            let waited = Instant::now();
            let _ = c.done.recv();
            c.blocked += waited.elapsed().as_secs_f64();
            c.copied = Some(waited);
        }
    }

    /// Waits for the save in flight, if any; returns the newest completed checkpoint, if any.
    /// An error of the background write surfaces here.
    pub fn wait(&mut self) -> Result<Option<CheckpointInfo>> {
        self.copied();
        if let Some(handle) = self.in_flight.take() {
            match handle.join() {
                Ok(result) => {
                    result?;
                }
                Err(_) => {
                    return Err(TrainError::Other("the checkpoint writer panicked".into()));
                }
            }
        }
        Ok(self.last_completed())
    }

    /// The newest checkpoint completed so far without waiting (for progress reports), with
    /// the time the training was blocked by its save once it is known.
    pub fn last_completed(&self) -> Option<CheckpointInfo> {
        let mut info = lock(&self.last).clone()?;
        if let Some(c) = self.copying.as_ref().filter(|c| c.step == info.step) {
            info.blocking_seconds = Some(c.blocked);
        }
        Some(info)
    }

    /// The last save's failure, when no save completed since (for progress reports).
    pub fn save_error(&self) -> Option<CheckpointError> {
        lock(&self.failures).current.clone()
    }

    /// Saves of this store that failed so far.
    pub fn save_failures(&self) -> u64 {
        lock(&self.failures).total
    }

    /// Calls `hook` at fixed points of every later background save (tests only).
    #[doc(hidden)]
    pub fn set_save_hook(&mut self, hook: SaveHook) {
        self.hook = Some(hook);
    }
}

impl Drop for CheckpointStore {
    /// A save in flight is finished, not abandoned: the run may be ending on an error and
    /// the checkpoint being written is the one the next attempt resumes from.
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            tracing::error!(error = %e, "the last checkpoint save failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::checkpoint::fixtures::*;

    /// The save copies the tensors out on its own thread; the training may read them meanwhile
    /// and changes them only after `copied`: the checkpoint holds them as they were at `save`.
    #[test]
    fn a_save_holds_the_tensors_as_they_were_however_soon_they_change_after_copied() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(3, 1)).unwrap();
        let (m, o) = (model(2), optimizer());
        let before: std::collections::BTreeMap<String, Tensor> =
            m.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
        let blocking = store.save(&m, &o, state(100, None)).unwrap();
        store.copied();
        let _guard = tch::no_grad_guard();
        for (_, t) in &m {
            let _ = t.shallow_clone().fill_(7.0);
        }
        let info = store.wait().unwrap().unwrap();
        assert!(info.blocking_seconds >= Some(blocking));
        let loaded = CheckpointStore::load(&tmp.path().join("step-00000100")).unwrap();
        assert_eq!(loaded.model.len(), before.len());
        for (name, saved) in &loaded.model {
            let was = &before[name];
            let same = bytes_of(saved) == bytes_of(was);
            assert!(same, "{name}: a change made after copied() was saved");
        }
    }

    #[test]
    fn round_trip_keeps_names_bits_and_state() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(3, 1)).unwrap();
        assert!(store.latest().unwrap().is_none());
        assert!(store.last_completed().is_none());
        let (m, o) = (model(2), optimizer());
        let blocking = store.save(&m, &o, state(100, Some(2.5))).unwrap();
        let info = store.wait().unwrap().expect("a completed checkpoint");
        assert_eq!(info.step, 100);
        // Blocked: the call, and (waiting at once, as a run's end does) the copy.
        assert!(
            info.blocking_seconds >= Some(blocking),
            "{info:?} {blocking}"
        );
        assert!(
            time::OffsetDateTime::parse(&info.time, &time::format_description::well_known::Rfc3339)
                .is_ok(),
            "{}",
            info.time
        );
        let dir = tmp.path().join("step-00000100");
        let on_disk: u64 = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE]
            .iter()
            .map(|f| fs::metadata(dir.join(f)).unwrap().len())
            .sum();
        assert_eq!(info.size_bytes, on_disk);
        assert_eq!(store.last_completed(), Some(info));
        assert_eq!(names(tmp.path()), ["step-00000100"]);

        let (latest_dir, latest_state) = store.latest().unwrap().unwrap();
        assert_eq!(latest_dir, dir);
        assert_eq!(latest_state, state(100, Some(2.5)));
        let loaded = CheckpointStore::load(&dir).unwrap();
        assert_eq!(loaded.dir, dir);
        assert_eq!(loaded.state, state(100, Some(2.5)));
        assert_same(&m, &loaded.model);
        assert_same(&o, &loaded.optimizer);
        // The non-contiguous tensor reads back with its logical layout.
        assert_eq!(loaded.model[2].1.size(), [6, 4]);
    }

    #[test]
    fn save_returns_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        let (release, log) = gate(&mut store, 100);
        store
            .save(&model(4), &optimizer(), state(100, None))
            .unwrap();
        // save() returned while the writer is held before writing a byte.
        assert!(!tmp.path().join("step-00000100").exists());
        assert!(store.last_completed().is_none());
        release.send(()).unwrap();
        assert_eq!(store.wait().unwrap().map(|i| i.step), Some(100));
        assert_eq!(
            *lock(&log),
            [
                "started 100",
                "wrote 100 model.safetensors",
                "wrote 100 optimizer.safetensors",
                "wrote 100 trainer.json",
                "renamed 100"
            ]
        );
    }

    #[test]
    fn tensors_are_copied_at_save_time() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        let (release, _log) = gate(&mut store, 100);
        let mut m: Named = vec![("w".into(), Tensor::ones([16], (Kind::Float, Device::Cpu)))];
        store.save(&m, &optimizer(), state(100, None)).unwrap();
        // Training goes on and, once the copy is out (as the step's update waits for it),
        // updates the weights in place while the write is pending.
        store.copied();
        let _ = m[0].1.fill_(7.0);
        release.send(()).unwrap();
        store.wait().unwrap();
        let loaded = CheckpointStore::load(&tmp.path().join("step-00000100")).unwrap();
        assert_eq!(loaded.model[0].1.sum(Kind::Float).double_value(&[]), 16.0);
    }

    #[test]
    fn a_second_save_waits_for_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(5, 1)).unwrap();
        let (release, log) = gate(&mut store, 100);
        store
            .save(&model(1), &optimizer(), state(100, None))
            .unwrap();
        let log2 = log.clone();
        let second = std::thread::spawn(move || {
            let (m, o) = (model(1), optimizer());
            store.save(&m, &o, state(200, None)).unwrap();
            lock(&log2).push("second save returned".into());
            store.wait().unwrap();
            store
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            !lock(&log).iter().any(|l| l == "second save returned"),
            "{:?}",
            lock(&log)
        );
        release.send(()).unwrap();
        let store = second.join().unwrap();
        let log = lock(&log).clone();
        let at = |s: &str| {
            log.iter()
                .position(|l| l == s)
                .unwrap_or_else(|| panic!("{s} missing in {log:?}"))
        };
        assert!(at("renamed 100") < at("second save returned"));
        assert!(at("renamed 100") < at("started 200"));
        assert_eq!(store.latest().unwrap().unwrap().1.step, 200);
    }

    #[test]
    fn a_failed_write_surfaces_at_wait_and_at_the_next_save() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("job");
        let mut store = CheckpointStore::new(&root, policy(2, 1)).unwrap();
        // The volume goes away under the trainer: root is replaced by a plain file.
        fs::remove_dir(&root).unwrap();
        fs::write(&root, b"not a directory").unwrap();
        store
            .save(&model(1), &optimizer(), state(100, None))
            .unwrap();
        let err = store.wait().unwrap_err().to_string();
        assert!(err.contains("checkpoint"), "{err}");
        store
            .save(&model(1), &optimizer(), state(200, None))
            .unwrap();
        assert!(
            store
                .save(&model(1), &optimizer(), state(300, None))
                .is_err()
        );
    }

    #[test]
    fn saving_the_same_step_twice_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        save_now(&mut store, 100, Some(4.0));
        save_now(&mut store, 100, Some(3.0));
        assert_eq!(names(tmp.path()), ["step-00000100"]);
        assert_eq!(store.latest().unwrap().unwrap().1.eval_loss, Some(3.0));
    }

    #[test]
    fn a_save_reports_how_long_it_took_until_its_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open_writer(tmp.path(), policy(1, 0), writer(0)).unwrap();
        let blocking = store.save(&model(1), &optimizer(), state(1, None)).unwrap();
        let info = store.wait().unwrap().unwrap();
        let total = info.save_seconds.expect("measured");
        assert!(total >= blocking && total < 60.0, "{total} vs {blocking}");
    }

    /// The checkpoint volume full (a real one: a tmpfs, so root): a save the disk refuses
    /// gives back what it wrote, is recorded with the disk's words, and the next save tries
    /// again instead of failing on it; the first save that completes clears the record. The
    /// checkpoint before it is untouched.
    #[test]
    fn a_save_the_full_disk_refuses_gives_its_space_back_and_the_next_save_tries_again() {
        let test =
            "a_save_the_full_disk_refuses_gives_its_space_back_and_the_next_save_tries_again";
        let Some(volume) = crate::tmpfs::Tmpfs::mount(2 << 20, test) else {
            return;
        };
        let root = volume.path().join("job");
        let mut store = CheckpointStore::open_writer(&root, policy(2, 0), writer(0)).unwrap();
        // About 400 KB a checkpoint.
        let opts = (Kind::Float, Device::Cpu);
        let m: Named = vec![("w".into(), Tensor::randn([100_000], opts))];
        let o: Named = vec![("exp_avg.w".into(), Tensor::zeros([1000], opts))];
        store.save(&m, &o, state(100, None)).unwrap();
        store.wait().unwrap();
        let ballast = volume.fill("ballast", 200 << 10);
        let left = volume.free();

        store.save(&m, &o, state(200, None)).unwrap();
        let err = store.wait().expect_err("no room for step 200");
        assert!(err.disk_refused(), "{err}");
        let recorded = store.save_error().expect("recorded");
        assert_eq!((recorded.step, recorded.failed_saves), (200, 1));
        assert!(
            recorded.message.contains("No space left on device"),
            "{}",
            recorded.message
        );
        assert_eq!(temp_dirs(&root), Vec::<String>::new(), "given back");
        assert!(volume.free() >= left, "{} < {left}", volume.free());

        // The next save starts although the last failed, and fails in turn.
        store.save(&m, &o, state(300, None)).unwrap();
        store.save(&m, &o, state(400, None)).unwrap();
        assert!(store.wait().is_err());
        let again = store.save_error().unwrap();
        assert_eq!((again.step, again.failed_saves), (400, 3));
        assert_eq!(again.since, recorded.since, "since the first");
        assert_eq!(store.last_completed().map(|c| c.step), Some(100));

        std::fs::remove_file(ballast).unwrap();
        store.save(&m, &o, state(500, None)).unwrap();
        assert_eq!(store.wait().unwrap().map(|c| c.step), Some(500));
        assert_eq!(
            store.save_error(),
            None,
            "cleared by the save that completed"
        );
        assert_eq!(store.save_failures(), 3);
        assert_eq!(
            names(&root),
            [
                crate::checkpoint::FENCE_FILE,
                "step-00000100",
                "step-00000500"
            ]
        );
        let loaded = CheckpointStore::load(&root.join("step-00000100")).unwrap();
        assert_same(&m, &loaded.model);
    }

    /// Issue 44: truncated, bit-flipped or zeroed at offsets over each file, the newest
    /// checkpoint is either skipped (the older one is resumed) or, where the damage could not
    /// change what it holds (JSON whitespace), read back exactly as saved. Never trained from
    /// damaged.
    #[test]
    fn a_damaged_newest_checkpoint_is_skipped_never_resumed_from() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(5, 0)).unwrap();
        save_now(&mut store, 100, None);
        save_now(&mut store, 200, Some(1.0));
        let newest = tmp.path().join("step-00000200");
        let pristine = CheckpointStore::load(&newest).unwrap();
        let (mut skipped, mut harmless) = (0, 0);
        for file in [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE] {
            let path = newest.join(file);
            let good = fs::read(&path).unwrap();
            for copy in ferrotrain_fuzz::damage::copies(&good) {
                fs::write(&path, &copy.bytes).unwrap();
                let (dir, state) = store.latest().unwrap().unwrap();
                if state.step == 100 {
                    skipped += 1;
                    let e = CheckpointStore::load(&newest).err().map(|e| e.to_string());
                    assert!(
                        e.as_deref().is_some_and(|e| e.contains(file)),
                        "{file} damaged ({copy}): load says {e:?}"
                    );
                } else {
                    harmless += 1;
                    let loaded = CheckpointStore::load(&dir).unwrap();
                    assert_eq!(loaded.state, pristine.state, "{file} {copy}");
                    assert_same(&loaded.model, &pristine.model);
                    assert_same(&loaded.optimizer, &pristine.optimizer);
                }
            }
            fs::write(&path, &good).unwrap();
        }
        println!("{skipped} damaged copies skipped, {harmless} harmless");
        assert!(skipped >= 80, "{skipped} skipped, {harmless} harmless");
    }

    /// A model of 64 fp32 tensors of `rows` x 1000 and AdamW's two moments for each: the
    /// measurements' state.
    fn large_state(rows: i64) -> (Named, Named) {
        let opts = (Kind::Float, Device::Cpu);
        let m: Named = (0..64)
            .map(|i| {
                (
                    format!("layer{i}.weight"),
                    Tensor::randn([rows, 1000], opts),
                )
            })
            .collect();
        let o: Named = m
            .iter()
            .flat_map(|(n, t)| {
                [
                    (format!("exp_avg.{n}"), t.randn_like()),
                    (format!("exp_avg_sq.{n}"), t.rand_like()),
                ]
            })
            .collect();
        (m, o)
    }

    /// What a save costs a training step (bench/checkpoint-blocking.sh): a 72 MB state (the
    /// Multi30k recipe's size: 6 M parameters and AdamW's two moments, 192 tensors) saved while
    /// a step's forward and backward (matmuls reading the weights for about `STEP` seconds)
    /// run, then the update that waits for the copy: the seconds the step was blocked.
    #[test]
    #[ignore = "measurement, prints numbers"]
    fn measure_save_blocking_in_a_step() {
        const STEP: f64 = 0.4;
        let tmp =
            tempfile::tempdir_in(std::env::var("CKPT_MEASURE_DIR").unwrap_or_else(|_| ".".into()))
                .unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        let (m, o) = large_state(94);
        let x = Tensor::randn([64, 94], (Kind::Float, Device::Cpu));
        let _guard = tch::no_grad_guard();
        let mut shares = Vec::new();
        for round in 0..20 {
            let step = Instant::now();
            let blocking = store.save(&m, &o, state(100 * (round + 1), None)).unwrap();
            let mut i = 0;
            while step.elapsed().as_secs_f64() < STEP {
                let _ = x.matmul(&m[i % m.len()].1).sum(Kind::Float);
                i += 1;
            }
            let waited = Instant::now();
            store.copied();
            let waited = waited.elapsed().as_secs_f64();
            for (_, t) in &m {
                let _ = t.shallow_clone().g_add_scalar_(1e-3);
            }
            let seconds = step.elapsed().as_secs_f64();
            let info = store.wait().unwrap().unwrap();
            let blocked = info.blocking_seconds.unwrap();
            println!(
                "save {round}: {} bytes, step {seconds:.3} s, blocked {blocked:.6} s (save \
                 {blocking:.6} + the update's wait {waited:.6}): {:.3}% of the step; written \
                 in {:.3} s",
                info.size_bytes,
                100.0 * blocked / seconds,
                info.save_seconds.unwrap_or(0.0)
            );
            shares.push((blocked, 100.0 * blocked / seconds));
        }
        shares.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (p50, max) = (shares[shares.len() / 2], shares[shares.len() - 1]);
        println!(
            "saves {}: blocked p50 {:.6} s ({:.4}% of the step), max {:.6} s ({:.4}%)",
            shares.len(),
            p50.0,
            p50.1,
            max.0,
            max.1
        );
    }

    /// Prints how long a transformer-sized save blocks the caller versus how long it takes
    /// in total (`cargo test --lib checkpoint::store::tests::measure -- --ignored --nocapture`).
    #[test]
    #[ignore = "measurement, prints numbers"]
    fn measure_60mb_save() {
        let tmp =
            tempfile::tempdir_in(std::env::var("CKPT_MEASURE_DIR").unwrap_or_else(|_| ".".into()))
                .unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        // ~20 MB of weights + 2x that of AdamW moments = ~60 MB, in 64 tensors.
        let (m, o) = large_state(80);
        for round in 0..3 {
            let start = Instant::now();
            let blocking = store.save(&m, &o, state(100 * (round + 1), None)).unwrap();
            let info = store.wait().unwrap().unwrap();
            let total = start.elapsed().as_secs_f64();
            println!(
                "save {round}: {} bytes, blocking {:.4}s, total {:.4}s",
                info.size_bytes, blocking, total
            );
        }
        let start = Instant::now();
        let (dir, _) = store.latest().unwrap().unwrap();
        println!("latest(): {:.4}s", start.elapsed().as_secs_f64());
        let start = Instant::now();
        CheckpointStore::load(&dir).unwrap();
        println!("load: {:.4}s", start.elapsed().as_secs_f64());
    }
}
