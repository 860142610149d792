//! Polling rank 0's `/progress` over HTTP (bounded reads, a timeout). Shaping the report for
//! the status is pure and lives in [`crate::report`].

use std::time::Duration;

use bytes::Bytes;
use ferrotrain_api::Progress;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The largest /progress answer read. A report is a few KiB; any image may serve the port, and
/// an unbounded read of an endless body would take the operator's memory with it.
pub const MAX_REPORT_BYTES: usize = 64 * 1024;

/// Why a poll gave no report.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    #[error("invalid URL {url}: {source}")]
    Url {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("GET {url}: {source}")]
    Request {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("GET {url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("GET {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("GET {url}: reading the body: {source}")]
    Body {
        url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("GET {url}: the answer is larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("GET {url}: not a progress report: {source}")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Polls `http://<rank 0 pod IP>:<port>/progress`, a new connection each time, as the
/// kubelet's HTTP probes do: a kept connection to every running job's rank 0 held about 25 KB
/// of the leader's memory per job (hyper's read and write buffers, the connection's task),
/// more than the rest of what it keeps of a job; a connect to a pod IP costs far less than a
/// poll interval. The request says `Connection: close`, so the pod, not the operator, keeps
/// the closed socket's TIME-WAIT.
#[derive(Clone)]
pub struct ProgressClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl ProgressClient {
    /// A client whose every request (connect + answer) is bounded by `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        ProgressClient { client, timeout }
    }

    /// The URL of a pod's report.
    pub fn url(ip: &str, port: u16) -> String {
        if ip.contains(':') {
            format!("http://[{ip}]:{port}/progress")
        } else {
            format!("http://{ip}:{port}/progress")
        }
    }

    /// One poll.
    pub async fn fetch(&self, ip: &str, port: u16) -> Result<Progress, PollError> {
        let url = Self::url(ip, port);
        let uri: http::Uri = url.parse().map_err(|source| PollError::Url {
            url: url.clone(),
            source,
        })?;
        let request = async {
            let get = http::Request::get(uri)
                .header(http::header::CONNECTION, "close")
                .body(Empty::new())
                .expect("a GET of a parsed URI is a valid request");
            let response = self
                .client
                .request(get)
                .await
                .map_err(|source| PollError::Request {
                    url: url.clone(),
                    source,
                })?;
            let status = response.status();
            if !status.is_success() {
                return Err(PollError::Status {
                    url: url.clone(),
                    status: status.as_u16(),
                });
            }
            let too_large = || PollError::TooLarge {
                url: url.clone(),
                limit: MAX_REPORT_BYTES,
            };
            let announced = response
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if announced.is_some_and(|n| n > MAX_REPORT_BYTES as u64) {
                return Err(too_large());
            }
            let body = Limited::new(response.into_body(), MAX_REPORT_BYTES)
                .collect()
                .await
                .map_err(|source| {
                    if source.is::<http_body_util::LengthLimitError>() {
                        too_large()
                    } else {
                        PollError::Body {
                            url: url.clone(),
                            source,
                        }
                    }
                })?
                .to_bytes();
            serde_json::from_slice::<Progress>(&body).map_err(|source| PollError::Decode {
                url: url.clone(),
                source,
            })
        };
        match tokio::time::timeout(self.timeout, request).await {
            Ok(result) => result,
            Err(_) => Err(PollError::Timeout {
                url: url.clone(),
                timeout: self.timeout,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_brackets_ipv6() {
        assert_eq!(
            ProgressClient::url("10.0.0.7", 9090),
            "http://10.0.0.7:9090/progress"
        );
        assert_eq!(
            ProgressClient::url("fd00::7", 9090),
            "http://[fd00::7]:9090/progress"
        );
    }

    #[tokio::test]
    async fn fetch_reads_a_served_report_and_reports_a_closed_port() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let report = Progress {
            step: 42,
            total_steps: 100,
            loss: Some(1.5),
            ..Progress::default()
        };
        let body = serde_json::to_string(&report).unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = socket.read(&mut buf).await.unwrap();
            let request = String::from_utf8_lossy(&buf[..n]).to_string();
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(response.as_bytes()).await.unwrap();
            request
        });
        let client = ProgressClient::new(Duration::from_secs(5));
        let got = client.fetch("127.0.0.1", port).await.unwrap();
        assert_eq!(got, report);
        let request = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
        assert!(request.starts_with("GET /progress HTTP/1.1"), "{request}");
        assert!(
            request.to_ascii_lowercase().contains("connection: close"),
            "{request}"
        );

        // Nothing listens any more (the listener was dropped with the task).
        let err = client.fetch("127.0.0.1", port).await.unwrap_err();
        assert!(matches!(err, PollError::Request { .. }), "{err}");
    }

    #[tokio::test]
    async fn no_connection_is_kept_between_polls_even_when_the_server_would_keep_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = serde_json::to_string(&Progress::default()).unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await.unwrap();
            // A keep-alive answer: only the client can decide to hang up.
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(response.as_bytes()).await.unwrap();
            socket.read(&mut buf).await.unwrap()
        });
        let client = ProgressClient::new(Duration::from_secs(5));
        client.fetch("127.0.0.1", port).await.unwrap();
        let after = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the client hung up after its poll")
            .unwrap();
        assert_eq!(after, 0, "the client sent more on the connection");
    }

    /// Answers one connection with `head` and then `body_len` bytes of `{`-padding, in chunks,
    /// until the client hangs up.
    async fn serve_huge(head: String, body_len: usize) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket.write_all(head.as_bytes()).await;
            let chunk = vec![b' '; 64 * 1024];
            let mut sent = 0;
            while sent < body_len {
                if socket.write_all(&chunk).await.is_err() {
                    return;
                }
                sent += chunk.len();
            }
        });
        port
    }

    #[tokio::test]
    async fn fetch_refuses_a_body_over_the_size_limit() {
        let client = ProgressClient::new(Duration::from_secs(5));
        // Announced: refused before reading a byte of it.
        let len = 1 << 30;
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n");
        let port = serve_huge(head, len).await;
        let err = client.fetch("127.0.0.1", port).await.unwrap_err();
        assert!(
            matches!(
                err,
                PollError::TooLarge {
                    limit: MAX_REPORT_BYTES,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("larger than 65536 bytes"), "{err}");

        // Not announced (chunked / read to close): cut off at the limit.
        let head = "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_string();
        let port = serve_huge(head, 16 << 20).await;
        let err = client.fetch("127.0.0.1", port).await.unwrap_err();
        assert!(matches!(err, PollError::TooLarge { .. }), "{err}");
    }

    #[tokio::test]
    async fn fetch_times_out_on_a_silent_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts (the kernel does) but never answers.
        let client = ProgressClient::new(Duration::from_millis(200));
        let started = std::time::Instant::now();
        let err = client.fetch("127.0.0.1", port).await.unwrap_err();
        assert!(matches!(err, PollError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
        drop(listener);
    }
}
