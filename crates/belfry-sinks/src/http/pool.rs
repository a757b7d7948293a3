//! Idle keep-alive connections of the plain-http client, per authority.
//!
//! No background task: a checkout drops its authority's expired
//! connections, and at most once per idle timeout every authority's (so a
//! target no delivery goes to any more does not keep its connections open
//! for ever, as long as the node delivers anything at all). A connection
//! the server closed while idle is noticed at checkout (a non-blocking
//! read) or, in a race, by the client's retry-once on a reused connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use belfry_core::{Clock, MonoTime};

use super::client::Conn;

/// Idle connections, most recently used last.
#[derive(Debug)]
pub(crate) struct Pool {
    inner: Mutex<Inner>,
    max_idle_per_host: usize,
    idle_timeout: Duration,
    clock: Arc<dyn Clock>,
}

#[derive(Debug)]
struct Inner {
    /// Per `host:port`, in the order they went idle.
    idle: HashMap<Arc<str>, Vec<Idle>>,
    /// When every authority's expired connections were last dropped.
    last_sweep: MonoTime,
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    /// When it went back to the pool.
    since: MonoTime,
}

impl Pool {
    pub(crate) fn new(
        max_idle_per_host: usize,
        idle_timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Pool {
            inner: Mutex::new(Inner {
                idle: HashMap::new(),
                last_sweep: clock.monotonic(),
            }),
            max_idle_per_host,
            idle_timeout,
            clock,
        }
    }

    /// The most recently used idle connection to `authority` that is still
    /// open, dropping the expired ones on the way.
    pub(crate) fn checkout(&self, authority: &str) -> Option<Conn> {
        // Declared before the guard, so dropped (closed) after it.
        let mut closed = Vec::new();
        loop {
            let conn = {
                let now = self.clock.monotonic();
                let mut inner = self.lock();
                if now.since(inner.last_sweep) >= self.idle_timeout {
                    self.sweep(&mut inner, now, &mut closed);
                }
                let list = inner.idle.get_mut(authority)?;
                let expired = self.expired(list, now);
                closed.extend(list.drain(..expired));
                list.pop()?.conn
            };
            // Outside the lock: may cost a syscall.
            if conn.is_reusable() {
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for the next request to `authority`, unless the
    /// authority already has `max_idle_per_host` idle connections (then it
    /// is closed).
    pub(crate) fn put(&self, authority: &Arc<str>, conn: Conn) {
        if self.max_idle_per_host == 0 {
            return;
        }
        let idle = Idle {
            conn,
            since: self.clock.monotonic(),
        };
        let rejected = {
            let mut inner = self.lock();
            match inner.idle.get_mut(&**authority) {
                Some(list) if list.len() >= self.max_idle_per_host => Some(idle),
                Some(list) => {
                    list.push(idle);
                    None
                }
                None => {
                    inner.idle.insert(Arc::clone(authority), vec![idle]);
                    None
                }
            }
        };
        // Closed outside the lock.
        drop(rejected);
    }

    /// Moves every authority's expired connections into `closed` and
    /// forgets authorities without idle connections; due once per idle
    /// timeout.
    fn sweep(&self, inner: &mut Inner, now: MonoTime, closed: &mut Vec<Idle>) {
        inner.last_sweep = now;
        inner.idle.retain(|_, list| {
            let expired = self.expired(list, now);
            closed.extend(list.drain(..expired));
            !list.is_empty()
        });
    }

    /// How many of `list`'s oldest connections have been idle too long:
    /// pushed in time order, so the expired ones are a prefix.
    fn expired(&self, list: &[Idle], now: MonoTime) -> usize {
        list.partition_point(|entry| now.since(entry.since) >= self.idle_timeout)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Poison means a panic elsewhere mid-update; the map is still valid.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use belfry_core::ManualClock;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    async fn connect(listener: &TcpListener) -> (Conn, TcpStream) {
        let address = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        (Conn::new(client.unwrap()), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn keeps_at_most_max_idle_and_drops_expired_and_closed_ones() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority: Arc<str> = Arc::from("a:80");
        let mut servers = Vec::new();

        let clock = ManualClock::default();
        let pool = Pool::new(2, Duration::from_secs(60), Arc::new(clock.clone()));
        for _ in 0..3 {
            let (conn, server) = connect(&listener).await;
            pool.put(&authority, conn);
            servers.push(server);
        }
        assert_eq!(pool.lock().idle[&authority].len(), 2);
        assert!(pool.checkout("b:80").is_none());
        // The server side of the most recent one closes: skipped.
        drop(servers.pop());
        drop(servers.pop());
        // Real sockets: the close takes a moment to reach this side.
        #[allow(clippy::disallowed_methods, reason = "waits for a real socket's close")]
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(pool.checkout(&authority).is_some());
        assert!(pool.checkout(&authority).is_none());

        let pool = Pool::new(8, Duration::from_millis(20), Arc::new(clock.clone()));
        let (conn, _server) = connect(&listener).await;
        pool.put(&authority, conn);
        clock.advance(Duration::from_millis(40));
        assert!(pool.checkout(&authority).is_none());
        // Another authority's expired connections go at the next sweep.
        let (conn, _server) = connect(&listener).await;
        pool.put(&authority, conn);
        clock.advance(Duration::from_millis(40));
        assert!(pool.checkout("b:80").is_none());
        assert!(pool.lock().idle.is_empty());
    }
}
