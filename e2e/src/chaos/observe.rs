//! What the soak reads of the job while faults hit it, through outages of the API server:
//! every API call is retried while the server is away ([`patiently`]); rank 0's own report
//! (`/progress`) is read straight from its pod's address on this machine, where the kit's
//! pod bridge is, so it stays readable when the API server is not.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ferrotrain_api::Progress;
use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::namespace::TestNamespace;

/// How long a call is retried while the API server does not answer: longer than the soak's
/// longest outage (20 s) and the kit's up.sh after it.
pub const API_PATIENCE: Duration = Duration::from_secs(180);

/// Runs `call` until it returns, retrying (every half second, for [`API_PATIENCE`]) while
/// the API server cannot be reached or answers 5xx/429; a refusal (4xx) is returned at once.
pub async fn patiently<T, F, Fut>(what: &str, mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let started = Instant::now();
    let mut told = false;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(kube::Error::Api(s)) if s.code < 500 && s.code != 429 => {
                return Err(kube::Error::Api(s));
            }
            Err(e) if started.elapsed() < API_PATIENCE => {
                if !told {
                    eprintln!("  ({what}: {e}; trying again while the API server is away)");
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A pod of the job, as the soak targets it.
#[derive(Clone, Debug)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub attempt: i64,
    pub node_rank: i32,
    /// The Kubernetes node it runs on.
    pub node: Option<String>,
    pub ip: Option<String>,
    pub phase: String,
    /// It has a deletionTimestamp.
    pub leaving: bool,
    /// Its metrics port (rank 0's `/progress`).
    pub port: u16,
}

/// The job's pods (`<job>-<attempt>-<node rank>`), sorted by name.
pub async fn job_pods(ns: &TestNamespace, job: &str) -> Vec<PodView> {
    let pods: Api<Pod> = ns.pods();
    let params = ListParams::default().labels(&format!("ferrotrain.dev/job={job}"));
    let list = patiently("listing the job's pods", || pods.list(&params))
        .await
        .unwrap_or_else(|e| panic!("listing the pods of {job}: {e}"));
    let mut views: Vec<PodView> = list.items.iter().filter_map(|p| view(p, job)).collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    views
}

fn view(pod: &Pod, job: &str) -> Option<PodView> {
    let name = pod.metadata.name.clone()?;
    let mut parts = name.strip_prefix(&format!("{job}-"))?.split('-');
    let attempt = parts.next()?.parse().ok()?;
    let node_rank = parts.next()?.parse().ok()?;
    let spec = pod.spec.as_ref()?;
    let port = spec.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == ferrotrain_api::env::FERROTRAIN_METRICS_PORT)
        .and_then(|e| e.value.as_ref()?.parse().ok())
        .unwrap_or(9090);
    let status = pod.status.as_ref();
    Some(PodView {
        uid: pod.metadata.uid.clone()?,
        attempt,
        node_rank,
        node: spec.node_name.clone(),
        ip: status.and_then(|s| s.pod_ip.clone()),
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        leaving: pod.metadata.deletion_timestamp.is_some(),
        port,
        name,
    })
}

/// The pod of node rank `node` of the newest attempt that has one, not leaving.
pub fn pod_of(pods: &[PodView], node: i32) -> Option<&PodView> {
    pods.iter()
        .filter(|p| p.node_rank == node && !p.leaving && p.phase != "Failed")
        .max_by_key(|p| p.attempt)
}

/// The job's status (retried through API server outages).
pub async fn job_status(ns: &TestNamespace, job: &str) -> DistributedTrainingStatus {
    let jobs: Api<DistributedTraining> = ns.jobs();
    let dt = patiently("reading the job", || jobs.get(job))
        .await
        .unwrap_or_else(|e| panic!("reading job {job}: {e}"));
    dt.status.unwrap_or_default()
}

/// Rank 0's report as read: its pod (UID, attempt) and its `/progress`.
#[derive(Clone, Debug)]
pub struct Seen {
    pub progress: Progress,
    pub uid: String,
    pub attempt: i64,
}

impl Seen {
    /// The round it trains in.
    pub fn key(&self) -> (i64, u64) {
        (self.attempt, self.progress.round)
    }
}

/// Rank 0's own report, read from its pod's address: the pod is found through the API once
/// (and again when it changes), its `/progress` straight from this machine.
#[derive(Clone)]
pub struct Rank0 {
    job: String,
    at: Option<(String, i64, SocketAddr)>,
}

impl Rank0 {
    pub fn new(job: &str) -> Rank0 {
        Rank0 {
            job: job.to_string(),
            at: None,
        }
    }

    /// Rank 0's `/progress` now, with the pod that served it.
    pub async fn read(&mut self, ns: &TestNamespace) -> Result<Seen, String> {
        if let Some((uid, attempt, addr)) = &self.at
            && let Ok(progress) = progress_at(*addr).await
        {
            return Ok(Seen {
                progress,
                uid: uid.clone(),
                attempt: *attempt,
            });
        }
        // Not reachable where it was: a new pod, or none yet.
        self.at = None;
        let pods = job_pods(ns, &self.job).await;
        let pod = pod_of(&pods, 0).ok_or("no pod of node rank 0")?;
        let ip = pod
            .ip
            .as_ref()
            .ok_or(format!("{} has no IP yet", pod.name))?;
        let addr: SocketAddr = format!("{ip}:{}", pod.port)
            .parse()
            .map_err(|e| format!("{ip}: {e}"))?;
        let progress = progress_at(addr).await?;
        self.at = Some((pod.uid.clone(), pod.attempt, addr));
        Ok(Seen {
            progress,
            uid: pod.uid.clone(),
            attempt: pod.attempt,
        })
    }
}

/// `/progress` of the rank 0 at `addr`.
async fn progress_at(addr: SocketAddr) -> Result<Progress, String> {
    let body = http_get(addr, "/progress").await?;
    serde_json::from_slice(&body).map_err(|e| format!("{addr}/progress: {e}"))
}

/// A plain HTTP/1.1 GET (`Connection: close`), bounded by a second: the body, de-chunked.
async fn http_get(addr: SocketAddr, path: &str) -> Result<Vec<u8>, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .map_err(|_| format!("{addr}{path}: no answer within 1 s"))?
        .map_err(|e| format!("{addr}{path}: {e}"))?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(format!("{addr}{path}: no HTTP header"))?;
    let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    if !head.starts_with("http/1.1 200") && !head.starts_with("http/1.0 200") {
        let line = head.lines().next().unwrap_or_default().to_string();
        return Err(format!("{addr}{path}: {line}"));
    }
    let body = &answer[split + 4..];
    if head.contains("transfer-encoding: chunked") {
        dechunk(body).ok_or(format!("{addr}{path}: a broken chunked body"))
    } else {
        Ok(body.to_vec())
    }
}

/// The data of a chunked HTTP body.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_is_joined() {
        assert_eq!(
            dechunk(b"4\r\nWiki\r\n6;x=y\r\npedia \r\n0\r\n\r\n").as_deref(),
            Some(&b"Wikipedia "[..])
        );
        assert_eq!(dechunk(b"4\r\nWi"), None);
    }
}
