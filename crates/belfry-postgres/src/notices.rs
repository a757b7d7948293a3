//! Where the server's notices go. tokio-postgres logs every NOTICE at info
//! when a connection is driven as a plain future, so the schema check at
//! each start (`CREATE … IF NOT EXISTS`: "relation … already exists,
//! skipping") and the like filled a node's log. Pool connections are
//! driven here instead: notices are logged at debug, warnings at warn.

use deadpool_postgres::Connect;
use futures::future::BoxFuture;
use tokio_postgres::{AsyncMessage, Client, Config};

use crate::tls::MakeTls;

/// Opens the pool's connections and drives each on a task that routes
/// the server's notices by severity.
#[derive(Debug)]
pub(crate) struct NoticesByLevel {
    pub(crate) tls: MakeTls,
}

impl Connect for NoticesByLevel {
    fn connect(
        &self,
        config: &Config,
    ) -> BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>> {
        let config = config.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let (client, mut connection) = config.connect(tls).await?;
            let task = tokio::spawn(async move {
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(message) = futures::StreamExt::next(&mut messages).await {
                    match message {
                        Ok(AsyncMessage::Notice(notice)) => log_notice(&notice),
                        Ok(_) => {}
                        Err(error) => {
                            // The pool sees the client closed and drops it.
                            tracing::warn!(%error, "database connection failed");
                            return;
                        }
                    }
                }
            });
            Ok((client, task))
        })
    }
}

fn log_notice(notice: &tokio_postgres::error::DbError) {
    // WARNING is worth an operator's eye; NOTICE, INFO, DEBUG and LOG are
    // routine.
    if notice.parsed_severity() == Some(tokio_postgres::error::Severity::Warning) {
        tracing::warn!(
            code = notice.code().code(),
            message = notice.message(),
            "database warning"
        );
    } else {
        tracing::debug!(
            severity = notice.severity(),
            code = notice.code().code(),
            message = notice.message(),
            "database notice"
        );
    }
}
