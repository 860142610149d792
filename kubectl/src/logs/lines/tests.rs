use super::*;

fn t(s: &str) -> Option<Timestamp> {
    Some(s.parse().unwrap())
}

/// Node 0's container log (rank 0, its launcher) and node 1's (rank 1, killed in round 0, and
/// the spare that became round 1's rank 1), as the kubelet serves them with timestamps.
const NODE_0: &str = "\
2026-12-01T12:00:01.000000000Z 2026-12-01T12:00:01.000Z  INFO launch: agent: round 0: started 1 rank(s)
2026-12-01T12:00:02.000000000Z [round 0 rank 0] 2026-12-01T12:00:01.900Z  INFO ferrotrain::train: step 1
2026-12-01T12:00:30.100000000Z [round 1 rank 0] 2026-12-01T12:00:30.050Z  INFO ferrotrain::train: resuming from a peer's state step=303
";
const NODE_1: &str = "\
2026-12-01T12:00:02.500000000Z [round 0 rank 1] 2026-12-01T12:00:02.400Z  INFO ferrotrain::train: step 1
2026-12-01T12:00:29.500000000Z [round 0 rank 1] thread 'main' panicked at src/x.rs:1:1
2026-12-01T12:00:29.600000000Z [spare of local rank 0] 2026-12-01T12:00:29.550Z  INFO ferrotrain: spare ready
2026-12-01T12:00:30.200000000Z [round 1 rank 1] 2026-12-01T12:00:30.150Z  INFO ferrotrain::train: step 304
";

#[test]
fn a_container_log_is_told_apart_by_its_labels() {
    let lines = container_log(1, NODE_1);
    let origins: Vec<Origin> = lines.iter().map(|l| l.origin).collect();
    assert_eq!(
        origins,
        [
            Origin::Rank {
                round: Some(0),
                rank: 1
            },
            Origin::Rank {
                round: Some(0),
                rank: 1
            },
            Origin::Spare { node: 1, local: 0 },
            Origin::Rank {
                round: Some(1),
                rank: 1
            },
        ]
    );
    assert_eq!(lines[1].text, "thread 'main' panicked at src/x.rs:1:1");
    assert_eq!(
        lines[1].time,
        t("2026-12-01T12:00:29.5Z"),
        "the kubelet's time"
    );
    let launcher = &container_log(0, NODE_0)[0];
    assert_eq!(launcher.origin, Origin::Launcher { node: 0 });
    assert_eq!(
        launcher.render(),
        "[node 0] 2026-12-01T12:00:01.000Z  INFO launch: agent: round 0: started 1 rank(s)"
    );
}

#[test]
fn every_rank_merged_in_time_order_with_its_round_and_rank() {
    let merged = merge(vec![container_log(0, NODE_0), container_log(1, NODE_1)]);
    let ranks: Vec<String> = merged
        .iter()
        .filter(|l| Filter::default().keeps(l))
        .map(|l| l.render().split(']').next().unwrap().to_string() + "]")
        .collect();
    assert_eq!(
        ranks,
        [
            "[node 0]",
            "[0.0]",
            "[0.1]",
            "[0.1]",
            "[node 1 spare 0]",
            "[1.0]",
            "[1.1]"
        ]
    );
}

#[test]
fn a_round_and_a_rank_keep_only_that_rank_s_lines_of_that_round() {
    let merged = merge(vec![container_log(0, NODE_0), container_log(1, NODE_1)]);
    let filter = Filter {
        round: Some(0),
        rank: Some(1),
    };
    let kept: Vec<String> = merged
        .iter()
        .filter(|l| filter.keeps(l))
        .map(Line::render)
        .collect();
    assert_eq!(
        kept,
        [
            "[0.1] 2026-12-01T12:00:02.400Z  INFO ferrotrain::train: step 1",
            "[0.1] thread 'main' panicked at src/x.rs:1:1",
        ]
    );
    let round_1 = Filter {
        round: Some(1),
        rank: None,
    };
    assert_eq!(merged.iter().filter(|l| round_1.keeps(l)).count(), 2);
}

#[test]
fn a_round_file_s_lines_take_the_trainer_s_time_and_an_untimed_one_its_predecessor_s() {
    let text = "2026-12-01T12:00:29.100Z  INFO ferrotrain::train: step 300\n\
                thread 'main' panicked\n\
                \x1b[2m2026-12-01T12:00:29.400Z\x1b[0m  INFO coloured\n";
    let lines = round_file(0, 1, text);
    assert_eq!(lines[0].time, t("2026-12-01T12:00:29.1Z"));
    assert_eq!(lines[1].time, lines[0].time);
    assert_eq!(lines[2].time, t("2026-12-01T12:00:29.4Z"));
    assert_eq!(lines[1].render(), "[0.1] thread 'main' panicked");
}

#[test]
fn labels_that_are_not_the_launcher_s_are_text() {
    for line in ["[rank x] a", "[round 1] b", "[INFO] c", "plain"] {
        assert_eq!(label(line), None, "{line}");
    }
    assert_eq!(
        label("[rank 3] hi"),
        Some((
            Origin::Rank {
                round: None,
                rank: 3
            },
            "hi"
        ))
    );
    assert_eq!(
        label("[round 2 rank 0]"),
        Some((
            Origin::Rank {
                round: Some(2),
                rank: 0
            },
            ""
        ))
    );
    let untimed_first = Line {
        time: None,
        origin: Origin::Rank {
            round: None,
            rank: 3,
        },
        text: "x".into(),
    };
    assert_eq!(untimed_first.render(), "[3] x");
    assert_eq!(tail(vec![untimed_first.clone(); 5], Some(2)).len(), 2);
    assert_eq!(tail(vec![untimed_first; 5], None).len(), 5);
}
