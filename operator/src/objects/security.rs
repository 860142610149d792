//! The pod's security context: the template's or a restricted default, with the ephemeral
//! port range the job's NetworkPolicy names.

use ferrotrain_api::crd::{DistributedTrainingSpec, PodTemplateOverrides};
use k8s_openapi::api::core::v1::{PodSecurityContext, SeccompProfile, Sysctl};

/// The non-root user and group the pods run as by default.
pub const RUN_AS: i64 = 65532;

/// The template's pod security context, else non-root 65532 with the default seccomp profile;
/// with spec.networkPolicy, the ephemeral port range pinned to its portRange (a namespaced
/// sysctl every kubelet allows since Kubernetes 1.29), so every listener the kernel places
/// is one the policy names: the ring's, NCCL's, Gloo's.
pub(super) fn pod_security_context(
    spec: &DistributedTrainingSpec,
    template: &PodTemplateOverrides,
) -> PodSecurityContext {
    let mut context = default_security_context(template);
    let np = &spec.network_policy;
    if np.enabled {
        let sysctls = context.sysctls.get_or_insert_with(Vec::new);
        if !sysctls.iter().any(|s| s.name == PORT_RANGE_SYSCTL) {
            sysctls.push(Sysctl {
                name: PORT_RANGE_SYSCTL.into(),
                value: np.port_range.sysctl_value(),
            });
        }
    }
    context
}

/// The sysctl that pins the ports the kernel picks (listeners bound to port 0 included).
pub const PORT_RANGE_SYSCTL: &str = "net.ipv4.ip_local_port_range";

fn default_security_context(template: &PodTemplateOverrides) -> PodSecurityContext {
    template
        .security_context
        .clone()
        .unwrap_or(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            fs_group: Some(RUN_AS),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        })
}
