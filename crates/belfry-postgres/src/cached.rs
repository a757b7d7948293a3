//! Cached prepared statements run on a connection or in a transaction,
//! their errors as store errors.

use belfry_store::StoreResult;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::error::{corrupt, db_error};

/// The values of a statement's `$n` parameters.
pub(crate) type Params<'a> = [&'a (dyn ToSql + Sync)];

/// The rows it changed.
pub(crate) async fn execute(
    client: &impl GenericClient,
    sql: &str,
    params: &Params<'_>,
) -> StoreResult<u64> {
    let statement = client.prepare_cached(sql).await.map_err(db_error)?;
    client.execute(&statement, params).await.map_err(db_error)
}

/// Its rows (`first()` of a lookup by key).
pub(crate) async fn query(
    client: &impl GenericClient,
    sql: &str,
    params: &Params<'_>,
) -> StoreResult<Vec<Row>> {
    let statement = client.prepare_cached(sql).await.map_err(db_error)?;
    client.query(&statement, params).await.map_err(db_error)
}

/// Its first row: an aggregate's one row.
pub(crate) async fn query_one(
    client: &impl GenericClient,
    sql: &str,
    params: &Params<'_>,
) -> StoreResult<Row> {
    query(client, sql, params)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| corrupt("a statement answered no row"))
}
