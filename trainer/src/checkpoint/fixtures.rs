//! What the checkpoint tests build from: a policy, a trainer state, a model and optimizer
//! with every dtype and layout the writer handles, a save that completes before it returns,
//! and a hook that holds a save at a known point.

use std::fs;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use ferrotrain_api::config::CheckpointPolicy;
use tch::{Device, Kind, Tensor};

use super::fence::WriterId;
use super::layout::TEMP_PREFIX;
use super::safetensors::Named;
use super::save::SaveEvent;
use super::state::TrainerState;
use super::store::CheckpointStore;
use crate::lock::lock;

pub(super) fn policy(keep_latest: u32, keep_best: u32) -> CheckpointPolicy {
    CheckpointPolicy {
        every_steps: 100,
        every_seconds: None,
        keep_latest,
        keep_best,
        store: None,
    }
}

pub(super) fn state(step: u64, eval_loss: Option<f64>) -> TrainerState {
    TrainerState {
        step,
        samples: step * 64,
        epoch: step / 1000,
        seed: 7,
        config_digest: "sha256:abc".into(),
        world_size: 2,
        train_loss: Some(3.25),
        eval_loss,
        eval_bleu: eval_loss.map(|l| 40.0 - l),
        time: "2026-01-02T03:04:05Z".into(),
        train_seconds: step as f64 * 0.5,
        precision: None,
        loss_scale: None,
    }
}

pub(super) fn model(scale: i64) -> Named {
    tch::manual_seed(scale);
    let opts = (Kind::Float, Device::Cpu);
    vec![
        (
            "encoder.layer0.attn.q.weight".into(),
            Tensor::randn([8 * scale, 8], opts),
        ),
        (
            "encoder.layer0.attn.q.bias".into(),
            Tensor::randn([8 * scale], opts),
        ),
        // Non-contiguous: must be written as its logical (row-major) values.
        (
            "decoder.out.weight_t".into(),
            Tensor::randn([4, 6], opts).transpose(0, 1),
        ),
        (
            "embed.half".into(),
            Tensor::randn([3, 5], (Kind::Half, Device::Cpu)),
        ),
        (
            "embed.bf16".into(),
            Tensor::randn([5], (Kind::BFloat16, Device::Cpu)),
        ),
        ("scalar.step".into(), Tensor::from(42i64)),
        ("mask".into(), Tensor::from_slice(&[true, false, true])),
        ("empty".into(), Tensor::zeros([0, 3], opts)),
        (
            "special".into(),
            Tensor::from_slice(&[f32::NAN, f32::INFINITY, -0.0, 1e-45]),
        ),
    ]
}

pub(super) fn optimizer() -> Named {
    vec![
        ("adamw.step".into(), Tensor::from(17i64)),
        (
            "adamw.exp_avg.encoder.layer0.attn.q.weight".into(),
            Tensor::randn([8, 8], (Kind::Float, Device::Cpu)),
        ),
        (
            "adamw.exp_avg_sq.encoder.layer0.attn.q.weight".into(),
            Tensor::rand([8, 8], (Kind::Double, Device::Cpu)),
        ),
    ]
}

pub(super) fn bytes_of(t: &Tensor) -> Vec<u8> {
    let numel = t.numel();
    let mut out = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.copy_data_u8(&mut out, numel);
    out
}

pub(super) fn assert_same(a: &Named, b: &Named) {
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        assert_eq!(ta.kind(), tb.kind(), "{na}");
        assert_eq!(ta.size(), tb.size(), "{na}");
        assert_eq!(bytes_of(ta), bytes_of(tb), "{na} differs bitwise");
    }
}

pub(super) fn names(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

pub(super) fn save_now(store: &mut CheckpointStore, step: u64, eval_loss: Option<f64>) {
    store
        .save(&model(1), &optimizer(), state(step, eval_loss))
        .unwrap();
    store.wait().unwrap();
}

/// A hook that blocks the writer at `Started` of the given step until released, and logs
/// every event.
pub(super) fn gate(
    store: &mut CheckpointStore,
    hold_step: u64,
) -> (mpsc::Sender<()>, Arc<Mutex<Vec<String>>>) {
    let (release, wait_for) = mpsc::channel::<()>();
    let wait_for = Mutex::new(wait_for);
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    store.set_save_hook(Arc::new(move |event: SaveEvent<'_>| {
        let line = match &event {
            SaveEvent::Started { step, .. } => format!("started {step}"),
            SaveEvent::FileWritten { step, file, .. } => format!("wrote {step} {file}"),
            SaveEvent::Renamed { step, .. } => format!("renamed {step}"),
        };
        lock(&log2).push(line);
        if let SaveEvent::Started { step, .. } = event
            && step == hold_step
        {
            let _ = lock(&wait_for).recv_timeout(std::time::Duration::from_secs(30));
        }
    }));
    (release, log)
}

pub(super) fn writer(attempt: u64) -> WriterId {
    WriterId::new(attempt, "token of the job")
}

pub(super) fn temp_dirs(root: &Path) -> Vec<String> {
    names(root)
        .into_iter()
        .filter(|n| n.starts_with(TEMP_PREFIX))
        .collect()
}
