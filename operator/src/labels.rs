//! Labels and names every object the operator creates carries: the pods' labels are half of
//! the operator's durable state (the status is the other half).

/// The field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "ferrotrain-operator";
/// `app.kubernetes.io/name` of every child object.
pub const APP_NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/managed-by`: the label selector of the operator's pod watch.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`].
pub const MANAGER: &str = "ferrotrain-operator";
// The pods' own labels, name and container: in the api crate, which `kubectl ferrotrain`
// reads them from too.
pub use ferrotrain_api::crd::labels::{
    ATTEMPT, JOB, NODE_RANK, PREEMPTION_COST, TRAINER_CONTAINER, pod_name, preemption_cost,
};

/// Key of the trainer config in the ConfigMap.
pub const CONFIG_KEY: &str = "trainer.yaml";
/// Where the ConfigMap is mounted.
pub const CONFIG_DIR: &str = "/etc/ferrotrain";
/// Key of the rendezvous token in the Secret (and its file name where it is mounted).
pub const TOKEN_KEY: &str = "token";
/// Where the rendezvous token's Secret is mounted (FERROTRAIN_RDZV_TOKEN_FILE).
pub const TOKEN_DIR: &str = "/var/run/ferrotrain/rdzv";

/// The headless Service: the pods' DNS subdomain.
pub fn service_name(job: &str) -> String {
    job.to_string()
}

/// The job's NetworkPolicy (spec.networkPolicy).
pub fn network_policy_name(job: &str) -> String {
    job.to_string()
}

/// The ConfigMap holding the trainer config.
pub fn config_map_name(job: &str) -> String {
    format!("{job}-config")
}

/// The Secret holding the rendezvous token.
pub fn secret_name(job: &str) -> String {
    format!("{job}-rdzv")
}

/// Rank 0's DNS name: `<job>-<attempt>-0.<job>.<namespace>.svc`.
pub fn master_addr(job: &str, attempt: i32, namespace: &str) -> String {
    format!(
        "{}.{}.{namespace}.svc",
        pod_name(job, attempt, 0),
        service_name(job)
    )
}
