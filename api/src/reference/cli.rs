//! A program's command line as a reference page, read from its clap `Command`: a section per
//! subcommand with what it does and a table of its flags (env twin, default, help).

use clap::{Arg, Command};

use super::markdown::{Table, cell, code, prose};

/// The page of `program` (its clap `Command`), headed by `generated`, the sentence that says
/// where the page comes from.
pub fn page(program: &Command, generated: &str) -> String {
    let mut program = program.clone();
    program.build();
    let name = program.get_name().to_string();
    let mut out = format!("# `{name}` command line\n\n{}\n", prose(generated));
    if let Some(about) = about(&program) {
        out.push_str(&prose(&about));
    }
    let mut shown: Vec<(String, Vec<String>)> = Vec::new();
    for sub in program.get_subcommands().filter(|s| s.get_name() != "help") {
        let path = format!("{name} {}", sub.get_name());
        out.push('\n');
        out.push_str(&section(&path, sub, &shown));
        shown.push((path, ids(sub)));
    }
    out
}

/// The section of one subcommand (`path`: `ferrotrain launch`). Flags that an earlier
/// section (in `shown`) has all of are named by a link to it instead of listed again.
fn section(path: &str, sub: &Command, shown: &[(String, Vec<String>)]) -> String {
    let hidden = if sub.is_hide_set() { " (hidden)" } else { "" };
    let mut out = format!("## `{path}`{hidden}\n\n");
    if let Some(about) = about(sub) {
        out.push_str(&prose(&about));
        out.push('\n');
    }
    let mine = ids(sub);
    let earlier = shown
        .iter()
        .find(|(_, ids)| !ids.is_empty() && ids.iter().all(|id| mine.contains(id)));
    if let Some((earlier, _)) = earlier {
        let anchor = earlier.replace(' ', "-");
        out.push_str(&format!(
            "Every flag of [`{earlier}`](#{anchor}), and these:\n\n"
        ));
    }
    let mut table = Table::new(&["Flag", "Env", "Default", "Description"]);
    for arg in args(sub) {
        if earlier.is_some_and(|(_, ids)| ids.contains(&arg.get_id().to_string())) {
            continue;
        }
        table.row(vec![
            flag(arg),
            arg.get_env()
                .map_or(String::new(), |e| code(&e.to_string_lossy())),
            default(arg),
            description(arg),
        ]);
    }
    if table.is_empty() {
        out.push_str("No flags.\n");
    } else {
        out.push_str(&table.render());
    }
    out
}

fn about(cmd: &Command) -> Option<String> {
    cmd.get_long_about()
        .or(cmd.get_about())
        .map(|a| sentence(&a.to_string()))
}

/// clap drops the period of a one-paragraph doc comment; the reference writes sentences.
fn sentence(text: &str) -> String {
    let text = text.trim_end();
    if text.is_empty() || text.ends_with(['.', ':', '!', '?']) {
        text.to_string()
    } else {
        format!("{text}.")
    }
}

/// The arguments a user gives (clap's own --help and --version left out).
fn args(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
}

fn ids(cmd: &Command) -> Vec<String> {
    args(cmd).map(|a| a.get_id().to_string()).collect()
}

/// `-f, --file <FILE>`, `--sizes-mb <SIZES_MB>,...`, `--restart-in-place`, `-- <RANK_ARGS>...`.
fn flag(arg: &Arg) -> String {
    let value = value_name(arg);
    let value = match arg.get_value_delimiter() {
        Some(d) => format!("{value}{d}..."),
        None if arg.is_positional() && arg.get_action().takes_values() && is_many(arg) => {
            format!("{value}...")
        }
        None => value,
    };
    let text = if arg.is_positional() {
        let last = if arg.is_last_set() { "-- " } else { "" };
        format!("{last}{value}")
    } else {
        let short = arg.get_short().map_or(String::new(), |s| format!("-{s}, "));
        let long = arg.get_long().unwrap_or_default();
        if arg.get_action().takes_values() {
            format!("{short}--{long} {value}")
        } else {
            format!("{short}--{long}")
        }
    };
    let hidden = if arg.is_hide_set() { " (hidden)" } else { "" };
    format!("{}{hidden}", code(&text))
}

fn is_many(arg: &Arg) -> bool {
    arg.get_num_args().is_some_and(|n| n.max_values() > 1)
}

fn value_name(arg: &Arg) -> String {
    let name = arg
        .get_value_names()
        .and_then(|n| n.first())
        .map_or_else(|| arg.get_id().as_str().to_uppercase(), |n| n.to_string());
    format!("<{name}>")
}

/// The default, `required`, or nothing (for a flag that takes no value).
fn default(arg: &Arg) -> String {
    if !arg.get_action().takes_values() {
        return String::new();
    }
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if values.iter().any(|v| !v.is_empty()) {
        code(&values.join(","))
    } else if !values.is_empty() {
        code("\"\"")
    } else if arg.is_required_set() {
        "required".into()
    } else {
        String::new()
    }
}

/// The help, and the values a choice takes (each with its help) unless they are true/false.
fn description(arg: &Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| sentence(&h.to_string()))
        .unwrap_or_default();
    let values: Vec<_> = arg
        .get_possible_values()
        .into_iter()
        .filter(|v| !v.is_hide_set())
        .collect();
    let boolean = values
        .iter()
        .all(|v| ["true", "false"].contains(&v.get_name()));
    if values.is_empty() || boolean || !arg.get_action().takes_values() {
        return cell(&help);
    }
    let choices: Vec<String> = values
        .iter()
        .map(|v| match v.get_help() {
            Some(h) => format!(
                "`{}` ({})",
                v.get_name(),
                h.to_string().trim_end_matches('.')
            ),
            None => format!("`{}`", v.get_name()),
        })
        .collect();
    cell(&format!("{help}\n\nOne of: {}.", choices.join(", ")))
}

#[cfg(test)]
#[allow(dead_code)] // the parsed values: only the `Command` is read
mod tests {
    use super::*;
    use clap::{ArgAction, Parser, Subcommand, ValueEnum};

    #[derive(Parser)]
    #[command(name = "tool", about = "A tool.")]
    struct Cli {
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Clone, ValueEnum)]
    enum Format {
        /// Lines.
        Text,
        Json,
    }

    #[derive(Subcommand)]
    enum Sub {
        /// Runs it.
        Run(RunArgs),
        /// Runs it dry.
        Dry {
            #[command(flatten)]
            run: RunArgs,
            /// The file.
            #[arg(long, short = 'f')]
            file: String,
        },
        #[command(hide = true)]
        Secret,
    }

    #[derive(clap::Args)]
    struct RunArgs {
        /// Sizes | in MB.
        #[arg(long, env = "TOOL_SIZES", value_delimiter = ',', default_value = "1,2")]
        sizes: Vec<u32>,
        /// Whether to go.
        #[arg(long, default_value_t = true, action = ArgAction::Set)]
        go: bool,
        /// How to log.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Quiet.
        #[arg(long)]
        quiet: bool,
        /// What the rank runs.
        #[arg(last = true)]
        rest: Vec<String>,
    }

    #[test]
    fn every_flag_has_its_row_and_a_flattened_struct_is_named_once() {
        let page = page(&<Cli as clap::CommandFactory>::command(), "Generated.");
        let expected = [
            "# `tool` command line\n\nGenerated.\n\nA tool.\n",
            "## `tool run`\n\nRuns it.\n\n| Flag | Env | Default | Description |",
            "| `--sizes <SIZES>,...` | `TOOL_SIZES` | `1,2` | Sizes \\| in MB. |",
            "| `--go <GO>` |  | `true` | Whether to go. |",
            "| `--format <FORMAT>` |  | `text` | How to log.<br><br>One of: `text` (Lines), `json`. |",
            "| `--quiet` |  |  | Quiet. |",
            "| `-- <REST>...` |  |  | What the rank runs. |",
            "## `tool dry`\n\nRuns it dry.\n\nEvery flag of [`tool run`](#tool-run), and these:\n\n",
            "| `-f, --file <FILE>` |  | required | The file. |",
            "## `tool secret` (hidden)\n\nNo flags.\n",
        ];
        for part in expected {
            assert!(page.contains(part), "{part}\nnot in\n{page}");
        }
        assert_eq!(page.matches("`--quiet`").count(), 1, "{page}");
        assert!(!page.contains("--help"), "{page}");
    }
}
