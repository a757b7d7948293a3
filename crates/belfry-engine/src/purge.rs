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
    let events = in_pages("finished events", move || {
        env.store.purge_finished(PurgeParams {
            finished_before: cut_off,
            limit: PAGE,
        })
    })
    .await?;
    in_pages("audit entries", move || {
        env.store.purge_audit(cut_off, PAGE)
    })
    .await?;
    in_pages("finished bulk actions", move || {
        env.store.purge_bulk_actions(PurgeBulkActionsParams {
            finished_before: cut_off,
            limit: PAGE,
        })
    })
    .await?;
    Ok(events)
}

/// Calls `purge_page` (which removes up to [`PAGE`] entries and says how
/// many it did) until a page comes back short; logs and returns the total.
async fn in_pages<F>(what: &str, mut purge_page: impl FnMut() -> F) -> StoreResult<usize>
where
    F: Future<Output = StoreResult<usize>>,
{
    let mut total = 0;
    loop {
        let purged = purge_page().await?;
        total += purged;
        if purged < PAGE {
            if total > 0 {
                tracing::info!(purged = total, "retention sweep removed {what}");
            }
            return Ok(total);
        }
    }
}
