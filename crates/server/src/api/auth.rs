//! What refuses a request before it reaches a route: a `Host` an attacker could own (DNS
//! rebinding), a change sent by a page of another origin, a missing or wrong token. Every
//! answer leaves with its security headers.

use super::{ApiContext, ApiError, Ctx};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub(super) async fn authorize(State(ctx): State<Ctx>, request: Request, next: Next) -> Response {
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
        return Some(forbidden("host_not_allowed", &host, |shown| {
            format!(
                "the API does not answer requests addressed to '{shown}' (protection against DNS rebinding): use an IP address or localhost, or add the name to [api] allowed_hosts or --api-allowed-host"
            )
        }));
    }
    let changes = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    if changes {
        if let Some(origin) = request.headers().get(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes());
            if !same_origin(&origin, &host) {
                return Some(forbidden("origin_not_allowed", &origin, |shown| {
                    format!(
                        "changes are accepted only from sliver's own pages, not from a page of '{shown}'"
                    )
                }));
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

/// 403 Forbidden with `code`, its message quoting `sent` (a header of the request) up to 80
/// characters.
fn forbidden(code: &'static str, sent: &str, message: impl FnOnce(&str) -> String) -> ApiError {
    let shown: String = sent.chars().take(80).collect();
    ApiError::new(StatusCode::FORBIDDEN, code, message(&shown))
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
