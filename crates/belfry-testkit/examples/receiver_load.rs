//! Rough throughput check of the lean receiver: N keep-alive connections
//! send small POSTs for a few seconds (a minimal raw HTTP/1.1 client, so the
//! client costs little), then it prints requests per second. Client and
//! server share the machine, so this is a lower bound.
//!
//! `cargo run --release -p belfry-testkit --example receiver_load -- [connections] [seconds]`
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::{Duration, Instant};

use belfry_testkit::Receiver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let connections: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let receiver = Receiver::start_lean().await;
    let addr = receiver.addr();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for connection in 0..connections {
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            let body = "{\"orderId\":42}";
            let mut buffer = vec![0u8; 4096];
            let mut sent = 0u64;
            while Instant::now() < deadline {
                let request = format!(
                    "POST /hook HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                     x-belfry-event-id: c{connection}-{sent}\r\n\
                     x-belfry-scheduled-at: 2030-01-31T04:00:30Z\r\nidempotency-key: k{sent}\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(request.as_bytes()).await.expect("write");
                // The receiver answers with an empty body: the head is the
                // whole response.
                let mut read = 0;
                loop {
                    let n = stream.read(&mut buffer[read..]).await.expect("read");
                    assert!(n > 0, "receiver closed the connection");
                    read += n;
                    if buffer[..read].ends_with(b"\r\n\r\n") {
                        break;
                    }
                }
                sent += 1;
            }
            sent
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap_or(0);
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{connections} connections, {total} requests in {elapsed:.1} s: {:.0} req/s; recorded {}, accepted {}",
        total as f64 / elapsed,
        receiver.count(),
        receiver.accepted_connections()
    );
}
