//! The ring's listeners inside the range the job's NetworkPolicy names (`FERROTRAIN_PORT_RANGE`;
//! the launch crate's `ports`, which the launcher picks a PyTorch script's MASTER_PORT with):
//! the ring binds inside it itself, so it holds even where the operator's sysctl
//! net.ipv4.ip_local_port_range was not applied.

use std::net::TcpListener;

use ferrotrain_launch::ports::{self, Listened};

use crate::error::{Result, TrainError};

/// Parses `first-last` (both ends included, first <= last, neither 0).
pub fn parse_range(value: &str) -> Result<(u16, u16)> {
    ports::parse_range(value).map_err(|e| TrainError::Config(e.into()))
}

/// A listener on every interface: in `range` when given (the first free port from a start
/// that differs between processes, so that ranks of one pod do not race for the same
/// port), else wherever the kernel puts it.
pub fn listen(range: Option<(u16, u16)>) -> Result<TcpListener> {
    match ports::listen(range, std::process::id())? {
        Listened::Bound(listener) => Ok(listener),
        Listened::Full => Err(TrainError::Distributed(
            ports::full_message(range.unwrap_or_default()).into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

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
