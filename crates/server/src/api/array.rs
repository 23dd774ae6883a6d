//! `/api/v1/array`: the array's space and GC figures, and its settings.

use super::error::ApiResult;
use super::{blocking, ApiContext, ApiError, Ctx, JsonBody};
use crate::array::{gc_priority_name, parse_gc_priority};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use sliver_api_types::{ArrayInfo, GcInfo, UpdateArray};

pub(super) async fn array_show(State(ctx): State<Ctx>) -> Json<ArrayInfo> {
    Json(array_info(&ctx))
}

pub(super) async fn array_update(
    State(ctx): State<Ctx>,
    JsonBody(req): JsonBody<UpdateArray>,
) -> ApiResult<Json<ArrayInfo>> {
    let gc = req
        .gc_priority
        .as_deref()
        .map(parse_gc_priority)
        .transpose()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_setting", e.to_string()))?;
    blocking(move || {
        if let Some(t) = req.soft_threshold {
            ctx.array.set_soft_threshold(t)?;
        }
        if let Some(p) = gc {
            ctx.array.set_gc_priority(p)?;
        }
        Ok(array_info(&ctx))
    })
    .await
    .map(Json)
}

pub(crate) fn array_info(ctx: &ApiContext) -> ArrayInfo {
    let space = ctx.array.engine_space();
    let tuning = ctx.array.engine().tuning();
    ArrayInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        target_name: ctx.array.target_name(),
        portals: ctx.portals.iter().map(|p| p.to_string()).collect(),
        capacity_bytes: space.capacity_bytes,
        physical_used_bytes: space.physical_used_bytes,
        anchored_bytes: space.anchored_bytes,
        live_bytes: space.live_bytes,
        reclaimable_bytes: space.reclaimable_bytes,
        provisioned_bytes: space.provisioned_bytes,
        mapped_bytes: space.logical_mapped_bytes,
        data_reduction: space.data_reduction,
        total_reduction: space.total_reduction,
        soft_threshold: tuning.soft_threshold,
        soft_threshold_exceeded: space.soft_threshold_exceeded,
        gc: GcInfo {
            priority: gc_priority_name(tuning.gc),
            write_amplification: space.write_amplification,
            host_written_bytes: space.host_written_bytes,
            relocated_bytes: space.gc_relocated_bytes,
        },
        volumes: ctx.array.volumes().len(),
        hosts: ctx.array.hosts().len(),
        started_ms: ctx.array.opened_ms(),
        poisoned: ctx.array.engine().poisoned(),
        tls_fingerprint: ctx.tls.as_ref().map(|t| t.fingerprint().to_string()),
    }
}
