//! The HTTP management API (JSON over HTTP, default 127.0.0.1:8600) and Prometheus metrics,
//! over HTTPS when [`ApiContext::tls`] holds a certificate (always beyond loopback:
//! `crate::tls`).
//!
//! Routes live in [`ROUTES`] and in `openapi.json`; a test keeps the two identical and
//! checks that every documented route answers. Errors are JSON objects with a stable
//! `code` (see [`error_code`]) and one readable sentence. When a token is configured every
//! request, `/metrics` included, needs `Authorization: Bearer <token>`; `sliver serve`
//! refuses to listen beyond loopback without one. Before that, every request must address
//! sliver by a name an attacker cannot own ([`AllowedHosts`]: DNS rebinding).
//!
//! This module holds the router, the server and the history sampler. The handlers are split
//! by what they serve: `array`, `volumes`, `hosts`, `stats` (statistics and their history,
//! events, sessions, metrics) and `replication` (the off-site copy, hydration); `auth`
//! refuses a request before any of them runs, and `error` turns failures into answers. The
//! JSON bodies are the types of `sliver_api_types`.

mod array;
mod auth;
mod error;
mod hosts;
mod replication;
mod stats;
mod volumes;

pub use crate::allowed_hosts::AllowedHosts;
pub(crate) use error::not_found_error;
pub use error::{error_code, ApiError};

use crate::array::{now_ms, Array, ArrayError};
use crate::history::{self, Counters, History, SpaceReading};
use crate::tls::ApiListener;
use array::{array_show, array_update};
use auth::authorize;
use axum::extract::connect_info::Connected;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::IncomingStream;
use axum::{Json, Router};
use error::{method_not_allowed, not_found, ApiResult};
use hosts::{host_create, host_delete, host_list, host_update};
use replication::{hydration_show, point_delete, point_take, points_list, replication_show};
use stats::{
    array_history, events_list, metrics_text, refused_initiators, sessions_list, stats,
    volume_history,
};
use std::net::SocketAddr;
use std::sync::Arc;
use volumes::{
    volume_clone, volume_connect, volume_create, volume_delete, volume_disconnect, volume_list,
    volume_show, volume_snapshot, volume_update,
};

/// The OpenAPI 3 description of this API, served at `/api/openapi.json`.
pub const OPENAPI: &str = include_str!("../openapi.json");

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
    /// The certificate served over HTTPS; `None`: plain HTTP (loopback only).
    pub tls: Option<Arc<crate::tls::CertFiles>>,
    /// Wrong tokens by source address, which slow that address down.
    pub failed_logins: crate::throttle::FailedLogins,
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

/// Serve the API on `listener` (over HTTPS when `ctx.tls` is set) until `shutdown`
/// resolves, sampling the statistics history every [`history::SAMPLE_SECONDS`] meanwhile.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ctx: ApiContext,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls = match &ctx.tls {
        Some(certs) => Some(Arc::new(
            crate::tls::server_config(certs.clone()).map_err(std::io::Error::other)?,
        )),
        None => None,
    };
    let listener = ApiListener::new(listener, tls)?;
    let ctx = Arc::new(ctx);
    let sampler = tokio::spawn(sample_history(Arc::downgrade(&ctx)));
    let served = axum::serve(
        listener,
        router_shared(ctx).into_make_service_with_connect_info::<Peer>(),
    )
    .with_graceful_shutdown(shutdown)
    .await;
    sampler.abort();
    served
}

/// The address a request came from (`ConnectInfo<Peer>` in a request's extensions).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, ApiListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, ApiListener>) -> Self {
        Peer(*stream.remote_addr())
    }
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

/// A JSON request body; a body that is not the JSON expected is refused as every API error
/// is (`bad_request`).
struct JsonBody<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let Json(body) = Json::<T>::from_request(request, state).await?;
        Ok(JsonBody(body))
    }
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
