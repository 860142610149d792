//! Where this process sits in the gang, read from the env contract (RANK, WORLD_SIZE, ...,
//! torchrun's names, and ferrotrain's attempt, token and round).

use ferrotrain_api::env;
use ferrotrain_launch::DEFAULT_MASTER_PORT;

use crate::error::{Result, TrainError};

/// Where this process sits in the gang (from RANK, WORLD_SIZE, ... in the env contract).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub attempt: u64,
    pub token: String,
    /// The in-place round (FERROTRAIN_ROUND; 0 without in-place restarts).
    pub round: u64,
    /// Node 0's launcher hosts the rendezvous store (FERROTRAIN_STORE_HOSTED=1): rank 0
    /// connects to it like every other rank.
    pub store_hosted: bool,
    /// The gang's full world size when this (elastic) round has fewer ranks
    /// (FERROTRAIN_VIRTUAL_WORLD): the ranks cover the missing ones' shards.
    pub virtual_world: Option<usize>,
    /// The ranks each step's global batch is sized for when the gang may grow beyond the
    /// size asked for (FERROTRAIN_BATCH_WORLD, elastic.maxReplicas): none, the gang's full
    /// world size.
    pub batch_world: Option<usize>,
    /// Where this rank's ring listener must bind (FERROTRAIN_PORT_RANGE: the ports the job's
    /// NetworkPolicy names).
    pub port_range: Option<(u16, u16)>,
    /// Where the ranks of this pod leave their state for the next round
    /// (FERROTRAIN_HEAL_DIR; none: nothing is left).
    pub heal_dir: Option<std::path::PathBuf>,
}

impl RankEnv {
    /// Reads the env contract; a process started without it is rank 0 of 1.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like `from_env`, reading variables through `var` (tests).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        fn parse<T: std::str::FromStr>(
            var: &impl Fn(&str) -> Option<String>,
            name: &str,
            default: T,
        ) -> Result<T> {
            match var(name) {
                None => Ok(default),
                Some(v) if v.trim().is_empty() => Ok(default),
                Some(v) => v.trim().parse().map_err(|_| {
                    TrainError::Config(format!("{name}={v:?} is not a valid number").into())
                }),
            }
        }
        let world_size: usize = parse(&var, env::WORLD_SIZE, 1)?;
        let rank: usize = parse(&var, env::RANK, 0)?;
        let local_world_size: usize = parse(&var, env::LOCAL_WORLD_SIZE, world_size)?;
        let local_rank: usize = parse(&var, env::LOCAL_RANK, rank)?;
        let master_port: u16 = parse(&var, env::MASTER_PORT, DEFAULT_MASTER_PORT)?;
        let attempt: u64 = match var(env::FERROTRAIN_ATTEMPT) {
            Some(_) => parse(&var, env::FERROTRAIN_ATTEMPT, 0)?,
            None => parse(&var, env::TORCHELASTIC_RESTART_COUNT, 0)?,
        };
        let master_addr = var(env::MASTER_ADDR)
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "127.0.0.1".to_string());
        let token = ferrotrain_launch::auth::token_from(&var)?.unwrap_or_default();
        let round: u64 = parse(&var, env::FERROTRAIN_ROUND, 0)?;
        let store_hosted = var(env::FERROTRAIN_STORE_HOSTED).is_some_and(|v| v.trim() == "1");
        let virtual_world: usize = parse(&var, env::FERROTRAIN_VIRTUAL_WORLD, 0)?;
        let virtual_world = (virtual_world > world_size).then_some(virtual_world);
        let batch_world: usize = parse(&var, env::FERROTRAIN_BATCH_WORLD, 0)?;
        let batch_world = (batch_world > 0).then_some(batch_world);
        let port_range = var(env::FERROTRAIN_PORT_RANGE)
            .filter(|v| !v.trim().is_empty())
            .map(|v| super::ports::parse_range(&v))
            .transpose()?;
        if world_size == 0 {
            return Err(TrainError::Config("WORLD_SIZE must be at least 1".into()));
        }
        if rank >= world_size {
            return Err(TrainError::Config(
                format!("RANK={rank} is not below WORLD_SIZE={world_size}").into(),
            ));
        }
        if local_world_size == 0 || local_rank >= local_world_size {
            return Err(TrainError::Config(
                format!("LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world_size}")
                    .into(),
            ));
        }
        if world_size > 1 && token.is_empty() {
            return Err(TrainError::Config(
                format!(
                    "{} must be set when WORLD_SIZE > 1: every rendezvous connection proves it \
                 knows it (`ferrotrain launch` and the operator set it)",
                    env::FERROTRAIN_RDZV_TOKEN
                )
                .into(),
            ));
        }
        Ok(RankEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            attempt,
            token,
            round,
            store_hosted,
            virtual_world,
            batch_world,
            port_range,
            heal_dir: var(env::FERROTRAIN_HEAL_DIR)
                .filter(|d| !d.trim().is_empty())
                .map(std::path::PathBuf::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn empty_env_is_rank_zero_of_one() {
        let e = RankEnv::from_lookup(lookup(&[])).unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_world_size),
            (0, 1, 0, 1)
        );
        assert_eq!(e.master_port, DEFAULT_MASTER_PORT);
    }

    #[test]
    fn full_env_is_read() {
        let e = RankEnv::from_lookup(lookup(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "job-0-0.job.ns.svc"),
            ("MASTER_PORT", "1234"),
            ("FERROTRAIN_ATTEMPT", "5"),
            ("FERROTRAIN_RDZV_TOKEN", "s3cret"),
        ]))
        .unwrap();
        assert_eq!(e.rank, 3);
        assert_eq!(e.local_rank, 1);
        assert_eq!(e.master_addr, "job-0-0.job.ns.svc");
        assert_eq!(e.master_port, 1234);
        assert_eq!(e.attempt, 5);
    }

    #[test]
    fn bad_env_is_a_config_error() {
        for pairs in [
            &[
                ("RANK", "2"),
                ("WORLD_SIZE", "2"),
                ("FERROTRAIN_RDZV_TOKEN", "t"),
            ][..],
            &[("RANK", "x")][..],
            &[("WORLD_SIZE", "2"), ("RANK", "1")][..],
            &[("MASTER_PORT", "70000")][..],
        ] {
            let err = RankEnv::from_lookup(lookup(pairs)).unwrap_err();
            assert!(matches!(err, TrainError::Config(_)), "{pairs:?}: {err}");
        }
    }
}
