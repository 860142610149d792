//! The handshake every rendezvous and ring connection starts with.
//!
//! Both sides prove they know the job's token and attempt without sending it:
//!
//! ```text
//! acceptor  -> connector: MAGIC (8) | channel (1) | acceptor nonce (32)
//! connector -> acceptor : connector nonce (32) | hello (4, u32 LE) | HMAC(token, "c" ...) (32)
//! acceptor  -> connector: HMAC(token, "s" ...) (32)
//! ```
//!
//! Each HMAC-SHA256 covers the channel, both nonces, the attempt and the hello (the
//! connector's rank on the ring), so a reply cannot be replayed on another connection, another
//! channel or another attempt. The acceptor drops a connection whose MAC does not verify
//! (checked in constant time) without answering; every read is bounded by a timeout, so a
//! silent or half-open connection costs one thread for at most that long.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const MAGIC: &[u8; 8] = b"FTRDZV1\0";
const NONCE: usize = 32;
const MAC: usize = 32;
/// Bytes the connector sends: its nonce, hello and MAC.
const CONNECTOR_MESSAGE: usize = NONCE + 4 + MAC;

/// Which service a connection is for; part of the MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Channel {
    Store = 1,
    Ring = 2,
}

/// The shared secret and the attempt a connection must prove it belongs to.
#[derive(Clone)]
pub struct Auth {
    token: Vec<u8>,
    attempt: u64,
    /// The in-place round (0 outside rounds): ring connections of another round fail.
    round: u64,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("token", &"<redacted>")
            .field("attempt", &self.attempt)
            .field("round", &self.round)
            .finish()
    }
}

/// The rendezvous token: FERROTRAIN_RDZV_TOKEN, else the content of the file
/// FERROTRAIN_RDZV_TOKEN_FILE names (trimmed; the operator mounts the job's Secret there);
/// None when neither is set. `var` reads the environment (tests pass their own).
pub fn token_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<String>, TokenError> {
    use ferrotrain_api::env;
    if let Some(t) = var(env::FERROTRAIN_RDZV_TOKEN).filter(|t| !t.is_empty()) {
        return Ok(Some(t));
    }
    let Some(path) = var(env::FERROTRAIN_RDZV_TOKEN_FILE).filter(|p| !p.trim().is_empty()) else {
        return Ok(None);
    };
    let path = std::path::PathBuf::from(path.trim());
    let token = std::fs::read_to_string(&path).map_err(|source| TokenError { path, source })?;
    let token = token.trim().to_string();
    Ok((!token.is_empty()).then_some(token))
}

/// FERROTRAIN_RDZV_TOKEN_FILE could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{}={}: cannot read the rendezvous token: {source}", ferrotrain_api::env::FERROTRAIN_RDZV_TOKEN_FILE, path.display())]
pub struct TokenError {
    pub path: std::path::PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("I/O during handshake: {0}")]
    Io(#[from] std::io::Error),
    #[error("the peer is not a ferrotrain rendezvous endpoint (bad magic bytes)")]
    BadMagic,
    #[error("the peer expects another channel")]
    WrongChannel,
    #[error(
        "the peer failed to authenticate: FERROTRAIN_RDZV_TOKEN, FERROTRAIN_ATTEMPT or FERROTRAIN_ROUND differ"
    )]
    BadMac,
}

impl Auth {
    pub fn new(token: &str, attempt: u64) -> Self {
        Auth {
            token: token.as_bytes().to_vec(),
            attempt,
            round: 0,
        }
    }

    /// The same token and attempt, proving the in-place round `round` too (the ring's
    /// connections; the store, shared by every round, uses the attempt alone).
    pub fn for_round(&self, round: u64) -> Self {
        Auth {
            round,
            ..self.clone()
        }
    }

    fn mac(&self, side: &[u8], channel: Channel, nonces: (&[u8], &[u8]), hello: u32) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.token).expect("HMAC accepts keys of any length");
        mac.update(b"ferrotrain-rdzv/");
        mac.update(side);
        mac.update(&[channel as u8]);
        mac.update(nonces.0);
        mac.update(nonces.1);
        mac.update(&self.attempt.to_le_bytes());
        mac.update(&self.round.to_le_bytes());
        mac.update(&hello.to_le_bytes());
        mac
    }

    /// Acceptor side. Returns the connector's hello once it has proven it knows the token
    /// and attempt. The stream's read and write timeouts are set to `timeout` (callers set
    /// their own afterwards).
    pub fn accept(
        &self,
        stream: &mut TcpStream,
        channel: Channel,
        timeout: Duration,
    ) -> Result<u32, HandshakeError> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut nonce_s = [0u8; NONCE];
        rand::rng().fill_bytes(&mut nonce_s);
        let mut hello_msg = [0u8; 8 + 1 + NONCE];
        hello_msg[..8].copy_from_slice(MAGIC);
        hello_msg[8] = channel as u8;
        hello_msg[9..].copy_from_slice(&nonce_s);
        stream.write_all(&hello_msg)?;

        let mut answer = [0u8; CONNECTOR_MESSAGE];
        stream.read_exact(&mut answer)?;
        let nonce_c = &answer[..NONCE];
        let hello = u32::from_le_bytes(answer[NONCE..NONCE + 4].try_into().expect("4 bytes"));
        let their_mac = &answer[NONCE + 4..];
        self.mac(b"c", channel, (&nonce_s, nonce_c), hello)
            .verify_slice(their_mac)
            .map_err(|_| HandshakeError::BadMac)?;

        let ours = self
            .mac(b"s", channel, (&nonce_s, nonce_c), hello)
            .finalize()
            .into_bytes();
        stream.write_all(&ours)?;
        Ok(hello)
    }

    /// Connector side: answers the acceptor's challenge with `hello` and checks that the
    /// acceptor knows the token too.
    pub fn connect(
        &self,
        stream: &mut TcpStream,
        channel: Channel,
        hello: u32,
        timeout: Duration,
    ) -> Result<(), HandshakeError> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut challenge = [0u8; 8 + 1 + NONCE];
        stream.read_exact(&mut challenge)?;
        if &challenge[..8] != MAGIC {
            return Err(HandshakeError::BadMagic);
        }
        if challenge[8] != channel as u8 {
            return Err(HandshakeError::WrongChannel);
        }
        let nonce_s = &challenge[9..];
        let mut nonce_c = [0u8; NONCE];
        rand::rng().fill_bytes(&mut nonce_c);
        let mac = self
            .mac(b"c", channel, (nonce_s, &nonce_c), hello)
            .finalize()
            .into_bytes();
        let mut answer = [0u8; CONNECTOR_MESSAGE];
        answer[..NONCE].copy_from_slice(&nonce_c);
        answer[NONCE..NONCE + 4].copy_from_slice(&hello.to_le_bytes());
        answer[NONCE + 4..].copy_from_slice(&mac);
        stream.write_all(&answer)?;

        let mut theirs = [0u8; MAC];
        match stream.read_exact(&mut theirs) {
            Ok(()) => {}
            // The acceptor closes without answering when our MAC is wrong.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(HandshakeError::BadMac);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(HandshakeError::BadMac);
            }
            Err(e) => return Err(e.into()),
        }
        self.mac(b"s", channel, (nonce_s, &nonce_c), hello)
            .verify_slice(&theirs)
            .map_err(|_| HandshakeError::BadMac)?;
        Ok(())
    }
}

/// A fresh random token (hex), for single-node runs started without FERROTRAIN_RDZV_TOKEN.
pub fn random_token() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(
        server: Auth,
        client: Auth,
        server_channel: Channel,
        client_channel: Channel,
    ) -> (Result<u32, HandshakeError>, Result<(), HandshakeError>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let r = server.accept(&mut s, server_channel, Duration::from_secs(5));
            drop(s);
            r
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let rc = client.connect(&mut c, client_channel, 7, Duration::from_secs(5));
        (t.join().unwrap(), rc)
    }

    #[test]
    fn same_token_and_attempt_agree() {
        let (s, c) = pair(
            Auth::new("t", 3),
            Auth::new("t", 3),
            Channel::Ring,
            Channel::Ring,
        );
        assert_eq!(s.unwrap(), 7);
        c.unwrap();
    }

    #[test]
    fn wrong_token_or_attempt_is_rejected_on_both_sides() {
        for client in [Auth::new("x", 3), Auth::new("t", 4)] {
            let (s, c) = pair(Auth::new("t", 3), client, Channel::Store, Channel::Store);
            assert!(matches!(s, Err(HandshakeError::BadMac)), "{s:?}");
            assert!(matches!(c, Err(HandshakeError::BadMac)), "{c:?}");
        }
    }

    #[test]
    fn the_token_comes_from_the_variable_else_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let path = file.to_str().unwrap().to_string();
        let lookup = |pairs: Vec<(&'static str, String)>| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let both = lookup(vec![
            ("FERROTRAIN_RDZV_TOKEN", "from-env".into()),
            ("FERROTRAIN_RDZV_TOKEN_FILE", path.clone()),
        ]);
        assert_eq!(token_from(both).unwrap().as_deref(), Some("from-env"));
        let file_only = lookup(vec![("FERROTRAIN_RDZV_TOKEN_FILE", path)]);
        assert_eq!(token_from(file_only).unwrap().as_deref(), Some("from-file"));
        assert_eq!(token_from(lookup(vec![])).unwrap(), None);
        let missing = lookup(vec![(
            "FERROTRAIN_RDZV_TOKEN_FILE",
            "/nonexistent/token".into(),
        )]);
        let e = token_from(missing).unwrap_err().to_string();
        assert!(
            e.contains("FERROTRAIN_RDZV_TOKEN_FILE=/nonexistent/token"),
            "{e}"
        );
    }

    #[test]
    fn wrong_channel_is_rejected() {
        let (s, c) = pair(
            Auth::new("t", 0),
            Auth::new("t", 0),
            Channel::Store,
            Channel::Ring,
        );
        assert!(s.is_err());
        assert!(matches!(c, Err(HandshakeError::WrongChannel)), "{c:?}");
    }

    #[test]
    fn debug_hides_the_token() {
        assert!(!format!("{:?}", Auth::new("secret-token", 1)).contains("secret"));
    }

    #[test]
    fn random_tokens_differ() {
        assert_ne!(random_token(), random_token());
        assert_eq!(random_token().len(), 32);
    }
}
