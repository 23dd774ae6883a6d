//! `/api/v1/volumes`: volumes, their snapshots and clones, and their connections to hosts.

use super::error::ApiResult;
use super::{blocking, ApiContext, ApiError, Ctx, JsonBody};
use crate::array::{ArrayError, VolumeKind, VolumeRecord};
use crate::Array;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use sliver_api_types::{
    Connect, ConnectionInfo, CreateVolume, NewName, UpdateVolume, VolumeInfo, WriteCache,
};
use std::net::SocketAddr;

pub(crate) fn volume_info(
    ctx: &ApiContext,
    record: &VolumeRecord,
) -> Result<VolumeInfo, ArrayError> {
    volume_info_among(ctx, record, &names_by_id(&ctx.array.volumes()))
}

fn names_by_id(all: &[VolumeRecord]) -> std::collections::HashMap<&str, &str> {
    all.iter()
        .map(|v| (v.id.as_str(), v.name.as_str()))
        .collect()
}

/// As [`volume_info`], with the source's name looked up in `names` (id -> name, built once
/// for a whole listing).
fn volume_info_among(
    ctx: &ApiContext,
    record: &VolumeRecord,
    names: &std::collections::HashMap<&str, &str>,
) -> Result<VolumeInfo, ArrayError> {
    let space = ctx.array.volume_space(&record.name)?;
    let (kind, read_only) = match record.kind {
        VolumeKind::Engine {
            read_only: true, ..
        } => ("snapshot", true),
        VolumeKind::Engine { .. } => ("engine", false),
        VolumeKind::Passthrough { .. } => ("passthrough", false),
    };
    let connections = ctx
        .array
        .connections()
        .into_iter()
        .filter(|c| c.volume == record.name)
        .map(|c| ConnectionInfo {
            url: lun_url(ctx, c.lun),
            host: c.host,
            lun: c.lun,
        })
        .collect();
    let unit = ctx.array.unit(&record.name);
    let vaai = unit.as_ref().map(|u| u.stats().vaai).unwrap_or_default();
    let write_cache = unit.as_ref().map_or(record.write_cache, |u| {
        WriteCache::from_wce(u.write_cache())
    });
    Ok(VolumeInfo {
        name: record.name.clone(),
        id: record.id.clone(),
        kind: kind.into(),
        read_only,
        block_size: record.block_size,
        provisioned_bytes: space.provisioned_bytes,
        mapped_bytes: space.mapped_bytes,
        thin_provisioning: space.thin_provisioning(),
        physical_bytes: space.unique_bytes,
        shared_bytes: space.shared_bytes,
        data_reduction: space.data_reduction,
        connections,
        vaai,
        created_ms: record.created_ms,
        source: record
            .source_id
            .as_ref()
            .and_then(|id| names.get(id.as_str()))
            .map(|n| n.to_string()),
        source_id: record.source_id.clone(),
        write_cache,
        write_cache_saved: record.write_cache,
    })
}

fn lun_url(ctx: &ApiContext, lun: u64) -> String {
    let portal = match ctx.portals.first() {
        // A wildcard listener is reachable on loopback from this machine.
        Some(p) if p.ip().is_unspecified() => {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), p.port()).to_string()
        }
        Some(p) => p.to_string(),
        None => "127.0.0.1:3260".into(),
    };
    format!("iscsi://{portal}/{}/{lun}", ctx.array.target_name())
}

fn find_volume(ctx: &ApiContext, name: &str) -> Result<VolumeRecord, ArrayError> {
    ctx.array
        .volumes()
        .into_iter()
        .find(|v| v.name == name)
        .ok_or_else(|| ArrayError::NoSuchVolume(name.into()))
}

pub(super) async fn volume_list(State(ctx): State<Ctx>) -> ApiResult<Json<Vec<VolumeInfo>>> {
    blocking(move || {
        let all = ctx.array.volumes();
        let names = names_by_id(&all);
        all.iter()
            .map(|r| volume_info_among(&ctx, r, &names))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map(Json)
}

pub(super) async fn volume_show(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
) -> ApiResult<Json<VolumeInfo>> {
    blocking(move || volume_info(&ctx, &find_volume(&ctx, &name)?))
        .await
        .map(Json)
}

pub(super) async fn volume_create(
    State(ctx): State<Ctx>,
    JsonBody(req): JsonBody<CreateVolume>,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    let block_size = req.block_size.unwrap_or(512);
    if block_size != 512 && block_size != 4096 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_block_size",
            format!("block size {block_size} is not supported: use 512 or 4096"),
        ));
    }
    let passthrough = match req.kind.as_deref() {
        None | Some("engine") => false,
        Some("passthrough") => true,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_kind",
                format!("volume kind '{other}' is not known: use engine or passthrough"),
            ))
        }
    };
    let write_cache = req.write_cache.unwrap_or_default();
    created_volume(ctx, req.name, move |array, name| {
        if passthrough {
            array.create_passthrough_volume(name, req.size_bytes, block_size, write_cache)
        } else {
            array.create_volume_caching(name, req.size_bytes, block_size, write_cache)
        }
    })
    .await
}

/// Make the volume `name` with `make` (off the async workers) and answer 201 Created with it.
async fn created_volume(
    ctx: Ctx,
    name: String,
    make: impl FnOnce(&Array, &str) -> Result<(), ArrayError> + Send + 'static,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    let info = blocking(move || {
        make(&ctx.array, &name)?;
        volume_info(&ctx, &find_volume(&ctx, &name)?)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub(super) async fn volume_update(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<UpdateVolume>,
) -> ApiResult<Json<VolumeInfo>> {
    blocking(move || {
        find_volume(&ctx, &name)?;
        if let Some(size) = req.size_bytes {
            ctx.array.resize_volume(&name, size)?;
        }
        if let Some(setting) = req.write_cache {
            ctx.array.set_write_cache(&name, setting)?;
        }
        let name = match req.name {
            Some(new) if new != name => {
                ctx.array.rename_volume(&name, &new)?;
                new
            }
            _ => name,
        };
        volume_info(&ctx, &find_volume(&ctx, &name)?)
    })
    .await
    .map(Json)
}

pub(super) async fn volume_delete(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    blocking(move || ctx.array.delete_volume(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn volume_snapshot(
    State(ctx): State<Ctx>,
    Path(source): Path<String>,
    JsonBody(req): JsonBody<NewName>,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    copied_volume(ctx, source, req.name, Array::snapshot_volume).await
}

pub(super) async fn volume_clone(
    State(ctx): State<Ctx>,
    Path(source): Path<String>,
    JsonBody(req): JsonBody<NewName>,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    copied_volume(ctx, source, req.name, Array::clone_volume).await
}

/// Make the volume `name` from `source` with `copy` (a snapshot or a clone) and answer 201
/// Created with it.
async fn copied_volume(
    ctx: Ctx,
    source: String,
    name: String,
    copy: fn(&Array, &str, &str) -> Result<(), ArrayError>,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    created_volume(ctx, name, move |array, name| copy(array, &source, name)).await
}

pub(super) async fn volume_connect(
    State(ctx): State<Ctx>,
    Path(volume): Path<String>,
    JsonBody(req): JsonBody<Connect>,
) -> ApiResult<(StatusCode, Json<ConnectionInfo>)> {
    if req.lun.is_some_and(|l| l > 16383) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_lun",
            "LUN numbers range from 0 to 16383",
        ));
    }
    let info = blocking(move || {
        let lun = ctx.array.connect(&volume, &req.host, req.lun)?;
        Ok(ConnectionInfo {
            url: lun_url(&ctx, lun),
            host: req.host,
            lun,
        })
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub(super) async fn volume_disconnect(
    State(ctx): State<Ctx>,
    Path((volume, host)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    blocking(move || ctx.array.disconnect(&volume, &host)).await?;
    Ok(StatusCode::NO_CONTENT)
}
