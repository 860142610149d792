//! One version for the binaries, the images and the chart: Cargo.toml's workspace version is
//! the chart's `version` and `appVersion`, it is SemVer, and CHANGELOG.md either dates it
//! (`## [X.Y.Z] - YYYY-MM-DD`, released) or announces it as the unreleased next version. The
//! release itself is `scripts/release.sh VERSION`, which refuses an undated one.

mod support;

fn read(path: &str) -> String {
    std::fs::read_to_string(support::repo_root().join(path)).unwrap()
}

fn semver(v: &str) -> bool {
    let core = v.split('-').next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars().all(|c| c.is_ascii_digit())
                && (p == &"0" || !p.starts_with('0'))
        })
}

/// `key: value` (quoted or not) of a YAML file's top level.
fn top_level(yaml: &str, key: &str) -> Option<String> {
    yaml.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().trim_matches('"').to_string())
}

/// What is wrong with `version` as the workspace's against the chart and the changelog.
fn problems(version: &str, chart: &str, changelog: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !semver(version) {
        problems.push(format!("{version} is not SemVer"));
    }
    for key in ["version", "appVersion"] {
        let got = top_level(chart, key);
        if got.as_deref() != Some(version) {
            problems.push(format!("Chart.yaml's {key} is {got:?}, not {version}"));
        }
    }
    let dated = changelog.lines().any(|l| {
        l.strip_prefix(&format!("## [{version}] - "))
            .is_some_and(|d| d.len() == 10 && d.as_bytes()[4] == b'-' && d.as_bytes()[7] == b'-')
    });
    let next = changelog
        .lines()
        .any(|l| l.starts_with("## [Unreleased]") && l.contains(version));
    if !dated && !next {
        problems.push(format!(
            "CHANGELOG.md neither dates {version} (## [{version}] - YYYY-MM-DD) nor names it as \
             the unreleased next version (## [Unreleased] ({version}...))"
        ));
    }
    problems
}

#[test]
fn the_workspace_the_chart_and_the_changelog_name_one_semver_version() {
    let cargo = read("Cargo.toml");
    let version = cargo
        .split("[workspace.package]")
        .nth(1)
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_string())
        .expect("Cargo.toml's workspace version");
    let found = problems(
        &version,
        &read("charts/ferrotrain/Chart.yaml"),
        &read("CHANGELOG.md"),
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_version_the_chart_or_the_changelog_does_not_name_is_refused() {
    let chart = "apiVersion: v2\nversion: 0.2.0\nappVersion: \"0.2.0\"\n";
    let log = "## [Unreleased] (0.2.0: ...)\n\n## [0.1.0] - 2026-11-28\n";
    assert!(problems("0.2.0", chart, log).is_empty());
    assert!(
        problems("0.1.0", chart, log).len() == 2,
        "the chart says 0.2.0"
    );
    assert_eq!(problems("0.3.0", chart, log).len(), 3);
    assert!(!problems("0.2", chart, log).is_empty());
    assert!(!semver("01.2.3") && semver("1.2.3-rc.1") && semver("0.0.0"));
}
