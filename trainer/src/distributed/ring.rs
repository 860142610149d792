//! The TCP ring: all-reduce (reduce-scatter + all-gather), broadcast and barrier on CPU
//! buffers. Knows nothing of tensors so it can be tested with plain slices.
//!
//! Rank r sends to rank r+1 ("next") and receives from rank r-1 ("prev") over one
//! authenticated TCP connection each way. A buffer of n elements is cut into `world` chunks;
//! at step t (0 <= t < 2(world-1)) rank r sends chunk (r-t) mod world and receives chunk
//! (r-t-1) mod world, adding it into its own during the first world-1 steps (reduce-scatter)
//! and overwriting it during the rest (all-gather). Each chunk is further cut into segments
//! and the segments pipelined: segment k of step t leaves as soon as segment k of step t-1 has
//! arrived, so the links stay busy while chunks are still in flight. Both sockets are
//! non-blocking and driven by one `poll` loop per call, which also enforces the timeout.
//!
//! Every collective starts with a 24-byte header (operation, size, sequence number) so that
//! ranks calling different collectives fail loudly instead of exchanging garbage.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use ferrotrain_launch::auth::{Auth, Channel};
use ferrotrain_launch::signals;

use super::ring_accept::accept_prev;
use crate::error::{CollectiveFault, Result, TrainError};

/// Default pipeline segment; big enough to amortize syscalls, small enough to pipeline.
pub const DEFAULT_SEGMENT_BYTES: usize = 512 << 10;
const HEADER: usize = 24;
const MAGIC: u32 = u32::from_le_bytes(*b"FTRG");
const OP_ALL_REDUCE: u32 = 1;
const OP_BROADCAST: u32 = 2;
const OP_BARRIER: u32 = 3;

/// One rank's two links of the ring.
pub struct Ring {
    rank: usize,
    world: usize,
    next: TcpStream,
    prev: TcpStream,
    next_addr: SocketAddr,
    prev_addr: SocketAddr,
    timeout: Duration,
    segment_bytes: usize,
    scratch: Vec<f32>,
    seq: u64,
    /// Set by the first failure: a ring that lost a peer stays failed.
    broken: Option<CollectiveFault>,
}

/// A contiguous piece of the caller's buffer, in bytes.
#[derive(Clone, Copy, Debug)]
struct Piece {
    start: usize,
    len: usize,
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Header,
    Data(Piece),
}

#[derive(Clone, Copy, Debug)]
struct SendUnit {
    what: Target,
    /// Receive units that must be complete first.
    after: usize,
}

#[derive(Clone, Copy, Debug)]
struct RecvUnit {
    what: Target,
    reduce: bool,
}

#[derive(Default)]
struct Plan {
    sends: Vec<SendUnit>,
    recvs: Vec<RecvUnit>,
}

impl Plan {
    fn new() -> Self {
        Plan {
            sends: vec![SendUnit {
                what: Target::Header,
                after: 0,
            }],
            recvs: vec![RecvUnit {
                what: Target::Header,
                reduce: false,
            }],
        }
    }
}

/// Element range of chunk `c` when `n` elements are cut into `world` near-equal chunks.
fn chunk(n: usize, world: usize, c: usize) -> (usize, usize) {
    (c * n / world, (c + 1) * n / world)
}

/// Cuts `[start, end)` (elements of `elem` bytes) into pieces of at most `segment` bytes.
fn segments(start: usize, end: usize, elem: usize, segment: usize) -> Vec<Piece> {
    let per = (segment / elem).max(1);
    let mut out = Vec::new();
    let mut s = start;
    while s < end {
        let e = (s + per).min(end);
        out.push(Piece {
            start: s * elem,
            len: (e - s) * elem,
        });
        s = e;
    }
    out
}

fn all_reduce_plan(rank: usize, world: usize, n: usize, segment: usize) -> Plan {
    let mut plan = Plan::new();
    let mut prev_first = 0;
    for t in 0..2 * (world - 1) {
        let send_chunk = (rank + 2 * world - t) % world;
        let recv_chunk = (rank + 2 * world - t - 1) % world;
        let (s0, s1) = chunk(n, world, send_chunk);
        for (k, piece) in segments(s0, s1, 4, segment).into_iter().enumerate() {
            // What we send at step t is what we received at step t-1 (same chunk).
            let after = if t == 0 { 0 } else { prev_first + k + 1 };
            plan.sends.push(SendUnit {
                what: Target::Data(piece),
                after,
            });
        }
        prev_first = plan.recvs.len();
        let (r0, r1) = chunk(n, world, recv_chunk);
        for piece in segments(r0, r1, 4, segment) {
            plan.recvs.push(RecvUnit {
                what: Target::Data(piece),
                reduce: t < world - 1,
            });
        }
    }
    plan
}

fn broadcast_plan(rank: usize, world: usize, bytes: usize, root: usize, segment: usize) -> Plan {
    let mut plan = Plan::new();
    let position = (rank + world - root) % world;
    let pieces = segments(0, bytes, 1, segment);
    if position != 0 {
        for &piece in &pieces {
            plan.recvs.push(RecvUnit {
                what: Target::Data(piece),
                reduce: false,
            });
        }
    }
    if position != world - 1 {
        for (k, &piece) in pieces.iter().enumerate() {
            let after = if position == 0 { 0 } else { k + 2 };
            plan.sends.push(SendUnit {
                what: Target::Data(piece),
                after,
            });
        }
    }
    plan
}

fn header(op: u32, len: usize, seq: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&op.to_le_bytes());
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    h[16..].copy_from_slice(&seq.to_le_bytes());
    h
}

fn describe(h: &[u8; HEADER]) -> String {
    let magic = u32::from_le_bytes(h[..4].try_into().expect("4"));
    if magic != MAGIC {
        return "garbage".to_string();
    }
    let op = u32::from_le_bytes(h[4..8].try_into().expect("4"));
    let len = u64::from_le_bytes(h[8..16].try_into().expect("8"));
    let seq = u64::from_le_bytes(h[16..].try_into().expect("8"));
    let name = match op & 0xff {
        OP_ALL_REDUCE => "all-reduce".to_string(),
        OP_BROADCAST => format!("broadcast from rank {}", op >> 8),
        OP_BARRIER => "barrier".to_string(),
        _ => format!("operation {op}"),
    };
    format!("{name} of {len} bytes as collective #{seq}")
}

fn op_name(op: u32) -> &'static str {
    match op & 0xff {
        OP_ALL_REDUCE => "all-reduce",
        OP_BROADCAST => "broadcast",
        _ => "barrier",
    }
}

/// The longest a collective waits without looking whether its round was abandoned.
const ABANDON_CHECK: Duration = Duration::from_millis(100);

/// Waits for `events` on up to two fds; returns their revents.
fn poll2(a: (i32, i16), b: (i32, i16), timeout: Duration) -> std::io::Result<(i16, i16)> {
    let mut fds = [
        libc::pollfd {
            fd: a.0,
            events: a.1,
            revents: 0,
        },
        libc::pollfd {
            fd: b.0,
            events: b.1,
            revents: 0,
        },
    ];
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: two valid pollfds for the duration of the call.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == ErrorKind::Interrupted {
            return Ok((0, 0));
        }
        return Err(e);
    }
    Ok((fds[0].revents, fds[1].revents))
}

fn set_buffer_sizes(stream: &TcpStream, bytes: i32) {
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with a valid fd and a pointer to an int of the stated size.
        unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&bytes as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            );
        }
    }
}

impl Ring {
    /// Connects this rank into the ring: accepts rank-1's connection on `listener` (already
    /// published to the others) while connecting to rank+1 at `next_addr`. Both links are
    /// authenticated; connections from anyone else are dropped. Fails at `deadline`.
    pub fn establish(
        rank: usize,
        world: usize,
        listener: TcpListener,
        next_addr: SocketAddr,
        auth: &Auth,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Ring> {
        assert!(world >= 2 && rank < world, "a ring needs 2+ ranks");
        let prev_rank = (rank + world - 1) % world;
        let next_rank = (rank + 1) % world;
        let acceptor = {
            let auth = auth.clone();
            std::thread::Builder::new()
                .name("ring-accept".into())
                .spawn(move || accept_prev(listener, prev_rank as u32, &auth, deadline))?
        };
        let next = connect_next(next_addr, next_rank, rank as u32, auth, deadline);
        let prev = acceptor
            .join()
            .map_err(|_| TrainError::Distributed("ring accept thread panicked".into()))?;
        let next = next?;
        let (prev, prev_addr) = prev?;
        for s in [&next, &prev] {
            s.set_nodelay(true)?;
            set_buffer_sizes(s, 4 << 20);
            s.set_nonblocking(true)?;
        }
        Ok(Ring {
            rank,
            world,
            next,
            prev,
            next_addr,
            prev_addr,
            timeout,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            scratch: Vec::new(),
            seq: 0,
            broken: None,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    pub fn set_segment_bytes(&mut self, bytes: usize) {
        self.segment_bytes = bytes.max(4);
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Element-wise sum over all ranks, in place.
    pub fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<()> {
        let plan = all_reduce_plan(self.rank, self.world, data.len(), self.segment_bytes);
        // SAFETY: any byte pattern is a valid f32 and vice versa; the view has the same
        // lifetime and exclusivity as `data`.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), data.len() * 4)
        };
        self.run(OP_ALL_REDUCE, bytes, &plan)
    }

    /// Copies `root`'s bytes into every rank's `data`, pipelined along the ring.
    pub fn broadcast(&mut self, data: &mut [u8], root: usize) -> Result<()> {
        if root >= self.world {
            return Err(TrainError::Distributed(
                format!("broadcast from rank {root} in a world of {}", self.world).into(),
            ));
        }
        let plan = broadcast_plan(self.rank, self.world, data.len(), root, self.segment_bytes);
        self.run(OP_BROADCAST | ((root as u32) << 8), data, &plan)
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&mut self) -> Result<()> {
        let mut one = [1.0f32];
        let plan = all_reduce_plan(self.rank, self.world, 1, self.segment_bytes);
        // SAFETY: as in all_reduce_sum.
        let bytes = unsafe { std::slice::from_raw_parts_mut(one.as_mut_ptr().cast::<u8>(), 4) };
        self.run(OP_BARRIER, bytes, &plan)?;
        if one[0] != self.world as f32 {
            return self.fail(CollectiveFault::own(format!(
                "barrier counted {} ranks instead of {}",
                one[0], self.world
            )));
        }
        Ok(())
    }

    fn fail<T>(&mut self, fault: CollectiveFault) -> Result<T> {
        // Closing both links tells the neighbours at once instead of after their timeout.
        let _ = self.next.shutdown(Shutdown::Both);
        let _ = self.prev.shutdown(Shutdown::Both);
        self.broken = Some(fault.clone());
        Err(fault.into())
    }

    /// The global rank at the other end of the link to the next rank, or from the previous.
    fn peer_rank(&self, next: bool) -> usize {
        if next {
            (self.rank + 1) % self.world
        } else {
            (self.rank + self.world - 1) % self.world
        }
    }

    fn peer(&self, next: bool) -> String {
        let addr = if next {
            &self.next_addr
        } else {
            &self.prev_addr
        };
        format!("rank {} ({addr})", self.peer_rank(next))
    }

    fn io_failure(&mut self, next: bool, what: &str, e: &std::io::Error) -> CollectiveFault {
        let peer = self.peer(next);
        let message = match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted => {
                format!("{peer} closed the connection during {what} (it exited or was killed): {e}")
            }
            _ => format!("{what} with {peer} failed: {e}"),
        };
        CollectiveFault::failed(Some(self.peer_rank(next)), message)
    }

    fn run(&mut self, op: u32, data: &mut [u8], plan: &Plan) -> Result<()> {
        if let Some(b) = &self.broken {
            return Err(b.again("the ring is broken by an earlier failure").into());
        }
        let what = op_name(op);
        self.seq += 1;
        let ours = header(op, data.len(), self.seq);
        let mut theirs = [0u8; HEADER];
        let max_reduce = plan
            .recvs
            .iter()
            .filter(|u| u.reduce)
            .map(|u| match u.what {
                Target::Data(p) => p.len / 4,
                Target::Header => 0,
            })
            .max()
            .unwrap_or(0);
        if self.scratch.len() < max_reduce {
            self.scratch.resize(max_reduce, 0.0);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self.drive(what, &ours, &mut theirs, data, &mut scratch, plan);
        self.scratch = scratch;
        match result {
            Ok(()) => Ok(()),
            Err(fault) => self.fail(fault),
        }
    }

    /// The poll loop. Returns how it broke.
    fn drive(
        &mut self,
        what: &str,
        ours: &[u8; HEADER],
        theirs: &mut [u8; HEADER],
        data: &mut [u8],
        scratch: &mut [f32],
        plan: &Plan,
    ) -> std::result::Result<(), CollectiveFault> {
        let mut bufs = Buffers {
            ours,
            theirs,
            data,
            scratch,
        };
        let now = Instant::now();
        let mut at = Cursor {
            si: 0,
            so: 0,
            ri: 0,
            ro: 0,
            last_send: now,
            last_recv: now,
        };
        loop {
            let sent = self.send_ready(what, &bufs, plan, &mut at)?;
            let received = self.receive_ready(what, &mut bufs, plan, &mut at)?;
            let sending = at.si < plan.sends.len();
            let receiving = at.ri < plan.recvs.len();
            if !sending && !receiving {
                return Ok(());
            }
            if sent || received {
                continue;
            }
            self.wait_for_links(what, plan, &at, sending, receiving)?;
        }
    }

    /// Sends whatever is ready until the socket is full; returns whether any byte went.
    fn send_ready(
        &mut self,
        what: &str,
        bufs: &Buffers,
        plan: &Plan,
        at: &mut Cursor,
    ) -> std::result::Result<bool, CollectiveFault> {
        let mut progressed = false;
        while at.si < plan.sends.len() && at.ri >= plan.sends[at.si].after {
            let unit = plan.sends[at.si];
            let bytes = match unit.what {
                Target::Header => &bufs.ours[..],
                Target::Data(p) => &bufs.data[p.start..p.start + p.len],
            };
            if bytes.is_empty() {
                at.si += 1;
                continue;
            }
            match self.next.write(&bytes[at.so..]) {
                Ok(0) => {
                    let e = std::io::Error::new(ErrorKind::WriteZero, "wrote 0 bytes");
                    return Err(self.io_failure(true, what, &e));
                }
                Ok(n) => {
                    at.so += n;
                    progressed = true;
                    at.last_send = Instant::now();
                    if at.so == bytes.len() {
                        at.si += 1;
                        at.so = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_failure(true, what, &e)),
            }
        }
        Ok(progressed)
    }

    /// Receives until the socket is empty or a unit completes (which may unblock a send);
    /// returns whether any byte came.
    fn receive_ready(
        &mut self,
        what: &str,
        bufs: &mut Buffers,
        plan: &Plan,
        at: &mut Cursor,
    ) -> std::result::Result<bool, CollectiveFault> {
        let mut progressed = false;
        while at.ri < plan.recvs.len() {
            let unit = plan.recvs[at.ri];
            let len = match unit.what {
                Target::Header => HEADER,
                Target::Data(p) => p.len,
            };
            let buf = bufs.receive_buffer(unit);
            let n = match self.prev.read(&mut buf[at.ro..len]) {
                Ok(0) => {
                    let e = std::io::Error::new(ErrorKind::UnexpectedEof, "end of stream");
                    return Err(self.io_failure(false, what, &e));
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_failure(false, what, &e)),
            };
            at.ro += n;
            progressed = true;
            at.last_recv = Instant::now();
            if at.ro < len {
                continue;
            }
            self.received(unit, bufs)?;
            at.ri += 1;
            at.ro = 0;
            break;
        }
        Ok(progressed)
    }

    /// A receive unit is complete: checks a header against ours, adds a reduced piece in.
    fn received(
        &self,
        unit: RecvUnit,
        bufs: &mut Buffers,
    ) -> std::result::Result<(), CollectiveFault> {
        match unit.what {
            Target::Header => {
                if bufs.theirs != bufs.ours {
                    return Err(CollectiveFault::own(format!(
                        "{} called {} while this rank called {}: ranks disagree on the \
                         sequence of collectives",
                        self.peer(false),
                        describe(bufs.theirs),
                        describe(bufs.ours)
                    )));
                }
            }
            Target::Data(p) if unit.reduce => {
                add_into(
                    &mut bufs.data[p.start..p.start + p.len],
                    &bufs.scratch[..p.len / 4],
                );
            }
            Target::Data(_) => {}
        }
        Ok(())
    }

    /// Nothing moved: fails if the link waited on has been silent for the timeout, else polls
    /// both links for the rest of it.
    fn wait_for_links(
        &self,
        what: &str,
        plan: &Plan,
        at: &Cursor,
        sending: bool,
        receiving: bool,
    ) -> std::result::Result<(), CollectiveFault> {
        let can_send = sending && at.ri >= plan.sends[at.si].after;
        let quiet_since = if can_send && receiving {
            at.last_send.max(at.last_recv)
        } else if can_send {
            at.last_send
        } else {
            at.last_recv
        };
        if signals::abandoned() {
            return Err(CollectiveFault::abandoned(format!(
                "the round ended elsewhere: {what} abandoned"
            )));
        }
        let idle = quiet_since.elapsed();
        if idle >= self.timeout {
            // Blame the link that has been silent longest.
            let blame_next = can_send && (!receiving || at.last_send <= at.last_recv);
            return Err(CollectiveFault::silent(
                Some(self.peer_rank(blame_next)),
                format!(
                    "{} did not answer within {} s during {what}",
                    self.peer(blame_next),
                    self.timeout.as_secs_f64()
                ),
            ));
        }
        let send_events = if can_send { libc::POLLOUT } else { 0 };
        let recv_events = if receiving { libc::POLLIN } else { 0 };
        // In slices: a signal to abandon may come just before the poll.
        poll2(
            (self.next.as_raw_fd(), send_events),
            (self.prev.as_raw_fd(), recv_events),
            (self.timeout - idle).min(ABANDON_CHECK),
        )
        .map_err(|e| CollectiveFault::own(format!("poll failed during {what}: {e}")))?;
        Ok(())
    }
}

/// The buffers of one collective: the headers, the caller's data, the reduce scratch.
struct Buffers<'a> {
    ours: &'a [u8; HEADER],
    theirs: &'a mut [u8; HEADER],
    data: &'a mut [u8],
    scratch: &'a mut [f32],
}

impl Buffers<'_> {
    /// Where a receive unit's bytes go: the peer's header, the scratch (to be added into the
    /// data) or the data itself.
    fn receive_buffer(&mut self, unit: RecvUnit) -> &mut [u8] {
        match (unit.what, unit.reduce) {
            (Target::Header, _) => &mut self.theirs[..],
            (Target::Data(p), true) => {
                // SAFETY: the scratch floats viewed as bytes, exclusively borrowed.
                unsafe {
                    std::slice::from_raw_parts_mut(self.scratch.as_mut_ptr().cast::<u8>(), p.len)
                }
            }
            (Target::Data(p), false) => &mut self.data[p.start..p.start + p.len],
        }
    }
}

/// How far a collective has got: the next send and receive units, the bytes of each already
/// moved, and when each link last moved data.
struct Cursor {
    si: usize,
    so: usize,
    ri: usize,
    ro: usize,
    last_send: Instant,
    last_recv: Instant,
}

impl Drop for Ring {
    fn drop(&mut self) {
        let _ = self.next.shutdown(Shutdown::Both);
        let _ = self.prev.shutdown(Shutdown::Both);
    }
}

/// dst += src, element-wise; `dst` is a byte view of f32s from the caller's buffer.
fn add_into(dst: &mut [u8], src: &[f32]) {
    // SAFETY: f32 has no invalid bit patterns; align_to_mut only yields aligned f32s.
    let (head, body, tail) = unsafe { dst.align_to_mut::<f32>() };
    if head.is_empty() && tail.is_empty() && body.len() == src.len() {
        for (d, s) in body.iter_mut().zip(src) {
            *d += *s;
        }
    } else {
        for (d, s) in dst.chunks_exact_mut(4).zip(src) {
            let v = f32::from_ne_bytes(d[..].try_into().expect("4")) + *s;
            d.copy_from_slice(&v.to_ne_bytes());
        }
    }
}

fn connect_next(
    addr: SocketAddr,
    next: usize,
    rank: u32,
    auth: &Auth,
    deadline: Instant,
) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = left.clamp(Duration::from_millis(1), Duration::from_secs(10));
        let error = match TcpStream::connect_timeout(&addr, step) {
            Ok(mut s) => match auth.connect(&mut s, Channel::Ring, rank, step) {
                Ok(()) => {
                    s.set_read_timeout(None)?;
                    s.set_write_timeout(None)?;
                    return Ok(s);
                }
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() + backoff >= deadline {
            return Err(TrainError::Distributed(
                format!(
                    "ring: cannot connect to rank {next} at {addr} before the rendezvous timeout: \
                 {error}"
                )
                .into(),
            ));
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Test and benchmark helper: a complete ring of `world` ranks on 127.0.0.1, one `Ring` per
/// rank, built without a store.
pub fn local_rings(world: usize, auth: &Auth, timeout: Duration) -> Result<Vec<Ring>> {
    let listeners: Vec<TcpListener> = (0..world)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()?;
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<std::io::Result<_>>()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let next = addrs[(rank + 1) % world];
            let auth = auth.clone();
            std::thread::spawn(move || {
                Ring::establish(rank, world, l, next, &auth, deadline, timeout)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| TrainError::Distributed("ring setup panicked".into()))?
        })
        .collect()
}

#[cfg(test)]
mod tests;
