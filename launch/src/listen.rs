//! The rendezvous store's listener: MASTER_PORT, bound as soon as a previous holder lets go.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use crate::store::StoreError;

/// Binds `addr`, retrying while the port is still held (a previous attempt's rank 0 or
/// launcher exiting) until `deadline`.
pub fn bind_until(addr: SocketAddr, deadline: Instant) -> Result<TcpListener, StoreError> {
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(source) => return Err(StoreError::Listen { addr, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_is_waited_for_until_the_deadline_then_named() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let started = Instant::now();
        let err = bind_until(addr, started + Duration::from_millis(300)).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
        drop(held);
        bind_until(addr, Instant::now() + Duration::from_secs(5)).unwrap();
    }
}
