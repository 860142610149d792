//! The tensor files: 8-byte little-endian header length, a JSON header
//! `{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}}`, then
//! the tensors' bytes back to back (little-endian, row-major). Readable by the Python
//! `safetensors` package and by `tch::Tensor::read_safetensors`.
//!
//! `__metadata__.crc32c` (8 hex digits) is the CRC-32C of the whole file as written with that
//! value `00000000`: a flipped bit in a tensor's bytes, or in a tensor's name or shape in the
//! header, which no other check can see, makes the file damaged instead of silently loaded.
//! Files written before it (no `crc32c`) are read without that check.

use std::io::{Read, Write};
use std::path::Path;

use tch::{Kind, Tensor};

use super::io::write_synced;
use crate::error::{Reason, Result, TrainError};

/// A safetensors header larger than this is treated as corrupt (the reference
/// implementation uses the same bound).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The key of the file's CRC-32C in `__metadata__`, and its value while the CRC is taken.
const CRC_KEY: &str = "crc32c";
const CRC_PLACEHOLDER: &str = "00000000";

/// Named tensors (variable path -> tensor).
pub type Named = Vec<(String, Tensor)>;

/// A tensor copied out of libtorch: the writer thread never touches libtorch.
pub(super) struct Snapshot {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

/// The tensors themselves (shared storage, no copy), to copy out on another thread.
pub(super) fn shallow(tensors: &Named) -> Named {
    tensors
        .iter()
        .map(|(name, t)| (name.clone(), t.shallow_clone()))
        .collect()
}

pub(super) fn snapshot(tensors: &Named) -> Result<Vec<Snapshot>> {
    let _guard = tch::no_grad_guard();
    let mut out = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        let kind = tensor.f_kind()?;
        let dtype = dtype_of(kind).ok_or_else(|| {
            TrainError::Other(
                format!("checkpoint: tensor {name} has unsupported kind {kind:?}").into(),
            )
        })?;
        let numel = tensor.numel();
        let mut bytes = vec![0u8; numel * kind.elt_size_in_bytes()];
        // Moves device tensors to the host and makes strided ones contiguous on the way.
        tensor.f_copy_data_u8(&mut bytes, numel)?;
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        out.push(Snapshot {
            name: name.clone(),
            dtype,
            shape,
            bytes,
        });
    }
    Ok(out)
}

#[derive(Debug)]
pub(super) struct HeaderEntry {
    name: String,
    kind: Kind,
    shape: Vec<i64>,
    begin: usize,
    end: usize,
}

fn dtype_of(kind: Kind) -> Option<&'static str> {
    Some(match kind {
        Kind::Bool => "BOOL",
        Kind::Uint8 => "U8",
        Kind::Int8 => "I8",
        Kind::Int16 => "I16",
        Kind::Int => "I32",
        Kind::Int64 => "I64",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Float => "F32",
        Kind::Double => "F64",
        _ => return None,
    })
}

fn kind_of(dtype: &str) -> Option<Kind> {
    Some(match dtype {
        "BOOL" => Kind::Bool,
        "U8" => Kind::Uint8,
        "I8" => Kind::Int8,
        "I16" => Kind::Int16,
        "I32" => Kind::Int,
        "I64" => Kind::Int64,
        "BF16" => Kind::BFloat16,
        "F16" => Kind::Half,
        "F32" => Kind::Float,
        "F64" => Kind::Double,
        _ => return None,
    })
}

/// Writes one safetensors file and fsyncs it; returns its size in bytes.
pub(super) fn write_safetensors(path: &Path, tensors: &[Snapshot]) -> Result<u64> {
    let mut header = serde_json::Map::new();
    let mut metadata = serde_json::Map::new();
    metadata.insert("format".into(), "pt".into());
    metadata.insert(CRC_KEY.into(), CRC_PLACEHOLDER.into());
    header.insert("__metadata__".into(), metadata.into());
    let mut offset = 0usize;
    for t in tensors {
        if header.contains_key(&t.name) {
            return Err(TrainError::Other(
                format!("checkpoint: duplicate tensor name {}", t.name).into(),
            ));
        }
        let end = offset + t.bytes.len();
        header.insert(
            t.name.clone(),
            serde_json::json!({ "dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut json = serde_json::to_vec(&header)
        .map_err(|e| TrainError::Other(Reason::caused("checkpoint: encoding a header", e)))?;
    // Pad so the data starts 8-byte aligned, as the reference writer does.
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let len = (json.len() as u64).to_le_bytes();
    let crc = tensors.iter().fold(
        crc32c::crc32c_append(crc32c::crc32c(&len), &json),
        |crc, t| crc32c::crc32c_append(crc, &t.bytes),
    );
    let placeholder = crc_field(CRC_PLACEHOLDER);
    if let Some(at) = find(&json, placeholder.as_bytes()) {
        json.splice(
            at..at + placeholder.len(),
            crc_field(&format!("{crc:08x}")).bytes(),
        );
    }
    write_synced(path, |w| {
        w.write_all(&(json.len() as u64).to_le_bytes())?;
        w.write_all(&json)?;
        for t in tensors {
            w.write_all(&t.bytes)?;
        }
        Ok(())
    })
}

/// A checked header: its tensors in file order and, in files that record one, the CRC-32C
/// the file must have and that of its length and header (what the data's bytes continue).
#[derive(Debug)]
pub(super) struct Header {
    pub(super) entries: Vec<HeaderEntry>,
    pub(super) crc32c: Option<(u32, u32)>,
}

/// `"crc32c":"<hex>"` as the compact header spells it.
fn crc_field(hex: &str) -> String {
    format!("\"{CRC_KEY}\":\"{hex}\"")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The recorded CRC-32C of a header that has one, and the CRC of the length and the header
/// as they were when it was taken (the recorded value replaced by the placeholder).
fn header_crc(
    len: &[u8; 8],
    json: &[u8],
    header: &serde_json::Map<String, serde_json::Value>,
) -> Result<Option<(u32, u32)>, String> {
    let Some(v) = header.get("__metadata__").and_then(|m| m.get(CRC_KEY)) else {
        return Ok(None);
    };
    let bad = || format!("__metadata__.{CRC_KEY} is not a CRC: {v}");
    let hex = v
        .as_str()
        .filter(|h| h.len() == CRC_PLACEHOLDER.len())
        .ok_or_else(bad)?;
    let expected = u32::from_str_radix(hex, 16).map_err(|_| bad())?;
    let field = crc_field(hex);
    let at = find(json, field.as_bytes()).ok_or_else(bad)?;
    let mut zeroed = json.to_vec();
    zeroed.splice(at..at + field.len(), crc_field(CRC_PLACEHOLDER).bytes());
    let partial = crc32c::crc32c_append(crc32c::crc32c(len), &zeroed);
    Ok(Some((expected, partial)))
}

/// Parses and checks a header against the file length: every tensor's byte range matches its
/// dtype and shape, the ranges tile the data section exactly, and the file is not shorter or
/// longer than that. Leaves `f` positioned at the start of the data.
pub(super) fn read_header(f: &mut impl Read, file_len: u64) -> Result<Header, String> {
    let mut len_bytes = [0u8; 8];
    f.read_exact(&mut len_bytes)
        .map_err(|e| format!("reading the header length: {e}"))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
        return Err(format!(
            "header length {header_len} does not fit a file of {file_len} bytes"
        ));
    }
    let mut json = vec![0u8; header_len as usize];
    f.read_exact(&mut json)
        .map_err(|e| format!("reading the header: {e}"))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&json).map_err(|e| format!("header is not a JSON object: {e}"))?;
    let crc32c = header_crc(&len_bytes, &json, &header)?;
    let mut entries = Vec::with_capacity(header.len());
    for (name, value) in header {
        if name != "__metadata__" {
            entries.push(entry(name, &value)?);
        }
    }
    entries.sort_by_key(|e| (e.begin, e.end));
    let mut expected = 0usize;
    for e in &entries {
        if e.begin != expected {
            return Err(format!(
                "tensor {} starts at {} but the previous one ends at {expected}",
                e.name, e.begin
            ));
        }
        expected = e.end;
    }
    let data_len = file_len - 8 - header_len;
    if expected as u64 != data_len {
        return Err(format!(
            "header describes {expected} data bytes but the file holds {data_len} (truncated or padded)"
        ));
    }
    Ok(Header { entries, crc32c })
}

/// One tensor's header entry, checked against its dtype and shape.
fn entry(name: String, value: &serde_json::Value) -> Result<HeaderEntry, String> {
    let bad = |why: &str| format!("tensor {name}: {why}");
    let dtype = value
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| bad("no dtype"))?;
    let kind = kind_of(dtype).ok_or_else(|| bad(&format!("unsupported dtype {dtype}")))?;
    let shape: Vec<u64> = value
        .get("shape")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .ok_or_else(|| bad("no shape"))?;
    let offsets: [u64; 2] = value
        .get("data_offsets")
        .and_then(|o| serde_json::from_value(o.clone()).ok())
        .ok_or_else(|| bad("no data_offsets"))?;
    let numel = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let bytes = numel.and_then(|n| n.checked_mul(kind.elt_size_in_bytes() as u64));
    if offsets[1] < offsets[0] || Some(offsets[1] - offsets[0]) != bytes {
        return Err(bad("data_offsets do not match dtype and shape"));
    }
    let shape = shape
        .iter()
        .map(|&d| i64::try_from(d))
        .collect::<Result<Vec<i64>, _>>()
        .map_err(|_| bad("dimension too large"))?;
    let (begin, end) = match (usize::try_from(offsets[0]), usize::try_from(offsets[1])) {
        (Ok(b), Ok(e)) => (b, e),
        _ => return Err(bad("data_offsets out of range")),
    };
    Ok(HeaderEntry {
        name,
        kind,
        shape,
        begin,
        end,
    })
}

/// Checks the data section that follows a header in `f` against the header's CRC-32C,
/// reading it in pieces (a checkpoint can be larger than memory allows twice).
pub(super) fn verify_data(f: &mut impl Read, header: &Header) -> Result<(), String> {
    let Some((expected, mut crc)) = header.crc32c else {
        return Ok(());
    };
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("reading the data: {e}"))?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
    }
    check_crc(crc, expected)
}

fn check_crc(actual: u32, expected: u32) -> Result<(), String> {
    if actual == expected {
        Ok(())
    } else {
        Err(format!(
            "the file does not match its CRC-32C ({actual:08x}, its header says {expected:08x}): it is damaged"
        ))
    }
}

/// The tensors of a whole safetensors file's bytes, after checking its header and, when it
/// records one, the data's CRC-32C; in file order.
pub fn tensors_from_bytes(bytes: &[u8]) -> Result<Named, String> {
    let mut rest = bytes;
    let header = read_header(&mut rest, bytes.len() as u64)?;
    if let Some((expected, partial)) = header.crc32c {
        check_crc(crc32c::crc32c_append(partial, rest), expected)?;
    }
    header
        .entries
        .into_iter()
        .map(|e| {
            let data = rest
                .get(e.begin..e.end)
                .ok_or_else(|| format!("tensor {}: outside the file", e.name))?;
            let t = Tensor::f_from_data_size(data, &e.shape, e.kind)
                .map_err(|err| format!("tensor {}: {err}", e.name))?;
            Ok((e.name, t))
        })
        .collect()
}

/// Reads a safetensors file fully, after checking its header and data; tensors in file order.
pub fn read_safetensors(path: &Path) -> Result<Named, String> {
    let fail = |e: String| format!("{}: {e}", path.display());
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    tensors_from_bytes(&bytes).map_err(fail)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::checkpoint::MODEL_FILE;
    use crate::checkpoint::fixtures::*;
    use crate::checkpoint::store::CheckpointStore;

    #[test]
    fn files_are_standard_safetensors() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(1, 0)).unwrap();
        save_now(&mut store, 5, None);
        // tch's reader is the reference `safetensors` crate.
        let mut theirs =
            Tensor::read_safetensors(tmp.path().join("step-00000005").join(MODEL_FILE)).unwrap();
        theirs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut ours = model(1);
        ours.sort_by(|a, b| a.0.cmp(&b.0));
        assert_same(&ours, &theirs);
        let raw = fs::read(tmp.path().join("step-00000005").join(MODEL_FILE)).unwrap();
        let header_len = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + header_len) % 8, 0, "data section is 8-byte aligned");
        let json = std::str::from_utf8(&raw[8..8 + header_len]).unwrap();
        assert!(json.contains("\"encoder.layer0.attn.q.weight\""), "{json}");
    }
}
