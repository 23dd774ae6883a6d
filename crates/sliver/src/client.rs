//! The CLI side of the HTTP API: one blocking request per command.

use serde::de::DeserializeOwned;
use serde::Serialize;
use sliver_server::tls::{self, PinnedVerifier, Trust};
use std::sync::Arc;
use std::time::Duration;

/// Where the API is and how to authenticate.
#[derive(clap::Args, Clone, Debug)]
pub struct ApiArgs {
    /// URL of the sliver API.
    #[arg(
        long = "api",
        env = "SLIVER_API",
        default_value = "http://127.0.0.1:8600",
        global = true
    )]
    pub url: String,
    /// API token (when the server requires one).
    #[arg(
        long = "api-token",
        env = "SLIVER_API_TOKEN",
        global = true,
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// SHA-256 fingerprint of the array's certificate (as `sliver serve` prints it) for an
    /// https:// API; without it the certificate must chain to the system's CA store.
    #[arg(
        long = "api-fingerprint",
        env = "SLIVER_API_FINGERPRINT",
        value_name = "SHA256",
        global = true
    )]
    pub fingerprint: Option<String>,
}

pub struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
    /// For an https:// API pinned by fingerprint: what tells a refused certificate.
    pinned: Option<Arc<PinnedVerifier>>,
}

impl Client {
    pub fn new(args: &ApiArgs) -> Result<Client, String> {
        let base = args.url.trim_end_matches('/').to_string();
        let https = base.starts_with("https://");
        if !https && !base.starts_with("http://") {
            return Err(format!(
                "--api {base}: give the API's URL, http://ADDRESS:PORT or https://ADDRESS:PORT"
            ));
        }
        let mut agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            // Deleting a large volume or taking a snapshot of a busy one can take a while.
            .timeout(Duration::from_secs(600))
            // The API never redirects; a redirect would carry the token elsewhere.
            .redirects(0);
        let mut pinned = None;
        match (&args.fingerprint, https) {
            (Some(_), false) => {
                return Err(format!(
                    "--api-fingerprint pins the certificate of an https:// API, but the API is {base}: give its https:// URL"
                ))
            }
            (fingerprint, true) => {
                let trust = match fingerprint {
                    Some(f) => Trust::Pinned(f.parse().map_err(|e| format!("--api-fingerprint: {e}"))?),
                    None => Trust::SystemRoots,
                };
                let (config, verifier) = tls::client_config(&trust)?;
                agent = agent.tls_config(Arc::new(config));
                pinned = verifier;
            }
            (None, false) => {}
        }
        Ok(Client {
            base,
            token: args.token.clone(),
            agent: agent.build(),
            pinned,
        })
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        self.send_for_json("GET", path, None::<&()>)
    }

    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, String> {
        self.send_for_json("POST", path, Some(body))
    }

    pub fn patch<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, String> {
        self.send_for_json("PATCH", path, Some(body))
    }

    pub fn delete(&self, path: &str) -> Result<(), String> {
        self.send("DELETE", path, None::<&()>).map(|_| ())
    }

    /// Sends a request and decodes the JSON answer.
    fn send_for_json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, String> {
        self.send(method, path, body)?
            .into_json()
            .map_err(|e| format!("unexpected answer from the API at {}: {e}", self.base))
    }

    fn send<B: Serialize>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<ureq::Response, String> {
        let mut request = self.agent.request(method, &format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let result = match body {
            Some(b) => request.send_json(b),
            None => request.call(),
        };
        match result {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(status, response)) => {
                let text = response.into_string().unwrap_or_default();
                Err(serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                    .unwrap_or_else(|| format!("the API answered HTTP {status}: {text}")))
            }
            Err(ureq::Error::Transport(t)) => Err(self.transport_error(&t)),
        }
    }
}

impl Client {
    /// One sentence for a request that got no answer: a certificate refused, TLS spoken to
    /// a plain port, or nothing listening.
    fn transport_error(&self, t: &ureq::Transport) -> String {
        if let Some(message) = self
            .pinned
            .as_ref()
            .and_then(|p| p.mismatch_message(&self.base))
        {
            return message;
        }
        let text = t.to_string();
        if text.contains("invalid peer certificate") {
            return format!(
                "the certificate of the API at {} is not trusted ({}): give its fingerprint with --api-fingerprint or SLIVER_API_FINGERPRINT (`sliver serve` prints it at start; the console's settings show it)",
                self.base,
                text.rsplit(": ").next().unwrap_or(&text)
            );
        }
        if text.contains("corrupt message") || text.contains("InvalidContentType") {
            return format!(
                "the API at {} does not speak TLS: it serves plain HTTP (use http://)",
                self.base
            );
        }
        format!(
            "cannot reach the sliver API at {} ({t}); is `sliver serve` running? (--api / SLIVER_API select another)",
            self.base
        )
    }
}

/// Percent-encode one path segment (names are restricted, but `*` and user input are not).
pub fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
