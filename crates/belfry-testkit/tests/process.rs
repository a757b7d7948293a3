//! `BelfryProcess` against `fake_belfry`, a stand-in that serves `/ping`.

use belfry_testkit::{BelfryLaunch, BelfryProcess, HarnessError, get_json};

fn launch(data_dir: &std::path::Path) -> BelfryLaunch {
    BelfryLaunch::new(env!("CARGO_BIN_EXE_fake_belfry"), data_dir).arg("--extra")
}

fn starts(data_dir: &std::path::Path) -> String {
    std::fs::read_to_string(data_dir.join("starts")).unwrap()
}

#[tokio::test]
async fn start_terminate_kill_and_restart() {
    let data = tempfile::tempdir().unwrap();
    let mut belfry = BelfryProcess::start(launch(data.path())).await.unwrap();
    let pid = belfry.pid().unwrap();
    assert_eq!(get_json(&belfry.url("/ping")).await.0, 200);
    assert!(
        belfry.logs_tail(10).contains("--extra"),
        "{}",
        belfry.logs_tail(10)
    );

    let status = belfry.terminate().await.unwrap();
    assert!(status.success(), "{status}");
    assert!(belfry.logs_tail(10).contains("stopping on SIGTERM"));
    assert_eq!(belfry.pid(), None);

    let port = belfry.port();
    belfry.restart().await.unwrap();
    assert_eq!(belfry.port(), port);
    assert_ne!(belfry.pid(), Some(pid));
    assert_eq!(starts(data.path()), "2");

    belfry.kill_9();
    assert_eq!(belfry.pid(), None);
    belfry.restart().await.unwrap();
    assert_eq!(starts(data.path()), "3");
    assert_eq!(get_json(&belfry.url("/ping")).await.0, 200);
}

#[tokio::test]
async fn early_exit_reports_status_and_logs() {
    let data = tempfile::tempdir().unwrap();
    let error = BelfryProcess::start(launch(data.path()).env("FAKE_BELFRY_FAIL", "1"))
        .await
        .unwrap_err();
    match &error {
        HarnessError::ExitedEarly { status, logs } => {
            assert_eq!(status.code(), Some(3));
            assert!(logs.contains("failing on request"), "{logs}");
        }
        other => panic!("unexpected {other}"),
    }
}
