//! docs/reference/reasons.md and environment.md: the tables api/src/reason.rs and
//! api/src/env.rs declare with each constant (`ferrotrain_api::documented`), in their order.

use ferrotrain_api::documented::Documented;
use ferrotrain_api::reference::markdown::{Table, cell, code, prose};
use ferrotrain_api::{env, reason};

pub fn reasons_page() -> String {
    let mut out = String::from("# Reasons\n\n");
    out.push_str(&prose(
        "Generated from api/src/reason.rs (`ferrotrain_api::reason::ALL`) by \
         scripts/gen-reference.sh: do not edit. Every reason the operator writes on a \
         DistributedTraining: of its status conditions, of its Kubernetes Events and of \
         `status.lastFailure.reason` (also the key of `status.restartsByCause` and the \
         `reason` label of `ferrotrain_operator_gang_restarts_total`), and the reasons of \
         the recovery ledger's ends. [The reasons guide](../reasons.md) says what each means \
         for a job and what to do.",
    ));
    out.push('\n');
    let mut table = Table::new(&["Reason", "Constant", "Where it appears and why"]);
    for r in reason::ALL {
        table.row(vec![
            code(r.value),
            code(&format!("reason::{}", r.name)),
            cell(&named_by_value(r, reason::ALL)),
        ]);
    }
    out.push_str(&table.render());
    out
}

pub fn environment_page() -> String {
    let mut out = String::from("# Environment variables\n\n");
    out.push_str(&prose(
        "Generated from api/src/env.rs (`ferrotrain_api::env::ALL`) by \
         scripts/gen-reference.sh: do not edit. The contract between the operator, \
         `ferrotrain launch` and each rank: what the operator sets on a job's pods, what the \
         launcher sets on each rank it starts, and what either reads. The torchrun names are \
         kept, so that an image started by torchrun works too.",
    ));
    out.push('\n');
    let mut table = Table::new(&["Variable", "Description"]);
    for v in env::ALL {
        table.row(vec![code(v.value), cell(&v.text())]);
    }
    out.push_str(&table.render());
    out.push_str("\n## Related names\n\n");
    out.push_str(&prose(
        "Not variables themselves: what the variables' names are made of, and what they point at.",
    ));
    out.push('\n');
    let mut table = Table::new(&["Constant", "Value", "Description"]);
    for v in env::RELATED {
        table.row(vec![
            code(&format!("env::{}", v.name)),
            code(v.value),
            cell(&v.text()),
        ]);
    }
    out.push_str(&table.render());
    out
}

/// The doc of `c` with the constants of `table` it names shown by value, as users see them
/// (`` `INVALID_SPEC` `` -> `` `InvalidSpec` ``).
fn named_by_value(c: &Documented, table: &[Documented]) -> String {
    table.iter().fold(c.text(), |text, other| {
        text.replace(&format!("`{}`", other.name), &format!("`{}`", other.value))
    })
}
