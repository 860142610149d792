//! What a simulator simulates: how many nodes, their capacity and addresses, their heartbeats,
//! how fast its pods start and stop, and the pace of jobs whose pods do not say.

use std::time::Duration;

use super::training::Pace;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Config {
    /// Nodes are `<name>-0000`..., labelled and tainted `ferrotrain.dev/hollow=<name>`.
    pub name: String,
    pub nodes: usize,
    pub cpu: String,
    pub memory: String,
    pub gpus: u32,
    pub max_pods: u32,
    /// Pod IPs are 127.<ip_block>.x.y, node IPs 127.<ip_block + 1>.x.y.
    pub ip_block: u8,
    /// The nodes' Lease duration, and how often each is renewed (a kubelet: 40 s and 10 s).
    pub lease_duration: Duration,
    pub renew_interval: Duration,
    /// How often each node's status is refreshed (a kubelet: 5 minutes when nothing changes).
    pub status_interval: Duration,
    /// From a pod's binding to its Running status.
    pub start_delay: Duration,
    /// From a pod's deletion to its containers' exit (a trainer saving on SIGTERM).
    pub stop_delay: Duration,
    /// The pace of jobs whose pods do not say.
    pub pace: Pace,
    /// API writes in flight at most.
    pub write_concurrency: usize,
}

impl Config {
    /// The defaults, for the simulator `name`.
    pub fn named(name: &str) -> Config {
        Config {
            name: name.to_string(),
            nodes: 20,
            cpu: "96".into(),
            memory: "1Ti".into(),
            gpus: 8,
            max_pods: 110,
            ip_block: 43,
            lease_duration: Duration::from_secs(40),
            renew_interval: Duration::from_secs(10),
            status_interval: Duration::from_secs(300),
            start_delay: Duration::ZERO,
            stop_delay: Duration::from_secs(1),
            pace: Pace {
                steps_per_second: 1.0,
                total_steps: 1_000_000,
            },
            write_concurrency: 16,
        }
    }
}
