//! The store's frames, parsed and encoded: pure, so that any bytes a peer sends can be tried
//! against it (a malformed request is `None`, never a panic or an unbounded allocation: a
//! frame is at most [`MAX_FRAME`] bytes, and nothing here allocates more than it holds, or
//! than twice what the peer actually sent: a declared length is not reserved up front).

use std::io::{ErrorKind, Read, Write};
use std::time::Duration;

/// Largest request or response frame; the store only carries addresses, ids and reports.
pub const MAX_FRAME: usize = 1 << 20;
/// What a frame's buffer starts with; it grows as the rest of the frame arrives.
const FIRST_READ: usize = 64 << 10;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const OP_WILL: u8 = 4;
/// The first byte of a reply: done (and what follows is its value).
pub const OK: u8 = 0;
/// The first byte of a GET's reply when the key was not set in time.
pub const TIMED_OUT: u8 = 1;
/// The first byte of a write's reply when it would pass one of the store's limits; the
/// rest is the limit in words (`values`).
pub const REFUSED: u8 = 2;

/// One request, as a client sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Set {
        key: String,
        value: Vec<u8>,
    },
    Get {
        key: String,
        wait: Duration,
    },
    Add {
        key: String,
        delta: i64,
    },
    /// This connection's last word: `key` is set to `value` (unless set by then) when the
    /// connection ends; an empty key takes it back.
    Will {
        key: String,
        value: Vec<u8>,
    },
}

impl Request {
    /// A request frame's payload parsed; None when it is malformed.
    pub fn parse(frame: &[u8]) -> Option<Request> {
        let (&op, body) = frame.split_first()?;
        match op {
            OP_SET | OP_WILL => {
                let klen = u32::from_le_bytes(body.get(..4)?.try_into().ok()?) as usize;
                let end = 4usize.checked_add(klen)?;
                let key = std::str::from_utf8(body.get(4..end)?).ok()?.to_string();
                let value = body[end..].to_vec();
                Some(match op {
                    OP_SET => Request::Set { key, value },
                    _ => Request::Will { key, value },
                })
            }
            OP_GET => {
                let ms = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
                let key = std::str::from_utf8(&body[8..]).ok()?.to_string();
                Some(Request::Get {
                    key,
                    wait: Duration::from_millis(ms),
                })
            }
            OP_ADD => {
                let delta = i64::from_le_bytes(body.get(..8)?.try_into().ok()?);
                let key = std::str::from_utf8(&body[8..]).ok()?.to_string();
                Some(Request::Add { key, delta })
            }
            _ => None,
        }
    }

    /// The frame's payload.
    pub fn encode(&self) -> Vec<u8> {
        let keyed = |op: u8, key: &str, value: &[u8]| {
            let mut p = vec![op];
            p.extend_from_slice(&(key.len() as u32).to_le_bytes());
            p.extend_from_slice(key.as_bytes());
            p.extend_from_slice(value);
            p
        };
        let numbered = |op: u8, n: [u8; 8], key: &str| {
            let mut p = vec![op];
            p.extend_from_slice(&n);
            p.extend_from_slice(key.as_bytes());
            p
        };
        match self {
            Request::Set { key, value } => keyed(OP_SET, key, value),
            Request::Will { key, value } => keyed(OP_WILL, key, value),
            Request::Get { key, wait } => {
                let ms = wait.as_millis().min(u64::MAX as u128) as u64;
                numbered(OP_GET, ms.to_le_bytes(), key)
            }
            Request::Add { key, delta } => numbered(OP_ADD, delta.to_le_bytes(), key),
        }
    }
}

/// Reads one frame; `Ok(None)` on a clean EOF between frames. A frame over [`MAX_FRAME`] is
/// an error before anything is allocated for it.
pub fn read_frame(stream: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte cap"),
        ));
    }
    // Grows with what arrives: a peer that declares a megabyte and sends a byte costs a byte.
    let mut buf = Vec::with_capacity(len.min(FIRST_READ));
    stream.take(len as u64).read_to_end(&mut buf)?;
    if buf.len() < len {
        return Err(std::io::Error::new(
            ErrorKind::UnexpectedEof,
            format!("frame cut short: {} of {len} bytes", buf.len()),
        ));
    }
    Ok(Some(buf))
}

/// Writes one frame.
pub fn write_frame(stream: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    stream.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_round_trips() {
        let requests = [
            Request::Set {
                key: "agent/round".into(),
                value: b"3".to_vec(),
            },
            Request::Get {
                key: "ring/0".into(),
                wait: Duration::from_millis(1500),
            },
            Request::Add {
                key: "agent/done".into(),
                delta: -7,
            },
            Request::Will {
                key: "agent/2/report/1".into(),
                value: b"{}".to_vec(),
            },
            Request::Will {
                key: String::new(),
                value: Vec::new(),
            },
        ];
        for r in requests {
            assert_eq!(Request::parse(&r.encode()), Some(r.clone()), "{r:?}");
        }
    }

    #[test]
    fn malformed_requests_are_none() {
        for bad in [
            &[][..],
            &[9u8][..],
            &[OP_SET, 255, 255, 255, 255][..],
            &[OP_WILL, 2, 0, 0, 0, b'k'][..],
            &[OP_GET, 1, 2][..],
            &[OP_ADD, 1][..],
            &[OP_SET, 1, 0, 0, 0, 0xff][..],
        ] {
            assert_eq!(Request::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_frame_over_the_cap_is_refused_before_it_is_read() {
        let mut huge = (u32::MAX).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        let err = read_frame(&mut huge.as_slice()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData);
        let mut out = Vec::new();
        write_frame(&mut out, b"abc").unwrap();
        assert_eq!(
            read_frame(&mut out.as_slice()).unwrap(),
            Some(b"abc".to_vec())
        );
        assert_eq!(read_frame(&mut [].as_slice()).unwrap(), None, "a clean end");
        assert!(
            read_frame(&mut [3, 0, 0, 0, 1].as_slice()).is_err(),
            "cut short"
        );
    }
}
