//! What a block printed against what the page shows: numbers, durations and spacing as
//! wildcards, `...` gaps, kubectl's own log lines left out, the runner's names shown as the
//! page's.

/// A line of output as compared: every number, duration and age becomes `#`, whitespace
/// runs one space but the indentation (`kubectl describe`'s nesting), none at the end.
pub fn normalize(line: &str) -> String {
    let body = line.trim_start();
    let mut out = line[..line.len() - body.len()].replace('\t', "    ");
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    let digit = |i: usize| chars.get(i).is_some_and(|c| c.is_ascii_digit());
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            out.push(' ');
            continue;
        }
        if !c.is_ascii_digit() {
            out.push(c);
            i += 1;
            continue;
        }
        // A number: digits, a fraction, an exponent, then units (`1m`, `2m5s`, `1h05m`,
        // `250ms`) when a unit ends the word or another number follows it.
        loop {
            while digit(i) {
                i += 1;
            }
            if chars.get(i) == Some(&'.') && digit(i + 1) {
                i += 1;
                while digit(i) {
                    i += 1;
                }
            }
            if matches!(chars.get(i), Some('e' | 'E')) {
                let sign = usize::from(matches!(chars.get(i + 1), Some('+' | '-')));
                if digit(i + 1 + sign) {
                    i += 1 + sign;
                    while digit(i) {
                        i += 1;
                    }
                }
            }
            let unit = ["ms", "s", "m", "h", "d"].into_iter().find(|u| {
                u.chars()
                    .enumerate()
                    .all(|(k, uc)| chars.get(i + k) == Some(&uc))
            });
            let Some(unit) = unit else { break };
            let after = i + unit.len();
            if digit(after) {
                i = after;
                continue;
            }
            if !chars.get(after).is_some_and(|c| c.is_alphanumeric()) {
                i = after;
            }
            break;
        }
        out.push('#');
    }
    if out.trim().is_empty() {
        return String::new();
    }
    out.trim_end().to_string()
}

/// One line of a console block: `...` alone, or a line whose `...`s stand for any text.
#[derive(Debug)]
enum Expected {
    Gap,
    Line { shown: String, parts: Vec<String> },
}

impl Expected {
    fn parse(line: &str) -> Expected {
        let normal = normalize(line);
        if normal.trim() == "..." {
            return Expected::Gap;
        }
        Expected::Line {
            shown: line.trim_end().to_string(),
            // The first part keeps its indentation.
            parts: normal
                .split("...")
                .enumerate()
                .map(|(i, p)| if i == 0 { p.trim_end() } else { p.trim() }.to_string())
                .collect(),
        }
    }

    fn matches(&self, output: &str) -> bool {
        let Expected::Line { parts, .. } = self else {
            return true;
        };
        if parts.len() == 1 {
            return parts[0] == output;
        }
        let (first, last) = (&parts[0], &parts[parts.len() - 1]);
        if !output.starts_with(first.as_str()) {
            return false;
        }
        let mut rest = &output[first.len()..];
        for part in &parts[1..parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.ends_with(last.as_str())
    }

    fn shown(&self) -> &str {
        match self {
            Expected::Gap => "...",
            Expected::Line { shown, .. } => shown,
        }
    }
}

/// Whether a line is client-go's klog header (`Lmmdd hh:mm:ss.uuuuuu threadid file:line] `):
/// kubectl's diagnostics on stderr, not what the command prints.
pub fn is_klog(line: &str) -> bool {
    let b = line.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let Some(close) = line.find("] ") else {
        return false;
    };
    matches!(b.first(), Some(b'I' | b'W' | b'E' | b'F'))
        && digits(1..5)
        && b.get(5) == Some(&b' ')
        && digits(6..8)
        && b.get(8) == Some(&b':')
        && line[..close].rsplit_once(' ').is_some_and(|(_, at)| {
            at.rsplit_once(':').is_some_and(|(file, n)| {
                file.ends_with(".go") && !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit())
            })
        })
}

/// Compares a command's output with the console block the page shows for it (see the
/// module's documentation); the error says which line of the block was not found where.
pub fn compare(expected: &str, output: &str) -> Result<(), String> {
    let want: Vec<Expected> = expected
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(Expected::parse)
        .collect();
    let got: Vec<String> = output
        .lines()
        .filter(|l| !is_klog(l))
        .map(normalize)
        .filter(|l| !l.is_empty())
        .collect();
    let open_start = matches!(want.first(), Some(Expected::Gap));
    let open_end = matches!(want.last(), Some(Expected::Gap));
    let runs: Vec<&[Expected]> = want
        .split(|e| matches!(e, Expected::Gap))
        .filter(|run| !run.is_empty())
        .collect();
    if runs.is_empty() {
        return if want.is_empty() && !got.is_empty() {
            Err(format!(
                "the page shows no output, but the command printed `{}`",
                got[0]
            ))
        } else {
            Ok(())
        };
    }
    let fits = |run: &[Expected], at: usize| {
        at + run.len() <= got.len() && run.iter().zip(&got[at..]).all(|(e, g)| e.matches(g))
    };
    // How far a run gets at each start it may take: the line it fails at, for the error.
    let stuck = |run: &[Expected], starts: &mut dyn Iterator<Item = usize>| {
        let (best, at) = starts
            .map(|at| {
                let n = run
                    .iter()
                    .zip(got.get(at..).unwrap_or_default())
                    .take_while(|(e, g)| e.matches(g))
                    .count();
                (n, at)
            })
            .max_by_key(|(n, at)| (*n, std::cmp::Reverse(*at)))
            .unwrap_or((0, got.len()));
        let seen = got
            .get(at + best)
            .map_or("the end of the output".to_string(), |g| format!("`{g}`"));
        format!(
            "the page's line `{}` is not in the output (the closest place: output line {}, {seen})",
            run[best.min(run.len() - 1)].shown(),
            at + best + 1
        )
    };
    let more = |run: &[Expected], at: usize| {
        let after = at + run.len();
        format!(
            "the command printed more than the page shows: after `{}`, output line {} `{}`",
            run[run.len() - 1].shown(),
            after + 1,
            got[after]
        )
    };
    let mut next = 0;
    for (i, run) in runs.iter().enumerate() {
        let first = i == 0 && !open_start;
        let last = i == runs.len() - 1 && !open_end;
        let leftmost = (next..got.len()).find(|&at| fits(run, at));
        let at = if first {
            if !fits(run, 0) {
                return Err(stuck(run, &mut std::iter::once(0)));
            }
            if last && run.len() < got.len() {
                return Err(more(run, 0));
            }
            0
        } else if last {
            // The last run ends the output.
            let tail = got
                .len()
                .checked_sub(run.len())
                .filter(|&t| t >= next && fits(run, t));
            match (tail, leftmost) {
                (Some(t), _) => t,
                (None, Some(at)) => return Err(more(run, at)),
                (None, None) => return Err(stuck(run, &mut (next..got.len().max(next + 1)))),
            }
        } else {
            match leftmost {
                Some(at) => at,
                None => return Err(stuck(run, &mut (next..got.len().max(next + 1)))),
            }
        };
        next = at + run.len();
    }
    Ok(())
}

/// Replaces the runner's own names (its namespace, its image tag) with the page's.
pub fn shown_as(output: &str, names: &[(String, String)]) -> String {
    let mut names: Vec<&(String, String)> = names.iter().filter(|(a, _)| !a.is_empty()).collect();
    names.sort_by_key(|(a, _)| std::cmp::Reverse(a.len()));
    names.iter().fold(output.to_string(), |text, (from, to)| {
        text.replace(from, to)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_durations_ages_and_spacing_are_wildcards() {
        assert_eq!(
            normalize("copy   Running   1450   35.9      0.0118    43s   0          51s"),
            "copy Running # # # # # #"
        );
        for same in ["1m", "2m5s", "1h05m", "2d04h", "250ms", "4.21e-05", "12"] {
            assert_eq!(normalize(same), "#", "{same}");
        }
        assert_eq!(normalize("copy-0-1"), "copy-#-#");
        assert_eq!(normalize("3000 steps, 0.26 s"), "# steps, # s");
        // A unit is a unit only at the end of a word.
        assert_eq!(normalize("5seconds"), "#seconds");
        // The indentation stays: it is `kubectl describe`'s nesting.
        assert_eq!(normalize("    Lost Steps:   0  "), "    Lost Steps: #");
        assert_ne!(
            normalize("      Lost Steps:  0"),
            normalize("    Lost Steps:  0")
        );
        assert_eq!(normalize("   "), "");
    }

    const GET: &str = "\
NAME   PHASE     STEP   STEPS/S   LOSS     ETA   RESTARTS   AGE
copy   Running   120    38.2      1.02     1m    0          14s
";

    #[test]
    fn the_output_matches_when_only_numbers_and_spacing_differ() {
        let output = "NAME   PHASE     STEP   STEPS/S   LOSS      ETA   RESTARTS   AGE\n\
                      copy   Running   1450   35.9      0.0118    43s   0          2m5s\n";
        assert_eq!(compare(GET, output), Ok(()));
    }

    #[test]
    fn kubectls_own_log_lines_are_not_output() {
        let warning = r#"W1202 03:42:48.123456   28225 reflector.go:561] "Warning: watch ended with error" err="context canceled""#;
        assert!(is_klog(warning));
        assert!(is_klog("I1202 03:42:48.1   1 informerwatcher.go:12] x"));
        assert!(!is_klog(
            "distributedtraining.ferrotrain.dev/copy condition met"
        ));
        assert!(!is_klog("I1202 is not a klog line] x"));
        assert!(!is_klog("W1202 03:42:48.123456   1 reflector] no file"));
        let page = "created\ncondition met\ncondition met\n";
        let output = format!("created\ncondition met\n{warning}\ncondition met\n");
        assert_eq!(compare(page, &output), Ok(()));
        let shown = format!("created\n{warning}\n");
        assert!(
            compare(page, &shown).is_err(),
            "a klog line stands for nothing"
        );
    }

    #[test]
    fn a_planted_mismatch_fails() {
        let output = "NAME   PHASE     STEP   STEPS/S   LOSS     ETA   RESTARTS   AGE\n\
                      copy   Failed    120    38.2      1.02     1m    0          14s\n";
        let err = compare(GET, output).unwrap_err();
        assert!(err.contains("copy   Running"), "{err}");
        assert!(err.contains("output line 2"), "{err}");
        // An empty column is not a number.
        let output = "NAME   PHASE     STEP   STEPS/S   LOSS     ETA   RESTARTS   AGE\n\
                      copy   Running                                0          14s\n";
        assert!(compare(GET, output).is_err());
    }

    #[test]
    fn output_the_page_does_not_show_fails() {
        let more = format!("{GET}copy   Running   130    38.2      1.02     1m    0   15s\n");
        let err = compare(GET, &more).unwrap_err();
        assert!(err.contains("more than the page shows"), "{err}");
        let before = format!("Warning: something\n{GET}");
        assert!(compare(GET, &before).is_err());
        // A block with no console block must print nothing.
        assert!(compare("", "").is_ok());
        assert!(compare("", "\n\n").is_ok());
        assert!(compare("", "error: no such pod").is_err());
        // A missing line.
        let err = compare(GET, "NAME   PHASE\n").unwrap_err();
        assert!(err.contains("not in the output"), "{err}");
    }

    #[test]
    fn gaps_skip_lines_and_inline_gaps_skip_text() {
        let expected = "\
...
NAME: ferrotrain
LAST DEPLOYED: ...
STATUS: deployed
...
";
        let output = "Release \"ferrotrain\" has been upgraded. Happy Helming!\n\
                      NAME: ferrotrain\n\
                      LAST DEPLOYED: Tue Dec  1 10:00:00 2026\n\
                      STATUS: deployed\n\
                      REVISION: 3\n\
                      NOTES:\n";
        assert_eq!(compare(expected, output), Ok(()));
        // Without the gaps the first and the last lines must be the output's.
        let strict = "NAME: ferrotrain\nLAST DEPLOYED: ...\nSTATUS: deployed\n";
        assert!(compare(strict, output).is_err());
        // Lines between two shown lines need a gap.
        let no_gap = "...\nNAME: ferrotrain\nSTATUS: deployed\n...\n";
        assert!(compare(no_gap, output).is_err());
        // An inline gap in the middle of a line.
        let inline = "...\nLAST DEPLOYED: Tue ... 2026\n...\n";
        assert_eq!(compare(inline, output), Ok(()));
        let wrong = "...\nLAST DEPLOYED: Wed ... 2026\n...\n";
        assert!(compare(wrong, output).is_err());
        // A gap in the middle, the last run anchored at the end.
        let ends = "...\nNAME: ferrotrain\n...\nNOTES:\n";
        assert_eq!(compare(ends, output), Ok(()));
        let not_last = "...\nNAME: ferrotrain\n...\nSTATUS: deployed\n";
        assert!(compare(not_last, output).is_err());
    }

    #[test]
    fn the_runners_names_are_shown_as_the_pages() {
        let names = vec![
            ("ft-e2e-pages-1a2b".to_string(), "default".to_string()),
            ("e2e-abc1234-deadbeef".to_string(), "dev".to_string()),
        ];
        let output = "pod \"copy-0-0\" deleted from ft-e2e-pages-1a2b namespace\n\
                      Jobs without spec.image run ferrotrain/trainer:e2e-abc1234-deadbeef.\n";
        assert_eq!(
            shown_as(output, &names),
            "pod \"copy-0-0\" deleted from default namespace\n\
             Jobs without spec.image run ferrotrain/trainer:dev.\n"
        );
    }
}
