//! Listening ports inside the range the job's NetworkPolicy names (`FERROTRAIN_PORT_RANGE`,
//! `first-last`; docs/security.md): the trainer's ring listeners, and the port a PyTorch
//! script's rank 0 serves its TCPStore on each round (MASTER_PORT, program.rs), which node
//! 0's launcher picks here. The operator also pins the pod's ephemeral port range to it (the
//! sysctl net.ipv4.ip_local_port_range), which covers NCCL's and Gloo's listeners.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, TcpListener};

use ferrotrain_api::env;

/// Parses `first-last` (both ends included, first <= last, neither 0); the error names the
/// variable.
pub fn parse_range(value: &str) -> Result<(u16, u16), String> {
    let bad = || {
        format!(
            "{}={value:?} is not a port range first-last (e.g. 41000-42999)",
            env::FERROTRAIN_PORT_RANGE
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

/// The range in this process's environment: None when unset, an error when malformed.
pub fn range_from_env() -> Result<Option<(u16, u16)>, String> {
    match std::env::var(env::FERROTRAIN_PORT_RANGE) {
        Ok(v) if !v.trim().is_empty() => parse_range(&v).map(Some),
        _ => Ok(None),
    }
}

/// What [`listen`] found.
#[derive(Debug)]
pub enum Listened {
    Bound(TcpListener),
    /// Every port of the range is taken.
    Full,
}

/// A listener on every interface: in `range` when given (the first free port from `start`
/// on, wrapping, so that processes that start differently do not race for the same port),
/// else wherever the kernel puts it.
pub fn listen(range: Option<(u16, u16)>, start: u32) -> std::io::Result<Listened> {
    let Some((first, last)) = range else {
        return TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).map(Listened::Bound);
    };
    let span = u32::from(last - first) + 1;
    for i in 0..span {
        let port = first + ((start % span + i) % span) as u16;
        match TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
            Ok(listener) => return Ok(Listened::Bound(listener)),
            Err(e) if e.kind() == ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Listened::Full)
}

/// The error of a range with no free port, for people.
pub fn full_message(range: (u16, u16)) -> String {
    format!(
        "no free port in {}={}-{}: the job's NetworkPolicy lets peers reach only these (widen \
         spec.networkPolicy.portRange)",
        env::FERROTRAIN_PORT_RANGE,
        range.0,
        range.1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_first_dash_last_and_a_bad_one_names_the_variable() {
        assert_eq!(parse_range("41000-42999").unwrap(), (41000, 42999));
        assert_eq!(parse_range(" 5000 - 5000 ").unwrap(), (5000, 5000));
        for bad in ["", "41000", "42999-41000", "0-10", "a-b", "1-70000"] {
            let e = parse_range(bad).unwrap_err();
            assert!(e.contains("FERROTRAIN_PORT_RANGE"), "{bad}: {e}");
        }
    }

    #[test]
    fn listeners_stay_in_the_range_and_a_full_range_says_so() {
        // A free port, then a range of exactly that port and the next.
        let probe = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let range = (port, port.saturating_add(1));
        let Listened::Bound(a) = listen(Some(range), 7).unwrap() else {
            panic!("a free port in {range:?}");
        };
        let got = a.local_addr().unwrap().port();
        assert!(got == range.0 || got == range.1, "{got} outside {range:?}");
        // Only one port, and it is taken.
        assert!(matches!(
            listen(Some((got, got)), 0).unwrap(),
            Listened::Full
        ));
        assert!(full_message((got, got)).contains("no free port"));
        let Listened::Bound(any) = listen(None, 0).unwrap() else {
            panic!("an ephemeral port");
        };
        assert_ne!(any.local_addr().unwrap().port(), 0);
    }
}
