//! The web console (RFC 0002): static files compiled into the binary and served at `/` and
//! `/console/*` on the API listener, so `cargo build` needs no Node and nothing is fetched at
//! run time.
//!
//! The files are plain HTML, CSS and ES modules (`crates/server/console/`), with uPlot
//! vendored and pinned by `console/vendor/SHA256SUMS` (a test checks it). They are the same
//! for every array of a version and hold no data, so they need no token (the login screen
//! must load before one is known); the `Host` check applies as to the API. Every answer
//! carries a strict Content-Security-Policy: scripts, styles and connections to this origin
//! only, no inline code, and Trusted Types with no policy, so no HTML string can reach the
//! page.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::OnceLock;

/// One embedded file: its path under `/console/`, its media type, its bytes.
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            bytes: include_bytes!(concat!("../console/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file of the console (a test checks this list against the directory).
pub const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("icon.svg", "image/svg+xml"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("format.js", JS),
    asset!("charts.js", JS),
    asset!("screens/dashboard.js", JS),
    asset!("screens/volumes.js", JS),
    asset!("screens/volume.js", JS),
    asset!("screens/hosts.js", JS),
    asset!("screens/tree.js", JS),
    asset!("screens/space.js", JS),
    asset!("screens/settings.js", JS),
    asset!("screens/events.js", JS),
    asset!("screens/copy.js", JS),
    asset!("vendor/uPlot.esm.js", JS),
    asset!("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    asset!("vendor/LICENSE.uPlot", "text/plain; charset=utf-8"),
    asset!("vendor/SHA256SUMS", "text/plain; charset=utf-8"),
];

/// The console's Content-Security-Policy, exactly as RFC 0002 gives it.
pub const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'";

/// The policy of API answers: nothing in them may run or be framed.
pub const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// Whether `path` is one of the console's (served without a token).
pub fn is_console_path(path: &str) -> bool {
    path == "/" || path.starts_with("/console/")
}

/// Strong validators, computed once: the first 16 hex digits of each file's BLAKE3.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| format!("\"{}\"", &blake3::hash(a.bytes).to_hex()[..16]))
            .collect()
    })
}

/// `GET /`: the console's page.
pub async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// `GET /console/{*file}`.
pub async fn file(Path(file): Path<String>, headers: HeaderMap) -> Response {
    serve(&file, &headers)
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some((i, asset)) = ASSETS.iter().enumerate().find(|(_, a)| a.path == path) else {
        return crate::api::not_found_error().into_response();
    };
    let etag = &etags()[i];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            )],
            asset.bytes,
        )
            .into_response()
    };
    let h = response.headers_mut();
    // Revalidated on every load (no hashed file names without a build step): an upgraded
    // binary never mixes with cached scripts of the old one.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    response
}

/// The headers every answer carries, with `csp` as its Content-Security-Policy.
fn common_headers(h: &mut HeaderMap, csp: &'static str) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
}

/// The headers every console answer carries.
pub fn console_headers(h: &mut HeaderMap) {
    common_headers(h, CONSOLE_CSP);
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
}

/// The headers every API and metrics answer carries.
pub fn api_headers(h: &mut HeaderMap) {
    common_headers(h, API_CSP);
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    fn console_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("console")
    }

    fn files_under(dir: &Path, base: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files_under(&path, base, out);
            } else {
                let rel = path.strip_prefix(base).unwrap().to_string_lossy();
                out.insert(rel.replace('\\', "/"));
            }
        }
    }

    /// The table lists exactly the files in `console/`: a file added and not embedded (or
    /// listed and gone) fails here, not in a browser.
    #[test]
    fn the_asset_table_is_the_console_directory() {
        let dir = console_dir();
        let mut on_disk = BTreeSet::new();
        files_under(&dir, &dir, &mut on_disk);
        let listed: BTreeSet<String> = ASSETS.iter().map(|a| a.path.to_string()).collect();
        assert_eq!(listed, on_disk);
    }

    /// The vendored files are the pinned ones.
    #[test]
    fn vendored_files_match_their_checksums() {
        use sha2::{Digest, Sha256};
        let vendor = console_dir().join("vendor");
        let sums = std::fs::read_to_string(vendor.join("SHA256SUMS")).unwrap();
        let mut checked = 0;
        for line in sums.lines().filter(|l| !l.trim().is_empty()) {
            let (sum, name) = line.split_once("  ").expect("sha256sum format");
            let bytes = std::fs::read(vendor.join(name)).unwrap();
            let got: String = Sha256::digest(&bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(got, sum, "{name} is not the pinned file");
            let embedded = ASSETS
                .iter()
                .find(|a| a.path == format!("vendor/{name}"))
                .expect("embedded");
            assert!(embedded.bytes == bytes.as_slice());
            checked += 1;
        }
        assert_eq!(checked, 3, "uPlot's module, its CSS and its licence");
    }

    /// Nothing in our sources can turn a string into markup or code, or keep the token: the
    /// CSP would refuse it at run time, this finds it before.
    #[test]
    fn the_sources_use_no_html_sinks_inline_code_or_storage() {
        let forbidden_js = [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "localStorage",
            "sessionStorage",
            "setAttribute(\"style\"",
            "document.cookie",
        ];
        for a in ASSETS.iter().filter(|a| !a.path.starts_with("vendor/")) {
            let text = std::str::from_utf8(a.bytes).unwrap();
            if a.path.ends_with(".js") {
                for f in forbidden_js {
                    assert!(!text.contains(f), "{} uses {f}", a.path);
                }
            }
        }
        let html = std::str::from_utf8(ASSETS[0].bytes).unwrap();
        assert!(!html.contains("style="), "a style attribute");
        assert!(!html.contains("<style"), "an inline style sheet");
        let lower = html.to_ascii_lowercase();
        for (i, _) in lower.match_indices(" on") {
            let name: String = lower[i + 3..]
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            let after = &lower[i + 3 + name.len()..];
            assert!(
                name.is_empty() || !after.trim_start().starts_with('='),
                "an inline handler: on{name}="
            );
        }
        for script in html.split("<script").skip(1) {
            let tag = script.split('>').next().unwrap();
            assert!(tag.contains("src="), "an inline script: <script{tag}>");
        }
        // uPlot's module too: it may not build markup from strings.
        let uplot = ASSETS
            .iter()
            .find(|a| a.path == "vendor/uPlot.esm.js")
            .unwrap();
        let text = std::str::from_utf8(uplot.bytes).unwrap();
        for f in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "eval(",
            "new Function",
        ] {
            assert!(!text.contains(f), "uPlot uses {f}");
        }
    }

    #[test]
    fn console_paths_are_the_page_and_its_files() {
        assert!(is_console_path("/"));
        assert!(is_console_path("/console/app.js"));
        assert!(!is_console_path("/api/v1/array"));
        assert!(!is_console_path("/metrics"));
        assert!(!is_console_path("/consolex"));
    }
}
