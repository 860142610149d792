//! `manifest.json`: written last into a checkpoint's prefix in the bucket, it is what makes the
//! checkpoint count. It names every file with its size and CRC-32C, the writer that uploaded
//! it, and the eval loss retention ranks by; it carries its own CRC-32C ([`sealed`]).

use ferrotrain_api::checksummed;
use serde::{Deserialize, Serialize};

use crate::checkpoint::fence::WriterId;

/// The manifest's object name inside a checkpoint's prefix.
pub const MANIFEST_FILE: &str = "manifest.json";

/// One uploaded file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    pub name: String,
    pub size: u64,
    /// CRC-32C of the whole file, 8 hex digits.
    pub crc32c: String,
}

/// A checkpoint complete in the bucket.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub step: u64,
    pub files: Vec<ManifestFile>,
    /// Who uploaded it: a manifest of a writer superseded before it was written is not
    /// trusted (see `fence`).
    pub writer: WriterId,
    /// When the manifest was written (RFC 3339).
    pub time: String,
    /// The checkpoint's eval loss, for `keepBest` in the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
}

impl Manifest {
    /// The manifest's bytes: pretty JSON sealed with its CRC-32C.
    pub fn encode(&self) -> serde_json::Result<Vec<u8>> {
        checksummed::seal(self, checksummed::CRC_FIELD)
    }

    /// Parses a manifest and checks its CRC-32C (a manifest without one is refused: every
    /// manifest is written sealed).
    pub fn decode(bytes: &[u8]) -> Result<Manifest, String> {
        match checksummed::verify(bytes, checksummed::CRC_FIELD)? {
            checksummed::Seal::Intact => checksummed::open(bytes, checksummed::CRC_FIELD),
            checksummed::Seal::Absent => Err("the manifest has no crc32c".into()),
        }
    }

    /// The file called `name`, if the manifest lists it.
    pub fn file(&self, name: &str) -> Option<&ManifestFile> {
        self.files.iter().find(|f| f.name == name)
    }

    /// Whether the listing's sizes (object name → bytes) hold every file at its size; the
    /// error names the first object that is missing or has another size.
    pub fn check_sizes(&self, listed: &[(String, u64)]) -> Result<(), String> {
        for file in &self.files {
            match listed.iter().find(|(name, _)| *name == file.name) {
                None => return Err(format!("{} is missing", file.name)),
                Some((_, size)) if *size != file.size => {
                    return Err(format!(
                        "{} holds {size} bytes, the manifest says {}",
                        file.name, file.size
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// CRC-32C as the manifest writes it.
pub fn crc_hex(crc: u32) -> String {
    format!("{crc:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            step: 300,
            files: vec![
                ManifestFile {
                    name: "model.safetensors".into(),
                    size: 1000,
                    crc32c: crc_hex(0xdead_beef),
                },
                ManifestFile {
                    name: "trainer.json".into(),
                    size: 20,
                    crc32c: crc_hex(7),
                },
            ],
            writer: WriterId::new(2, "token"),
            time: "2026-12-02T05:00:00Z".into(),
            eval_loss: Some(1.5),
        }
    }

    #[test]
    fn a_manifest_round_trips_and_any_changed_byte_is_seen() {
        let m = manifest();
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        let text = String::from_utf8(bytes.clone()).unwrap();
        let flipped = text.replacen("1000", "1001", 1);
        assert!(Manifest::decode(flipped.as_bytes()).is_err());
        let unsealed = serde_json::to_vec(&m).unwrap();
        let e = Manifest::decode(&unsealed).unwrap_err();
        assert!(e.contains("crc32c"), "{e}");
        assert!(Manifest::decode(&bytes[..bytes.len() - 3]).is_err());
    }

    #[test]
    fn sizes_are_checked_against_the_listing() {
        let m = manifest();
        let listed = |model: u64| {
            vec![
                ("model.safetensors".to_string(), model),
                ("trainer.json".to_string(), 20),
            ]
        };
        assert_eq!(m.check_sizes(&listed(1000)), Ok(()));
        let e = m.check_sizes(&listed(999)).unwrap_err();
        assert!(e.contains("model.safetensors holds 999 bytes"), "{e}");
        let e = m.check_sizes(&listed(1000)[..1]).unwrap_err();
        assert_eq!(e, "trainer.json is missing");
    }
}
