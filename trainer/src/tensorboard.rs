//! TensorBoard event files: scalars TensorBoard (and anything reading `tfevents`) plots.
//!
//! The format is TFRecord framing around `tensorflow.Event` protos: per record a little-endian
//! u64 length, the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data.
//! The first event carries `file_version = "brain.Event:2"`; each later one a step, a wall
//! time and a `Summary` of `simple_value`s. Only the fields written here are declared (prost
//! derives; no protoc). Rank 0 writes one run directory per attempt,
//! `<job dir>/tensorboard/attempt-<N>/`: a restart resumes from its checkpoint's step, so the
//! attempts draw one continuing curve, and a step a failure lost shows as an overlap.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use ferrotrain_api::Progress;
use prost::Message;

use crate::error::Result;

/// `tensorflow.Event` (tensorflow/core/util/event.proto), the fields used here.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary` (tensorflow/core/framework/summary.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with `simple_value` (a scalar), or a plugin's `metadata` and
/// `tensor`.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
}

/// `tensorflow.TensorProto`: the hparams plugin's summaries hold a float 0.
#[derive(Clone, PartialEq, prost::Message)]
struct TensorProto {
    /// `DT_FLOAT` = 1.
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(float, repeated, tag = "5")]
    float_val: Vec<f32>,
}

/// `tensorflow.SummaryMetadata` with its `plugin_data`.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    content: Vec<u8>,
}

/// `tensorboard.hparams.HParamsPluginData` (plugins/hparams/plugin_data.proto), version 0,
/// with its `session_start_info`.
#[derive(Clone, PartialEq, prost::Message)]
struct HParamsPluginData {
    #[prost(int32, tag = "1")]
    version: i32,
    #[prost(message, optional, tag = "3")]
    session_start_info: Option<SessionStartInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SessionStartInfo {
    #[prost(map = "string, message", tag = "1")]
    hparams: std::collections::HashMap<String, ProtoValue>,
    #[prost(double, tag = "5")]
    start_time_secs: f64,
}

/// `google.protobuf.Value`, its string and number kinds.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoValue {
    #[prost(double, optional, tag = "2")]
    number_value: Option<f64>,
    #[prost(string, optional, tag = "3")]
    string_value: Option<String>,
}

/// TFRecord's CRC: CRC-32C rotated and offset, so a CRC of data holding CRCs stays strong.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One event file, appended to and flushed on demand.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `dir` and a new event file in it, named the way TensorBoard finds them.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}.0",
            unix_now() as u64,
            std::process::id()
        ));
        let out = BufWriter::new(File::create(&path)?);
        let mut writer = EventWriter { out, path };
        writer.write_event(&Event {
            wall_time: unix_now(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        writer.flush()?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One event at `step` holding every `(tag, value)` as a scalar.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let value = values
            .iter()
            .map(|&(tag, v)| SummaryValue {
                tag: tag.to_string(),
                simple_value: Some(v as f32),
                ..Default::default()
            })
            .collect();
        self.write_event(&Event {
            wall_time: unix_now(),
            step: step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })
    }

    /// The run's hyper-parameters (TensorBoard's HPARAMS tab): `session_start_info` of the
    /// hparams plugin, as `tensorboard.plugins.hparams.summary` writes it.
    pub fn hparams(&mut self, values: &[(&str, &str)]) -> Result<()> {
        let info = SessionStartInfo {
            hparams: values
                .iter()
                .map(|&(k, v)| {
                    let value = ProtoValue {
                        string_value: Some(v.to_string()),
                        ..Default::default()
                    };
                    (k.to_string(), value)
                })
                .collect(),
            start_time_secs: unix_now(),
        };
        let content = HParamsPluginData {
            version: 0,
            session_start_info: Some(info),
        }
        .encode_to_vec();
        let value = SummaryValue {
            tag: "_hparams_/session_start_info".into(),
            tensor: Some(TensorProto {
                dtype: 1,
                float_val: vec![0.0],
            }),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "hparams".into(),
                    content,
                }),
            }),
            ..Default::default()
        };
        self.write_event(&Event {
            wall_time: unix_now(),
            step: 0,
            file_version: None,
            summary: Some(Summary { value: vec![value] }),
        })
    }

    /// Hands the buffered events to the OS (TensorBoard reads them from there).
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }

    fn write_event(&mut self, event: &Event) -> Result<()> {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc(&len).to_le_bytes())?;
        self.out.write_all(&data)?;
        self.out.write_all(&masked_crc(&data).to_le_bytes())?;
        Ok(())
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The run directory of this attempt: `<root>/attempt-<N>`, or `attempt-<N>.<k>` when a
/// directory for the same attempt already holds events (a run started again by hand).
pub fn attempt_dir(root: &Path, attempt: u64) -> PathBuf {
    let base = root.join(format!("attempt-{attempt}"));
    let used = |d: &Path| std::fs::read_dir(d).is_ok_and(|mut it| it.next().is_some());
    if !used(&base) {
        return base;
    }
    (1..)
        .map(|k| root.join(format!("attempt-{attempt}.{k}")))
        .find(|d| !used(d))
        .expect("an unused directory name")
}

/// Turns the training loop's reports into TensorBoard scalars: every step's training values,
/// and each evaluation and completed checkpoint once, at its own step.
pub struct TrainingBoard {
    events: EventWriter,
    eval_step: Option<u64>,
    checkpoint_step: Option<u64>,
}

impl TrainingBoard {
    /// A board for this attempt; the precision the run trains in goes into its hparams.
    pub fn create(dir: &Path, resumed: &Progress) -> Result<Self> {
        let mut events = EventWriter::create(dir)?;
        if let Some(p) = &resumed.precision {
            events.hparams(&[
                ("precision", p.used.as_str()),
                ("precision_requested", p.requested.as_str()),
                ("precision_reason", &p.reason),
            ])?;
        }
        Ok(TrainingBoard {
            events,
            eval_step: resumed.eval_step,
            // The checkpoint a run resumes from was plotted by the attempt that saved it.
            checkpoint_step: resumed.last_checkpoint.as_ref().map(|c| c.step),
        })
    }

    pub fn path(&self) -> &Path {
        self.events.path()
    }

    /// Writes step `p.step`: `loss` and `grad_norm` are this step's own; the rest comes from
    /// the report (rates are its recent averages). Flushes.
    pub fn report(&mut self, p: &Progress, loss: f64, grad_norm: Option<f64>) -> Result<()> {
        let optional = [
            ("train/loss", Some(loss)),
            ("train/learning_rate", p.learning_rate),
            ("train/grad_norm", grad_norm),
            ("train/tokens_per_second", p.tokens_per_second),
            ("train/step_time_seconds", p.step_time_seconds),
            ("train/comm_fraction", p.comm_fraction),
            ("train/loss_scale", p.loss_scale),
            (
                "train/skipped_steps",
                p.loss_scale.map(|_| p.skipped_steps as f64),
            ),
        ];
        // An fp16 step skipped on an overflow has an infinite gradient norm (and maybe loss).
        let values: Vec<(&str, f64)> = optional
            .into_iter()
            .filter_map(|(t, v)| Some((t, v.filter(|v| v.is_finite())?)))
            .collect();
        self.events.scalars(p.step, &values)?;
        if p.eval_step.is_some() && p.eval_step != self.eval_step {
            self.eval_step = p.eval_step;
            let step = p.eval_step.unwrap_or(p.step);
            let evals = [("eval/loss", p.eval_loss), ("eval/bleu", p.eval_bleu)];
            let evals: Vec<_> = evals
                .into_iter()
                .filter_map(|(t, v)| Some((t, v?)))
                .collect();
            self.events.scalars(step, &evals)?;
        }
        self.checkpoint(p)?;
        self.events.flush()
    }

    /// At the end of a run: the final checkpoint (saved in the background) and a flush.
    pub fn finish(&mut self, p: &Progress) -> Result<()> {
        self.checkpoint(p)?;
        self.events.flush()
    }

    fn checkpoint(&mut self, p: &Progress) -> Result<()> {
        let Some(c) = p.last_checkpoint.as_ref() else {
            return Ok(());
        };
        if Some(c.step) == self.checkpoint_step {
            return Ok(());
        }
        self.checkpoint_step = Some(c.step);
        match c.blocking_seconds {
            Some(s) => self
                .events
                .scalars(c.step, &[("checkpoint/save_seconds", s)]),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // crc32c("123456789") = 0xe3069283 (the CRC-32C check value); TensorFlow's mask
        // ((crc >> 15) | (crc << 17)) + 0xa282ead8 makes it 0xc78ab0e5.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn attempt_dirs_are_never_reused() {
        let root = tempfile::tempdir().unwrap();
        let a = attempt_dir(root.path(), 3);
        assert_eq!(a, root.path().join("attempt-3"));
        EventWriter::create(&a).unwrap();
        assert_eq!(attempt_dir(root.path(), 3), root.path().join("attempt-3.1"));
        assert_eq!(attempt_dir(root.path(), 4), root.path().join("attempt-4"));
    }
}
