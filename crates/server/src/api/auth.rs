//! What refuses a request before it reaches a route: a `Host` an attacker could own (DNS
//! rebinding), a change sent by a page of another origin, a missing or wrong token (an
//! address that keeps sending wrong ones is slowed down: `crate::throttle`). Every answer
//! leaves with its security headers.

use super::{ApiContext, ApiError, Ctx, Peer};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use subtle::ConstantTimeEq;

pub(super) async fn authorize(State(ctx): State<Ctx>, request: Request, next: Next) -> Response {
    let console = crate::console::is_console_path(request.uri().path());
    let mut refused = refusal(&ctx, &request);
    if refused.is_none() && !console {
        let peer = request
            .extensions()
            .get::<ConnectInfo<Peer>>()
            .map(|c| c.0 .0.ip());
        refused = token_refusal(&ctx, request.headers(), peer).await;
    }
    let mut response = match refused {
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

/// Why `request` is refused before its token is looked at, if it is: a `Host` an attacker
/// could own (DNS rebinding), a change sent by a page of another origin.
fn refusal(ctx: &ApiContext, request: &Request) -> Option<ApiError> {
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
    None
}

/// Why a request that needs the token is refused, if it is: no token, a wrong one, or too
/// many wrong ones from its address waiting already. A wrong token from an address that
/// sent several is checked only after its delay (`crate::throttle`); a request without
/// any token is no guess and waits for nothing.
async fn token_refusal(
    ctx: &ApiContext,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Option<ApiError> {
    let token = ctx.token.as_ref()?;
    let unauthorized = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API token is required (Authorization: Bearer <token>)",
        )
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Some(unauthorized());
    };
    // A malformed header is a wrong token, not a missing one.
    let presented = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if let Some(ip) = peer {
        if !ctx.failed_logins.wait_turn(ip).await {
            return Some(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_attempts",
                format!("too many wrong API tokens from {ip}: its requests are slowed down, try again in a few seconds with the right token"),
            ));
        }
    }
    if secrets_match(presented.as_bytes(), token.as_bytes()) {
        if let Some(ip) = peer {
            ctx.failed_logins.succeeded(ip);
        }
        return None;
    }
    if let Some(ip) = peer {
        let failures = ctx.failed_logins.failed(ip, std::time::Instant::now());
        if crate::throttle::worth_reporting(failures) {
            tracing::warn!(%ip, failures, "wrong API token");
            ctx.array.events().failed_logins(
                crate::array::now_ms(),
                "wrong API token",
                &ip.to_string(),
                failures,
                None,
            );
        }
    }
    Some(unauthorized())
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

/// Whether two secrets are equal, in time that depends on neither's content nor on the
/// presented one's length: their SHA-256 digests are compared in constant time.
fn secrets_match(presented: &[u8], secret: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    Sha256::digest(presented)
        .ct_eq(&Sha256::digest(secret))
        .into()
}
