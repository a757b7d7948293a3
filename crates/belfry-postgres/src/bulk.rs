//! Bulk actions on PostgreSQL (table `bulk_actions`, migration 6 in
//! [`crate::schema`]).
//!
//! The record is stored whole as JSON (`action`); the columns beside it are
//! what the statements select and order by. The compare-and-set is one
//! `UPDATE … WHERE id = $1 AND revision = $2`: PostgreSQL's row lock makes
//! exactly one of several concurrent updates from the same revision match.

use belfry_core::bulk::{BulkAction, BulkActionId};
use belfry_core::{TenantName, Timestamp};
use belfry_store::{
    ListBulkActionsParams, PurgeBulkActionsParams, RunningBulkActionsParams, StoreError,
    StoreResult,
};

use crate::PostgresStore;
use crate::error::{corrupt, db_error};

impl PostgresStore {
    pub(crate) async fn bulk_create(&self, action: BulkAction) -> StoreResult<bool> {
        let client = self.client().await?;
        let inserted = client
            .execute(
                "INSERT INTO bulk_actions (id, tenant, state, revision, finished_at, action)
                 VALUES ($1, $2, $3, $4, $5, $6::text::jsonb)
                 ON CONFLICT (id) DO NOTHING",
                &[
                    &action.id.as_str(),
                    &action.tenant().as_str(),
                    &action.state.as_str(),
                    &revision(action.revision)?,
                    &action.finished_at.map(Timestamp::as_millis),
                    &encode(&action)?,
                ],
            )
            .await
            .map_err(db_error)?;
        Ok(inserted == 1)
    }

    pub(crate) async fn bulk_get(&self, id: &BulkActionId) -> StoreResult<Option<BulkAction>> {
        let client = self.client().await?;
        client
            .query_opt(
                "SELECT action::text FROM bulk_actions WHERE id = $1",
                &[&id.as_str()],
            )
            .await
            .map_err(db_error)?
            .map(|row| decode(&row))
            .transpose()
    }

    pub(crate) async fn bulk_list(
        &self,
        params: ListBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        let limit = i64::try_from(params.limit).unwrap_or(i64::MAX);
        self.bulk_query(
            "SELECT action::text FROM bulk_actions
             WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR id < $2)
             ORDER BY id DESC LIMIT $3",
            &[
                &params.tenant.as_ref().map(TenantName::as_str),
                &params.before.as_ref().map(BulkActionId::as_str),
                &limit,
            ],
        )
        .await
    }

    pub(crate) async fn bulk_running(
        &self,
        params: RunningBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        let limit = i64::try_from(params.limit).unwrap_or(i64::MAX);
        self.bulk_query(
            "SELECT action::text FROM bulk_actions
             WHERE state = 'running' AND ($1::text IS NULL OR id > $1)
             ORDER BY id LIMIT $2",
            &[&params.after.as_ref().map(BulkActionId::as_str), &limit],
        )
        .await
    }

    /// The bulk actions a `SELECT action::text` finds.
    async fn bulk_query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StoreResult<Vec<BulkAction>> {
        let client = self.client().await?;
        let rows = client.query(sql, params).await.map_err(db_error)?;
        rows.iter().map(decode).collect()
    }

    pub(crate) async fn bulk_update(&self, action: BulkAction) -> StoreResult<Option<BulkAction>> {
        let Some(current) = self.bulk_get(&action.id).await? else {
            return Ok(None);
        };
        let mut next = action;
        // The filter (hence the tenant) and the creation never change.
        next.filter = current.filter;
        next.created_at = current.created_at;
        let expected = next.revision;
        next.revision = expected + 1;
        let client = self.client().await?;
        let updated = client
            .execute(
                "UPDATE bulk_actions
                 SET state = $3, revision = $4, finished_at = $5, action = $6::text::jsonb
                 WHERE id = $1 AND revision = $2",
                &[
                    &next.id.as_str(),
                    &revision(expected)?,
                    &next.state.as_str(),
                    &revision(next.revision)?,
                    &next.finished_at.map(Timestamp::as_millis),
                    &encode(&next)?,
                ],
            )
            .await
            .map_err(db_error)?;
        Ok((updated == 1).then_some(next))
    }

    pub(crate) async fn bulk_purge(&self, params: PurgeBulkActionsParams) -> StoreResult<usize> {
        let limit = i64::try_from(params.limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let deleted = client
            .execute(
                "DELETE FROM bulk_actions WHERE id IN
                     (SELECT id FROM bulk_actions WHERE finished_at < $1
                      ORDER BY finished_at, id LIMIT $2)",
                &[&params.finished_before.as_millis(), &limit],
            )
            .await
            .map_err(db_error)?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }
}

fn revision(value: u64) -> StoreResult<i64> {
    i64::try_from(value).map_err(|_| StoreError::Internal("bulk action revision overflow".into()))
}

fn encode(action: &BulkAction) -> StoreResult<String> {
    serde_json::to_string(action)
        .map_err(|e| StoreError::Internal(format!("cannot encode a bulk action: {e}")))
}

fn decode(row: &tokio_postgres::Row) -> StoreResult<BulkAction> {
    let text: String = row.get(0);
    serde_json::from_str(&text).map_err(corrupt)
}
