//! The ConfigMap with the trainer config.

use std::collections::BTreeMap;

use ferrotrain_api::crd::DistributedTrainingSpec;
use k8s_openapi::api::core::v1::ConfigMap;

use super::owner::Owner;
use crate::labels;

/// The ConfigMap with the trainer config (spec.trainer as written: spec.checkpoint says only
/// where); None when the job runs its own command without a trainer config.
pub fn config_map(owner: &Owner, spec: &DistributedTrainingSpec) -> Option<ConfigMap> {
    let config = spec.trainer.as_ref()?;
    Some(ConfigMap {
        metadata: owner.meta(labels::config_map_name(&owner.name), BTreeMap::new()),
        data: Some(BTreeMap::from([(
            labels::CONFIG_KEY.to_string(),
            config.to_yaml(),
        )])),
        ..ConfigMap::default()
    })
}
