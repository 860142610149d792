//! Listening ports inside the range the job's NetworkPolicy names (`FERROTRAIN_PORT_RANGE`,
//! `first-last`; docs/security.md). The operator also pins the pod's ephemeral port range to
//! it (the sysctl net.ipv4.ip_local_port_range), which covers NCCL's and Gloo's listeners; the
//! ring binds inside it itself, so it holds even where that sysctl was not applied.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, TcpListener};

use ferrotrain_api::env;

use crate::error::{Result, TrainError};

/// Parses `first-last` (both ends included, first <= last, neither 0).
pub fn parse_range(value: &str) -> Result<(u16, u16)> {
    let bad = || {
        TrainError::Config(
            format!(
                "{}={value:?} is not a port range first-last (e.g. 41000-42999)",
                env::FERROTRAIN_PORT_RANGE
            )
            .into(),
        )
    };
    let (first, last) = value.trim().split_once('-').ok_or_else(bad)?;
    let first: u16 = first.trim().parse().map_err(|_| bad())?;
    let last: u16 = last.trim().parse().map_err(|_| bad())?;
    if first == 0 || first > last {
        return Err(bad());
    }
    Ok((first, last))
}

/// A listener on every interface: in `range` when given (the first free port from a start
/// that differs between processes, so that ranks of one pod do not race for the same
/// port), else wherever the kernel puts it.
pub fn listen(range: Option<(u16, u16)>) -> Result<TcpListener> {
    let Some((first, last)) = range else {
        return Ok(TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))?);
    };
    let span = u32::from(last - first) + 1;
    let start = std::process::id() % span;
    for i in 0..span {
        let port = first + ((start + i) % span) as u16;
        match TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(TrainError::Distributed(
        format!(
            "no free port in {}={first}-{last}: the job's NetworkPolicy lets peers reach only \
             these (widen spec.networkPolicy.portRange)",
            env::FERROTRAIN_PORT_RANGE
        )
        .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_first_dash_last_and_a_bad_one_names_the_variable() {
        assert_eq!(parse_range("41000-42999").unwrap(), (41000, 42999));
        assert_eq!(parse_range(" 5000 - 5000 ").unwrap(), (5000, 5000));
        for bad in ["", "41000", "42999-41000", "0-10", "a-b", "1-70000"] {
            let e = parse_range(bad).unwrap_err().to_string();
            assert!(e.contains("FERROTRAIN_PORT_RANGE"), "{bad}: {e}");
        }
    }

    #[test]
    fn listeners_stay_in_the_range_and_a_full_range_is_an_error() {
        // A free port, then a range of exactly that port and the next.
        let probe = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let range = (port, port.saturating_add(1));
        let a = listen(Some(range)).unwrap();
        let got = a.local_addr().unwrap().port();
        assert!(got == range.0 || got == range.1, "{got} outside {range:?}");
        // Only one port, and it is taken.
        let e = listen(Some((got, got))).unwrap_err().to_string();
        assert!(e.contains("no free port"), "{e}");
        assert!(listen(None).unwrap().local_addr().unwrap().port() != 0);
    }
}
