//! The HTTP management API (JSON over HTTP, default 127.0.0.1:8600) and Prometheus metrics.
//!
//! Routes live in [`ROUTES`] and in `openapi.json`; a test keeps the two identical and
//! checks that every documented route answers. Errors are JSON objects with a stable
//! `code` (see [`error_code`]) and one readable sentence. When a token is configured every
//! request, `/metrics` included, needs `Authorization: Bearer <token>`; `sliver serve`
//! refuses to listen beyond loopback without one. Before that, every request must address
//! sliver by a name an attacker cannot own ([`AllowedHosts`]: DNS rebinding).

pub use crate::allowed_hosts::AllowedHosts;
use crate::array::now_ms;
use crate::array::{
    gc_priority_name, parse_gc_priority, validate_iscsi_name, Array, ArrayError, ChapChange,
    ChapSecret, VolumeKind, VolumeRecord,
};
use crate::history::{self, Counters, History, Point, SpaceReading, Step};
use crate::metrics;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sliver_api_types::{
    ArrayInfo, ClassStats, Connect, ConnectionInfo, CreateHost, CreateVolume, ErrorBody,
    ErrorDetail, EventsInfo, EventsQuery, GcInfo, HistoryInfo, HistoryQuery, HostInfo,
    HydrationInfo, NewName, PointInfo, ReplicationInfo, Stats, UpdateArray, UpdateHost,
    UpdateVolume, VaaiCounters, VolumeInfo, VolumeStats,
};
use std::net::SocketAddr;
use std::sync::Arc;

/// The OpenAPI 3 description of this API, served at `/api/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Every (method, path) the router serves, in OpenAPI path syntax.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/api/openapi.json"),
    ("get", "/api/v1/array"),
    ("patch", "/api/v1/array"),
    ("get", "/api/v1/volumes"),
    ("post", "/api/v1/volumes"),
    ("get", "/api/v1/volumes/{name}"),
    ("patch", "/api/v1/volumes/{name}"),
    ("delete", "/api/v1/volumes/{name}"),
    ("post", "/api/v1/volumes/{name}/snapshots"),
    ("post", "/api/v1/volumes/{name}/clones"),
    ("post", "/api/v1/volumes/{name}/connections"),
    ("delete", "/api/v1/volumes/{name}/connections/{host}"),
    ("get", "/api/v1/hosts"),
    ("post", "/api/v1/hosts"),
    ("patch", "/api/v1/hosts/{name}"),
    ("delete", "/api/v1/hosts/{name}"),
    ("get", "/api/v1/stats"),
    ("get", "/api/v1/stats/history"),
    ("get", "/api/v1/events"),
    ("get", "/api/v1/initiators/refused"),
    ("get", "/api/v1/sessions"),
    ("get", "/api/v1/replication"),
    ("get", "/api/v1/hydration"),
    ("get", "/api/v1/replication/points"),
    ("post", "/api/v1/replication/points"),
    ("delete", "/api/v1/replication/points/{name}"),
    ("get", "/api/v1/volumes/{name}/history"),
    ("get", "/metrics"),
];

/// What the API serves from.
pub struct ApiContext {
    pub array: Arc<Array>,
    /// The iSCSI portals, for the URLs the API prints.
    pub portals: Vec<SocketAddr>,
    /// Bearer token every request must carry; `None`: no authentication (loopback only).
    pub token: Option<String>,
    /// Names the `Host` header may carry besides IP literals and `localhost`.
    pub allowed_hosts: AllowedHosts,
    /// Rates over the last hour and day, sampled by [`serve`] (RFC 0002).
    pub history: Arc<std::sync::Mutex<History>>,
    /// The iSCSI server, for its live sessions (`None`: an API without one lists none).
    pub server: Option<Arc<crate::Server>>,
}

type Ctx = Arc<ApiContext>;

/// The API's router.
pub fn router(ctx: ApiContext) -> Router {
    router_shared(Arc::new(ctx))
}

fn router_shared(ctx: Ctx) -> Router {
    let routes = Router::new()
        .route("/api/openapi.json", get(openapi))
        .route("/api/v1/array", get(array_show).patch(array_update))
        .route("/api/v1/volumes", get(volume_list).post(volume_create))
        .route(
            "/api/v1/volumes/{name}",
            get(volume_show).patch(volume_update).delete(volume_delete),
        )
        .route(
            "/api/v1/volumes/{name}/snapshots",
            axum::routing::post(volume_snapshot),
        )
        .route(
            "/api/v1/volumes/{name}/clones",
            axum::routing::post(volume_clone),
        )
        .route(
            "/api/v1/volumes/{name}/connections",
            axum::routing::post(volume_connect),
        )
        .route(
            "/api/v1/volumes/{name}/connections/{host}",
            axum::routing::delete(volume_disconnect),
        )
        .route("/api/v1/hosts", get(host_list).post(host_create))
        .route(
            "/api/v1/hosts/{name}",
            axum::routing::patch(host_update).delete(host_delete),
        )
        .route("/api/v1/stats", get(stats))
        .route("/api/v1/stats/history", get(array_history))
        .route("/api/v1/events", get(events_list))
        .route("/api/v1/initiators/refused", get(refused_initiators))
        .route("/api/v1/sessions", get(sessions_list))
        .route("/api/v1/replication", get(replication_show))
        .route("/api/v1/hydration", get(hydration_show))
        .route(
            "/api/v1/replication/points",
            get(points_list).post(point_take),
        )
        .route(
            "/api/v1/replication/points/{name}",
            axum::routing::delete(point_delete),
        )
        .route("/api/v1/volumes/{name}/history", get(volume_history))
        .route("/metrics", get(metrics_text))
        // The console (RFC 0002): not API routes, so not in ROUTES or the OpenAPI document.
        .route("/", get(crate::console::index))
        .route("/console/{*file}", get(crate::console::file))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    routes
        .layer(axum::middleware::from_fn_with_state(ctx.clone(), authorize))
        // Bodies are small JSON documents.
        .layer(axum::extract::DefaultBodyLimit::max(64 << 10))
        .with_state(ctx)
}

/// Serve the API on `listener` until `shutdown` resolves, sampling the statistics history
/// every [`history::SAMPLE_SECONDS`] meanwhile.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ctx: ApiContext,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ctx = Arc::new(ctx);
    let sampler = tokio::spawn(sample_history(Arc::downgrade(&ctx)));
    let served = axum::serve(listener, router_shared(ctx))
        .with_graceful_shutdown(shutdown)
        .await;
    sampler.abort();
    served
}

/// Samples the history until the API is gone. A reading costs O(volumes): counters only.
async fn sample_history(ctx: std::sync::Weak<ApiContext>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(history::SAMPLE_SECONDS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(ctx) = ctx.upgrade() else {
            return;
        };
        let _ =
            tokio::task::spawn_blocking(move || record_history(&ctx.array, &ctx.history, now_ms()))
                .await;
    }
}

/// Reads every counter of `array` once and adds the reading to `history`, as taken at
/// `now_ms` (the sampler passes the wall clock; tests pass their own).
pub fn record_history(array_ref: &Array, history: &std::sync::Mutex<History>, now_ms: u64) {
    let space = array_ref.engine_space();
    let mut array = Counters {
        space: Some(SpaceReading {
            physical_used_bytes: space.physical_used_bytes,
            live_bytes: space.live_bytes,
            reclaimable_bytes: space.reclaimable_bytes,
            mapped_bytes: space.logical_mapped_bytes,
            provisioned_bytes: space.provisioned_bytes,
            data_reduction: space.data_reduction,
            host_written_bytes: space.host_written_bytes,
            gc_relocated_bytes: space.gc_relocated_bytes,
        }),
        ..Counters::default()
    };
    let mut volumes = Vec::new();
    for record in array_ref.volumes() {
        let Some(unit) = array_ref.unit(&record.name) else {
            continue;
        };
        let stats = unit.stats();
        let mut c = Counters::default();
        history::add_classes(&mut c.classes, &stats.classes);
        c.vaai.add(&stats.vaai);
        history::add_classes(&mut array.classes, &stats.classes);
        array.vaai.add(&stats.vaai);
        volumes.push((record.name, c));
    }
    history
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .record(now_ms, array, volumes);
    let used = if space.capacity_bytes > 0 {
        space.physical_used_bytes as f64 / space.capacity_bytes as f64
    } else {
        0.0
    };
    array_ref.events().observe(
        now_ms,
        space.soft_threshold_exceeded,
        used,
        array_ref.engine().poisoned(),
    );
}

/// An API error: HTTP status, stable code, one sentence.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl ApiError {
    /// The sentence describing the error.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn code(&self) -> &'static str {
        self.code
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.into(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

/// The stable code and HTTP status of each array error.
pub fn error_code(e: &ArrayError) -> (StatusCode, &'static str) {
    use ArrayError::*;
    match e {
        NoSuchVolume(_) => (StatusCode::NOT_FOUND, "volume_not_found"),
        NoSuchHost(_) => (StatusCode::NOT_FOUND, "host_not_found"),
        NotConnected { .. } => (StatusCode::NOT_FOUND, "not_connected"),
        VolumeExists(_) => (StatusCode::CONFLICT, "volume_exists"),
        HostExists(_) => (StatusCode::CONFLICT, "host_exists"),
        LunInUse { .. } => (StatusCode::CONFLICT, "lun_in_use"),
        AlreadyConnected { .. } => (StatusCode::CONFLICT, "already_connected"),
        VolumeConnected { .. } => (StatusCode::CONFLICT, "volume_connected"),
        HostInUse { .. } => (StatusCode::CONFLICT, "host_in_use"),
        InvalidName(_) => (StatusCode::BAD_REQUEST, "invalid_name"),
        InvalidSize(_) => (StatusCode::BAD_REQUEST, "invalid_size"),
        Shrink { .. } => (StatusCode::BAD_REQUEST, "shrink_not_supported"),
        NotSupported(_) => (StatusCode::BAD_REQUEST, "not_supported"),
        InvalidSetting(_) => (StatusCode::BAD_REQUEST, "invalid_setting"),
        InvalidIscsiName(_) => (StatusCode::BAD_REQUEST, "invalid_iqn"),
        InvalidChap(_) => (StatusCode::BAD_REQUEST, "invalid_chap"),
        Engine(_) => (StatusCode::INTERNAL_SERVER_ERROR, "engine_error"),
        Volume(_) | Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "io_error"),
        Config { .. } | Locked(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
    }
}

impl From<ArrayError> for ApiError {
    fn from(e: ArrayError) -> Self {
        let (status, code) = error_code(&e);
        ApiError::new(status, code, e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text())
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Array operations write and fsync the configuration: keep them off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ArrayError> + Send + 'static,
) -> ApiResult<T> {
    off_workers(f).await?.map_err(ApiError::from)
}

/// Run `f` on the blocking pool (it waits for the disk or the object store).
async fn off_workers<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            e.to_string(),
        )
    })
}

async fn authorize(State(ctx): State<Ctx>, request: Request, next: Next) -> Response {
    let console = crate::console::is_console_path(request.uri().path());
    let mut response = match refusal(&ctx, &request, console) {
        Some(refused) => refused.into_response(),
        None => next.run(request).await,
    };
    if console {
        crate::console::console_headers(response.headers_mut());
    } else {
        crate::console::api_headers(response.headers_mut());
    }
    response
}

/// Why `request` is refused before it reaches a route, if it is: a `Host` an attacker could
/// own (DNS rebinding), a change sent by a page of another origin, a missing token (the
/// console's static files need none).
fn refusal(ctx: &ApiContext, request: &Request, console: bool) -> Option<ApiError> {
    let host = request
        .headers()
        .get(header::HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if !ctx.allowed_hosts.permits(&host) {
        let shown: String = host.chars().take(80).collect();
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            "host_not_allowed",
            format!(
                "the API does not answer requests addressed to '{shown}' (protection against DNS rebinding): use an IP address or localhost, or add the name to [api] allowed_hosts or --api-allowed-host"
            ),
        ));
    }
    let changes = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    if changes {
        if let Some(origin) = request.headers().get(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes());
            if !same_origin(&origin, &host) {
                let shown: String = origin.chars().take(80).collect();
                return Some(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "origin_not_allowed",
                    format!(
                        "changes are accepted only from sliver's own pages, not from a page of '{shown}'"
                    ),
                ));
            }
        }
    }
    if let Some(token) = &ctx.token {
        if !console && !bearer_matches(request.headers(), token) {
            return Some(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid API token is required (Authorization: Bearer <token>)",
            ));
        }
    }
    None
}

/// Whether an `Origin` header (`http://name:port`) names the host and port the request was
/// sent to (its `Host` header). A page's own requests carry its origin; `null` (a sandboxed
/// frame, a file) never matches.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let authority = authority.trim_end_matches('/');
    !authority.is_empty() && authority.eq_ignore_ascii_case(host.trim())
}

/// Constant-time comparison of the presented bearer token.
fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(presented) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (presented.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found() -> ApiError {
    not_found_error()
}

pub(crate) fn not_found_error() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such API route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

// ---- array ----

async fn array_show(State(ctx): State<Ctx>) -> Json<ArrayInfo> {
    Json(array_info(&ctx))
}

async fn array_update(
    State(ctx): State<Ctx>,
    body: Result<Json<UpdateArray>, JsonRejection>,
) -> ApiResult<Json<ArrayInfo>> {
    let Json(req) = body?;
    let gc = req
        .gc_priority
        .as_deref()
        .map(parse_gc_priority)
        .transpose()
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, "invalid_setting", m))?;
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
    }
}

// ---- volumes ----

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
    let vaai = ctx
        .array
        .unit(&record.name)
        .map(|u| vaai_counters(&u.stats().vaai))
        .unwrap_or_default();
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

async fn volume_list(State(ctx): State<Ctx>) -> ApiResult<Json<Vec<VolumeInfo>>> {
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

async fn volume_show(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
) -> ApiResult<Json<VolumeInfo>> {
    blocking(move || volume_info(&ctx, &find_volume(&ctx, &name)?))
        .await
        .map(Json)
}

async fn volume_create(
    State(ctx): State<Ctx>,
    body: Result<Json<CreateVolume>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    let Json(req) = body?;
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
    let info = blocking(move || {
        if passthrough {
            ctx.array
                .create_passthrough_volume(&req.name, req.size_bytes, block_size)?;
        } else {
            ctx.array
                .create_volume(&req.name, req.size_bytes, block_size)?;
        }
        volume_info(&ctx, &find_volume(&ctx, &req.name)?)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

async fn volume_update(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
    body: Result<Json<UpdateVolume>, JsonRejection>,
) -> ApiResult<Json<VolumeInfo>> {
    let Json(req) = body?;
    blocking(move || {
        find_volume(&ctx, &name)?;
        if let Some(size) = req.size_bytes {
            ctx.array.resize_volume(&name, size)?;
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

async fn volume_delete(State(ctx): State<Ctx>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    blocking(move || ctx.array.delete_volume(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn volume_snapshot(
    State(ctx): State<Ctx>,
    Path(source): Path<String>,
    body: Result<Json<NewName>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    let Json(req) = body?;
    let info = blocking(move || {
        ctx.array.snapshot_volume(&source, &req.name)?;
        volume_info(&ctx, &find_volume(&ctx, &req.name)?)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

async fn volume_clone(
    State(ctx): State<Ctx>,
    Path(source): Path<String>,
    body: Result<Json<NewName>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<VolumeInfo>)> {
    let Json(req) = body?;
    let info = blocking(move || {
        ctx.array.clone_volume(&source, &req.name)?;
        volume_info(&ctx, &find_volume(&ctx, &req.name)?)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

async fn volume_connect(
    State(ctx): State<Ctx>,
    Path(volume): Path<String>,
    body: Result<Json<Connect>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<ConnectionInfo>)> {
    let Json(req) = body?;
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

async fn volume_disconnect(
    State(ctx): State<Ctx>,
    Path((volume, host)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    blocking(move || ctx.array.disconnect(&volume, &host)).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- hosts ----

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

async fn host_list(State(ctx): State<Ctx>) -> Json<Vec<HostInfo>> {
    let connections = ctx.array.connections();
    Json(
        ctx.array
            .hosts()
            .into_iter()
            .map(|h| host_info(h, &connections))
            .collect(),
    )
}

async fn host_create(
    State(ctx): State<Ctx>,
    body: Result<Json<CreateHost>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<HostInfo>)> {
    let Json(req) = body?;
    for iqn in &req.iqns {
        validate_iscsi_name(iqn)?;
    }
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
        chap_user: chap.as_ref().map(|c| c.user.clone()),
        volumes: vec![],
    };
    blocking(move || ctx.array.create_host(&req.name, req.iqns, chap)).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

async fn host_update(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
    body: Result<Json<UpdateHost>, JsonRejection>,
) -> ApiResult<Json<HostInfo>> {
    let Json(req) = body?;
    for iqn in req.iqns.iter().flatten() {
        validate_iscsi_name(iqn)?;
    }
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
    let host = blocking(move || array.array.update_host(&name, req.iqns, chap)).await?;
    Ok(Json(host_info(host, &ctx.array.connections())))
}

async fn host_delete(State(ctx): State<Ctx>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    blocking(move || ctx.array.delete_host(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- statistics ----

/// An LU's VAAI counters as the API shows them (a test keeps the two JSON forms equal).
fn vaai_counters(v: &sliver_scsi::VaaiCounters) -> VaaiCounters {
    VaaiCounters {
        ats: v.ats,
        ats_failed: v.ats_failed,
        clone_read: v.clone_read,
        clone_write: v.clone_write,
        clone_failed: v.clone_failed,
        zero: v.zero,
        zero_failed: v.zero_failed,
        delete: v.delete,
        delete_failed: v.delete_failed,
        deleted_bytes: v.deleted_bytes,
        cloned_bytes: v.cloned_bytes,
        zeroed_bytes: v.zeroed_bytes,
    }
}

/// A command class's counters as the API shows them.
fn class_stats(s: &sliver_scsi::ClassStats) -> ClassStats {
    ClassStats {
        commands: s.commands,
        errors: s.errors,
        bytes: s.bytes,
        latency_sum_us: s.latency_sum_us,
        latency_buckets: s.latency_buckets.clone(),
    }
}

async fn stats(State(ctx): State<Ctx>) -> ApiResult<Json<Stats>> {
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
                    .map(|(c, s)| (c.name(), class_stats(s)))
                    .collect(),
                vaai: vaai_counters(&stats.vaai),
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

async fn events_list(
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
async fn refused_initiators(State(ctx): State<Ctx>) -> Json<Vec<crate::events::RefusedInitiator>> {
    Json(ctx.array.events().refused())
}

async fn hydration_show(State(ctx): State<Ctx>) -> Json<HydrationInfo> {
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

async fn points_list(State(ctx): State<Ctx>) -> ApiResult<Json<Vec<PointInfo>>> {
    let points = ctx.array.replication_points().ok_or_else(no_replication)?;
    Ok(Json(points.iter().map(point_info).collect()))
}

/// How long `POST /api/v1/replication/points` waits for the store before it answers that the
/// point is still on its way.
const POINT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

async fn point_take(
    State(ctx): State<Ctx>,
    body: Result<Json<NewName>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<PointInfo>)> {
    let Json(req) = body?;
    if ctx.array.replication().is_none() {
        return Err(no_replication());
    }
    let array = ctx.array.clone();
    let name = req.name.clone();
    let rx = off_workers(move || array.take_replication_point(&name))
        .await?
        .map_err(|m| {
            let code = if m.contains("exists") {
                (StatusCode::CONFLICT, "point_exists")
            } else if m.contains("name") {
                (StatusCode::BAD_REQUEST, "invalid_name")
            } else {
                (StatusCode::CONFLICT, "replication_stopped")
            };
            ApiError::new(code.0, code.1, m)
        })?;
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

async fn point_delete(State(ctx): State<Ctx>, Path(name): Path<String>) -> ApiResult<StatusCode> {
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
        Err(m) => Err(ApiError::new(StatusCode::BAD_GATEWAY, "store_error", m)),
    }
}

async fn replication_show(State(ctx): State<Ctx>) -> Json<ReplicationInfo> {
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
        lag_seconds: s
            .oldest_unshipped
            .map_or(0.0, |t| t.elapsed().as_secs_f64()),
        resyncs: s.resyncs,
        last_restart: s.last_restart.clone(),
        newest_point: s.newest_point.as_ref().map(point_info),
        deleted_objects: s.deleted_objects,
    })
}

/// Logged-in iSCSI sessions (normal and discovery), by initiator name.
async fn sessions_list(State(ctx): State<Ctx>) -> Json<Vec<crate::SessionSummary>> {
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

async fn array_history(
    State(ctx): State<Ctx>,
    q: Result<Query<HistoryQuery>, QueryRejection>,
) -> ApiResult<Json<HistoryInfo>> {
    history_answer(&ctx, q, |h, step, since| h.array(step, since))
}

async fn volume_history(
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

async fn metrics_text(State(ctx): State<Ctx>) -> ApiResult<Response> {
    let text = blocking(move || metrics::render(&ctx)).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API's copies of the LU's counters serialise exactly as the counters themselves
    /// did when the API sent those: same names, same order. Every field is set, so a counter
    /// added to the LU stops this compiling until the API shows it too.
    #[test]
    fn counters_keep_their_json_in_the_api_types() {
        let vaai = sliver_scsi::VaaiCounters {
            ats: 1,
            ats_failed: 2,
            clone_read: 3,
            clone_write: 4,
            clone_failed: 5,
            zero: 6,
            zero_failed: 7,
            delete: 8,
            delete_failed: 9,
            deleted_bytes: 10,
            cloned_bytes: 11,
            zeroed_bytes: 12,
        };
        assert_eq!(
            serde_json::to_string(&vaai_counters(&vaai)).unwrap(),
            serde_json::to_string(&vaai).unwrap()
        );
        let class = sliver_scsi::ClassStats {
            commands: 1,
            errors: 2,
            bytes: 3,
            latency_sum_us: 4,
            latency_buckets: vec![5, 6],
        };
        assert_eq!(
            serde_json::to_string(&class_stats(&class)).unwrap(),
            serde_json::to_string(&class).unwrap()
        );
    }
}
