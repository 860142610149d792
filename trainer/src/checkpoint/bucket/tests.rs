//! The bucket against an in-memory object store (object_store's own, with conditional
//! PUTs): uploads, resumes, half uploads, damage, stale writers, retention, refused
//! credentials. e2e/tests/store.rs runs the same against a real S3 server.

use std::sync::Arc;
use std::time::Duration;

use ferrotrain_api::config::BucketUrl;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::*;
use crate::checkpoint::fixtures::*;
use crate::checkpoint::layout::{MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, step_dir_name};
use crate::checkpoint::{CheckpointStore, WriterId};
use crate::error::TrainError;

pub(super) const FLUSH: Duration = Duration::from_secs(30);

pub(super) fn url() -> BucketUrl {
    BucketUrl::parse("s3://ckpt/runs").unwrap()
}

pub(super) fn bucket(mem: &Arc<InMemory>) -> Bucket {
    Bucket::with_store(mem.clone(), &url(), "job", Some("s3-creds".into())).unwrap()
}

/// Every object under the job's prefix, as `step-…/file` (or `fence.json`).
pub(super) fn objects(mem: &Arc<InMemory>) -> Vec<String> {
    let b = bucket(mem);
    let mut out: Vec<String> = b
        .block_on(futures::TryStreamExt::try_collect::<Vec<_>>(
            mem.list(Some(&ObjectPath::from("runs/job"))),
        ))
        .unwrap()
        .into_iter()
        .map(|m| {
            m.location
                .as_ref()
                .trim_start_matches("runs/job/")
                .to_string()
        })
        .collect();
    out.sort();
    out
}

pub(super) fn open(root: &std::path::Path, mem: &Arc<InMemory>, w: WriterId) -> CheckpointStore {
    CheckpointStore::open_writer_with(root, policy(2, 0), w, Some(bucket(mem))).unwrap()
}

/// Saves `step` and waits until it is durable in the bucket.
pub(super) fn save_durable(store: &mut CheckpointStore, step: u64, eval_loss: Option<f64>) {
    save_now(store, step, eval_loss);
    assert!(store.flush_uploads(FLUSH).unwrap());
}

/// A bucket holding `steps`, uploaded by attempt 0 from a directory that is gone since (the
/// node it ran on).
pub(super) fn bucket_holding(steps: &[u64]) -> Arc<InMemory> {
    let (mem, tmp) = (Arc::new(InMemory::new()), tempfile::tempdir().unwrap());
    let mut store = open(&tmp.path().join("job"), &mem, writer(0));
    for &step in steps {
        save_durable(&mut store, step, None);
    }
    mem
}

pub(super) fn steps_in(mem: &Arc<InMemory>) -> Vec<u64> {
    bucket(mem)
        .complete()
        .unwrap()
        .iter()
        .map(|m| m.step)
        .collect()
}

#[test]
fn a_save_is_uploaded_with_its_manifest_last_and_becomes_durable() {
    let (tmp, mem) = (tempfile::tempdir().unwrap(), Arc::new(InMemory::new()));
    let root = tmp.path().join("job");
    let mut store = open(&root, &mem, writer(0));
    assert_eq!(store.durable(), None);
    save_durable(&mut store, 100, None);
    let durable = store.durable().expect("durable");
    assert_eq!(durable.step, 100);
    assert_eq!(durable.url, "s3://ckpt/runs/job/step-00000100/");
    assert!(durable.durable_seconds.is_some() && durable.upload_bytes_per_second.is_some());
    assert_eq!(durable.upload_error, None);
    let dir = step_dir_name(100);
    assert_eq!(
        objects(&mem),
        [
            "fence.json".to_string(),
            format!("{dir}/{MANIFEST_FILE}"),
            format!("{dir}/{MODEL_FILE}"),
            format!("{dir}/{OPTIMIZER_FILE}"),
            format!("{dir}/{STATE_FILE}"),
        ]
    );
    // The bytes in the bucket are the local files', as the manifest says.
    let b = bucket(&mem);
    let m = b.complete().unwrap().pop().unwrap();
    for f in &m.files {
        let local = std::fs::read(root.join(&dir).join(&f.name)).unwrap();
        let (remote, _) = b.get(&b.step_object(100, &f.name)).unwrap().unwrap();
        assert_eq!(remote.as_ref(), local.as_slice(), "{}", f.name);
        assert_eq!(f.size, local.len() as u64);
        assert_eq!(f.crc32c, manifest::crc_hex(crc32c::crc32c(&local)));
    }
    assert!(temp_dirs(&root).is_empty(), "{:?}", temp_dirs(&root));
}

#[test]
fn a_file_larger_than_a_part_goes_up_in_parts_and_comes_back_the_same() {
    use tch::{Device, Kind, Tensor};
    let (tmp, mem) = (tempfile::tempdir().unwrap(), Arc::new(InMemory::new()));
    let mut store = open(&tmp.path().join("job"), &mem, writer(0));
    // 40 MB of weights: three parts of 16 MiB, the last one short.
    let big: crate::checkpoint::Named = vec![(
        "w".into(),
        Tensor::randn([10_000_000], (Kind::Float, Device::Cpu)),
    )];
    store.save(&big, &optimizer(), state(100, None)).unwrap();
    assert!(store.flush_uploads(FLUSH).unwrap());
    let m = bucket(&mem).complete().unwrap().pop().expect("complete");
    assert!(m.file(MODEL_FILE).unwrap().size > 2 * (16 << 20));
    drop(store);
    let fresh = tempfile::tempdir().unwrap();
    let store = open(&fresh.path().join("job"), &mem, writer(1));
    let (dir, _) = store.latest().unwrap().expect("downloaded");
    assert_same(&CheckpointStore::load(&dir).unwrap().model, &big);
}

#[test]
fn a_new_node_resumes_from_the_bucket_bit_for_bit() {
    let mem = Arc::new(InMemory::new());
    let first = tempfile::tempdir().unwrap();
    let mut store = open(&first.path().join("job"), &mem, writer(0));
    save_now(&mut store, 100, None);
    save_now(&mut store, 200, Some(1.0));
    assert!(store.flush_uploads(FLUSH).unwrap());
    let saved = CheckpointStore::load(&first.path().join("job").join(step_dir_name(200))).unwrap();
    drop(store);

    // Another node: an empty directory.
    let second = tempfile::tempdir().unwrap();
    let root = second.path().join("job");
    let store = open(&root, &mem, writer(1));
    let (dir, state) = store.latest().unwrap().expect("downloaded");
    assert_eq!(
        (dir.clone(), state.step),
        (root.join(step_dir_name(200)), 200)
    );
    let loaded = CheckpointStore::load(&dir).unwrap();
    assert_eq!(loaded.state, saved.state);
    assert_same(&loaded.model, &saved.model);
    assert_same(&loaded.optimizer, &saved.optimizer);
    assert_eq!(store.durable().map(|d| d.step), Some(200));
    assert_eq!(names(&root), ["fence.json", "step-00000200"]);
}

#[test]
fn an_upload_cut_short_is_never_resumed_from_and_is_cleaned_up_later() {
    let mem = bucket_holding(&[100]);
    // What a server killed mid-upload of step 200 leaves: some files, no manifest.
    let b = bucket(&mem);
    let model = b.step_object(200, MODEL_FILE);
    b.block_on(mem.put(&model, PutPayload::from(vec![7u8; 1000])))
        .unwrap();
    assert_eq!(steps_in(&mem), [100]);
    let fresh = tempfile::tempdir().unwrap();
    let mut store = open(&fresh.path().join("job"), &mem, writer(1));
    assert_eq!(store.latest().unwrap().unwrap().1.step, 100);
    // The next complete checkpoint (300) leaves no trace of the half upload.
    save_durable(&mut store, 300, None);
    assert_eq!(steps_in(&mem), [100, 300]);
    assert!(!objects(&mem).iter().any(|o| o.starts_with("step-00000200")));
}

#[test]
fn a_damaged_checkpoint_in_the_bucket_is_skipped_for_the_older_one() {
    let mem = bucket_holding(&[100, 200]);
    // Same size, one byte changed: the listing cannot see it, the CRC-32C does.
    let b = bucket(&mem);
    let path = b.step_object(200, OPTIMIZER_FILE);
    let (bytes, _) = b.get(&path).unwrap().unwrap();
    let mut bad = bytes.to_vec();
    bad[bytes.len() / 2] ^= 0x40;
    b.block_on(mem.put(&path, PutPayload::from(bad))).unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let root = fresh.path().join("job");
    let store = open(&root, &mem, writer(1));
    assert_eq!(store.latest().unwrap().unwrap().1.step, 100);
    assert_eq!(names(&root), ["fence.json", "step-00000100"]);
    // A manifest whose sizes do not match the objects does not count at all.
    let state = b.step_object(100, STATE_FILE);
    b.block_on(mem.put(&state, PutPayload::from(vec![0u8; 3])))
        .unwrap();
    assert_eq!(steps_in(&mem), [200]);
}

#[test]
fn a_download_that_fails_fails_the_start_rather_than_train_from_an_older_state() {
    let mem = bucket_holding(&[100]);
    // The new node's disk refuses the download (here: a file where its directory goes).
    let fresh = tempfile::tempdir().unwrap();
    let root = fresh.path().join("job");
    std::fs::create_dir_all(&root).unwrap();
    let blocked = root.join(format!(
        ".tmp-step-00000100-download-{}",
        std::process::id()
    ));
    std::fs::write(&blocked, b"not a directory").unwrap();
    let e = CheckpointStore::open_writer_with(&root, policy(2, 0), writer(1), Some(bucket(&mem)))
        .err()
        .expect("the start fails");
    assert!(matches!(e, TrainError::Other(_)), "retryable: {e:?}");
    std::fs::remove_file(&blocked).unwrap();
    let store = open(&root, &mem, writer(2));
    assert_eq!(store.latest().unwrap().unwrap().1.step, 100);
}

#[test]
fn a_stale_writer_commits_nothing_to_the_bucket() {
    let mem = Arc::new(InMemory::new());
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut old = open(&a.path().join("job"), &mem, writer(3));
    save_durable(&mut old, 100, None);
    // Attempt 4 takes over the bucket on another node (the old one's disk is not shared).
    let new = open(&b.path().join("job"), &mem, writer(4));
    save_durable(&mut old, 200, None);
    let err = old.durable().and_then(|d| d.upload_error).expect("refused");
    assert!(err.contains("attempt 4") && err.contains("stale"), "{err}");
    assert_eq!(steps_in(&mem), [100]);
    // A manifest the stale writer got in just before the fence changed, for a step past the
    // takeover, is not trusted either.
    let bucket = bucket(&mem);
    let forged = Manifest {
        step: 300,
        files: vec![],
        writer: writer(3),
        time: String::new(),
        eval_loss: None,
    };
    let path = bucket.step_object(300, MANIFEST_FILE);
    bucket
        .block_on(mem.put(&path, PutPayload::from(forged.encode().unwrap())))
        .unwrap();
    assert_eq!(steps_in(&mem), [100]);
    // An older attempt cannot claim the bucket back.
    let c = tempfile::tempdir().unwrap();
    let late = CheckpointStore::open_writer_with(
        &c.path().join("job"),
        policy(2, 0),
        writer(2),
        Some(bucket),
    );
    let e = late.err().expect("stale").to_string();
    assert!(e.contains("stale"), "{e}");
    drop(new);
}

#[test]
fn retention_in_the_bucket_keeps_what_the_policy_keeps() {
    let mem = Arc::new(InMemory::new());
    let tmp = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open_writer_with(
        &tmp.path().join("job"),
        policy(2, 1),
        writer(0),
        Some(bucket(&mem)),
    )
    .unwrap();
    for (step, loss) in [(100, Some(1.0)), (200, Some(3.0)), (300, None), (400, None)] {
        save_durable(&mut store, step, loss);
    }
    assert_eq!(steps_in(&mem), [100, 300, 400]);
    assert_eq!(objects(&mem).len(), 1 + 3 * 4, "{:?}", objects(&mem));
}

#[test]
fn refused_credentials_are_a_configuration_error_naming_the_secret() {
    let mem = Arc::new(InMemory::new());
    let b = bucket(&mem);
    let refused = object_store::Error::PermissionDenied {
        path: "runs/job/fence.json".into(),
        source: "403 Forbidden: SignatureDoesNotMatch".into(),
    };
    let e = b.error("claiming the fence", refused);
    assert!(matches!(e, TrainError::Config(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("Secret s3-creds") && text.contains("AWS_SECRET_ACCESS_KEY"),
        "{text}"
    );
    let other = object_store::Error::Generic {
        store: "S3",
        source: "connection refused".into(),
    };
    assert!(matches!(b.error("listing", other), TrainError::Other(_)));
}

#[test]
fn the_newest_local_checkpoint_missing_from_the_bucket_is_uploaded_at_start() {
    let mem = Arc::new(InMemory::new());
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("job");
    let mut local = CheckpointStore::open_writer(&root, policy(2, 0), writer(0)).unwrap();
    save_now(&mut local, 100, None);
    drop(local);
    let mut store = open(&root, &mem, writer(1));
    assert!(store.flush_uploads(FLUSH).unwrap());
    assert_eq!(steps_in(&mem), [100]);
}

/// Prints, for a 72 MB state (the Multi30k recipe's: 24 MB of weights, twice that of AdamW
/// moments) against the S3 server at FERROTRAIN_BENCH_S3_ENDPOINT (bench/checkpoint-bucket.sh
/// starts one): the save's blocking time, its local commit, the time until it is durable
/// in the bucket and the upload's rate; then a resume on an empty directory from the bucket
/// against one from the local disk.
#[test]
#[ignore = "measurement against a real S3 server, prints numbers"]
fn measure_72mb_bucket() {
    use std::time::Instant;

    use tch::{Device, Kind, Tensor};

    let endpoint = std::env::var("FERROTRAIN_BENCH_S3_ENDPOINT").expect("the server");
    let config = ferrotrain_api::config::ObjectStore {
        url: "s3://ckpt/bench".into(),
        endpoint: Some(endpoint),
        region: None,
    };
    let opts = (Kind::Float, Device::Cpu);
    let m: crate::checkpoint::Named = (0..96)
        .map(|i| (format!("layer{i}.weight"), Tensor::randn([250, 250], opts)))
        .collect();
    let o: crate::checkpoint::Named = m
        .iter()
        .flat_map(|(n, t)| {
            [
                (format!("exp_avg.{n}"), t.randn_like()),
                (format!("exp_avg_sq.{n}"), t.rand_like()),
            ]
        })
        .collect();
    let tmp =
        tempfile::tempdir_in(std::env::var("CKPT_MEASURE_DIR").unwrap_or_else(|_| ".".into()))
            .unwrap();
    let root = tmp.path().join("job");
    let connect = || Bucket::connect(&config, "job").unwrap();
    let mut store =
        CheckpointStore::open_writer_with(&root, policy(2, 0), writer(0), Some(connect())).unwrap();
    for round in 0..3u64 {
        let start = Instant::now();
        let blocking = store.save(&m, &o, state(100 * (round + 1), None)).unwrap();
        let info = store.wait().unwrap().unwrap();
        let local = start.elapsed().as_secs_f64();
        assert!(store.flush_uploads(Duration::from_secs(300)).unwrap());
        let d = store.durable().unwrap();
        println!(
            "save {round}: {:.1} MB, blocking {blocking:.4} s, local commit {local:.3} s, durable {:.3} s after the save, upload {:.1} MB/s",
            info.size_bytes as f64 / 1e6,
            d.durable_seconds.unwrap(),
            d.upload_bytes_per_second.unwrap() / 1e6
        );
    }
    drop(store);
    let start = Instant::now();
    let (dir, _) = CheckpointStore::new(&root, policy(2, 0))
        .unwrap()
        .latest()
        .unwrap()
        .unwrap();
    CheckpointStore::load(&dir).unwrap();
    println!(
        "resume from the local disk: {:.3} s (find, check, load)",
        start.elapsed().as_secs_f64()
    );
    let fresh = tempfile::tempdir_in(tmp.path()).unwrap();
    let root = fresh.path().join("job");
    let start = Instant::now();
    let store =
        CheckpointStore::open_writer_with(&root, policy(2, 0), writer(1), Some(connect())).unwrap();
    let (dir, _) = store.latest().unwrap().unwrap();
    CheckpointStore::load(&dir).unwrap();
    println!(
        "resume from the bucket: {:.3} s (claim, list, download, check, load)",
        start.elapsed().as_secs_f64()
    );
}
