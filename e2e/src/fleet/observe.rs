//! What the phases read of the fleet as it is now: the hollow nodes and their readiness, the
//! simulator's snapshot and poll intervals (its control endpoint), the Lease's holder.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use super::bench::Bench;
use super::jobs::poll;
use super::metrics::http_get;
use crate::hollow::Snapshot;

/// The bench's hollow nodes (`selector`) as the API has them now; none when the list fails.
pub(super) async fn hollow_nodes(api: &Api<Node>, selector: &str) -> Vec<Node> {
    api.list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Whether the node's Ready condition is True.
pub(super) fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(super) async fn wait_holder(
    b: &Bench,
    identity: &str,
    limit: Duration,
) -> Result<Instant, String> {
    poll(
        &format!("{identity} holding the Lease"),
        limit,
        Duration::from_millis(20),
        || async move {
            let holder = b.tracker.with(|s| s.holder.clone());
            let at = holder
                .as_ref()
                .filter(|(h, _)| h == identity)
                .map(|(_, at)| *at);
            (at, format!("{holder:?}"))
        },
    )
    .await
}

pub(super) async fn sim_snapshot(b: &Bench) -> Result<Snapshot, String> {
    let addr = b.sim_control.ok_or("no hollow nodes")?;
    let text = http_get(addr, "/snapshot").await?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

pub(super) async fn sim_polls(b: &Bench) -> Result<BTreeMap<String, Vec<f64>>, String> {
    let addr = b.sim_control.ok_or("no hollow nodes")?;
    let text = http_get(addr, "/polls").await?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}
