//! `belfry cron next` run as a real process.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::process::{Command, Output};

fn belfry_cron(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_belfry"))
        .arg("cron")
        .args(args)
        .output()
        .expect("the belfry binary runs")
}

fn stdout_lines(output: &Output) -> Vec<String> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn prints_next_occurrences_across_spring_forward_in_berlin() {
    let output = belfry_cron(&[
        "next",
        "30 2 * * *",
        "--type",
        "unix",
        "--tz",
        "Europe/Berlin",
        "--from",
        "2027-03-27T00:00:00Z",
        "--count",
        "3",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        stdout_lines(&output),
        [
            "2027-03-27T01:30:00Z",
            "2027-03-28T01:00:00Z",
            "2027-03-29T00:30:00Z"
        ]
    );
}

#[test]
fn quartz_hourly_through_new_york_fall_back() {
    let output = belfry_cron(&[
        "next",
        "0 0 * * * ?",
        "--type",
        "quartz",
        "--tz",
        "America/New_York",
        "--from",
        "2027-11-07T04:30:00Z",
        "--count",
        "3",
    ]);
    assert!(output.status.success(), "{output:?}");
    // 01:00 EDT, 01:00 EST, 02:00 EST: every real hour.
    assert_eq!(
        stdout_lines(&output),
        [
            "2027-11-07T05:00:00Z",
            "2027-11-07T06:00:00Z",
            "2027-11-07T07:00:00Z"
        ]
    );
}

#[test]
fn every_interval_and_default_from_now() {
    let output = belfry_cron(&[
        "next",
        "@every 90s",
        "--type",
        "every",
        "--from",
        "2027-01-01T00:00:00+01:00",
        "--count",
        "2",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        stdout_lines(&output),
        ["2026-12-31T23:01:30Z", "2026-12-31T23:03:00Z"]
    );

    // Without --from the occurrences are after now: five increasing lines.
    let output = belfry_cron(&["next", "* * * * *"]);
    assert!(output.status.success(), "{output:?}");
    let lines = stdout_lines(&output);
    assert_eq!(lines.len(), 5);
    assert!(lines.windows(2).all(|pair| pair[0] < pair[1]), "{lines:?}");
}

#[test]
fn bad_input_is_one_line_on_stderr_and_a_failing_exit() {
    let cases: [&[&str]; 6] = [
        &["next", "61 * * * *"],
        &["next", "0 0 * * * ?"],
        &["next", "* * * * *", "--tz", "Mars/Olympus"],
        &["next", "* * * * *", "--type", "linux"],
        &["next", "* * * * *", "--from", "yesterday"],
        &["next", "* * * * *", "--count", "0"],
    ];
    for args in cases {
        let output = belfry_cron(args);
        assert!(!output.status.success(), "{args:?} should fail");
        assert!(output.stdout.is_empty(), "{args:?}: {output:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("belfry cron: "), "{args:?}: {stderr}");
    }
}
