//! The bucket against a store that fails as S3 does under load ([`faulty`]): each fault
//! retried within the bound, and past it a start that fails and an upload that does not
//! count, never a checkpoint skipped, deleted or distrusted because it could not be read. Each
//! focused test failed on the code before issue 57 (each says how; two of them only because
//! nothing was retried then: they hold what the retries must not break); the property runs
//! writers through a seeded schedule of faults.

use std::sync::Arc;
use std::time::Duration;

use ferrotrain_api::checksummed;
use ferrotrain_api::config::CheckpointPolicy;
use object_store::ObjectStoreExt;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use proptest::prelude::*;

use super::faulty::{Fault, Faulty, Request, Schedule};
use super::fence::BucketFence;
use super::retry::Retry;
use super::tests::{FLUSH, bucket, bucket_holding, objects, save_durable, steps_in, url};
use super::*;
use crate::checkpoint::fence::FENCE_FILE;
use crate::checkpoint::fixtures::*;
use crate::checkpoint::layout::{MODEL_FILE, OPTIMIZER_FILE, STATE_FILE};
use crate::checkpoint::{CheckpointStore, WriterId};
use crate::error::TrainError;
use crate::lock::lock;

/// The bound in tests: 4 tries, waits of a millisecond or two.
const QUICK: Retry = Retry {
    first: Duration::from_millis(1),
    longest: Duration::from_millis(2),
    within: Duration::from_secs(20),
    tries: 4,
};

/// Longer than [`QUICK`] lasts.
const PERSISTENT: u32 = 1000;

/// The job's bucket through `faulty`: the quick bound, and parts small enough that the
/// fixtures' model and optimizer go up in several.
fn through(faulty: &Faulty) -> Bucket {
    let mut b = Bucket::with_store(Arc::new(faulty.clone()), &url(), "job", None).unwrap();
    b.retry = QUICK;
    b.part_bytes = 512;
    b
}

/// `mem` with the faults `script` only: (request, object, fault, tries).
fn scripted(mem: &Arc<InMemory>, script: &[(Request, ObjectPath, Fault, u32)]) -> Faulty {
    let mut schedule = Schedule::scripted();
    for (request, path, fault, tries) in script {
        schedule.script(*request, path, *fault, *tries);
    }
    Faulty::new(mem.clone(), schedule)
}

fn open_through(
    root: &std::path::Path,
    faulty: &Faulty,
    w: WriterId,
    policy: CheckpointPolicy,
) -> crate::error::Result<CheckpointStore> {
    CheckpointStore::open_writer_with(root, policy, w, Some(through(faulty)))
}

fn manifest_of(mem: &Arc<InMemory>, step: u64) -> ObjectPath {
    bucket(mem).step_object(step, MANIFEST_FILE)
}

fn fence_in(mem: &Arc<InMemory>) -> BucketFence {
    let b = bucket(mem);
    let (bytes, _) = b.get(&b.object(FENCE_FILE)).unwrap().unwrap();
    checksummed::open(&bytes, checksummed::CRC_FIELD).unwrap()
}

#[test]
fn a_manifest_read_that_meets_slowdown_is_read_again_not_skipped() {
    // Before: `complete()` took the 503 for a damaged manifest and skipped step 300, and the
    // start resumed from 200.
    let mem = bucket_holding(&[100, 200, 300]);
    let faulty = scripted(
        &mem,
        &[(Request::Get, manifest_of(&mem, 300), Fault::SlowDown, 3)],
    );
    let fresh = tempfile::tempdir().unwrap();
    let store = open_through(&fresh.path().join("job"), &faulty, writer(1), policy(2, 0)).unwrap();
    assert_eq!(store.latest().unwrap().unwrap().1.step, 300);
    assert_eq!(store.durable().map(|d| d.step), Some(300));
    assert_eq!(lock(&faulty.schedule).log.len(), 3);
}

#[test]
fn a_manifest_that_cannot_be_read_fails_the_start_and_claims_nothing() {
    // Before: the start skipped step 300 and resumed from 200, claiming the bucket after 200.
    let mem = bucket_holding(&[100, 200, 300]);
    let manifest = manifest_of(&mem, 300);
    let faulty = scripted(
        &mem,
        &[(Request::Get, manifest.clone(), Fault::SlowDown, PERSISTENT)],
    );
    let fresh = tempfile::tempdir().unwrap();
    let root = fresh.path().join("job");
    let e = open_through(&root, &faulty, writer(1), policy(2, 0))
        .err()
        .expect("the start fails");
    assert!(
        matches!(e, TrainError::Other(_)),
        "retried as any start: {e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains(manifest.as_ref()) && text.contains("gave up after 4 tries"),
        "{text}"
    );
    assert_eq!(fence_in(&mem).writer, writer(0), "claimed nothing");
    lock(&faulty.schedule).calm();
    let store = open_through(&root, &faulty, writer(2), policy(2, 0)).unwrap();
    assert_eq!(store.latest().unwrap().unwrap().1.step, 300);
}

#[test]
fn retention_deletes_nothing_when_a_manifest_cannot_be_read() {
    // Before: retention skipped step 200 as if damaged, kept 100 and 300 as "the newest two",
    // and deleted 200.
    let (tmp, mem) = (tempfile::tempdir().unwrap(), Arc::new(InMemory::new()));
    let faulty = scripted(&mem, &[]);
    let root = tmp.path().join("job");
    let mut store = open_through(&root, &faulty, writer(0), policy(2, 0)).unwrap();
    save_durable(&mut store, 100, None);
    save_durable(&mut store, 200, None);
    let manifest = manifest_of(&mem, 200);
    lock(&faulty.schedule).script(Request::Get, &manifest, Fault::SlowDown, PERSISTENT);
    save_durable(&mut store, 300, None);
    let durable = store.durable().unwrap();
    assert_eq!((durable.step, durable.upload_error), (300, None));
    lock(&faulty.schedule).calm();
    assert_eq!(steps_in(&mem), [100, 200, 300]);
    save_durable(&mut store, 400, None);
    assert_eq!(steps_in(&mem), [300, 400]);
}

#[test]
fn a_takeover_claims_after_the_newest_checkpoint_read_in_full() {
    // Before: the new writer's read of step 200's manifest met a 503, it claimed the bucket
    // after step 100, and from then on every writer distrusted 200 (attempt 0's, past the
    // takeover): the newest durable checkpoint was lost for good.
    let mem = bucket_holding(&[100, 200]);
    let faulty = scripted(
        &mem,
        &[(Request::Get, manifest_of(&mem, 200), Fault::SlowDown, 2)],
    );
    let fresh = tempfile::tempdir().unwrap();
    let store = open_through(&fresh.path().join("job"), &faulty, writer(1), policy(2, 0)).unwrap();
    assert_eq!(fence_in(&mem).claimed_after, Some(200));
    assert_eq!(store.latest().unwrap().unwrap().1.step, 200);
    drop(store);
    assert_eq!(steps_in(&mem), [100, 200]);
    let later = tempfile::tempdir().unwrap();
    let store = super::tests::open(&later.path().join("job"), &mem, writer(2));
    assert_eq!(store.latest().unwrap().unwrap().1.step, 200);
}

#[test]
fn a_body_cut_short_is_read_again_never_taken_for_damage() {
    // Before: a body that ended short was "damaged" (a size unlike the manifest's) and the
    // start resumed from step 100; a body that failed part way failed the start.
    let mem = bucket_holding(&[100, 200]);
    let b = bucket(&mem);
    let faulty = scripted(
        &mem,
        &[
            (
                Request::Get,
                b.step_object(200, MODEL_FILE),
                Fault::BodyShort,
                1,
            ),
            (
                Request::Get,
                b.step_object(200, OPTIMIZER_FILE),
                Fault::BodyCut,
                2,
            ),
            (
                Request::Get,
                b.step_object(200, STATE_FILE),
                Fault::Reset,
                1,
            ),
        ],
    );
    let fresh = tempfile::tempdir().unwrap();
    let root = fresh.path().join("job");
    let store = open_through(&root, &faulty, writer(1), policy(2, 0)).unwrap();
    assert_eq!(store.latest().unwrap().unwrap().1.step, 200);
    assert_eq!(names(&root), ["fence.json", "step-00000200"]);
    assert_eq!(lock(&faulty.schedule).log.len(), 4);
}

#[test]
fn every_kind_of_request_is_retried_and_the_upload_counts() {
    // Before: no request was retried past object_store's own retries, which see neither a
    // lost answer nor a failure after the headers: the claim failed the start.
    let (tmp, mem) = (tempfile::tempdir().unwrap(), Arc::new(InMemory::new()));
    let b = bucket(&mem);
    let at = |step, file| b.step_object(step, file);
    let script = [
        (Request::PutIf, b.object(FENCE_FILE), Fault::SlowDown, 2),
        (
            Request::List,
            ObjectPath::from("runs/job"),
            Fault::BodyCut,
            1,
        ),
        (
            Request::CreateMultipart,
            at(100, MODEL_FILE),
            Fault::Internal,
            1,
        ),
        (Request::Part, at(100, OPTIMIZER_FILE), Fault::Reset, 2),
        (Request::Complete, at(100, MODEL_FILE), Fault::Lost, 1),
        (Request::Put, at(100, STATE_FILE), Fault::TooMany, 2),
        (Request::Get, b.object(FENCE_FILE), Fault::Timeout, 1),
        (Request::Put, at(100, MANIFEST_FILE), Fault::Lost, 1),
        (Request::Delete, at(100, MANIFEST_FILE), Fault::SlowDown, 2),
        (Request::Delete, at(100, MODEL_FILE), Fault::Lost, 1),
    ];
    let faulty = scripted(&mem, &script);
    let mut store =
        open_through(&tmp.path().join("job"), &faulty, writer(0), policy(1, 0)).unwrap();
    for step in [100, 200] {
        save_durable(&mut store, step, None);
        let durable = store.durable().unwrap();
        assert_eq!((durable.step, durable.upload_error), (step, None));
    }
    assert_eq!(steps_in(&mem), [200]);
    assert_eq!(objects(&mem).len(), 1 + 4, "{:?}", objects(&mem));
    let log = lock(&faulty.schedule).log.clone();
    let scripted: u32 = script.iter().map(|s| s.3).sum();
    assert_eq!(
        log.len(),
        scripted as usize,
        "every fault was met: {log:#?}"
    );
}

#[test]
fn an_upload_that_outlasts_the_retries_does_not_count_and_the_next_one_goes_up() {
    // Before: the first 503 failed the upload (nothing was retried). What the bound must
    // keep: past it, the upload does not count, and the next one goes up in full.
    let (tmp, mem) = (tempfile::tempdir().unwrap(), Arc::new(InMemory::new()));
    let faulty = scripted(&mem, &[]);
    let mut store =
        open_through(&tmp.path().join("job"), &faulty, writer(0), policy(2, 0)).unwrap();
    save_durable(&mut store, 100, None);
    let manifest = manifest_of(&mem, 200);
    lock(&faulty.schedule).script(Request::Put, &manifest, Fault::SlowDown, PERSISTENT);
    save_durable(&mut store, 200, None);
    let durable = store.durable().unwrap();
    assert_eq!(durable.step, 100);
    let why = durable.upload_error.expect("reported");
    assert!(
        why.contains("step 200") && why.contains("gave up after 4 tries"),
        "{why}"
    );
    assert_eq!(steps_in(&mem), [100]);
    lock(&faulty.schedule).calm();
    save_durable(&mut store, 300, None);
    assert_eq!(
        store.durable().map(|d| (d.step, d.upload_error)),
        Some((300, None))
    );
    assert_eq!(steps_in(&mem), [100, 300]);
    assert!(!objects(&mem).iter().any(|o| o.starts_with("step-00000200")));
}

/// A takeover by `w` after step `after`, as another writer does it, from inside a request
/// of the store (so with no runtime, no `Bucket`, of its own).
fn take_over(mem: &Arc<InMemory>, w: WriterId, after: u64) -> impl FnMut() + Send + use<> {
    let fence = BucketFence {
        writer: w,
        claimed_after: Some(after),
        time: String::new(),
    };
    let bytes = checksummed::seal(&fence, checksummed::CRC_FIELD).unwrap();
    let (mem, path) = (mem.clone(), bucket(mem).object(FENCE_FILE));
    move || {
        futures::executor::block_on(mem.put(&path, bytes.clone().into()))
            .map(drop)
            .unwrap()
    }
}

#[test]
fn a_writer_superseded_while_its_manifest_is_retried_commits_nothing() {
    // The manifest's PUT meets a 503, and attempt 4 takes over before the next try. The
    // retry reads the fence again and stops: a retried PUT must not commit after a takeover.
    // (Before: the 503 failed the upload, nothing was retried.)
    let (tmp, mem) = (tempfile::tempdir().unwrap(), Arc::new(InMemory::new()));
    let faulty = scripted(&mem, &[]);
    let mut old = open_through(&tmp.path().join("job"), &faulty, writer(3), policy(2, 0)).unwrap();
    save_durable(&mut old, 100, None);
    let manifest = manifest_of(&mem, 200);
    let (mut takeover, at) = (take_over(&mem, writer(4), 100), manifest.to_string());
    let mut schedule = lock(&faulty.schedule);
    schedule.script(Request::Put, &manifest, Fault::SlowDown, 1);
    schedule.on_request = Some(Box::new(move |request, path| {
        if request == Request::Put && path == at {
            takeover();
        }
    }));
    drop(schedule);
    save_durable(&mut old, 200, None);
    let why = old.durable().and_then(|d| d.upload_error).expect("refused");
    assert!(why.contains("attempt 4") && why.contains("stale"), "{why}");
    assert!(
        !objects(&mem)
            .iter()
            .any(|o| o.ends_with("step-00000200/manifest.json"))
    );
}

#[test]
fn a_manifest_whose_writer_is_superseded_right_after_its_put_is_not_reported_durable() {
    // The takeover lands between the manifest's PUT and the writer's last read of the fence:
    // the new writer counts step 200 (it listed the bucket after the PUT), but the old one
    // cannot know that it did, so it does not report it durable. (Before: it did.)
    let (tmp, mem) = (tempfile::tempdir().unwrap(), Arc::new(InMemory::new()));
    let faulty = scripted(&mem, &[]);
    let mut old = open_through(&tmp.path().join("job"), &faulty, writer(3), policy(2, 0)).unwrap();
    save_durable(&mut old, 100, None);
    let (inner, manifest) = (mem.clone(), manifest_of(&mem, 200));
    let fence = bucket(&mem).object(FENCE_FILE).to_string();
    let mut takeover = take_over(&mem, writer(4), 200);
    lock(&faulty.schedule).on_request = Some(Box::new(move |request, path| {
        let committed = futures::executor::block_on(inner.head(&manifest)).is_ok();
        if request == Request::Get && path == fence && committed {
            takeover();
        }
    }));
    save_durable(&mut old, 200, None);
    let durable = old.durable().unwrap();
    assert_eq!(durable.step, 100);
    assert!(durable.upload_error.unwrap().contains("stale"));
    assert_eq!(steps_in(&mem), [100, 200]);
}

#[test]
fn a_checkpoint_committed_during_a_takeover_stays_trusted_and_is_resumed_from() {
    // Attempt 0 read the fence, then attempt 1 listed the bucket, then attempt 0's manifest
    // of step 200 landed, then attempt 1 claimed the fence. Before: attempt 1 claimed after
    // step 100 and distrusted 200 for good, though it was committed before the takeover.
    let mem = bucket_holding(&[100, 200]);
    let b = bucket(&mem);
    let step_200: Vec<_> = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, MANIFEST_FILE]
        .iter()
        .map(|name| {
            let path = b.step_object(200, name);
            let (bytes, _) = b.get(&path).unwrap().unwrap();
            b.block_on(mem.delete(&path)).unwrap();
            (path, bytes)
        })
        .collect();
    let faulty = scripted(&mem, &[]);
    let (inner, mut landing) = (mem.clone(), Some(step_200));
    lock(&faulty.schedule).on_request = Some(Box::new(move |request, _| {
        if request == Request::PutIf
            && let Some(objects) = landing.take()
        {
            for (path, bytes) in objects {
                futures::executor::block_on(inner.put(&path, bytes.into())).unwrap();
            }
        }
    }));
    let fresh = tempfile::tempdir().unwrap();
    let store = open_through(&fresh.path().join("job"), &faulty, writer(1), policy(2, 0)).unwrap();
    assert_eq!(fence_in(&mem).claimed_after, Some(200));
    assert_eq!(store.latest().unwrap().unwrap().1.step, 200);
    assert_eq!(steps_in(&mem), [100, 200]);
}

/// One store through the life of a job: writers one after another (a start that fails is
/// tried again by a new attempt, as the operator does), each saving and uploading a few
/// checkpoints, with `faulty` failing as its schedule says.
struct Job {
    mem: Arc<InMemory>,
    faulty: Faulty,
    policy: CheckpointPolicy,
    attempt: u64,
    /// The newest step whose upload reported success.
    durable: Option<u64>,
    dirs: Vec<tempfile::TempDir>,
}

impl Job {
    /// The newest durable checkpoint is complete in the bucket and trusted under its fence
    /// (read without faults).
    fn check(&self, when: &str) {
        let Some(step) = self.durable else {
            return;
        };
        let complete = steps_in(&self.mem);
        assert!(
            complete.contains(&step),
            "{when}: durable step {step} is gone or distrusted; complete: {complete:?}; \
             faults: {:#?}",
            lock(&self.faulty.schedule).log
        );
    }

    /// A new writer starting on an empty directory: its store and the step it resumed from,
    /// or none when the start failed.
    fn start(&mut self) -> Option<(CheckpointStore, u64)> {
        self.attempt += 1;
        self.dirs.push(tempfile::tempdir().unwrap());
        let root = self.dirs.last().unwrap().path().join("job");
        let opened = open_through(
            &root,
            &self.faulty,
            writer(self.attempt),
            self.policy.clone(),
        );
        let store = match opened {
            Ok(store) => store,
            Err(e) => {
                assert!(matches!(e, TrainError::Other(_)), "{e:?}");
                self.check("after a failed start");
                return None;
            }
        };
        let resumed = store.latest().unwrap().map_or(0, |(_, s)| s.step);
        assert!(
            resumed >= self.durable.unwrap_or(0),
            "attempt {} resumed from {resumed}, passing over durable step {:?}; faults: {:#?}",
            self.attempt,
            self.durable,
            lock(&self.faulty.schedule).log
        );
        self.check("after a start");
        Some((store, resumed))
    }

    fn train(&mut self, store: &mut CheckpointStore, from: u64, losses: &[Option<f64>]) {
        for (i, loss) in losses.iter().enumerate() {
            let step = from + 100 * (i as u64 + 1);
            save_now(store, step, *loss);
            assert!(store.flush_uploads(FLUSH).unwrap());
            if store
                .durable()
                .is_some_and(|d| d.step == step && d.upload_error.is_none())
            {
                self.durable = Some(step);
            }
            self.check(&format!("after the upload of step {step}"));
        }
    }
}

/// Three writers (the first, then two takeovers), each saving three checkpoints.
fn a_job(seed: u64, rate: f64, policy: CheckpointPolicy, losses: &[Option<f64>]) {
    let mem = Arc::new(InMemory::new());
    let schedule = Schedule::new(seed, rate, QUICK.tries);
    let mut job = Job {
        faulty: Faulty::new(mem.clone(), schedule),
        mem,
        policy,
        attempt: 0,
        durable: None,
        dirs: Vec::new(),
    };
    for generation in 0..3 {
        let Some((mut store, resumed)) = (0..5).find_map(|_| job.start()) else {
            continue;
        };
        job.train(&mut store, resumed, &losses[generation * 3..][..3]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The newest durable checkpoint is never deleted, never passed over at a start (it
    /// resumes from it or fails), and never distrusted by a later writer, whatever the store's
    /// transient faults.
    #[test]
    fn the_newest_durable_checkpoint_outlives_any_transient_fault(
        seed in any::<u64>(),
        rate in 0.0f64..0.3,
        keep_latest in 1u32..3,
        keep_best in 0u32..2,
        losses in proptest::collection::vec(proptest::option::of(0.5f64..5.0), 9),
    ) {
        a_job(seed, rate, policy(keep_latest, keep_best), &losses);
    }
}
