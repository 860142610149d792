//! The training loss: label-smoothed cross-entropy over the real target tokens, and its
//! fused form, which projects decoder states onto the vocabulary and differentiates the loss
//! by hand a chunk of rows at a time, so the [tokens, V] logits never exist in full.

use tch::{Kind, Tensor};

use super::onednn;
use crate::data::PAD;

/// Label-smoothed cross-entropy summed over real target tokens (PAD ignored); with
/// `label_smoothing` 0 it is the plain negative log-likelihood.
/// bf16 logits are scored in fp32. Logits [..., V], targets [...].
pub fn loss_sum(logits: &Tensor, tgt_out: &Tensor, label_smoothing: f64) -> Tensor {
    let v = *logits.size().last().expect("logits [..., V]");
    logits
        .to_kind(Kind::Float)
        .view([-1, v])
        .cross_entropy_loss::<Tensor>(
            &tgt_out.view([-1]),
            None,
            tch::Reduction::Sum,
            PAD,
            label_smoothing,
        )
}

/// Decoder states [N, D] and targets [N] at the N real (non-PAD) positions of `tgt_out`
/// [B, T], from states [B, T, D]: about 14% of a length-bucketed batch is padding, which
/// the loss ignores anyway, so it is never projected onto the vocabulary.
/// `real` [N] holds the flattened positions, found on the host (`TensorBatch::real`): the
/// number of rows is then known without asking the device.
pub(super) fn real_positions(h: &Tensor, tgt_out: &Tensor, real: &Tensor) -> (Tensor, Tensor) {
    let d = *h.size().last().expect("[B, T, D]");
    (
        h.reshape([-1, d]).index_select(0, real),
        tgt_out.reshape([-1]).index_select(0, real),
    )
}

/// Rows of logits `fused_projection_loss` holds at a time, by device. On a CPU, 256 rows x 8k
/// vocabulary = 8 MB in fp32, which stays in cache while it is read and written six times.
/// Measured on the Multi30k recipe (2 threads): 64 rows 153 ms, 256 rows 85 ms, 1024 rows
/// 114 ms, all 1,750 rows at once (what autograd does) 198 ms for the projection and loss,
/// forward and backward. On a GPU the cache argument is gone and each chunk costs kernel
/// launches: 8192 rows (256 MB of fp32 logits at 8k) take a 16k-token batch in two chunks.
/// (The GPU value is not measured yet: no GPU has been lent to this project's sessions.)
pub(super) fn loss_chunk_rows(device: tch::Device) -> i64 {
    if device.is_cuda() { 8192 } else { 256 }
}

/// The label-smoothed loss of an output projection and its gradients.
pub(super) struct FusedLoss {
    /// Summed over rows: a 0-dim f64 tensor on the device (read by the caller once a step,
    /// not here: reading it would wait for the device every micro-batch).
    pub(super) loss: Tensor,
    /// dL/dh [N, D], fp32.
    pub(super) d_h: Tensor,
    /// dL/dW [V, D], fp32.
    pub(super) d_weight: Tensor,
    /// dL/db [V], fp32 (zeros when there is no bias).
    pub(super) d_bias: Tensor,
}

/// Label-smoothed cross-entropy (PyTorch's definition, summed) of the logits
/// `h W^T + b` against `targets` [N], with its gradients, `rows` rows at a time. Matrix
/// multiplies run in `kind`, like `dense` (fp32 on a CPU through oneDNN); the logits stay in
/// `kind`, softmax and log-sum-exp are fp32, and dL/dz is rounded to `kind` once. The returned
/// loss and gradients are fp32 (the loss accumulated in f64).
///
/// With p = softmax(z) and smoothing e over V classes, per row:
///   loss  = logsumexp(z) - (1 - e) z[y] - (e / V) sum(z)
///   dL/dz = p - (1 - e) onehot(y) - e / V
pub(super) fn fused_projection_loss(
    h: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    targets: &Tensor,
    label_smoothing: f64,
    kind: Kind,
    rows: i64,
) -> FusedLoss {
    let (n, d) = (h.size()[0], h.size()[1]);
    let v = weight.size()[0];
    let eps = label_smoothing;
    let device = h.device();
    let hk = h.to_kind(kind);
    let wk = weight.to_kind(kind);
    let bk = bias.map(|b| b.to_kind(kind));
    // fp32 on a CPU: the three products through oneDNN (onednn.rs), W^T copied once.
    let through_onednn = onednn::applies(&hk);
    let wk_t = through_onednn.then(|| wk.tr().contiguous());
    let d_h = Tensor::empty([n, d], (Kind::Float, device));
    let mut d_weight = Tensor::zeros([v, d], (Kind::Float, device));
    let mut d_bias = Tensor::zeros([v], (Kind::Float, device));
    // The smoothing term's sum over every logit, sum(z) = sum_rows(h) . sum_vocab(W) + n sum(b),
    // from the inputs instead of a pass over the [n, V] logits.
    let mut z_total = hk
        .sum_dim_intlist(0, false, Kind::Double)
        .dot(&wk.sum_dim_intlist(0, false, Kind::Double));
    if let Some(b) = &bk {
        z_total += b.sum(Kind::Double) * n as f64;
    }
    let mut loss = -z_total * (eps / v as f64);
    let offset = Tensor::from(-(eps / v as f64) as f32).to_device(device);
    let mut start = 0;
    while start < n {
        let len = rows.min(n - start);
        let hc = hk.narrow(0, start, len);
        let y = targets.narrow(0, start, len).unsqueeze(1);
        let z = if through_onednn {
            onednn::product_t(&hc, &wk, bk.as_ref())
        } else {
            hc.linear(&wk, bk.as_ref())
        };
        // p = softmax(z) and lse = logsumexp(z) with one exp over the chunk: e = exp(z - max)
        // in fp32 (z stays in the compute dtype), lse = max + log(sum e), p = e / sum e.
        let max = z.amax([-1], true).to_kind(Kind::Float);
        let e = (&z - &max).exp_();
        let total = e.sum_dim_intlist(-1, true, Kind::Float);
        let lse = &max + total.log();
        loss += lse.sum(Kind::Double) - z.gather(1, &y, false).sum(Kind::Double) * (1.0 - eps);
        // dL/dz = p - e/V - (1 - e) onehot(y), written once in the compute dtype: p - e/V for
        // every column (addcdiv into a `kind` tensor: computed in fp32, rounded once), then the
        // target column computed in fp32 and written over it.
        let at_y = (e.gather(1, &y, false) / &total - eps / v as f64) + (eps - 1.0);
        let mut gk = Tensor::empty([len, v], (kind, device));
        let _ = offset.addcdiv_out(&gk, &e, &total);
        let _ = gk.scatter_(1, &y, &at_y.to_kind(kind));
        let mut rows_d_h = d_h.narrow(0, start, len);
        let (rows_of_d_h, chunk_d_weight) = match &wk_t {
            Some(w_t) => (
                onednn::product_t(&gk, w_t, None),
                onednn::product_t(&gk.tr(), &hc.tr(), None),
            ),
            None => (gk.matmul(&wk), gk.tr().matmul(&hc)),
        };
        rows_d_h.copy_(&rows_of_d_h.to_kind(Kind::Float));
        d_weight += chunk_d_weight.to_kind(Kind::Float);
        if bias.is_some() {
            d_bias += gk.sum_dim_intlist(0, false, Kind::Float);
        }
        start += len;
    }
    FusedLoss {
        loss,
        d_h,
        d_weight,
        d_bias,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::{build, tiny};

    #[test]
    fn loss_ignores_padding_and_matches_the_label_smoothing_formula() {
        let (_, m) = build(&tiny());
        let src = Tensor::from_slice(&[5i64, 6, 2]).unsqueeze(0);
        let tgt_in = Tensor::from_slice(&[1i64, 4, 5]).unsqueeze(0);
        let out = Tensor::from_slice(&[4i64, 5, 2]).unsqueeze(0);
        let in_padded = Tensor::from_slice(&[1i64, 4, 5, 2]).unsqueeze(0);
        let out_padded = Tensor::from_slice(&[4i64, 5, 2, PAD]).unsqueeze(0);
        let logits = m.forward(&src, &tgt_in, false);
        let smoothed = loss_sum(&logits, &out, 0.1);
        let nll = loss_sum(&logits, &out, 0.0);
        let nll_padded = loss_sum(&m.forward(&src, &in_padded, false), &out_padded, 0.0);
        let (smoothed, nll, nll_padded) = (
            smoothed.double_value(&[]),
            nll.double_value(&[]),
            nll_padded.double_value(&[]),
        );
        assert!((nll - nll_padded).abs() < 1e-4, "{nll} vs {nll_padded}");
        // (1 - e) * NLL + e * mean over the vocabulary of -log p, summed over tokens.
        let logp = logits.log_softmax(-1, Kind::Float);
        let uniform = -logp
            .mean_dim(-1, false, Kind::Float)
            .sum(Kind::Float)
            .double_value(&[]);
        let expected = 0.9 * nll + 0.1 * uniform;
        assert!(
            (smoothed - expected).abs() < 1e-4,
            "{smoothed} vs {expected}"
        );
    }
}
