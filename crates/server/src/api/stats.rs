//! What the array observed: cumulative statistics and their history, events, refused
//! initiators, live sessions and the Prometheus metrics.

use super::error::ApiResult;
use super::{blocking, ApiContext, ApiError, Ctx};
use crate::array::{now_ms, ArrayError};
use crate::history::{self, History, Point, Step};
use crate::metrics;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sliver_api_types::{EventsInfo, EventsQuery, HistoryInfo, HistoryQuery, Stats, VolumeStats};

pub(super) async fn stats(State(ctx): State<Ctx>) -> ApiResult<Json<Stats>> {
    blocking(move || {
        let time_ms = now_ms();
        let mut volumes = Vec::new();
        for record in ctx.array.volumes() {
            let Some(unit) = ctx.array.unit(&record.name) else {
                continue;
            };
            let data_reduction = unit.volume().space().map(|s| s.data_reduction)?;
            let stats = unit.stats();
            volumes.push(VolumeStats {
                name: record.name,
                data_reduction,
                classes: stats
                    .classes
                    .iter()
                    .map(|(c, s)| (c.name(), s.clone()))
                    .collect(),
                vaai: stats.vaai,
            });
        }
        Ok(Stats {
            time_ms,
            latency_bounds_us: sliver_scsi::LATENCY_BOUNDS_US,
            volumes,
        })
    })
    .await
    .map(Json)
}

pub(super) async fn events_list(
    State(ctx): State<Ctx>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> ApiResult<Json<EventsInfo>> {
    let Query(q) = q?;
    let after = q.after.unwrap_or(0);
    let limit = q
        .limit
        .unwrap_or(crate::events::KEPT)
        .min(crate::events::KEPT);
    let log = ctx.array.events();
    // Without `after`: the latest `limit` (what a page shows first); with it, what follows.
    let events = match q.after {
        Some(after) => log.after(after, limit),
        None => log.latest(limit),
    };
    let next = events
        .last()
        .map_or(after.min(log.next_seq() - 1), |e| e.seq);
    Ok(Json(EventsInfo { events, next }))
}

/// Initiators refused recently (unknown to every host), most recent last: what the console
/// offers to add to a host with one click.
pub(super) async fn refused_initiators(
    State(ctx): State<Ctx>,
) -> Json<Vec<crate::events::RefusedInitiator>> {
    Json(ctx.array.events().refused())
}

/// Logged-in iSCSI sessions (normal and discovery), by initiator name.
pub(super) async fn sessions_list(State(ctx): State<Ctx>) -> Json<Vec<crate::SessionSummary>> {
    Json(
        ctx.server
            .as_ref()
            .map(|s| s.sessions())
            .unwrap_or_default(),
    )
}

/// The points a history query asks for, from the array's history or one volume's.
fn history_answer(
    ctx: &ApiContext,
    q: Result<Query<HistoryQuery>, QueryRejection>,
    read: impl FnOnce(&History, Step, u64) -> Vec<Point>,
) -> ApiResult<Json<HistoryInfo>> {
    let Query(q) = q?;
    let step_seconds = q.step.unwrap_or(history::SAMPLE_SECONDS);
    let step = Step::from_seconds(step_seconds).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!(
                "step must be {} or {} seconds, not {step_seconds}",
                history::SAMPLE_SECONDS,
                history::COARSE_SECONDS
            ),
        )
    })?;
    let history = ctx.history.lock().unwrap_or_else(|e| e.into_inner());
    Ok(Json(HistoryInfo {
        step_seconds,
        latency_bounds_us: sliver_scsi::LATENCY_BOUNDS_US,
        points: read(&history, step, q.since.unwrap_or(0)),
    }))
}

pub(super) async fn array_history(
    State(ctx): State<Ctx>,
    q: Result<Query<HistoryQuery>, QueryRejection>,
) -> ApiResult<Json<HistoryInfo>> {
    history_answer(&ctx, q, |h, step, since| h.array(step, since))
}

pub(super) async fn volume_history(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
    q: Result<Query<HistoryQuery>, QueryRejection>,
) -> ApiResult<Json<HistoryInfo>> {
    if ctx.array.unit(&name).is_none() {
        return Err(ArrayError::NoSuchVolume(name).into());
    }
    history_answer(&ctx, q, |h, step, since| {
        h.volume(&name, step, since).unwrap_or_default()
    })
}

pub(super) async fn metrics_text(State(ctx): State<Ctx>) -> ApiResult<Response> {
    let text = blocking(move || metrics::render(&ctx.array)).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
