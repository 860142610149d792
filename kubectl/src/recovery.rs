//! `recovery`: the job's ledger (`status.recovery`) as a table (src/ledger.rs), or as it is in
//! JSON or YAML; one GET.

use crate::cli::{Output, RecoveryArgs};
use crate::connect::Cluster;
use crate::error::Result;
use crate::ledger::ledger_table;

/// Prints the ledger of job `args.name`.
pub async fn recovery(cluster: &Cluster, args: &RecoveryArgs) -> Result<()> {
    let dt = cluster.job(&args.name).await?;
    let Some(ledger) = dt.status.and_then(|s| s.recovery) else {
        eprintln!(
            "{} has no recovery ledger yet: no attempt has started",
            args.name
        );
        return Ok(());
    };
    match args.output {
        Output::Table => print!("{}", ledger_table(&args.name, &ledger)),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&ledger).unwrap_or_default()
        ),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&ledger).unwrap_or_default()),
    }
    Ok(())
}
