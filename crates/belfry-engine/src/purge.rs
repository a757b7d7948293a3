//! The background retention sweep: finished events and their attempt
//! history go once they are older than `history_retention`, and so do
//! audit log entries and finished bulk actions (kept like history).

use std::sync::Arc;

use belfry_store::{PurgeBulkActionsParams, PurgeParams, StoreResult};

use crate::Env;

const PAGE: usize = 10_000;

pub(crate) async fn run(env: Arc<Env>) {
    let mut tick = crate::tasks::ticks(env.options.purge_interval);
    loop {
        tick.tick().await;
        if let Err(error) = run_once(&env).await {
            tracing::warn!(%error, "retention sweep failed; will try again");
        }
    }
}

/// One sweep: purges pages until nothing old is left. Returns how many
/// events went.
pub(crate) async fn run_once(env: &Env) -> StoreResult<usize> {
    let cut_off = env.clock.now().minus(env.options.history_retention);
    let mut total = 0;
    loop {
        let purged = env
            .store
            .purge_finished(PurgeParams {
                finished_before: cut_off,
                limit: PAGE,
            })
            .await?;
        total += purged;
        if purged < PAGE {
            if total > 0 {
                tracing::info!(purged = total, "retention sweep removed finished events");
            }
            break;
        }
    }
    let mut audit = 0;
    loop {
        let purged = env.store.purge_audit(cut_off, PAGE).await?;
        audit += purged;
        if purged < PAGE {
            if audit > 0 {
                tracing::info!(purged = audit, "retention sweep removed audit entries");
            }
            break;
        }
    }
    let mut bulk = 0;
    loop {
        let purged = env
            .store
            .purge_bulk_actions(PurgeBulkActionsParams {
                finished_before: cut_off,
                limit: PAGE,
            })
            .await?;
        bulk += purged;
        if purged < PAGE {
            if bulk > 0 {
                tracing::info!(
                    purged = bulk,
                    "retention sweep removed finished bulk actions"
                );
            }
            return Ok(total);
        }
    }
}
