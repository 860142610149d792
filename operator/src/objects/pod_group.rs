//! The attempt's PodGroup (or Workload) for all-or-nothing scheduling.

use ferrotrain_api::crd::DistributedTrainingSpec;

use super::owner::{Owner, common_labels};
use crate::scheduling::{self, GangMode, GroupObject};

/// The attempt's group object, labelled and owned like every child.
pub(super) fn group_object(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    gang: &GangMode,
    attempt: i32,
) -> Option<GroupObject> {
    let mut group = scheduling::group_object(&owner.name, &owner.namespace, spec, gang, attempt)?;
    let meta = &mut group.object.metadata;
    meta.labels = Some(common_labels(&owner.name));
    meta.owner_references = Some(vec![owner.reference.clone()]);
    Some(group)
}
