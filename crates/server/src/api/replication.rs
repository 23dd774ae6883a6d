//! The off-site copy (RFC 0003): its state, its restore points, and the hydration of an
//! array restored from it.

use super::error::ApiResult;
use super::{off_workers, ApiError, Ctx, JsonBody};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use sliver_api_types::{HydrationInfo, NewName, PointInfo, ReplicationInfo};

pub(super) async fn hydration_show(State(ctx): State<Ctx>) -> Json<HydrationInfo> {
    Json(match ctx.array.hydration() {
        None => HydrationInfo {
            done: true,
            ..HydrationInfo::default()
        },
        Some(h) => HydrationInfo {
            active: true,
            done: h.done,
            source: Some(h.source),
            bytes_left: h.bytes_left,
            ranges: h.ranges,
            bytes_at_start: h.bytes_at_start,
            fetched_bytes: h.fetched_bytes,
            on_demand_fetches: h.on_demand_fetches,
            on_demand_bytes: h.on_demand_bytes,
            rate: h.rate,
            error: h.error,
        },
    })
}

/// A restore point as the API shows it.
fn point_info(p: &sliver_replica::catalog::Point) -> PointInfo {
    PointInfo {
        name: p.name.clone(),
        scheduled: p.scheduled,
        time: sliver_replica::catalog::utc(p.time_ms),
        time_ms: p.time_ms,
        through: p.through,
        base: p.base,
    }
}

fn no_replication() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "replication_not_configured",
        "this array ships no off-site copy: start it with --replicate-to or [replication]",
    )
}

pub(super) async fn points_list(State(ctx): State<Ctx>) -> ApiResult<Json<Vec<PointInfo>>> {
    let points = ctx.array.replication_points().ok_or_else(no_replication)?;
    Ok(Json(points.iter().map(point_info).collect()))
}

/// How long `POST /api/v1/replication/points` waits for the store before it answers that the
/// point is still on its way.
const POINT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

pub(super) async fn point_take(
    State(ctx): State<Ctx>,
    JsonBody(req): JsonBody<NewName>,
) -> ApiResult<(StatusCode, Json<PointInfo>)> {
    if ctx.array.replication().is_none() {
        return Err(no_replication());
    }
    let array = ctx.array.clone();
    let name = req.name.clone();
    let rx = off_workers(move || array.take_replication_point(&name)).await??;
    let answer = off_workers(move || rx.recv_timeout(POINT_WAIT)).await?;
    match answer {
        Ok(Ok(p)) => Ok((StatusCode::CREATED, Json(point_info(&p)))),
        Ok(Err(m)) => Err(ApiError::new(StatusCode::CONFLICT, "point_refused", m)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "point_pending",
            format!(
                "the store has not taken point {:?} within {} s (see GET /api/v1/replication): it is created once the store holds the writes before it",
                req.name,
                POINT_WAIT.as_secs()
            ),
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "replication_stopped",
            "replication stopped before the point reached the store",
        )),
    }
}

pub(super) async fn point_delete(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    if ctx.array.replication().is_none() {
        return Err(no_replication());
    }
    let deleted =
        off_workers(move || ctx.array.delete_replication_point(&name).map(|p| (p, name))).await?;
    match deleted {
        Ok((Some(_), _)) => Ok(StatusCode::NO_CONTENT),
        Ok((None, name)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "point_not_found",
            format!("no restore point named {name:?}"),
        )),
        // The copy stopping under the request is the only other cause, and was always
        // answered as the store's.
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "store_error",
            e.to_string(),
        )),
    }
}

pub(super) async fn replication_show(State(ctx): State<Ctx>) -> Json<ReplicationInfo> {
    use sliver_replica::ship::ShipState;
    let Some(r) = ctx.array.replication() else {
        return Json(ReplicationInfo {
            configured: false,
            target: None,
            state: None,
            error: None,
            pool: None,
            shipped_through: 0,
            shipped_objects: 0,
            shipped_bytes: 0,
            backlog_bytes: 0,
            lag_seconds: 0.0,
            resyncs: 0,
            last_restart: None,
            newest_point: None,
            deleted_objects: 0,
        });
    };
    let s = r.status;
    let (state, why) = match &s.state {
        ShipState::Base => ("base", None),
        ShipState::Streaming => ("streaming", None),
        ShipState::Fenced(w) => ("fenced", Some(w.clone())),
        ShipState::Broken(w) => ("broken", Some(w.clone())),
        ShipState::Waiting(w) => ("waiting", Some(w.clone())),
        ShipState::Stopped => ("stopped", None),
    };
    Json(ReplicationInfo {
        configured: true,
        target: Some(r.target),
        state: Some(state),
        error: why.or(s.last_error),
        // Unknown until the store has been read (a new array's copy waiting for the store).
        pool: (s.pool != [0; 16]).then(|| sliver_replica::object::hex(&s.pool)),
        shipped_through: s.shipped_through,
        shipped_objects: s.objects,
        shipped_bytes: s.bytes,
        backlog_bytes: s.backlog_bytes,
        lag_seconds: s.lag.map_or(0.0, |t| t.as_secs_f64()),
        resyncs: s.resyncs,
        last_restart: s.last_restart.clone(),
        newest_point: s.newest_point.as_ref().map(point_info),
        deleted_objects: s.deleted_objects,
    })
}
