//! API keys and the audit log on PostgreSQL (tables `api_keys`, `audit_log`;
//! migration 5 in [`crate::schema`]; `revoked_api_keys`, migration 10).

use belfry_core::auth::{ApiKey, AuditAction, AuditEntry, KeyHash, KeyId, Role};
use belfry_core::{TenantName, Timestamp};
use belfry_store::{AuditPageParams, StoreResult};

use crate::PostgresStore;
use crate::cached;
use crate::error::{corrupt, db_error};

const KEY_COLUMNS: &str = "id, tenant, role, hash, created_at, expires_at, last_used_at";
const AUDIT_COLUMNS: &str = "id, at, actor, action, tenant, target";

impl PostgresStore {
    pub(crate) async fn auth_put_key(&self, key: ApiKey) -> StoreResult<bool> {
        let client = self.client().await?;
        let inserted = client
            .execute(
                // A revoked secret is never stored again.
                "INSERT INTO api_keys (id, tenant, role, hash, created_at, expires_at, last_used_at)
                 SELECT $1::text, $2::text, $3::text, $4::text, $5::bigint, $6::bigint, $7::bigint
                 WHERE NOT EXISTS (SELECT 1 FROM revoked_api_keys WHERE hash = $4::text)
                 ON CONFLICT (hash) DO NOTHING",
                &[
                    &key.id.as_str(),
                    &key.tenant.as_ref().map(TenantName::as_str),
                    &key.role.as_str(),
                    &key.hash.as_str(),
                    &key.created_at.as_millis(),
                    &key.expires_at.map(Timestamp::as_millis),
                    &key.last_used_at.map(Timestamp::as_millis),
                ],
            )
            .await
            .map_err(db_error)?;
        Ok(inserted == 1)
    }

    pub(crate) async fn auth_key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = $1");
        cached::query(&self.client().await?, &sql, &[&hash.as_str()])
            .await?
            .first()
            .map(key_from_row)
            .transpose()
    }

    pub(crate) async fn auth_list_keys(&self) -> StoreResult<Vec<ApiKey>> {
        let client = self.client().await?;
        client
            .query(
                &format!("SELECT {KEY_COLUMNS} FROM api_keys ORDER BY id"),
                &[],
            )
            .await
            .map_err(db_error)?
            .iter()
            .map(key_from_row)
            .collect()
    }

    pub(crate) async fn auth_delete_key(&self, id: &KeyId) -> StoreResult<Option<ApiKey>> {
        let client = self.client().await?;
        client
            .query_opt(
                // One statement: the key leaves and its tombstone arrives
                // together.
                &format!(
                    "WITH gone AS (DELETE FROM api_keys WHERE id = $1 RETURNING {KEY_COLUMNS}),
                     tombstone AS (INSERT INTO revoked_api_keys (hash, id)
                                   SELECT hash, id FROM gone ON CONFLICT (hash) DO NOTHING)
                     SELECT {KEY_COLUMNS} FROM gone"
                ),
                &[&id.as_str()],
            )
            .await
            .map_err(db_error)?
            .map(|row| key_from_row(&row))
            .transpose()
    }

    pub(crate) async fn auth_touch_key(&self, id: &KeyId, at: Timestamp) -> StoreResult<()> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE api_keys SET last_used_at = $2
                 WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)",
                &[&id.as_str(), &at.as_millis()],
            )
            .await
            .map_err(db_error)?;
        Ok(())
    }

    pub(crate) async fn auth_append_audit(&self, entry: AuditEntry) -> StoreResult<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO audit_log (id, at, actor, action, tenant, target)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &entry.id,
                    &entry.at.as_millis(),
                    &entry.actor,
                    &entry.action.as_str(),
                    &entry.tenant.as_ref().map(TenantName::as_str),
                    &entry.target,
                ],
            )
            .await
            .map_err(db_error)?;
        Ok(())
    }

    pub(crate) async fn auth_list_audit(
        &self,
        params: AuditPageParams,
    ) -> StoreResult<Vec<AuditEntry>> {
        let limit = i64::try_from(params.limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let rows = match &params.after {
            Some((at, id)) => {
                client
                    .query(
                        &format!(
                            "SELECT {AUDIT_COLUMNS} FROM audit_log WHERE (at, id) > ($1, $2)
                             ORDER BY at, id LIMIT $3"
                        ),
                        &[&at.as_millis(), id, &limit],
                    )
                    .await
            }
            None => {
                client
                    .query(
                        &format!("SELECT {AUDIT_COLUMNS} FROM audit_log ORDER BY at, id LIMIT $1"),
                        &[&limit],
                    )
                    .await
            }
        }
        .map_err(db_error)?;
        rows.iter().map(audit_from_row).collect()
    }

    pub(crate) async fn auth_purge_audit(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> StoreResult<usize> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let deleted = client
            .execute(
                "DELETE FROM audit_log WHERE (at, id) IN
                     (SELECT at, id FROM audit_log WHERE at < $1 ORDER BY at, id LIMIT $2)",
                &[&before.as_millis(), &limit],
            )
            .await
            .map_err(db_error)?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }
}

fn key_from_row(row: &tokio_postgres::Row) -> StoreResult<ApiKey> {
    let id: String = row.get(0);
    let tenant: Option<String> = row.get(1);
    let role: String = row.get(2);
    let hash: String = row.get(3);
    Ok(ApiKey {
        id: KeyId::parse(&id).ok_or_else(|| corrupt("api key id"))?,
        tenant: tenant.map(TenantName::new).transpose().map_err(corrupt)?,
        role: Role::parse(&role).map_err(corrupt)?,
        hash: KeyHash::from_stored(hash),
        created_at: Timestamp::from_millis(row.get(4)),
        expires_at: row.get::<_, Option<i64>>(5).map(Timestamp::from_millis),
        last_used_at: row.get::<_, Option<i64>>(6).map(Timestamp::from_millis),
    })
}

fn audit_from_row(row: &tokio_postgres::Row) -> StoreResult<AuditEntry> {
    let action: String = row.get(3);
    let tenant: Option<String> = row.get(4);
    Ok(AuditEntry {
        id: row.get(0),
        at: Timestamp::from_millis(row.get(1)),
        actor: row.get(2),
        action: AuditAction::parse(&action).ok_or_else(|| corrupt("audit action"))?,
        tenant: tenant.map(TenantName::new).transpose().map_err(corrupt)?,
        target: row.get(5),
    })
}
