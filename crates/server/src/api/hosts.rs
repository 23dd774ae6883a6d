//! `/api/v1/hosts`: hosts, their initiator names and CHAP credentials.

use super::error::ApiResult;
use super::{blocking, ApiError, Ctx, JsonBody};
use crate::array::{ArrayError, ChapChange, ChapSecret};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use sliver_api_types::{CreateHost, HostInfo, IscsiName, UpdateHost};

/// A host as the API shows it (never its secret), with the volumes connected to it.
fn host_info(
    h: crate::array::HostRecord,
    connections: &[crate::array::ConnectionRecord],
) -> HostInfo {
    HostInfo {
        volumes: connections
            .iter()
            .filter(|c| c.host == h.name)
            .map(|c| c.volume.clone())
            .collect(),
        chap_user: h.chap.map(|c| c.user),
        iqns: h.iqns,
        name: h.name,
    }
}

/// The initiator names of a request, each checked (the first that is not one is refused as
/// `invalid_iqn`).
fn iscsi_names(iqns: &[String]) -> Result<Vec<IscsiName>, ArrayError> {
    iqns.iter()
        .map(|iqn| Ok(IscsiName::new(iqn.as_str())?))
        .collect()
}

pub(super) async fn host_list(State(ctx): State<Ctx>) -> Json<Vec<HostInfo>> {
    let connections = ctx.array.connections();
    Json(
        ctx.array
            .hosts()
            .into_iter()
            .map(|h| host_info(h, &connections))
            .collect(),
    )
}

pub(super) async fn host_create(
    State(ctx): State<Ctx>,
    JsonBody(req): JsonBody<CreateHost>,
) -> ApiResult<(StatusCode, Json<HostInfo>)> {
    let iqns = iscsi_names(&req.iqns)?;
    let chap = match (req.chap_user, req.chap_secret) {
        (None, None) => None,
        (Some(user), Some(secret)) => Some(ChapSecret::new(user, secret)?),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_chap",
                "give both chap_user and chap_secret, or neither",
            ))
        }
    };
    let info = HostInfo {
        name: req.name.clone(),
        iqns: req.iqns.clone(),
        chap_user: chap.as_ref().map(|c| c.user().to_string()),
        volumes: vec![],
    };
    blocking(move || ctx.array.create_host(&req.name, iqns, chap)).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub(super) async fn host_update(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<UpdateHost>,
) -> ApiResult<Json<HostInfo>> {
    let iqns = req.iqns.as_deref().map(iscsi_names).transpose()?;
    let invalid_chap = |m: &str| ApiError::new(StatusCode::BAD_REQUEST, "invalid_chap", m);
    let chap = match (req.chap_user, req.chap_secret, req.clear_chap) {
        (None, None, false) => ChapChange::Keep,
        (None, None, true) => ChapChange::Clear,
        (Some(user), Some(secret), false) => ChapChange::Set(ChapSecret::new(user, secret)?),
        (_, _, true) => {
            return Err(invalid_chap(
                "give clear_chap, or chap_user and chap_secret, not both",
            ))
        }
        _ => {
            return Err(invalid_chap(
                "give both chap_user and chap_secret, or neither",
            ))
        }
    };
    let array = ctx.clone();
    let host = blocking(move || array.array.update_host(&name, iqns, chap)).await?;
    Ok(Json(host_info(host, &ctx.array.connections())))
}

pub(super) async fn host_delete(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    blocking(move || ctx.array.delete_host(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}
