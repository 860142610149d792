//! Hostile bytes on the rendezvous port: a wrong token, a wrong attempt, random bytes, a
//! half-open connection and oversized or malformed frames are each dropped, and the store
//! still serves (trainer/tests/dist_store.rs: real ranks complete a rendezvous meanwhile).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferrotrain_launch::auth::{Auth, Channel, HandshakeError};
use ferrotrain_launch::store::{MAX_FRAME, StoreClient, StoreServer};

const TOKEN: &str = "the-real-token";

fn server(handshake_timeout: Duration) -> StoreServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    StoreServer::start(listener, Auth::new(TOKEN, 4), handshake_timeout).unwrap()
}

fn connect(srv: &StoreServer) -> TcpStream {
    let s = TcpStream::connect(srv.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads until the server closes the connection; fails if it stays open past `within`.
fn assert_closed_by_server(mut s: TcpStream, within: Duration) {
    s.set_read_timeout(Some(within)).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("connection still open after {:?}: {e}", start.elapsed()),
        }
    }
}

#[test]
fn wrong_token_and_wrong_attempt_are_rejected() {
    let srv = server(Duration::from_secs(2));
    for auth in [
        Auth::new("guess", 4),
        Auth::new(TOKEN, 3),
        Auth::new(TOKEN, 5),
    ] {
        let mut s = connect(&srv);
        let r = auth.connect(&mut s, Channel::Store, u32::MAX, Duration::from_secs(5));
        assert!(matches!(r, Err(HandshakeError::BadMac)), "{r:?}");
    }
    // And the client side refuses to talk to a store with another token or attempt: it
    // retries until the rendezvous deadline, then names the cause.
    let deadline = Instant::now() + Duration::from_millis(700);
    let err = StoreClient::connect(
        "127.0.0.1",
        srv.local_addr().port(),
        &Auth::new("x", 4),
        deadline,
    )
    .err()
    .expect("wrong token must not connect");
    assert!(err.to_string().contains("FERROTRAIN_RDZV_TOKEN"), "{err}");
    assert!(srv.stats.rejected.load(Ordering::SeqCst) >= 4);
    assert_eq!(srv.stats.authenticated.load(Ordering::SeqCst), 0);
}

#[test]
fn random_bytes_are_dropped() {
    let srv = server(Duration::from_secs(2));
    // Garbage sent without reading the challenge, garbage after it, and a tiny burst.
    let mut garbage = vec![0u8; 100_000];
    for (i, b) in garbage.iter_mut().enumerate() {
        *b = ((i * 2_654_435_761usize) >> 7) as u8;
    }
    let mut a = connect(&srv);
    let _ = a.write_all(&garbage);
    assert_closed_by_server(a, Duration::from_secs(3));

    let mut b = connect(&srv);
    let mut challenge = [0u8; 41];
    b.read_exact(&mut challenge).unwrap();
    b.write_all(&garbage[..68]).unwrap();
    assert_closed_by_server(b, Duration::from_secs(3));

    let mut c = connect(&srv);
    c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    // Too short for a handshake answer: the handshake timeout closes it.
    assert_closed_by_server(c, Duration::from_secs(4));
    assert_eq!(srv.stats.authenticated.load(Ordering::SeqCst), 0);
}

#[test]
fn a_half_open_connection_is_closed_after_the_handshake_timeout() {
    let srv = server(Duration::from_millis(500));
    let s = connect(&srv);
    let start = Instant::now();
    assert_closed_by_server(s, Duration::from_secs(3));
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn oversized_and_malformed_frames_drop_only_that_connection() {
    let srv = server(Duration::from_secs(2));
    let auth = Auth::new(TOKEN, 4);
    for frame in [
        (u32::MAX).to_le_bytes().to_vec(),
        ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec(),
        // A well-sized frame with an unknown operation.
        vec![3, 0, 0, 0, 0xee, 1, 2],
        // A SET whose key length points past the frame.
        vec![6, 0, 0, 0, 1, 0xff, 0xff, 0, 0, 0],
    ] {
        let mut s = connect(&srv);
        auth.connect(&mut s, Channel::Store, u32::MAX, Duration::from_secs(5))
            .unwrap();
        s.write_all(&frame).unwrap();
        assert_closed_by_server(s, Duration::from_secs(3));
    }
    assert!(srv.stats.dropped_frames.load(Ordering::SeqCst) >= 4);
    // The store still serves.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut c =
        StoreClient::connect("127.0.0.1", srv.local_addr().port(), &auth, deadline).unwrap();
    c.set("still", b"alive").unwrap();
    assert_eq!(c.get("still", Duration::from_secs(1)).unwrap(), b"alive");
}
