//! A rank's own report on the pod's endpoint (`ferrotrain run --metrics-port`, a rank run
//! alone): its progress with its process's resources read at request time and the
//! connections its listeners refused, served by the launcher's endpoint server
//! (`ferrotrain_launch::endpoint`), which node 0's launcher serves its gang's report with.

use std::sync::{Arc, Mutex};

use ferrotrain_launch::endpoint::{MetricsServer, Source};
use ferrotrain_launch::refused;

use super::reporter::SharedProgress;
use crate::error::{Reason, Result, TrainError};
use crate::lock::lock;
use crate::resources::ResourceSampler;

/// A rank's own report: its progress with its process's resources read now and the
/// connections its listeners refused.
pub fn rank_source(progress: SharedProgress) -> Source {
    let resources: Arc<Mutex<ResourceSampler>> = Arc::default();
    Arc::new(move || {
        let mut p = lock(&progress).clone();
        p.resources = lock(&resources).sample().or(p.resources);
        p.rejected_connections = refused::merged(refused::snapshot(), &p.rejected_connections);
        p
    })
}

/// Binds `0.0.0.0:port` (port 0 = ephemeral) and serves a rank's `progress` until dropped.
pub fn serve_rank(port: u16, progress: SharedProgress) -> Result<MetricsServer> {
    MetricsServer::serve(port, rank_source(progress))
        .map_err(|e| TrainError::Other(Reason::caused(format!("metrics: port {port}"), e)))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use ferrotrain_api::Progress;

    use super::*;

    fn get(addr: SocketAddr, path: &str) -> Vec<u8> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        out[end + 4..].to_vec()
    }

    #[test]
    fn a_ranks_report_has_its_processs_resources_read_at_request_time() {
        let shared = Arc::new(Mutex::new(Progress {
            step: 1234,
            ..Progress::default()
        }));
        let server = serve_rank(0, shared.clone()).unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], server.local_addr().port()));
        let back: Progress = serde_json::from_slice(&get(addr, "/progress")).unwrap();
        let res = back.resources.clone().unwrap();
        assert!(res.rss_bytes > 1 << 20 && res.threads > 1, "{res:?}");
        assert_eq!(back.step, 1234);
        let text = String::from_utf8(get(addr, "/metrics")).unwrap();
        assert!(
            text.contains("ferrotrain_process_resident_memory_bytes"),
            "{text}"
        );
        shared.lock().unwrap().step = 1300;
        let back: Progress = serde_json::from_slice(&get(addr, "/progress")).unwrap();
        assert_eq!(back.step, 1300);
    }

    #[test]
    fn a_busy_port_is_an_error_not_a_panic() {
        let shared = Arc::new(Mutex::new(Progress::default()));
        let server = serve_rank(0, shared.clone()).unwrap();
        assert!(serve_rank(server.local_addr().port(), shared).is_err());
    }
}
