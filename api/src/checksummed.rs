//! JSON files that carry their own CRC-32C, so that a bit flipped in a step count, an attempt
//! or a token's id is seen when the file is read back instead of being taken for good state.
//!
//! The writer puts a field holding `00000000` into the object, writes it as pretty JSON and
//! replaces those zeros with the CRC-32C (hex) of the bytes written; the reader puts the zeros
//! back and compares. A checkpoint's trainer.json, the checkpoint directory's fence.json, a
//! heal snapshot's meta.json and rank 0's progress file for its launcher are sealed so.

use serde::Serialize;

/// The field most sealed files keep their CRC-32C in.
pub const CRC_FIELD: &str = "crc32c";
const PLACEHOLDER: &str = "00000000";

/// What [`verify`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seal {
    /// The field is there and matches the bytes.
    Intact,
    /// The file has no such field (written before it was recorded).
    Absent,
}

/// Pretty JSON of `value` (which must serialize as an object) with its CRC-32C in `field`.
pub fn seal(value: &impl Serialize, field: &str) -> serde_json::Result<Vec<u8>> {
    let mut object = serde_json::to_value(value)?;
    if let Some(map) = object.as_object_mut() {
        map.insert(field.into(), PLACEHOLDER.into());
    }
    let mut bytes = serde_json::to_vec_pretty(&object)?;
    let crc = format!("{:08x}", crc32c::crc32c(&bytes));
    let placeholder = field_text(field, PLACEHOLDER);
    if let Some(at) = find(&bytes, placeholder.as_bytes()) {
        bytes.splice(at..at + placeholder.len(), field_text(field, &crc).bytes());
    }
    Ok(bytes)
}

/// Checks the CRC-32C in `field` of the JSON object `bytes`; the error says what is wrong.
pub fn verify(bytes: &[u8], field: &str) -> Result<Seal, String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let Some(recorded) = value.get(field) else {
        return Ok(Seal::Absent);
    };
    let hex = recorded
        .as_str()
        .filter(|h| h.len() == PLACEHOLDER.len())
        .ok_or_else(|| format!("{field} is not a CRC: {recorded}"))?;
    let text = field_text(field, hex);
    let at = find(bytes, text.as_bytes())
        .ok_or_else(|| format!("{field} is not where it was written"))?;
    let mut zeroed = bytes.to_vec();
    zeroed.splice(at..at + text.len(), field_text(field, PLACEHOLDER).bytes());
    let actual = format!("{:08x}", crc32c::crc32c(&zeroed));
    if actual != hex {
        return Err(format!(
            "does not match its CRC-32C ({actual}, the file says {hex}): the file is damaged"
        ));
    }
    Ok(Seal::Intact)
}

/// [`verify`], then the object parsed as `T`; a file without `field` is taken as it is.
pub fn open<T: serde::de::DeserializeOwned>(bytes: &[u8], field: &str) -> Result<T, String> {
    verify(bytes, field)?;
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

fn field_text(field: &str, hex: &str) -> String {
    format!("\"{field}\": \"{hex}\"")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Fence {
        attempt: u64,
        host: String,
    }

    #[test]
    fn a_sealed_file_opens_and_any_changed_byte_is_seen() {
        let fence = Fence {
            attempt: 12,
            host: "node-a".into(),
        };
        let bytes = seal(&fence, CRC_FIELD).unwrap();
        assert_eq!(verify(&bytes, CRC_FIELD), Ok(Seal::Intact));
        assert_eq!(open::<Fence>(&bytes, CRC_FIELD).unwrap(), fence);
        let text = String::from_utf8(bytes.clone()).unwrap();
        let flipped = text.replace("12", "13");
        let err = open::<Fence>(flipped.as_bytes(), CRC_FIELD).unwrap_err();
        assert!(err.contains("CRC-32C") && err.contains("damaged"), "{err}");
        // Another field name: this one is not sealed.
        assert_eq!(verify(&bytes, "other"), Ok(Seal::Absent));
        let unsealed = serde_json::to_vec(&fence).unwrap();
        assert_eq!(open::<Fence>(&unsealed, CRC_FIELD).unwrap(), fence);
    }
}
