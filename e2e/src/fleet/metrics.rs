//! Reading Prometheus text: the API server's own counters (every client's requests, its CPU,
//! its latency) and the operator's and the hollow nodes' endpoints over plain HTTP.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use kube::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One sample: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

/// Every sample of metric `name` (exactly that name) in `text`.
pub fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (metric, labels) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (metric == name).then(|| (parse_labels(labels), value))
        })
        .collect()
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let Some(end) = after.find('"') else {
            break;
        };
        out.insert(
            key.trim_start_matches(',').trim().to_string(),
            after[..end].to_string(),
        );
        rest = &after[end + 1..];
    }
    out
}

/// The sum of metric `name`'s samples whose labels pass `keep`.
pub fn sum(text: &str, name: &str, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
    samples(text, name)
        .iter()
        .filter(|(l, _)| keep(l))
        .map(|(_, v)| v)
        .sum()
}

/// What the API server says of itself at one moment.
#[derive(Clone, Debug, Default)]
pub struct ApiServer {
    /// apiserver_request_total by verb (every client).
    pub requests: BTreeMap<String, f64>,
    pub cpu_seconds: f64,
    pub rss_bytes: f64,
    /// apiserver_request_duration_seconds buckets of mutating requests (le -> count).
    pub write_latency: BTreeMap<String, f64>,
    /// Objects stored, by resource (apiserver_resource_objects).
    pub objects: BTreeMap<String, f64>,
}

impl ApiServer {
    pub fn parse(text: &str) -> ApiServer {
        let mut requests = BTreeMap::new();
        for (labels, v) in samples(text, "apiserver_request_total") {
            *requests
                .entry(labels.get("verb").cloned().unwrap_or_default())
                .or_insert(0.0) += v;
        }
        let mut write_latency = BTreeMap::new();
        for (labels, v) in samples(text, "apiserver_request_duration_seconds_bucket") {
            let verb = labels.get("verb").map(String::as_str).unwrap_or_default();
            if matches!(verb, "POST" | "PUT" | "PATCH" | "DELETE") {
                *write_latency
                    .entry(labels.get("le").cloned().unwrap_or_default())
                    .or_insert(0.0) += v;
            }
        }
        let objects = samples(text, "apiserver_resource_objects")
            .into_iter()
            .map(|(l, v)| (l.get("resource").cloned().unwrap_or_default(), v))
            .collect();
        ApiServer {
            requests,
            cpu_seconds: sum(text, "process_cpu_seconds_total", |_| true),
            rss_bytes: sum(text, "process_resident_memory_bytes", |_| true),
            write_latency,
            objects,
        }
    }

    /// Requests per second by verb between `earlier` and this, over `seconds`.
    pub fn rates(&self, earlier: &ApiServer, seconds: f64) -> BTreeMap<String, f64> {
        self.requests
            .iter()
            .map(|(verb, n)| {
                let before = earlier.requests.get(verb).copied().unwrap_or(0.0);
                (verb.clone(), (n - before) / seconds.max(1e-9))
            })
            .filter(|(_, r)| *r > 0.0)
            .collect()
    }

    /// The q-quantile of mutating requests' latency between `earlier` and this (the upper
    /// bound of the bucket it falls in).
    pub fn write_latency_quantile(&self, earlier: &ApiServer, q: f64) -> Option<f64> {
        let mut buckets: Vec<(f64, f64)> = self
            .write_latency
            .iter()
            .filter_map(|(le, n)| {
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((
                    bound,
                    n - earlier.write_latency.get(le).copied().unwrap_or(0.0),
                ))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        buckets
            .iter()
            .find(|(_, n)| *n >= q * total)
            .map(|(bound, _)| *bound)
    }
}

/// The API server's /metrics (or any path) through the client.
pub async fn api_text(client: &Client, path: &str) -> Result<String, String> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| format!("GET {path}: {e}"))
}

/// GET `path` from a plain-HTTP server on this machine (bounded); the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let work = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&answer).to_string();
        let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP answer")?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(head.lines().next().unwrap_or_default().to_string());
        }
        Ok(body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .map_err(|_| format!("GET http://{addr}{path}: no answer within 30 s"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP apiserver_request_total x
apiserver_request_total{code=\"200\",component=\"apiserver\",verb=\"PATCH\"} 10
apiserver_request_total{code=\"201\",component=\"apiserver\",verb=\"POST\"} 4
apiserver_request_total{code=\"200\",component=\"apiserver\",verb=\"PATCH\",resource=\"pods\"} 5
apiserver_request_duration_seconds_bucket{verb=\"PATCH\",le=\"0.1\"} 8
apiserver_request_duration_seconds_bucket{verb=\"PATCH\",le=\"1\"} 10
apiserver_request_duration_seconds_bucket{verb=\"PATCH\",le=\"+Inf\"} 10
apiserver_request_duration_seconds_bucket{verb=\"GET\",le=\"+Inf\"} 1000
process_cpu_seconds_total 12.5
apiserver_resource_objects{group=\"\",resource=\"pods\"} 4000";

    #[test]
    fn the_api_servers_counters_are_read_by_verb() {
        let now = ApiServer::parse(TEXT);
        assert_eq!(now.requests["PATCH"], 15.0);
        assert_eq!(now.requests["POST"], 4.0);
        assert_eq!(now.cpu_seconds, 12.5);
        assert_eq!(now.objects["pods"], 4000.0);
        let before = ApiServer::default();
        assert_eq!(now.rates(&before, 5.0)["PATCH"], 3.0);
        assert_eq!(now.write_latency_quantile(&before, 0.5), Some(0.1));
        assert_eq!(now.write_latency_quantile(&before, 0.99), Some(1.0));
        assert_eq!(now.write_latency_quantile(&now, 0.99), None);
    }
}
