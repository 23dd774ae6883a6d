//! The HTTP API on a real listener: the OpenAPI document against the live routes, error
//! codes, token authentication, the Host check (DNS rebinding) and the metrics text.

use serde_json::{json, Value};
use sliver_server::api::{self, AllowedHosts, ApiContext, OPENAPI, ROUTES};
use sliver_server::Array;
use sliver_test_support::target::runtime;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

struct Api {
    base: String,
    history: Arc<std::sync::Mutex<sliver_server::history::History>>,
    _runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
    array: Arc<Array>,
}

fn start(token: Option<&str>) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let array = Arc::new(
        Array::open_with(
            dir.path(),
            "iqn.2026-11.test.sliver:api",
            sliver_server::array::ArrayOptions {
                capacity_bytes: Some(512 << 20),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let runtime = runtime(1);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let ctx = ApiContext {
        array: array.clone(),
        portals: vec!["127.0.0.1:3260".parse::<SocketAddr>().unwrap()],
        token: token.map(str::to_string),
        allowed_hosts: AllowedHosts::new(["array1.example.com"]).unwrap(),
        history: Default::default(),
        server: None,
        tls: None,
        failed_logins: Default::default(),
    };
    let history = ctx.history.clone();
    runtime.spawn(api::serve(listener, ctx, std::future::pending()));
    Api {
        base: format!("http://{addr}"),
        history,
        _runtime: runtime,
        _dir: dir,
        array,
    }
}

/// (status, JSON body or Null, raw text)
fn call(api: &Api, method: &str, path: &str, body: Option<Value>) -> (u16, Value, String) {
    call_with(api, method, path, body, None)
}

/// POST `body` to `path`, which must answer 201 Created: the JSON answer.
#[track_caller]
fn post_created(api: &Api, path: &str, body: Value) -> Value {
    let (s, v, t) = call(api, "POST", path, Some(body));
    assert_eq!(s, 201, "{t}");
    v
}

/// `method` on `path` with `body` is refused with HTTP `status` and error code `code`.
#[track_caller]
fn assert_refused(
    api: &Api,
    method: &str,
    path: &str,
    body: Option<Value>,
    status: u16,
    code: &str,
) {
    let what = format!("{method} {path} {body:?}");
    let (s, v, _) = call(api, method, path, body);
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (status, Some(code)),
        "{what}"
    );
}

/// The sequence numbers of a page of events.
fn event_seqs(page: &Value) -> Vec<u64> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

fn call_with(
    api: &Api,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (u16, Value, String) {
    let mut req = ureq::request(method, &format!("{}{path}", api.base));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let result = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = response.status();
    let text = response.into_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    )
}

#[test]
fn the_openapi_document_matches_the_live_routes() {
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if method != "parameters" {
                documented.insert((method.clone(), path.clone()));
            }
        }
    }
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, routed, "openapi.json and ROUTES differ");

    // Every documented route is served: no route-level 404 or 405 for any of them.
    let api = start(None);
    for (method, path) in &routed {
        let concrete = path
            .replace("{name}", "nothing")
            .replace("{host}", "nobody");
        let body = matches!(method.as_str(), "post" | "patch").then(|| json!({}));
        let (status, value, text) = call(&api, &method.to_uppercase(), &concrete, body);
        let code = value["error"]["code"].as_str().unwrap_or("");
        assert!(
            status != 405 && code != "not_found" && code != "method_not_allowed",
            "{method} {path}: HTTP {status} {text}"
        );
    }
    // And something that is not documented is not served.
    let (status, value, _) = call(&api, "GET", "/api/v1/nothing", None);
    assert_eq!(
        (status, value["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, value, _) = call(&api, "PUT", "/api/v1/volumes", None);
    assert_eq!(
        (status, value["error"]["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
    // Every error code the server can produce is in the document's enum.
    let codes: Vec<&str> = doc["components"]["schemas"]["Error"]["properties"]["error"]
        ["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // The API's source is every file of src/api/; quotes pair within a file.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    assert!(files.len() > 1, "no API source in {}", dir.display());
    let sources: Vec<String> = files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    for source in &sources {
        for piece in source.split('"').skip(1).step_by(2) {
            let looks_like_code = piece.len() > 3
                && piece.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                && piece.contains('_')
                && sources.iter().any(|s| s.contains(&format!("\"{piece}\")")));
            if looks_like_code && !codes.contains(&piece) {
                panic!("error code {piece} is missing from openapi.json");
            }
        }
    }
}

#[test]
fn volumes_hosts_and_connections_round_trip_with_stable_error_codes() {
    let api = start(None);
    let v = post_created(
        &api,
        "/api/v1/volumes",
        json!({"name": "vol1", "size_bytes": 64u64 << 20}),
    );
    assert_eq!(v["name"], "vol1");
    assert_eq!(v["provisioned_bytes"], 64u64 << 20);
    assert_eq!(v["mapped_bytes"], 0);
    assert_eq!(v["thin_provisioning"], 1.0);
    assert_eq!(v["kind"], "engine");

    for (body, status, code) in [
        (
            json!({"name": "vol1", "size_bytes": 4096}),
            409,
            "volume_exists",
        ),
        (
            json!({"name": "v2", "size_bytes": 1000}),
            400,
            "invalid_size",
        ),
        (
            json!({"name": "../etc", "size_bytes": 4096}),
            400,
            "invalid_name",
        ),
        (json!({"name": "v2", "size": 4096}), 400, "bad_request"),
    ] {
        assert_refused(&api, "POST", "/api/v1/volumes", Some(body), status, code);
    }
    assert_refused(
        &api,
        "GET",
        "/api/v1/volumes/missing",
        None,
        404,
        "volume_not_found",
    );

    // Hosts and connections.
    post_created(
        &api,
        "/api/v1/hosts",
        json!({"name": "esx1", "iqns": ["iqn.1998-01.com.vmware:esx1"], "chap_user": "esx1", "chap_secret": "twelve-chars-secret"}),
    );
    for (body, status, code) in [
        (
            json!({"name": "h2", "iqns": ["not an iqn"]}),
            400,
            "invalid_iqn",
        ),
        (
            json!({"name": "h2", "iqns": [], "chap_user": "u", "chap_secret": "short"}),
            400,
            "invalid_chap",
        ),
    ] {
        assert_refused(&api, "POST", "/api/v1/hosts", Some(body), status, code);
    }
    let (_, hosts, text) = call(&api, "GET", "/api/v1/hosts", None);
    assert_eq!(hosts[0]["chap_user"], "esx1");
    assert!(
        !text.contains("twelve-chars-secret"),
        "secrets are never returned"
    );

    let c = post_created(
        &api,
        "/api/v1/volumes/vol1/connections",
        json!({"host": "esx1", "lun": 3}),
    );
    assert_eq!(
        c["url"],
        "iscsi://127.0.0.1:3260/iqn.2026-11.test.sliver:api/3"
    );
    assert_refused(
        &api,
        "POST",
        "/api/v1/volumes/vol1/connections",
        Some(json!({"host": "esx1"})),
        409,
        "already_connected",
    );
    assert_refused(
        &api,
        "DELETE",
        "/api/v1/volumes/vol1",
        None,
        409,
        "volume_connected",
    );
    assert_refused(
        &api,
        "DELETE",
        "/api/v1/hosts/esx1",
        None,
        409,
        "host_in_use",
    );

    // Snapshot, clone, resize, rename.
    let snap = post_created(
        &api,
        "/api/v1/volumes/vol1/snapshots",
        json!({"name": "vol1.snap"}),
    );
    assert_eq!(snap["kind"], "snapshot");
    assert_eq!(snap["read_only"], true);
    let (_, vol1, _) = call(&api, "GET", "/api/v1/volumes/vol1", None);
    assert_eq!(
        (&snap["source"], &snap["source_id"]),
        (&json!("vol1"), &vol1["id"])
    );
    assert_eq!(vol1["source"], Value::Null, "a volume made from nothing");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let created = snap["created_ms"].as_u64().unwrap();
    assert!(created <= now_ms && created + 600_000 > now_ms, "{created}");
    let clone = post_created(
        &api,
        "/api/v1/volumes/vol1.snap/clones",
        json!({"name": "vol1-clone"}),
    );
    assert_eq!(clone["source"], "vol1.snap");
    assert_refused(
        &api,
        "PATCH",
        "/api/v1/volumes/vol1",
        Some(json!({"size_bytes": 4096})),
        400,
        "shrink_not_supported",
    );
    let (s, v, t) = call(
        &api,
        "PATCH",
        "/api/v1/volumes/vol1",
        Some(json!({"size_bytes": 128u64 << 20, "name": "vol-one"})),
    );
    assert_eq!(s, 200, "{t}");
    assert_eq!(
        (v["name"].as_str(), v["provisioned_bytes"].as_u64()),
        (Some("vol-one"), Some(128 << 20))
    );
    assert_eq!(
        v["connections"][0]["host"], "esx1",
        "connections follow a rename"
    );
    let (_, snap, _) = call(&api, "GET", "/api/v1/volumes/vol1.snap", None);
    assert_eq!(
        snap["source"], "vol-one",
        "the source is named as it is now"
    );
    assert_eq!(
        api.array
            .volumes()
            .iter()
            .filter(|v| v.name == "vol-one")
            .count(),
        1
    );

    // Disconnect, delete.
    assert_refused(
        &api,
        "DELETE",
        "/api/v1/volumes/vol-one/connections/nobody",
        None,
        404,
        "not_connected",
    );
    let (s, _, _) = call(
        &api,
        "DELETE",
        "/api/v1/volumes/vol-one/connections/esx1",
        None,
    );
    assert_eq!(s, 204);
    for name in ["vol-one", "vol1.snap", "vol1-clone"] {
        let (s, _, t) = call(&api, "DELETE", &format!("/api/v1/volumes/{name}"), None);
        assert_eq!(s, 204, "{name}: {t}");
        if name == "vol-one" {
            let (_, list, _) = call(&api, "GET", "/api/v1/volumes", None);
            let snap = &list.as_array().unwrap()[0];
            assert_eq!(snap["name"], "vol1.snap");
            assert_eq!(snap["source"], Value::Null, "its source is gone");
            assert!(
                snap["source_id"].is_string(),
                "the id still groups siblings"
            );
        }
    }
    let (s, _, _) = call(&api, "DELETE", "/api/v1/hosts/esx1", None);
    assert_eq!(s, 204);
    let (_, list, _) = call(&api, "GET", "/api/v1/volumes", None);
    assert_eq!(list, json!([]));
    let (_, array, _) = call(&api, "GET", "/api/v1/array", None);
    assert_eq!(array["volumes"], 0);
    assert!(array["capacity_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn a_token_protects_every_route_and_metrics_name_the_counters() {
    let token = "0123456789abcdef-token";
    let api = start(Some(token));
    for path in ["/api/v1/array", "/metrics", "/api/openapi.json"] {
        let (s, v, _) = call(&api, "GET", path, None);
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (401, Some("unauthorized")),
            "{path}"
        );
        let (s, _, _) = call_with(&api, "GET", path, None, Some("wrong-token-wrong-token"));
        assert_eq!(s, 401, "{path}");
        let (s, _, _) = call_with(&api, "GET", path, None, Some(token));
        assert_eq!(s, 200, "{path}");
    }
    api.array.create_volume("m1", 8 << 20, 512).unwrap();
    let (_, _, text) = call_with(&api, "GET", "/metrics", None, Some(token));
    for needle in [
        "# TYPE sliver_volume_commands_total counter",
        "sliver_volume_commands_total{volume=\"m1\",class=\"read\"} 0",
        "sliver_volume_command_latency_seconds_bucket{volume=\"m1\",class=\"write\",le=\"+Inf\"} 0",
        "sliver_volume_vaai_total{volume=\"m1\",primitive=\"ats_failed\"} 0",
        "sliver_volume_unmapped_bytes_total{volume=\"m1\"} 0",
        "sliver_volume_provisioned_bytes{volume=\"m1\"} 8388608",
        "sliver_array_capacity_bytes ",
        "sliver_gc_write_amplification_ratio ",
        "# TYPE sliver_engine_metadata_written_bytes_total counter",
        "sliver_engine_metadata_cache_pages ",
        "sliver_engine_dedup_chunks_total 0",
        "sliver_engine_metadata_lock_longest_hold_seconds ",
        "# TYPE sliver_engine_metadata_lock_held_seconds_total counter",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // Creating the volume held the metadata lock: the total counts it.
    let held: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sliver_engine_metadata_lock_held_seconds_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the lock's total hold");
    assert!(held > 0.0, "{held}");
    // And the histogram of holds counts them, every bucket cumulative, the last all of them.
    let value = |line: &str| -> f64 { line.rsplit(' ').next().unwrap().parse().unwrap() };
    let buckets: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("sliver_engine_metadata_lock_hold_seconds_bucket{"))
        .map(value)
        .collect();
    let count = text
        .lines()
        .find(|l| l.starts_with("sliver_engine_metadata_lock_hold_seconds_count "))
        .map(value)
        .expect("the histogram's count");
    assert!(buckets.len() > 100, "{} buckets", buckets.len());
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "not cumulative");
    assert!(
        count > 0.0 && buckets.last() == Some(&count),
        "{count} {buckets:?}"
    );
    assert!(text.contains("sliver_engine_metadata_lock_hold_seconds_bucket{le=\"+Inf\"}"));
}

/// One request written by hand, so the `Host` header is exactly what a browser tricked by
/// DNS rebinding would send: (status, body).
fn raw_request(
    api: &Api,
    method: &str,
    path: &str,
    host: Option<&str>,
    token: Option<&str>,
) -> (u16, Value) {
    let addr = api.base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n");
    if let Some(h) = host {
        req += &format!("Host: {h}\r\n");
    }
    if let Some(t) = token {
        req += &format!("Authorization: Bearer {t}\r\n");
    }
    req += "\r\n";
    s.write_all(req.as_bytes()).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {reply:?}"));
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A page that rebinds its own name to 127.0.0.1 reaches the API with that name in `Host`:
/// refused before anything runs, token or not; IP literals, localhost and configured names
/// are served.
#[test]
fn requests_addressed_to_other_names_are_refused_dns_rebinding() {
    let token = "0123456789abcdef-token";
    for (api, tok) in [(start(None), None), (start(Some(token)), Some(token))] {
        api.array.create_volume("keep", 8 << 20, 512).unwrap();
        let port = api.base.rsplit(':').next().unwrap().to_string();
        for host in [
            format!("attacker.example:{port}"),
            format!("localhost.attacker.example:{port}"),
            "array2.example.com".to_string(),
        ] {
            let (s, v) = raw_request(&api, "DELETE", "/api/v1/volumes/keep", Some(&host), tok);
            assert_eq!(s, 403, "{host}: {v}");
            assert_eq!(v["error"]["code"], "host_not_allowed", "{host}: {v}");
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(
                msg.contains("allowed_hosts") && msg.contains("DNS rebinding"),
                "{msg}"
            );
            let (s, _) = raw_request(&api, "GET", "/metrics", Some(&host), tok);
            assert_eq!(s, 403, "{host}");
        }
        let (s, _) = raw_request(&api, "GET", "/api/v1/array", None, tok);
        assert_eq!(s, 403, "a request without Host");
        assert!(api.array.unit("keep").is_some(), "the refused DELETE ran");
        for host in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
            format!("array1.example.com:{port}"),
            "ARRAY1.example.com".to_string(),
        ] {
            let (s, v) = raw_request(&api, "GET", "/api/v1/volumes/keep", Some(&host), tok);
            assert_eq!(s, 200, "{host}: {v}");
        }
        if tok.is_some() {
            let (s, v) = raw_request(&api, "GET", "/api/v1/array", Some("localhost"), None);
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (401, Some("unauthorized"))
            );
        }
    }
}

/// The history routes: points from readings the test takes at its own times (the sampler's
/// are seconds apart), bounds of the latency buckets, `since` and `step`, and clear errors.
#[test]
fn statistics_history_is_served_with_its_bounds_and_validated_queries() {
    let api = start(None);
    api.array.create_volume("h1", 8 << 20, 512).unwrap();
    let t0 = 4_000_000_000_000;
    for i in 0..3 {
        api::record_history(&api.array, &api.history, t0 + i * 5_000);
    }
    let (s, v, text) = call(&api, "GET", "/api/v1/stats/history", None);
    assert_eq!(s, 200, "{text}");
    assert_eq!(v["step_seconds"], 5);
    assert_eq!(
        v["latency_bounds_us"].as_array().unwrap().len(),
        sliver_scsi::LATENCY_BOUNDS_US.len()
    );
    // Readings from the sampler may be interleaved; the test's own are the last two points.
    let points = v["points"].as_array().unwrap();
    let ours: Vec<&Value> = points
        .iter()
        .filter(|p| p["time_ms"].as_u64().unwrap() > t0)
        .collect();
    assert_eq!(ours.len(), 2, "{text}");
    assert_eq!(ours[1]["seconds"], 5.0);
    assert_eq!(ours[1]["write_iops"], 0.0);
    assert!(ours[1]["space"]["provisioned_bytes"].as_u64().unwrap() >= 8 << 20);
    let (_, v, _) = call(
        &api,
        "GET",
        &format!("/api/v1/stats/history?since={}", t0 + 5_000),
        None,
    );
    assert_eq!(v["points"].as_array().unwrap().len(), 1);
    let (s, v, _) = call(&api, "GET", "/api/v1/volumes/h1/history?step=60", None);
    assert_eq!((s, v["step_seconds"].as_u64()), (200, Some(60)));
    for (path, status, code) in [
        ("/api/v1/stats/history?step=7", 400, "bad_request"),
        ("/api/v1/stats/history?since=soon", 400, "bad_request"),
        ("/api/v1/stats/history?colour=red", 400, "bad_request"),
        ("/api/v1/volumes/nothing/history", 404, "volume_not_found"),
    ] {
        let (s, v, text) = call(&api, "GET", path, None);
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{path}: {text}"
        );
    }
    let (_, v, _) = call(&api, "GET", "/api/v1/stats", None);
    assert_eq!(v["latency_bounds_us"][0], sliver_scsi::LATENCY_BOUNDS_US[0]);
}

/// Editing a host in place: names replaced, CHAP set and cleared, the secret never returned,
/// connections kept, bad requests refused with their codes and nothing changed.
#[test]
fn a_host_is_edited_in_place() {
    let api = start(None);
    api.array.create_volume("ev1", 8 << 20, 512).unwrap();
    post_created(
        &api,
        "/api/v1/hosts",
        json!({"name": "esx9", "iqns": ["iqn.1998-01.com.vmware:esx9"]}),
    );
    post_created(
        &api,
        "/api/v1/volumes/ev1/connections",
        json!({"host": "esx9"}),
    );
    let iqns = [
        "iqn.1998-01.com.vmware:esx9-new",
        "iqn.1998-01.com.vmware:esx9-b",
    ];
    let (s, h, t) = call(
        &api,
        "PATCH",
        "/api/v1/hosts/esx9",
        Some(json!({"iqns": iqns, "chap_user": "esx9", "chap_secret": "a-secret-of-16ch"})),
    );
    assert_eq!(s, 200, "{t}");
    assert_eq!(h["iqns"], json!(iqns));
    assert_eq!(h["chap_user"], "esx9");
    assert_eq!(h["volumes"], json!(["ev1"]));
    assert!(
        !t.contains("a-secret-of-16ch"),
        "secrets are never returned"
    );
    let (_, _, listed) = call(&api, "GET", "/api/v1/hosts", None);
    assert!(!listed.contains("a-secret-of-16ch") && listed.contains("esx9-new"));
    for (body, code) in [
        (json!({"iqns": ["not an iqn"]}), "invalid_iqn"),
        (json!({"chap_user": "u"}), "invalid_chap"),
        (
            json!({"chap_user": "u", "chap_secret": "short"}),
            "invalid_chap",
        ),
        (
            json!({"clear_chap": true, "chap_user": "u", "chap_secret": "a-secret-of-16ch"}),
            "invalid_chap",
        ),
        (json!({"colour": "red"}), "bad_request"),
    ] {
        let (s, v, t) = call(&api, "PATCH", "/api/v1/hosts/esx9", Some(body.clone()));
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (400, Some(code)),
            "{body}: {t}"
        );
    }
    let (s, v, _) = call(&api, "PATCH", "/api/v1/hosts/nobody", Some(json!({})));
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("host_not_found"))
    );
    // Unchanged by the refused edits; then CHAP cleared with the names kept.
    let (s, h, t) = call(
        &api,
        "PATCH",
        "/api/v1/hosts/esx9",
        Some(json!({"clear_chap": true})),
    );
    assert_eq!(s, 200, "{t}");
    assert_eq!(h["iqns"], json!(iqns));
    assert_eq!(h["chap_user"], Value::Null);
    let saved = api
        .array
        .hosts()
        .into_iter()
        .find(|h| h.name == "esx9")
        .unwrap();
    assert_eq!((saved.iqns.len(), saved.chap), (2, None));
}

/// The events route: what the API changed, in order, paged by `after`, survives a reopen of
/// the array; bad queries are refused.
#[test]
fn events_record_what_changed() {
    let api = start(None);
    post_created(
        &api,
        "/api/v1/volumes",
        json!({"name": "e1", "size_bytes": 8u64 << 20}),
    );
    call(
        &api,
        "POST",
        "/api/v1/hosts",
        Some(json!({"name": "eh", "iqns": ["iqn.1998-01.com.vmware:eh"]})),
    );
    call(
        &api,
        "POST",
        "/api/v1/volumes/e1/connections",
        Some(json!({"host": "eh"})),
    );
    call(
        &api,
        "POST",
        "/api/v1/volumes/e1/snapshots",
        Some(json!({"name": "e1s"})),
    );
    call(&api, "DELETE", "/api/v1/volumes/e1s", None);
    call(
        &api,
        "PATCH",
        "/api/v1/array",
        Some(json!({"soft_threshold": 0.5})),
    );
    let (s, v, t) = call(&api, "GET", "/api/v1/events", None);
    assert_eq!(s, 200, "{t}");
    let kinds: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "volume_created",
            "host_created",
            "volume_connected",
            "snapshot_created",
            "volume_deleted",
            "soft_threshold_changed"
        ],
        "{t}"
    );
    let first = &v["events"][0];
    assert_eq!(first["volume"], "e1");
    assert_eq!(first["severity"], "info");
    assert!(first["message"].as_str().unwrap().contains("8.0 MiB"));
    let seqs = event_seqs(&v);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(v["next"], *seqs.last().unwrap());
    let (_, page, _) = call(
        &api,
        "GET",
        &format!("/api/v1/events?after={}&limit=2", seqs[1]),
        None,
    );
    let page_seqs = event_seqs(&page);
    assert_eq!(page_seqs, seqs[2..4]);
    assert_eq!(page["next"], seqs[3]);
    // Without `after`: the latest, oldest first (what a page shows first).
    let (_, latest, _) = call(&api, "GET", "/api/v1/events?limit=2", None);
    let latest_seqs = event_seqs(&latest);
    assert_eq!(latest_seqs, seqs[4..6]);
    assert_eq!(latest["next"], seqs[5]);
    let (_, empty, _) = call(
        &api,
        "GET",
        &format!("/api/v1/events?after={}", seqs[5]),
        None,
    );
    assert_eq!(
        (empty["events"].as_array().unwrap().len(), &empty["next"]),
        (0, &json!(seqs[5]))
    );
    let (s, v, _) = call(&api, "GET", "/api/v1/events?after=-1", None);
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_request")));
    let (s, v, _) = call(&api, "GET", "/api/v1/initiators/refused", None);
    assert_eq!((s, v), (200, json!([])));
    // The file keeps them: a log opened on the same directory reads them back.
    let (reopened, skipped) = sliver_server::events::EventLog::open(api._dir.path()).unwrap();
    assert_eq!(skipped, 0);
    assert_eq!(reopened.after(0, 1000).len(), 6);
}

/// One request with any headers, written by hand: (status, header lines in lower case, body).
fn exchange(
    api: &Api,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let addr = api.base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    req += body;
    s.write_all(req.as_bytes()).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

/// The console: the page and its files from the binary, with the RFC's headers, validators
/// and 304s; no token needed for them (the login must load), the Host check as for the API;
/// API answers carry their own policy and are never cached.
#[test]
fn the_console_is_served_from_the_binary_with_strict_headers() {
    use sliver_server::console::{API_CSP, ASSETS, CONSOLE_CSP};
    let token = "0123456789abcdef-token";
    for (api, tok) in [(start(None), None), (start(Some(token)), Some(token))] {
        let port = api.base.rsplit(':').next().unwrap().to_string();
        let host = format!("127.0.0.1:{port}");
        let (s, head, body) = exchange(&api, "GET", "/", &[("Host", &host)], "");
        assert_eq!(s, 200, "{head}");
        assert_eq!(
            header(&head, "content-type"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(
            header(&head, "content-security-policy"),
            Some(CONSOLE_CSP.to_ascii_lowercase().as_str())
        );
        assert_eq!(header(&head, "x-frame-options"), Some("deny"));
        assert_eq!(header(&head, "x-content-type-options"), Some("nosniff"));
        assert_eq!(header(&head, "referrer-policy"), Some("no-referrer"));
        assert_eq!(
            header(&head, "cross-origin-opener-policy"),
            Some("same-origin")
        );
        assert_eq!(
            header(&head, "cross-origin-resource-policy"),
            Some("same-origin")
        );
        assert_eq!(header(&head, "cache-control"), Some("no-cache"));
        assert!(body.contains(r#"<script type="module" src="/console/app.js">"#));
        // Every embedded file, and a 304 for a copy the browser holds.
        for a in ASSETS {
            let path = format!("/console/{}", a.path);
            let (s, head, body) = exchange(&api, "GET", &path, &[("Host", &host)], "");
            assert_eq!(s, 200, "{path}");
            assert_eq!(header(&head, "content-type"), Some(a.content_type));
            assert_eq!(body.len(), a.bytes.len(), "{path}");
            let etag = header(&head, "etag").expect("an ETag").to_string();
            let (s, head, body) = exchange(
                &api,
                "GET",
                &path,
                &[("Host", &host), ("If-None-Match", &etag)],
                "",
            );
            assert_eq!((s, body.as_str()), (304, ""), "{path}");
            assert!(header(&head, "content-security-policy").is_some());
        }
        let (s, _, body) = exchange(&api, "GET", "/console/missing.js", &[("Host", &host)], "");
        assert_eq!(s, 404);
        assert!(body.contains("not_found"));
        // DNS rebinding: refused for the console as for the API; configured names served.
        for path in ["/", "/console/app.js", "/api/v1/array"] {
            let (s, _, body) = exchange(&api, "GET", path, &[("Host", "evil.example")], "");
            assert_eq!(s, 403, "{path}");
            assert!(body.contains("host_not_allowed"), "{path}: {body}");
        }
        let named = format!("array1.example.com:{port}");
        let (s, _, _) = exchange(&api, "GET", "/", &[("Host", &named)], "");
        assert_eq!(s, 200, "a configured name");
        // API answers: their own policy, never cached; a token still needed for them.
        let auth = tok.map(|t| format!("Bearer {t}"));
        let mut with_auth = vec![("Host", host.as_str())];
        if let Some(a) = &auth {
            with_auth.push(("Authorization", a.as_str()));
        }
        let (s, head, _) = exchange(&api, "GET", "/api/v1/array", &with_auth, "");
        assert_eq!(s, 200);
        assert_eq!(
            header(&head, "content-security-policy"),
            Some(API_CSP.to_ascii_lowercase().as_str())
        );
        assert_eq!(header(&head, "cache-control"), Some("no-store"));
        assert_eq!(header(&head, "x-content-type-options"), Some("nosniff"));
        if tok.is_some() {
            let (s, _, _) = exchange(&api, "GET", "/api/v1/array", &[("Host", &host)], "");
            assert_eq!(s, 401);
        }
    }
}

/// A page of another origin cannot change anything: a foreign `Origin` on a change is
/// refused (the page's own origin is served), and a form-encodable body is not JSON.
#[test]
fn changes_from_other_origins_are_refused() {
    let api = start(None);
    let port = api.base.rsplit(':').next().unwrap().to_string();
    let host = format!("127.0.0.1:{port}");
    let body = r#"{"name": "o1", "size_bytes": 8388608}"#;
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let (s, _, reply) = exchange(
            &api,
            "POST",
            "/api/v1/volumes",
            &[
                ("Host", &host),
                ("Origin", origin),
                ("Content-Type", "application/json"),
            ],
            body,
        );
        assert_eq!(s, 403, "{origin}: {reply}");
        assert!(reply.contains("origin_not_allowed"), "{reply}");
    }
    assert!(api.array.unit("o1").is_none(), "a refused change ran");
    let (s, _, reply) = exchange(
        &api,
        "POST",
        "/api/v1/volumes",
        &[("Host", &host), ("Content-Type", "text/plain")],
        body,
    );
    assert!(s >= 400, "{reply}");
    assert!(
        api.array.unit("o1").is_none(),
        "a text/plain body was taken as JSON"
    );
    let own = format!("http://{host}");
    let (s, _, reply) = exchange(
        &api,
        "POST",
        "/api/v1/volumes",
        &[
            ("Host", &host),
            ("Origin", &own),
            ("Content-Type", "application/json"),
        ],
        body,
    );
    assert_eq!(s, 201, "{reply}");
    // Reads from any origin are harmless (and unreadable to it without CORS headers).
    let (s, head, _) = exchange(
        &api,
        "GET",
        "/api/v1/array",
        &[("Host", &host), ("Origin", "http://evil.example")],
        "",
    );
    assert_eq!(s, 200);
    assert!(header(&head, "access-control-allow-origin").is_none());
}

/// Without an off-site copy the restore-point routes answer with a stable code and a sentence
/// saying how to configure one; the replication report says it is not configured.
#[test]
fn restore_points_need_a_configured_copy() {
    let api = start(None);
    let (s, v, _) = call(&api, "GET", "/api/v1/replication", None);
    assert_eq!((s, v["configured"].as_bool()), (200, Some(false)));
    assert!(v["newest_point"].is_null());
    for (method, path, body) in [
        ("GET", "/api/v1/replication/points", None),
        (
            "POST",
            "/api/v1/replication/points",
            Some(json!({"name": "before-upgrade"})),
        ),
        ("DELETE", "/api/v1/replication/points/before-upgrade", None),
    ] {
        let (s, v, _) = call(&api, method, path, body);
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (409, Some("replication_not_configured")),
            "{method} {path}"
        );
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--replicate-to"));
    }
}
