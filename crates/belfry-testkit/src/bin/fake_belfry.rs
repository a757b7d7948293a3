//! A stand-in for `belfry serve`, used only by the testkit's own tests of
//! [`belfry_testkit::BelfryProcess`]: answers 200 to every request on
//! `--listen`, counts its starts in `--data-dir/starts`, and exits 0 on
//! SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some("serve"), Some(listen), Some(data_dir)) = (
        args.first().map(String::as_str),
        value_of("--listen"),
        value_of("--data-dir"),
    ) else {
        eprintln!("usage: fake_belfry serve --listen ADDR --data-dir DIR [..]; got {args:?}");
        std::process::exit(2);
    };
    let starts_file = PathBuf::from(data_dir).join("starts");
    let starts = std::fs::read_to_string(&starts_file)
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .unwrap_or(0)
        + 1;
    std::fs::write(&starts_file, starts.to_string()).expect("write the starts file");
    if std::env::var("FAKE_BELFRY_FAIL").is_ok() {
        eprintln!("failing on request");
        std::process::exit(3);
    }
    let addr: SocketAddr = listen.parse().expect("a socket address");
    let _receiver = belfry_testkit::Receiver::start_on_port(addr.port(), false)
        .await
        .expect("bind the listen address");
    println!("fake belfry start {starts} on {addr} with args {args:?}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install a SIGTERM handler");
    term.recv().await;
    println!("fake belfry stopping on SIGTERM");
}
