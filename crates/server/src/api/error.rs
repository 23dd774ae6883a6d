//! Errors as the API answers them: an HTTP status, a stable code (one table,
//! [`error_code`]) and one sentence, in the body every error carries
//! (`sliver_api_types::ErrorBody`).

use crate::array::{ArrayError, ReplicationError};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sliver_api_types::{ErrorBody, ErrorDetail};

/// An API error: HTTP status, stable code, one sentence.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
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
        Replication(cause) => replication_code(cause),
        // `sliver restore` only: no request of the API restores.
        RestoreIntoArray(_) | Restore(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
    }
}

/// The stable code and HTTP status of each reason the off-site copy refuses or fails a request.
fn replication_code(cause: &ReplicationError) -> (StatusCode, &'static str) {
    use ReplicationError::*;
    match cause {
        InvalidPointName(_) => (StatusCode::BAD_REQUEST, "invalid_name"),
        PointExists(_) => (StatusCode::CONFLICT, "point_exists"),
        NotConfigured | Stopped | Flush(_) | Refused(_) => {
            (StatusCode::CONFLICT, "replication_stopped")
        }
        Store(_) => (StatusCode::BAD_GATEWAY, "store_error"),
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

pub(super) type ApiResult<T> = Result<T, ApiError>;

pub(super) async fn not_found() -> ApiError {
    not_found_error()
}

pub(crate) fn not_found_error() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such API route")
}

pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}
