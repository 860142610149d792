//! A connection to the store: connects (retrying name resolution, connection and a refused
//! handshake until a deadline), then asks one request at a time.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::error::{ConnectError, Result, StoreError};
use super::protocol::{OK, REFUSED, Request, read_frame, write_frame};
use crate::auth::{Auth, Channel};
use crate::keys;

/// A rank's connection to the store.
pub struct StoreClient {
    stream: TcpStream,
    server: String,
    /// Bounds every request that does not carry its own wait.
    timeout: Duration,
    /// Put before every key (the ranks of an in-place round use `round/<r>/`).
    prefix: String,
}

/// The longest one try to connect (and shake hands) may take.
const TRY_TIMEOUT: Duration = Duration::from_secs(3);

/// When a client that cannot reach the store says so: [`Unreached::FIRST`] after its first
/// try (a store that starts a moment later is normal and says nothing), then every
/// [`Unreached::EVERY`], with the address and the last error, so that a launcher never waits in
/// silence for a name that does not resolve or a port that does not answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unreached {
    since: Instant,
    next: Instant,
}

impl Unreached {
    pub(crate) const FIRST: Duration = Duration::from_secs(3);
    pub(crate) const EVERY: Duration = Duration::from_secs(5);

    pub(crate) fn since(start: Instant) -> Self {
        Unreached {
            since: start,
            next: start + Self::FIRST,
        }
    }

    /// Whether to say so at `now` (and when to say it next, if so).
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        while self.next <= now {
            self.next += Self::EVERY;
        }
        true
    }

    /// How long it has not been reached at `now`.
    pub(crate) fn waited(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }
}

impl StoreClient {
    /// Resolves and connects to `host:port`, retrying name resolution, connection and a
    /// rejected handshake with backoff until `deadline` (DNS records of a new pod appear
    /// late; rank 0 may not listen yet).
    pub fn connect(host: &str, port: u16, auth: &Auth, deadline: Instant) -> Result<Self> {
        let server = format!("{host}:{port}");
        let mut backoff = Duration::from_millis(50);
        let mut attempts = 0u32;
        let mut unreached = Unreached::since(Instant::now());
        loop {
            attempts += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let last_error = match Self::try_connect(host, port, auth, left) {
                Ok(stream) => {
                    return Ok(StoreClient {
                        stream,
                        server,
                        timeout: Duration::from_secs(60),
                        prefix: String::new(),
                    });
                }
                Err(e) => e,
            };
            let now = Instant::now();
            if now + backoff >= deadline {
                return Err(StoreError::Unreachable {
                    server,
                    attempts,
                    last: last_error,
                });
            }
            if unreached.due(now) {
                let waited = unreached.waited(now).as_secs_f64();
                let left = deadline.saturating_duration_since(now).as_secs_f64();
                tracing::warn!(
                    "rendezvous: cannot reach the store at {server} yet ({waited:.0} s, \
                     {attempts} tries): {last_error}; retrying for {left:.0} s more"
                );
            } else {
                tracing::debug!("rendezvous: {server} not ready ({last_error}); retrying");
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    fn try_connect(
        host: &str,
        port: u16,
        auth: &Auth,
        left: Duration,
    ) -> std::result::Result<TcpStream, ConnectError> {
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|source| ConnectError::Resolve {
                host: host.to_string(),
                source,
            })?
            .collect();
        let mut last = ConnectError::NoAddress {
            host: host.to_string(),
        };
        // One try is short: an address that drops the SYN (a stale name, a pod not yet on
        // the network) or a peer that never answers the handshake costs at most this before
        // the name is resolved again.
        let step = left.clamp(Duration::from_millis(1), TRY_TIMEOUT);
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, step) {
                Ok(mut stream) => {
                    let _ = stream.set_nodelay(true);
                    match auth.connect(&mut stream, Channel::Store, u32::MAX, step) {
                        Ok(()) => return Ok(stream),
                        Err(source) => last = ConnectError::Handshake { addr, source },
                    }
                }
                Err(source) => last = ConnectError::Connect { addr, source },
            }
        }
        Err(last)
    }

    /// How long a request may wait for the store beyond its own wait (default 60 s): a
    /// heartbeat's connection gives up sooner.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Every key this client reads or writes from now on is `prefix` + key.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The address this rank reaches rank 0 from: the one other ranks can reach it at.
    pub fn local_ip(&self) -> Result<IpAddr> {
        let addr = self
            .stream
            .local_addr()
            .map_err(self.fail("local address"))?;
        Ok(addr.ip())
    }

    /// The address this rank reached rank 0 at.
    pub fn peer_ip(&self) -> Result<IpAddr> {
        let addr = self.stream.peer_addr().map_err(self.fail("peer address"))?;
        Ok(addr.ip())
    }

    /// `StoreError::Io` of this connection, for `map_err`.
    fn fail(&self, what: &'static str) -> impl Fn(std::io::Error) -> StoreError + use<> {
        let server = self.server.clone();
        move |source| StoreError::Io {
            server: server.clone(),
            what,
            source,
        }
    }

    fn request(&mut self, payload: &[u8], wait: Duration) -> Result<Vec<u8>> {
        let fail = |what: &'static str, source: std::io::Error| StoreError::Io {
            server: self.server.clone(),
            what,
            source,
        };
        self.stream
            .set_read_timeout(Some(self.timeout + wait))
            .map_err(|e| fail("setting timeout", e))?;
        self.stream
            .set_write_timeout(Some(self.timeout))
            .map_err(|e| fail("setting timeout", e))?;
        write_frame(&mut self.stream, payload).map_err(|e| fail("sending", e))?;
        match read_frame(&mut self.stream) {
            Ok(Some(r)) if r.first() == Some(&REFUSED) => Err(StoreError::Refused {
                server: self.server.clone(),
                limit: String::from_utf8_lossy(&r[1..]).into_owned(),
            }),
            Ok(Some(r)) if !r.is_empty() => Ok(r),
            Ok(_) => Err(fail(
                "reading",
                std::io::Error::new(ErrorKind::UnexpectedEof, "connection closed"),
            )),
            Err(e) => Err(fail("reading", e)),
        }
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let key = self.key(key);
        let value = value.to_vec();
        self.request(&Request::Set { key, value }.encode(), Duration::ZERO)?;
        Ok(())
    }

    /// This connection's last word: when it ends (this process exits or is killed), the store
    /// sets `key` to `value` unless it is set by then. Replaces an earlier will of this
    /// connection; [`Self::revoke_will`] takes it back.
    pub fn will(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let key = self.key(key);
        let value = value.to_vec();
        self.request(&Request::Will { key, value }.encode(), Duration::ZERO)?;
        Ok(())
    }

    /// Takes this connection's will back.
    pub fn revoke_will(&mut self) -> Result<()> {
        let (key, value) = (String::new(), Vec::new());
        self.request(&Request::Will { key, value }.encode(), Duration::ZERO)?;
        Ok(())
    }

    /// Waits up to `wait` for `key` to be set.
    pub fn get(&mut self, key: &str, wait: Duration) -> Result<Vec<u8>> {
        self.try_get(key, wait)?
            .ok_or_else(|| StoreError::NotPublished {
                key: self.key(key),
                seconds: wait.as_secs_f64(),
            })
    }

    /// Waits up to `wait` for `key` to be set: None when it was not by then.
    pub fn try_get(&mut self, key: &str, wait: Duration) -> Result<Option<Vec<u8>>> {
        let key = self.key(key);
        let r = self.request(&Request::Get { key, wait }.encode(), wait)?;
        Ok((r[0] == OK).then(|| r[1..].to_vec()))
    }

    /// Adds `delta` to the counter `key`; returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let key = self.key(key);
        let r = self.request(&Request::Add { key, delta }.encode(), Duration::ZERO)?;
        if r.len() != 9 || r[0] != OK {
            return Err(StoreError::MalformedReply {
                server: self.server.clone(),
                what: "ADD",
            });
        }
        Ok(i64::from_le_bytes(r[1..].try_into().expect("8 bytes")))
    }

    /// Returns once `world` clients have entered the barrier `name`, or fails after `wait`.
    pub fn barrier(&mut self, name: &str, world: usize, wait: Duration) -> Result<()> {
        let arrived = self.add(&keys::barrier_count(name), 1)?;
        if arrived as usize == world {
            self.set(&keys::barrier_done(name), b"1")?;
        }
        match self.get(&keys::barrier_done(name), wait) {
            Ok(_) => Ok(()),
            Err(StoreError::NotPublished { .. }) => Err(StoreError::Barrier {
                name: name.to_string(),
                world,
                seconds: wait.as_secs_f64(),
            }),
            Err(e) => Err(e),
        }
    }
}
