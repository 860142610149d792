//! The semantic checks serde's types cannot express (ranges, cross-field rules), section by
//! section, each problem naming its field.

use super::error::FieldError;
use super::schedule::{ScheduleHorizon, ScheduleKind};
use super::trainer::{Task, TrainerConfig};

impl TrainerConfig {
    /// Every semantic problem (ranges, cross-field rules), section by section. Pure: does not
    /// touch files.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut problems = Problems::default();
        self.check_run(&mut problems);
        match self.task {
            Task::Translation => self.check_translation_data(&mut problems),
            Task::Copy => self.check_copy(&mut problems),
        }
        self.check_model(&mut problems);
        self.check_batch_and_optimizer(&mut problems);
        self.check_schedule(&mut problems);
        self.check_eval_and_checkpoint(&mut problems);
        self.check_distributed(&mut problems);
        problems.0
    }

    /// Run length, loss, logging and threads.
    fn check_run(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if self.max_steps == 0 {
            bad("maxSteps", "must be at least 1".into());
        }
        if self.max_seconds == Some(0) {
            bad("maxSeconds", "must be at least 1 when set".into());
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            bad(
                "labelSmoothing",
                format!("must be in [0, 1), got {}", self.label_smoothing),
            );
        }
        if self.log_every_steps == 0 {
            bad("logEverySteps", "must be at least 1".into());
        }
        if self.threads == Some(0) {
            bad("threads", "must be at least 1 when set".into());
        }
        let scale = &self.loss_scale;
        if !(scale.initial.is_finite() && scale.initial > 0.0) {
            bad(
                "lossScale.initial",
                format!("must be a positive number, got {}", scale.initial),
            );
        }
        if !(scale.growth_factor.is_finite() && scale.growth_factor > 1.0) {
            bad(
                "lossScale.growthFactor",
                format!("must be more than 1, got {}", scale.growth_factor),
            );
        }
        if !(scale.backoff_factor > 0.0 && scale.backoff_factor < 1.0) {
            bad(
                "lossScale.backoffFactor",
                format!("must be in (0, 1), got {}", scale.backoff_factor),
            );
        }
        if scale.growth_interval == 0 {
            bad("lossScale.growthInterval", "must be at least 1".into());
        }
    }

    /// The translation data, the tokenizer and the sentence lengths the model and batches hold.
    fn check_translation_data(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if self.data.train.is_none() {
            bad(
                "data.train",
                "is required for task translation (source and target files)".into(),
            );
        }
        for (name, files) in [
            ("data.train", &self.data.train),
            ("data.valid", &self.data.valid),
        ] {
            if let Some(f) = files {
                if f.source.trim().is_empty() {
                    bad(&format!("{name}.source"), "must name a file".into());
                }
                if f.target.trim().is_empty() {
                    bad(&format!("{name}.target"), "must name a file".into());
                }
            }
        }
        let tok = &self.data.tokenizer;
        if tok.path.is_none() && tok.vocab_size < 64 {
            bad(
                "data.tokenizer.vocabSize",
                format!(
                    "must be at least 64 to learn a subword vocabulary, got {}",
                    tok.vocab_size
                ),
            );
        }
        if tok.min_frequency == 0 {
            bad("data.tokenizer.minFrequency", "must be at least 1".into());
        }
        if self.data.max_sentence_tokens < 2 {
            bad("data.maxSentenceTokens", "must be at least 2".into());
        }
        if self.data.max_sentence_tokens + 2 > self.model.max_positions {
            bad(
                "data.maxSentenceTokens",
                format!(
                    "{} plus BOS/EOS exceeds model.maxPositions {}",
                    self.data.max_sentence_tokens, self.model.max_positions
                ),
            );
        }
        self.check_batch_holds(
            self.data.max_sentence_tokens,
            "sentence of data.maxSentenceTokens",
            problems,
        );
    }

    /// `batch.maxTokens` and `batch.globalTokens` each hold the longest sequence plus BOS/EOS
    /// (`what` names it: "sentence of data.maxSentenceTokens").
    fn check_batch_holds(&self, longest: u32, what: &str, problems: &mut Problems) {
        let limits = [
            ("batch.maxTokens", Some(self.batch.max_tokens)),
            ("batch.globalTokens", self.batch.global_tokens),
        ];
        for (path, limit) in limits {
            if let Some(limit) = limit
                && longest + 2 > limit
            {
                problems.bad(
                    path,
                    format!("{limit} cannot hold one {what} {longest} plus BOS/EOS"),
                );
            }
        }
    }

    /// The copy task's synthetic data and the sequence lengths the model and batches hold.
    fn check_copy(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        let c = &self.copy;
        if c.symbols < 2 {
            bad(
                "copy.symbols",
                format!("must be at least 2, got {}", c.symbols),
            );
        }
        if c.min_length == 0 {
            bad("copy.minLength", "must be at least 1".into());
        }
        if c.max_length < c.min_length {
            bad(
                "copy.maxLength",
                format!(
                    "{} is less than copy.minLength {}",
                    c.max_length, c.min_length
                ),
            );
        }
        if c.max_length + 2 > self.model.max_positions {
            bad(
                "copy.maxLength",
                format!(
                    "{} plus BOS/EOS exceeds model.maxPositions {}",
                    c.max_length, self.model.max_positions
                ),
            );
        }
        if c.train_samples == 0 {
            bad("copy.trainSamples", "must be at least 1".into());
        }
        if c.valid_samples == 0 {
            bad("copy.validSamples", "must be at least 1".into());
        }
        self.check_batch_holds(c.max_length, "sequence of copy.maxLength", problems);
    }

    /// The model's shape and dropouts.
    fn check_model(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        let m = &self.model;
        if m.d_model == 0 || m.heads == 0 {
            bad("model.dModel", "dModel and heads must be positive".into());
        } else if !m.d_model.is_multiple_of(m.heads) {
            bad(
                "model.dModel",
                format!("{} is not divisible by model.heads {}", m.d_model, m.heads),
            );
        } else if !(m.d_model / m.heads).is_multiple_of(2) {
            bad(
                "model.heads",
                format!(
                    "head size dModel/heads = {} must be even",
                    m.d_model / m.heads
                ),
            );
        }
        if m.encoder_layers == 0 {
            bad("model.encoderLayers", "must be at least 1".into());
        }
        if m.decoder_layers == 0 {
            bad("model.decoderLayers", "must be at least 1".into());
        }
        if m.ffn_dim == 0 {
            bad("model.ffnDim", "must be at least 1".into());
        }
        for (field, value) in [
            ("model.dropout", Some(m.dropout)),
            ("model.attentionDropout", m.attention_dropout),
            ("model.activationDropout", m.activation_dropout),
        ] {
            if let Some(v) = value
                && !(0.0..1.0).contains(&v)
            {
                bad(field, format!("must be in [0, 1), got {v}"));
            }
        }
    }

    /// Gradient accumulation and the optimizer's hyper-parameters.
    fn check_batch_and_optimizer(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if self.batch.accumulate == 0 {
            bad("batch.accumulate", "must be at least 1".into());
        }
        let o = &self.optimizer;
        if !(o.lr.is_finite() && o.lr > 0.0) {
            bad(
                "optimizer.lr",
                format!("must be a positive number, got {}", o.lr),
            );
        }
        for (path, v) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&v) {
                bad(path, format!("must be in [0, 1), got {v}"));
            }
        }
        if !(o.eps.is_finite() && o.eps > 0.0) {
            bad("optimizer.eps", format!("must be positive, got {}", o.eps));
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            bad(
                "optimizer.weightDecay",
                format!("must be >= 0, got {}", o.weight_decay),
            );
        }
        if !(o.clip_norm.is_finite() && o.clip_norm >= 0.0) {
            bad(
                "optimizer.clipNorm",
                format!("must be >= 0 (0 disables clipping), got {}", o.clip_norm),
            );
        }
    }

    /// The learning-rate schedule and its horizon.
    fn check_schedule(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if !(0.0..=1.0).contains(&self.schedule.min_lr_ratio) {
            bad(
                "schedule.minLrRatio",
                format!("must be in [0, 1], got {}", self.schedule.min_lr_ratio),
            );
        }
        if self.schedule.horizon == ScheduleHorizon::Time {
            if self.max_seconds.is_none() {
                bad(
                    "schedule.horizon",
                    "`time` decays over maxSeconds, which is not set".into(),
                );
            }
            if !matches!(
                self.schedule.kind,
                ScheduleKind::Cosine | ScheduleKind::Linear
            ) {
                let kind = serde_json::to_value(self.schedule.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                bad(
                    "schedule.horizon",
                    format!("`time` only applies to kind cosine or linear, not {kind}"),
                );
            }
        }
    }

    /// Evaluation and the checkpoint policy.
    fn check_eval_and_checkpoint(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if self.eval.beam_size == 0 {
            bad("eval.beamSize", "must be at least 1 (1 = greedy)".into());
        }
        if self.eval.max_sentences == Some(0) {
            bad("eval.maxSentences", "must be at least 1 when set".into());
        }
        if self.checkpoint.keep_latest == 0 {
            bad(
                "checkpoint.keepLatest",
                "must be at least 1 (the newest checkpoint is the resume point)".into(),
            );
        }
        if self.checkpoint.every_seconds == Some(0) {
            bad(
                "checkpoint.everySeconds",
                "must be at least 1 when set".into(),
            );
        }
        if let Some(store) = &self.checkpoint.store {
            if let Err(e) = super::checkpoint::BucketUrl::parse(&store.url) {
                bad("checkpoint.store.url", e);
            }
            if let Some(Err(e)) = store
                .endpoint
                .as_deref()
                .map(super::checkpoint::check_endpoint)
            {
                bad("checkpoint.store.endpoint", e);
            }
            if store.region.as_deref().is_some_and(|r| r.trim().is_empty()) {
                bad(
                    "checkpoint.store.region",
                    "must not be empty when set".into(),
                );
            }
        }
        if self
            .tensorboard
            .dir
            .as_deref()
            .is_some_and(|d| d.trim().is_empty())
        {
            bad(
                "tensorboard.dir",
                "must not be empty when set (leave it out for the job's checkpoint directory)"
                    .into(),
            );
        }
    }

    /// Gradient exchange and rendezvous.
    fn check_distributed(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        let d = &self.distributed;
        if d.bucket_mib == 0 {
            bad("distributed.bucketMib", "must be at least 1".into());
        }
        if d.collective_timeout_seconds == 0 {
            bad(
                "distributed.collectiveTimeoutSeconds",
                "must be at least 1".into(),
            );
        }
        if d.rendezvous_timeout_seconds == 0 {
            bad(
                "distributed.rendezvousTimeoutSeconds",
                "must be at least 1".into(),
            );
        }
    }
}

/// The problems one validation found, in the order the checks run.
#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn bad(&mut self, path: &str, reason: String) {
        self.0.push(FieldError {
            path: path.to_string(),
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigError, TrainerConfig};

    #[test]
    fn every_range_error_is_reported_with_its_path() {
        let text = "task: translation\nmaxSteps: 10\noptimizer:\n  lr: -0.1\nmodel:\n  dModel: 250\n  heads: 4\ndata:\n  tokenizer:\n    vocabSize: 20\n";
        let Err(ConfigError::Invalid { errors, .. }) = TrainerConfig::from_yaml(text, "t") else {
            panic!("expected invalid");
        };
        let paths: Vec<_> = errors.iter().map(|e| e.path.as_str()).collect();
        assert!(paths.contains(&"optimizer.lr"), "{paths:?}");
        assert!(paths.contains(&"model.dModel"), "{paths:?}");
        assert!(paths.contains(&"data.tokenizer.vocabSize"), "{paths:?}");
        assert!(paths.contains(&"data.train"), "{paths:?}");
    }

    #[test]
    fn a_time_horizon_needs_max_seconds_and_a_decaying_schedule() {
        let errors_of = |text: &str| match TrainerConfig::from_yaml(text, "t") {
            Err(ConfigError::Invalid { errors, .. }) => errors,
            other => panic!("expected invalid, got {other:?}"),
        };
        let no_budget =
            errors_of("task: copy\nmaxSteps: 10\nschedule: {kind: linear, horizon: time}\n");
        assert_eq!(no_budget.len(), 1, "{no_budget:?}");
        assert_eq!(no_budget[0].path, "schedule.horizon");
        assert!(no_budget[0].reason.contains("maxSeconds"), "{no_budget:?}");
        let inverse = errors_of(
            "task: copy\nmaxSteps: 10\nmaxSeconds: 60\nschedule: {kind: inverseSqrt, horizon: time}\n",
        );
        assert_eq!(inverse[0].path, "schedule.horizon");
        assert!(
            inverse[0].reason.ends_with("not inverseSqrt"),
            "{inverse:?}"
        );
        let ok =
            "task: copy\nmaxSteps: 10\nmaxSeconds: 60\nschedule: {kind: cosine, horizon: time}\n";
        assert!(TrainerConfig::from_yaml(ok, "t").is_ok());
    }
}
