//! A batch as padded tensors on the device: source with EOS, decoder input with BOS,
//! decoder output with EOS, and the positions the loss reads.

use tch::{Device, Tensor};

use super::corpus::Example;
use super::vocab::{BOS, EOS, PAD};

/// Padded tensors for a set of examples.
pub struct TensorBatch {
    /// [B, S] source ids with EOS, PAD-padded.
    pub src: Tensor,
    /// [B, T] decoder input: BOS + target.
    pub tgt_in: Tensor,
    /// [B, T] decoder output: target + EOS, PAD-padded.
    pub tgt_out: Tensor,
    /// [N] positions in the flattened `tgt_out` that are not PAD, computed on the host with
    /// the batch: the loss reads only those rows, and finding them on the device (`nonzero`)
    /// would wait for the GPU every micro-batch.
    pub real: Tensor,
    /// Real (non-pad) target tokens (the loss denominator).
    pub tgt_tokens: i64,
    /// Real source + target tokens (for throughput).
    pub tokens: i64,
}

impl TensorBatch {
    /// A batch from tensors made elsewhere (tests, tools): `real` is found with `nonzero`,
    /// which waits for the device; the training loop's batches come from [`to_tensors`].
    pub fn from_tensors(src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Self {
        let real = tgt_out.ne(PAD).reshape([-1]).nonzero().squeeze_dim(1);
        let tgt_tokens = real.size()[0];
        let src_tokens = src.ne(PAD).sum(tch::Kind::Int64).int64_value(&[]);
        TensorBatch {
            src,
            tgt_in,
            tgt_out,
            real,
            tgt_tokens,
            tokens: src_tokens + tgt_tokens,
        }
    }
}

/// `tgt_tokens` counts the target tokens plus EOS (the positions the loss sees); `tokens`
/// adds the source tokens plus EOS. An empty `indices` gives [0, 1] tensors.
pub fn to_tensors(examples: &[Example], indices: &[usize], device: Device) -> TensorBatch {
    let rows = indices.len();
    let src_width = indices
        .iter()
        .map(|&i| examples[i].src.len() + 1)
        .max()
        .unwrap_or(1);
    let tgt_width = indices
        .iter()
        .map(|&i| examples[i].tgt.len() + 1)
        .max()
        .unwrap_or(1);
    let mut src = vec![PAD; rows * src_width];
    let mut tgt_in = vec![PAD; rows * tgt_width];
    let mut tgt_out = vec![PAD; rows * tgt_width];
    let (mut src_tokens, mut tgt_tokens) = (0i64, 0i64);
    let mut real = Vec::new();
    for (row, &i) in indices.iter().enumerate() {
        let e = &examples[i];
        let s = &mut src[row * src_width..(row + 1) * src_width];
        for (slot, &id) in s.iter_mut().zip(&e.src) {
            *slot = i64::from(id);
        }
        s[e.src.len()] = EOS;
        let ti = &mut tgt_in[row * tgt_width..(row + 1) * tgt_width];
        ti[0] = BOS;
        for (slot, &id) in ti[1..].iter_mut().zip(&e.tgt) {
            *slot = i64::from(id);
        }
        let to = &mut tgt_out[row * tgt_width..(row + 1) * tgt_width];
        for (slot, &id) in to.iter_mut().zip(&e.tgt) {
            *slot = i64::from(id);
        }
        to[e.tgt.len()] = EOS;
        real.extend((0..=e.tgt.len()).map(|col| (row * tgt_width + col) as i64));
        src_tokens += e.src.len() as i64 + 1;
        tgt_tokens += e.tgt.len() as i64 + 1;
    }
    // One upload for the four tensors: views of it on the device.
    let (n_src, n_tgt, n_real) = (src.len() as i64, tgt_in.len() as i64, real.len() as i64);
    let mut host = src;
    host.extend(tgt_in);
    host.extend(tgt_out);
    host.extend(real);
    let all = to_device_queued(&Tensor::from_slice(&host), device);
    let part = |start: i64, n: i64| all.narrow(0, start, n);
    TensorBatch {
        src: part(0, n_src).view([rows as i64, src_width as i64]),
        tgt_in: part(n_src, n_tgt).view([rows as i64, tgt_width as i64]),
        tgt_out: part(n_src + n_tgt, n_tgt).view([rows as i64, tgt_width as i64]),
        real: part(n_src + 2 * n_tgt, n_real),
        tgt_tokens,
        tokens: src_tokens + tgt_tokens,
    }
}

/// A host tensor copied to `device`. On a GPU the copy is asynchronous, from pinned memory:
/// a plain `to_device` would wait until the GPU has finished all the work queued before it
/// (a host synchronisation); this copy is queued behind that work instead, and libtorch
/// keeps the pinned block until the copy is done.
pub fn to_device_queued(host: &Tensor, device: Device) -> Tensor {
    match device {
        // Pinned without naming the device (tch's pin_memory(device) is deprecated and
        // warns on every call); a copy that cannot be pinned is made the plain way.
        Device::Cuda(_) => match crate::memory::pin_memory(host) {
            Ok(pinned) => pinned.to_device_(device, host.kind(), true, false),
            Err(e) => {
                tracing::debug!("{e}; copying without pinning");
                host.to_device(device)
            }
        },
        _ => host.to_device(device),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_hold_eos_bos_and_padding() {
        let examples = vec![
            Example {
                src: vec![10, 11, 12],
                tgt: vec![20],
            },
            Example {
                src: vec![13],
                tgt: vec![21, 22, 23],
            },
        ];
        let b = to_tensors(&examples, &[1, 0], Device::Cpu);
        let rows = |t: &Tensor| -> Vec<Vec<i64>> { Vec::<Vec<i64>>::try_from(t).unwrap() };
        assert_eq!(
            rows(&b.src),
            [vec![13, EOS, PAD, PAD], vec![10, 11, 12, EOS]]
        );
        assert_eq!(
            rows(&b.tgt_in),
            [vec![BOS, 21, 22, 23], vec![BOS, 20, PAD, PAD]]
        );
        assert_eq!(
            rows(&b.tgt_out),
            [vec![21, 22, 23, EOS], vec![20, EOS, PAD, PAD]]
        );
        assert_eq!(b.src.kind(), tch::Kind::Int64);
        assert_eq!((b.tgt_tokens, b.tokens), (6, 12));
        // The non-PAD positions of tgt_out, found on the host, are what nonzero finds.
        assert_eq!(Vec::<i64>::try_from(&b.real).unwrap(), [0, 1, 2, 3, 4, 5]);
        let found = TensorBatch::from_tensors(b.src.copy(), b.tgt_in.copy(), b.tgt_out.copy());
        assert!(found.real.equal(&b.real));
        assert_eq!((found.tgt_tokens, found.tokens), (b.tgt_tokens, b.tokens));
        let empty = to_tensors(&examples, &[], Device::Cpu);
        assert_eq!(empty.src.size(), [0, 1]);
        assert_eq!(empty.real.size(), [0]);
    }
}
