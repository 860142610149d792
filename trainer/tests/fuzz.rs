//! Generated input against what the trainer reads back from disk and from the network
//! (issue 44): a checkpoint's safetensors file (header, tensor table and data), a
//! tokenizer.json, and the requests rank 0's /progress and /metrics server parses. Three
//! fuzz targets, `checkpoint_header`, `tokenizer_json` and `progress_http` (`bench/fuzz.sh`
//! runs them longer), and a property test of the server. The trainer links jemalloc, so no
//! counting allocator can be installed here: allocation sizes are bounded by the parsers' own
//! checks (a header over 100 MB or larger than its file is refused before it is read), and
//! the server's by its resident size, which jemalloc (freed pages kept) holds at its peak.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ferrotrain_api::Progress;
use ferrotrain_fuzz::Verdict;
use ferrotrain_trainer::checkpoint::tensors_from_bytes;
use ferrotrain_trainer::data::Vocabulary;
use ferrotrain_trainer::metrics::{MetricsServer, serve_rank};
use proptest::prelude::*;

/// Seconds per target in the test suite (`FERROTRAIN_FUZZ_SECONDS` overrides).
const SHORT_RUN: f64 = 3.0;

/// The `checkpoint_header` target: a whole safetensors file as `CheckpointStore::load` reads
/// it. Whatever is accepted must describe exactly the bytes there are.
fn checkpoint(input: &[u8]) -> Verdict {
    match tensors_from_bytes(input) {
        Ok(tensors) => {
            let bytes: usize = tensors
                .iter()
                .map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes())
                .sum();
            let header = u64::from_le_bytes(input[..8].try_into().expect("8 bytes")) as usize;
            if 8 + header + bytes != input.len() {
                return Err(format!(
                    "accepted {bytes} tensor bytes in a file of {} with a {header}-byte header",
                    input.len()
                ));
            }
            Ok(format!("{} tensors", tensors.len().min(4)))
        }
        Err(e) => Ok(refusal(&e)),
    }
}

/// A refusal's kind: its message without the numbers and names that vary.
fn refusal(message: &str) -> String {
    message
        .split(|c: char| c.is_ascii_digit() || c == ':')
        .next()
        .unwrap_or_default()
        .chars()
        .take(40)
        .collect()
}

#[test]
fn fuzz_checkpoint_header() {
    let report = ferrotrain_fuzz::check("checkpoint_header", SHORT_RUN, checkpoint);
    assert!(report.corpus >= 2, "{report}");
}

/// The `tokenizer_json` target: a tokenizer.json as a run loads its vocabulary; one that is
/// accepted must encode and decode text without failing.
fn tokenizer(input: &[u8]) -> Verdict {
    match Vocabulary::from_json(input, "fuzz") {
        Ok(vocab) => {
            let ids = vocab.encode("hello world, a small test");
            let _ = vocab.decode(&ids);
            Ok("loaded".into())
        }
        Err(e) => Ok(refusal(&e.to_string())),
    }
}

#[test]
fn fuzz_tokenizer_json() {
    let report = ferrotrain_fuzz::check("tokenizer_json", SHORT_RUN, tokenizer);
    assert!(report.corpus >= 1, "{report}");
}

/// Rank 0's progress server on an ephemeral port, one for the whole test binary.
fn progress_server() -> SocketAddr {
    static SERVER: OnceLock<(MetricsServer, SocketAddr)> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let progress = Arc::new(Mutex::new(Progress {
                step: 1234,
                ..Progress::default()
            }));
            let server = serve_rank(0, progress).unwrap();
            let addr = SocketAddr::from(([127, 0, 0, 1], server.local_addr().port()));
            (server, addr)
        })
        .1
}

/// Sends `bytes`, closes the sending side unless `keep_open` (hyper may close a connection
/// that half-closes before it answers) and reads what comes back until the server closes
/// (at most 1 MiB, 10 s).
fn exchange(addr: SocketAddr, bytes: &[u8], keep_open: bool) -> Result<Vec<u8>, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let _ = stream.write_all(bytes);
    if !keep_open {
        let _ = stream.shutdown(Shutdown::Write);
    }
    let mut back = Vec::new();
    match stream.take(1 << 20).read_to_end(&mut back) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(format!(
            "no end to the answer in 10 s ({} bytes)",
            back.len()
        )),
        _ => Ok(back),
    }
}

/// The status of the first response in `reply`, or what else it was.
fn first_status(reply: &[u8]) -> String {
    let rest = reply.strip_prefix(b"HTTP/1.1 ");
    match rest.or_else(|| reply.strip_prefix(b"HTTP/1.0 ")) {
        Some(rest) => String::from_utf8_lossy(&rest[..rest.len().min(3)]).into_owned(),
        None if reply.is_empty() => "closed".into(),
        None => "not http".into(),
    }
}

/// The server still answers /healthz.
fn still_serves(addr: SocketAddr) -> Result<(), String> {
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let reply = exchange(addr, request, true)?;
    match reply.ends_with(b"\r\n\r\nok") && first_status(&reply) == "200" {
        true => Ok(()),
        false => Err(format!(
            "/healthz answered {:?}",
            String::from_utf8_lossy(&reply)
        )),
    }
}

fn resident_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: 0 kB");
    line[6..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
        / 1024
}

/// How much the server may grow the process's resident size over a whole run: hyper reads
/// a request head into at most about 400 KiB, per connection, one connection at a time here.
const HTTP_GROWTH_MIB: u64 = 64;

/// The `progress_http` target: a request's bytes to rank 0's live /progress, /metrics and
/// /healthz server, as anyone the NetworkPolicy lets reach the port may send them. Whatever
/// they are, the server answers or closes within 10 s and goes on serving.
#[test]
fn fuzz_progress_http() {
    let addr = progress_server();
    still_serves(addr).unwrap();
    let before = resident_mib();
    let count = std::cell::Cell::new(0u64);
    let report = ferrotrain_fuzz::check("progress_http", SHORT_RUN, |input| {
        let reply = exchange(addr, input, false)?;
        count.set(count.get() + 1);
        if count.get().is_multiple_of(200) {
            still_serves(addr)?;
        }
        Ok(first_status(&reply))
    });
    still_serves(addr).unwrap();
    let after = resident_mib();
    println!("progress_http: resident {before} MiB before, {after} MiB after");
    assert!(after < before + HTTP_GROWTH_MIB, "{before} -> {after} MiB");
    assert!(report.executions >= 100, "{report}");
}

/// A request line and headers of any bytes, a head of up to 4 MiB, or any bytes at all.
fn request_bytes() -> impl Strategy<Value = Vec<u8>> {
    let any_bytes = proptest::collection::vec(any::<u8>(), 0..2048);
    let path = prop_oneof![
        Just("/progress".to_string()),
        Just("/metrics".to_string()),
        Just("/healthz".to_string()),
        "/\\PC{0,30}",
    ];
    let headers = proptest::collection::vec(any::<u8>(), 0..1024);
    prop_oneof![
        any_bytes,
        (path, headers).prop_map(|(path, headers)| {
            let mut r = format!("GET {path} HTTP/1.1\r\nHost: x\r\n").into_bytes();
            r.extend(headers);
            r.extend(b"\r\n\r\n");
            r
        }),
        (1usize..4 << 20).prop_map(|n| {
            let mut r = b"GET /metrics HTTP/1.1\r\nX-Long: ".to_vec();
            r.resize(r.len() + n, b'a');
            r.extend(b"\r\n\r\n");
            r
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Whatever a request's bytes, the server answers HTTP or closes, within 10 s, and goes
    /// on serving; over all the cases it grows the process by less than HTTP_GROWTH_MIB
    /// (a head over hyper's buffer is refused, not read on).
    #[test]
    fn any_request_is_answered_or_closed_and_memory_stays_bounded(request in request_bytes()) {
        static BEFORE: OnceLock<u64> = OnceLock::new();
        let addr = progress_server();
        let before = *BEFORE.get_or_init(resident_mib);
        let reply = exchange(addr, &request, false).unwrap();
        let status = first_status(&reply);
        prop_assert!(status != "not http", "{:?}", String::from_utf8_lossy(&reply));
        prop_assert!(still_serves(addr).is_ok());
        let now = resident_mib();
        prop_assert!(now < before + HTTP_GROWTH_MIB, "{} -> {} MiB", before, now);
    }
}
