//! Issue 44, on the wire and live: a two-rank gang (`ferrotrain launch` on this machine)
//! trains while the test opens hundreds of hostile connections to its rendezvous store and
//! its ring ports: random bytes, a well-sized but wrong proof, oversized frame lengths, slow
//! drips, half-open connections that say nothing, and clients that know the token but send
//! malformed frames. Training must go on, rank 0's memory stay bounded, and every refusal
//! be counted by reason in rank 0's report.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ProcessGroup, copy_config, free_port, progress, rank_pid, wait_until, write};
use ferrotrain_launch::auth::{Auth, Channel};
use ferrotrain_launch::keys;
use ferrotrain_launch::store::StoreClient;

const TOKEN: &str = "issue-44-live-token";
/// Hostile connections to the store; the issue asks for 1,000 against a pod on a cluster.
const STORE_CONNECTIONS: u64 = 1000;
/// Of them, held open without a word until the end (the store's handshake timeout ends them).
const HALF_OPEN: u64 = 100;
/// Of them, sending one byte every 200 ms for two seconds.
const SLOW_DRIP: u64 = 50;
/// Hostile connections to each rank's ring port.
const RING_CONNECTIONS: u64 = 50;

fn step(port: u16) -> u64 {
    progress(port).and_then(|p| p["step"].as_u64()).unwrap_or(0)
}

fn refusals(port: u16) -> BTreeMap<String, u64> {
    progress(port)
        .and_then(|p| serde_json::from_value(p["rejectedConnections"].clone()).ok())
        .unwrap_or_default()
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Pseudo-random bytes from `seed` (no two connections send the same).
fn junk(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One hostile connection of kind `i % 6` to the store at `addr`.
fn attack(addr: SocketAddr, i: u64) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(15)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let auth = Auth::new(TOKEN, 0);
    let payload = match i % 6 {
        // Random bytes, of any length.
        0 => junk(i, 1 + (i as usize * 37) % 900),
        // The right size for the handshake's answer, the wrong proof.
        1 => junk(i, 68),
        // A frame length of 4 GiB where the handshake's answer belongs.
        2 => [u32::MAX.to_le_bytes().to_vec(), junk(i, 64)].concat(),
        // Knows the token; then valid framing around an unknown operation.
        3 => {
            if auth
                .connect(&mut s, Channel::Store, 0, Duration::from_secs(10))
                .is_err()
            {
                return;
            }
            [5u32.to_le_bytes().to_vec(), vec![9, 1, 2, 3, 4]].concat()
        }
        // Knows the token; then a frame that declares 4 GiB.
        4 => {
            if auth
                .connect(&mut s, Channel::Store, 0, Duration::from_secs(10))
                .is_err()
            {
                return;
            }
            [u32::MAX.to_le_bytes().to_vec(), junk(i, 64)].concat()
        }
        // Knows the token; then a SET whose key length runs past its frame.
        _ => {
            if auth
                .connect(&mut s, Channel::Store, 0, Duration::from_secs(10))
                .is_err()
            {
                return;
            }
            let body = [vec![1u8], 1000u32.to_le_bytes().to_vec(), b"key".to_vec()].concat();
            [(body.len() as u32).to_le_bytes().to_vec(), body].concat()
        }
    };
    let _ = s.write_all(&payload);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.read_to_end(&mut Vec::new());
}

/// Sends one byte every 200 ms for two seconds, then hangs up.
fn drip(addr: SocketAddr, i: u64) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return;
    };
    for b in junk(i, 10) {
        if s.write_all(&[b]).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Connections to a ring port: (refused by the kernel, accepted).
fn ring_attack(addr: SocketAddr, n: u64) -> (u64, u64) {
    let (mut closed, mut open) = (0, 0);
    for i in 0..n {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(mut s) => {
                open += 1;
                let _ = s.write_all(&junk(i, 68));
            }
            Err(_) => closed += 1,
        }
    }
    (closed, open)
}

/// Samples `pid`'s resident memory every 100 ms until `stop`; the peak.
fn watch_rss(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(Ordering::SeqCst) {
            peak = peak.max(rss_bytes(pid));
            std::thread::sleep(Duration::from_millis(100));
        }
        peak
    })
}

fn ring_addresses(master: u16) -> Vec<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client = StoreClient::connect("127.0.0.1", master, &Auth::new(TOKEN, 0), deadline)
        .expect("the store, with the token");
    (0..2)
        .map(|r| {
            // The launcher hosts the store; its ranks' keys live under their round's prefix.
            let key = format!("{}{}", keys::round_prefix(0), keys::ring(r));
            let v = client.get(&key, Duration::from_secs(10)).unwrap();
            String::from_utf8(v).unwrap().parse().unwrap()
        })
        .collect()
}

fn start_gang(dir: &Path, master: u16, metrics: u16) -> ProcessGroup {
    let config = write(
        dir,
        "job.yaml",
        &copy_config(
            1_000_000,
            0,
            "distributed: {rendezvousTimeoutSeconds: 60}\n",
        ),
    );
    let log = dir.join("launch.log");
    let mut cmd = common::ferrotrain();
    cmd.arg("launch")
        .arg("--config")
        .arg(&config)
        .args(["--nproc-per-node", "2", "--max-restarts", "0"])
        .args(["--master-port", &master.to_string()])
        .env("FERROTRAIN_CHECKPOINT_DIR", dir.join("ckpt"))
        .env("OMP_NUM_THREADS", "1")
        .env("FERROTRAIN_RDZV_TOKEN", TOKEN)
        .env("FERROTRAIN_METRICS_PORT", metrics.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    ProcessGroup::spawn(cmd, Some(log))
}

#[test]
fn a_training_gang_refuses_and_counts_a_thousand_hostile_connections() {
    let tmp = tempfile::tempdir().unwrap();
    let (master, metrics) = (free_port(), free_port());
    let gang = start_gang(tmp.path(), master, metrics);
    assert!(
        wait_until(Duration::from_secs(120), || step(metrics) >= 20),
        "the gang did not train:\n{}",
        gang.log()
    );
    let pid = rank_pid(gang.pid(), 0).expect("rank 0's process") as u32;
    let rss_before = rss_bytes(pid);
    let step_before = step(metrics);
    let refused_before: u64 = refusals(metrics).values().sum();
    let rings = ring_addresses(master);
    let store: SocketAddr = ([127, 0, 0, 1], master).into();

    let stop = Arc::new(AtomicBool::new(false));
    let peak = watch_rss(pid, stop.clone());
    let started = Instant::now();
    let half_open: Vec<TcpStream> = (0..HALF_OPEN)
        .filter_map(|_| TcpStream::connect(store).ok())
        .collect();
    let drips: Vec<_> = (0..SLOW_DRIP)
        .map(|i| std::thread::spawn(move || drip(store, i)))
        .collect();
    let next = Arc::new(AtomicU64::new(0));
    let fast = STORE_CONNECTIONS - HALF_OPEN - SLOW_DRIP;
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let next = next.clone();
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= fast {
                        break;
                    }
                    attack(store, i);
                }
            })
        })
        .collect();
    let ring_results = Arc::new(Mutex::new(Vec::new()));
    for addr in &rings {
        ring_results
            .lock()
            .unwrap()
            .push((*addr, ring_attack(*addr, RING_CONNECTIONS)));
    }
    for t in workers.into_iter().chain(drips) {
        t.join().unwrap();
    }
    drop(half_open);
    let expected = refused_before + STORE_CONNECTIONS;
    let counted = wait_until(Duration::from_secs(30), || {
        refusals(metrics).values().sum::<u64>() >= expected
    });
    let flood_seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let rss_peak = peak.join().unwrap();
    let by_reason = refusals(metrics);
    let step_after = step(metrics);
    println!(
        "{STORE_CONNECTIONS} hostile store connections in {flood_seconds:.1} s: refusals {by_reason:?}; \
         ring ports {:?} (refused by the kernel, accepted); rank 0 RSS {} MiB before, peak {} MiB \
         during; steps {step_before} -> {step_after}",
        ring_results.lock().unwrap(),
        rss_before >> 20,
        rss_peak >> 20
    );
    assert!(
        counted,
        "refusals {by_reason:?}, expected {expected} in all"
    );
    assert_eq!(by_reason.values().sum::<u64>(), expected, "{by_reason:?}");
    assert!(
        step_after > step_before + 10,
        "{step_before} -> {step_after}"
    );
    assert!(
        rss_peak < rss_before + (256 << 20),
        "{rss_before} -> {rss_peak}"
    );
    assert!(
        gang.log().matches("refused a connection").count() <= 4 + (flood_seconds / 10.0) as usize,
        "the log is rate limited"
    );
    assert!(
        wait_until(Duration::from_secs(30), || step(metrics) > step_after),
        "still training after the flood:\n{}",
        gang.log()
    );
}
