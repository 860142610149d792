//! Generated input against the rendezvous store's wire format (issue 44): property tests of
//! the frame codec, and three fuzz targets (`bench/fuzz.sh` runs them for longer):
//!
//! - `store_frames`: bytes read as a stream of frames and parsed, as the server does;
//! - `store_connection`: bytes sent to a live store by a client that passed the handshake;
//! - `handshake`: bytes sent to a live store by a client that does not know the token.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferrotrain_fuzz::{CountingAlloc, Verdict, largest_allocation_since, reset_largest_allocation};
use ferrotrain_launch::auth::{Auth, Channel};
use ferrotrain_launch::store::{
    MAX_FRAME, Request, StoreClient, StoreServer, read_frame, write_frame,
};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Seconds per target in the test suite (`FERROTRAIN_FUZZ_SECONDS` overrides).
const SHORT_RUN: f64 = 3.0;

/// The most a frame may make the reader allocate at once: twice what arrived (a vector
/// grows by doubling) plus the first read's buffer.
fn allocation_limit(received: usize) -> usize {
    2 * received + (64 << 10) + 4096
}

fn request() -> impl Strategy<Value = Request> {
    let key = "\\PC{0,40}";
    let value = proptest::collection::vec(any::<u8>(), 0..300);
    prop_oneof![
        (key, value.clone()).prop_map(|(key, value)| Request::Set { key, value }),
        (key, value).prop_map(|(key, value)| Request::Will { key, value }),
        (key, any::<u64>()).prop_map(|(key, ms)| Request::Get {
            key,
            wait: Duration::from_millis(ms)
        }),
        (key, any::<i64>()).prop_map(|(key, delta)| Request::Add { key, delta }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_request_round_trips_through_a_frame(r in request()) {
        let mut wire = Vec::new();
        write_frame(&mut wire, &r.encode()).unwrap();
        let frame = read_frame(&mut wire.as_slice()).unwrap().unwrap();
        prop_assert_eq!(Request::parse(&frame), Some(r));
    }

    #[test]
    fn a_parsed_frame_encodes_back_to_its_bytes(frame in proptest::collection::vec(any::<u8>(), 0..64)) {
        // No two frames mean the same request, and nothing is dropped silently.
        if let Some(r) = Request::parse(&frame) {
            prop_assert_eq!(r.encode(), frame);
        }
    }

    #[test]
    fn a_declared_length_is_never_reserved_before_it_arrives(
        declared in prop_oneof![any::<u32>(), 0..=MAX_FRAME as u32],
        sent in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut wire = declared.to_le_bytes().to_vec();
        wire.extend_from_slice(&sent);
        reset_largest_allocation();
        let read = read_frame(&mut wire.as_slice());
        prop_assert!(largest_allocation_since() <= allocation_limit(wire.len()));
        match read {
            Ok(Some(frame)) => {
                prop_assert_eq!(frame.len(), declared as usize);
                prop_assert_eq!(&frame[..], &sent[..declared as usize]);
            }
            Ok(None) => prop_assert!(false, "a clean end with 4 length bytes read"),
            Err(_) => prop_assert!(declared as usize > sent.len().min(MAX_FRAME)),
        }
    }
}

/// The `store_frames` target: the server's reading and parsing of whatever a peer sends.
fn frames(input: &[u8]) -> Verdict {
    let mut stream = input;
    let mut label = String::new();
    reset_largest_allocation();
    loop {
        match read_frame(&mut stream) {
            Ok(Some(frame)) => match Request::parse(&frame) {
                Some(r) if r.encode() != frame => {
                    return Err(format!("{r:?} re-encodes to other bytes"));
                }
                Some(r) => label.push_str(&format!("{:.3} ", format!("{r:?}"))),
                None => {
                    label.push_str("malformed");
                    break;
                }
            },
            Ok(None) => break,
            Err(e) => {
                label.push_str(&format!("{:?}", e.kind()));
                break;
            }
        }
    }
    let largest = largest_allocation_since();
    if largest > allocation_limit(input.len()) {
        return Err(format!(
            "allocated {largest} bytes at once for {} bytes of input",
            input.len()
        ));
    }
    Ok(label)
}

#[test]
fn fuzz_store_frames() {
    let report = ferrotrain_fuzz::check("store_frames", SHORT_RUN, frames);
    assert!(report.executions >= 1000, "{report}");
}

/// A store on an ephemeral port with the token "t", attempt 1.
fn store() -> StoreServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    StoreServer::start(listener, Auth::new("t", 1), Duration::from_secs(2)).unwrap()
}

/// Sends `bytes`, closes the sending side and reads what comes back until the peer closes.
fn send_and_hang_up(mut stream: TcpStream, bytes: &[u8]) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(Shutdown::Write);
    let mut back = Vec::new();
    let _ = stream.read_to_end(&mut back);
    back
}

/// Whether the store still answers a client that knows the token.
fn still_serves(addr: SocketAddr, n: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut client = StoreClient::connect("127.0.0.1", addr.port(), &Auth::new("t", 1), deadline)
        .map_err(|e| format!("the store no longer accepts its own clients: {e}"))?;
    let key = format!("probe/{n}");
    client
        .set(&key, b"alive")
        .and_then(|()| client.get(&key, Duration::from_secs(5)))
        .map_err(|e| format!("the store no longer answers: {e}"))
        .and_then(|v| (v == b"alive").then_some(()).ok_or("a wrong answer".into()))
}

#[test]
fn fuzz_store_connection() {
    let server = store();
    let addr = server.local_addr();
    let auth = Auth::new("t", 1);
    let count = std::cell::Cell::new(0u64);
    let report = ferrotrain_fuzz::check("store_connection", SHORT_RUN, |input| {
        let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
        auth.connect(&mut stream, Channel::Store, 0, Duration::from_secs(5))
            .map_err(|e| format!("the store refused its own client: {e}"))?;
        let back = send_and_hang_up(stream, input);
        let n = count.get() + 1;
        count.set(n);
        // Every 200 connections: blocked GETs and broken frames must not have used it up.
        if n.is_multiple_of(200) {
            still_serves(addr, n)?;
        }
        Ok(format!("{} reply bytes", back.len().min(16)))
    });
    still_serves(addr, u64::MAX).unwrap();
    assert!(report.executions >= 100, "{report}");
}

#[test]
fn fuzz_handshake() {
    let server = store();
    let addr = server.local_addr();
    let report = ferrotrain_fuzz::check("handshake", SHORT_RUN, |input| {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
        let back = send_and_hang_up(stream, input);
        if server.stats.authenticated.load(Ordering::Relaxed) > 0 {
            return Err("a connection without the token was authenticated".into());
        }
        // The challenge (41 bytes) and nothing else: no answer to a wrong proof.
        if back.len() != 41 {
            return Err(format!("{} bytes came back", back.len()));
        }
        Ok(format!("{} bytes sent", input.len().min(69)))
    });
    let rejected = server.stats.rejected.load(Ordering::Relaxed) as u64;
    assert_eq!(rejected, report.executions, "every one refused and counted");
}

/// A GET on a key nobody sets, from a client that hangs up at once: the store must not keep a
/// thread and a connection slot for the GET's hour (300 of them were more than its 256 slots).
#[test]
fn gets_of_clients_that_left_do_not_use_up_the_store() {
    let server = store();
    let addr = server.local_addr();
    let auth = Auth::new("t", 1);
    let get = Request::Get {
        key: "never/set".into(),
        wait: Duration::from_secs(3600),
    };
    for _ in 0..300 {
        let mut stream = TcpStream::connect(addr).unwrap();
        auth.connect(&mut stream, Channel::Store, 0, Duration::from_secs(5))
            .unwrap();
        write_frame(&mut stream, &get.encode()).unwrap();
    }
    std::thread::sleep(Duration::from_secs(1));
    still_serves(addr, 0).unwrap();
    assert_eq!(server.stats.rejected.load(Ordering::Relaxed), 0);
}
