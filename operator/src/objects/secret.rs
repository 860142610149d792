//! The Secret with the rendezvous token, and the token.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use super::owner::Owner;
use crate::labels;

/// The Secret with the rendezvous token (created once; never rewritten).
pub fn secret(owner: &Owner, token: &str) -> Secret {
    Secret {
        metadata: owner.meta(labels::secret_name(&owner.name), BTreeMap::new()),
        type_: Some("Opaque".into()),
        string_data: Some(BTreeMap::from([(
            labels::TOKEN_KEY.to_string(),
            token.to_string(),
        )])),
        ..Secret::default()
    }
}

/// A fresh random rendezvous token (256 bits, hex).
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
