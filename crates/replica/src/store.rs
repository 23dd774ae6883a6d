//! The object store as the rest of sliver sees it: a narrow, blocking trait over the few
//! operations RFC 0003 needs, with names relative to the pool's prefix, and its S3
//! implementation on `object_store`.
//!
//! Blocking, because its callers are the shipper's and the restorer's own threads and the
//! engine's devices (hydration), none of which is async; the S3 implementation runs its requests on a
//! small tokio runtime of its own. Call it from plain threads (or `spawn_blocking`), never from
//! inside an async task.

#[cfg(feature = "s3")]
use bytes::Bytes;
#[cfg(feature = "s3")]
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
#[cfg(feature = "s3")]
use object_store::path::Path;
#[cfg(feature = "s3")]
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, ObjectStore as _, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;
#[cfg(feature = "s3")]
use std::time::Duration;

/// Why a store operation failed. `NotFound` is an answer; the rest are failures to report
/// (with the store's URL and the object's name) and to retry later.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{store}: object {name} not found")]
    NotFound { store: String, name: String },
    #[error("{store}: {op} {name}: {reason}")]
    Failed {
        store: String,
        op: &'static str,
        name: String,
        reason: String,
    },
    #[error("{0}")]
    Config(String),
}

/// What sliver needs of an object store. Names are relative to the pool's prefix
/// (`manifest/00000000000000000001`, see [`crate::object::ObjectName`]).
pub trait ObjectStore: Send + Sync {
    /// Create `name` holding `bytes` unless an object of that name exists: `true` if this
    /// call created it, `false` if it existed (the store's 412). The fence of RFC 0003.
    /// A create whose answer was lost and that the client sent again reports `false` although
    /// this caller made the object: a caller that must know reads it back and compares.
    fn put_if_absent(&self, name: &str, bytes: Vec<u8>) -> Result<bool, StoreError>;
    /// Create or replace `name`.
    fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), StoreError>;
    fn get(&self, name: &str) -> Result<Vec<u8>, StoreError>;
    /// Bytes `range` of `name` (fewer if the object is shorter).
    fn get_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>, StoreError>;
    /// The names under `folder` (`seg`, `manifest`, ...), sorted.
    fn list(&self, folder: &str) -> Result<Vec<String>, StoreError>;
    /// Delete `name`; deleting a missing object is not an error.
    fn delete(&self, name: &str) -> Result<(), StoreError>;
    /// Where the store is, for messages (`s3://bucket/prefix at http://host:port`).
    fn describe(&self) -> String;
}

/// Where a pool lives on an S3-compatible store.
#[derive(Debug, Clone, Default)]
pub struct S3Config {
    /// `s3://BUCKET/PREFIX` (the prefix may be empty).
    pub url: String,
    /// Another endpoint than AWS's (`http://127.0.0.1:8333` for a SeaweedFS on loopback).
    pub endpoint: Option<String>,
    /// Region; the standard AWS variables otherwise, `us-east-1` when nothing says.
    pub region: Option<String>,
    /// Credentials; the standard AWS variables otherwise.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

/// Where the S3 client takes its credentials from (see [`credential_source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialSource {
    /// An access key: the configuration's, or `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    AccessKey,
    /// What the platform names in the environment: a web identity token
    /// (`AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`) or a container's credentials
    /// (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`, or `..._FULL_URI` with
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`).
    Platform,
    /// None: unsigned requests (`AWS_SKIP_SIGNATURE=true`, a public bucket).
    Unsigned,
    /// The cloud's instance metadata (169.254.169.254): on AWS itself (no endpoint given), or
    /// elsewhere when asked for with [`CREDENTIALS_VAR`]`=instance-metadata`.
    InstanceMetadata,
}

/// The environment variable that asks for the instance metadata's credentials with an endpoint.
pub const CREDENTIALS_VAR: &str = "SLIVER_S3_CREDENTIALS";

/// Where the client for `config` takes its credentials from, reading the environment through
/// `env`: the sources `object_store`'s builder tries, in its order, except that its last one,
/// the instance metadata, is never used with an endpoint unless asked for. An endpoint with no
/// credentials is an error in one sentence that says how to give them, before any request.
pub fn credential_source(
    config: &S3Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<CredentialSource, StoreError> {
    let set = |name: &str| env(name).is_some();
    let describe = match &config.endpoint {
        Some(e) => format!("{} at {e}", config.url),
        None => config.url.clone(),
    };
    let asked = match env(CREDENTIALS_VAR) {
        None => false,
        Some(v) if v == "instance-metadata" => true,
        Some(v) => {
            return Err(StoreError::Config(format!(
                "{CREDENTIALS_VAR}={v:?}: the one value it takes is instance-metadata"
            )))
        }
    };
    let key = config.access_key_id.is_some() || set("AWS_ACCESS_KEY_ID");
    let secret = config.secret_access_key.is_some() || set("AWS_SECRET_ACCESS_KEY");
    if key != secret {
        let (given, missing) = if key {
            ("an access key id", "secret access key")
        } else {
            ("a secret access key", "access key id")
        };
        return Err(StoreError::Config(format!(
            "{describe}: {given} is configured but no {missing}: give both (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or [replication] access_key_id and secret_access_key_file)"
        )));
    }
    let truthy = |name: &str| {
        env(name).is_some_and(|v| {
            ["1", "true", "on", "yes", "y"].contains(&v.to_ascii_lowercase().as_str())
        })
    };
    Ok(if key {
        CredentialSource::AccessKey
    } else if (set("AWS_WEB_IDENTITY_TOKEN_FILE") && set("AWS_ROLE_ARN"))
        || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        || (set("AWS_CONTAINER_CREDENTIALS_FULL_URI")
            && set("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"))
    {
        CredentialSource::Platform
    } else if truthy("AWS_SKIP_SIGNATURE") {
        CredentialSource::Unsigned
    } else if asked
        || (config.endpoint.is_none() && !set("AWS_ENDPOINT") && !set("AWS_ENDPOINT_URL"))
    {
        CredentialSource::InstanceMetadata
    } else {
        return Err(StoreError::Config(format!(
            "no credentials are configured for {describe}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in sliver's environment (or, for `sliver serve`, access_key_id and secret_access_key_file under [replication]), or {CREDENTIALS_VAR}=instance-metadata to take them from the cloud's instance metadata"
        )));
    })
}

/// The bucket and the prefix of an `s3://BUCKET/PREFIX` URL, checked.
pub fn parse_s3_url(url: &str) -> Result<(String, String), StoreError> {
    let bad =
        |why: &str| StoreError::Config(format!("{url:?} is not an s3://BUCKET/PREFIX URL: {why}"));
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("it must start with s3://"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    // S3's bucket naming rules: 3-63 of lower-case letters, digits, dots and hyphens.
    if bucket.len() < 3
        || bucket.len() > 63
        || !bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err(bad(
            "the bucket name must be 3-63 lower-case letters, digits, dots or hyphens",
        ));
    }
    let prefix = prefix.trim_end_matches('/');
    if prefix.split('/').any(|part| part == "." || part == "..")
        || prefix.contains("//")
        || prefix.bytes().any(|b| b.is_ascii_control())
    {
        return Err(bad("the prefix must be plain path segments"));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// An S3 (or S3-compatible) store holding one pool under a prefix.
#[cfg(feature = "s3")]
pub struct S3Store {
    s3: AmazonS3,
    prefix: String,
    describe: String,
    runtime: tokio::runtime::Runtime,
}

#[cfg(feature = "s3")]
impl S3Store {
    pub fn connect(config: &S3Config) -> Result<Self, StoreError> {
        let (bucket, prefix) = parse_s3_url(&config.url)?;
        // Before the builder, whose last resort is the instance metadata at 169.254.169.254.
        credential_source(config, &|name| std::env::var(name).ok())?;
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            // If-None-Match / If-Match on PUT (AWS since 2024, SeaweedFS, Ceph RGW, MinIO, R2).
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            // Fail within seconds, not the client's default three minutes: the caller keeps the
            // local array serving, reports the error and tries again on its own schedule.
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 3,
                retry_timeout: Duration::from_secs(15),
            })
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(120)),
            );
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        if let Some(region) = &config.region {
            builder = builder.with_region(region);
        } else if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            builder = builder.with_region("us-east-1");
        }
        if let Some(key) = &config.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &config.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        let describe = match &config.endpoint {
            Some(e) => format!("{} at {e}", config.url),
            None => config.url.clone(),
        };
        let s3 = builder
            .build()
            .map_err(|e| StoreError::Config(format!("{describe}: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sliver-s3")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Config(format!("{describe}: start the S3 client: {e}")))?;
        Ok(S3Store {
            s3,
            prefix,
            describe,
            runtime,
        })
    }

    fn path(&self, name: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }

    fn failed(&self, op: &'static str, name: &str, e: object_store::Error) -> StoreError {
        match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound {
                store: self.describe.clone(),
                name: name.to_string(),
            },
            e => StoreError::Failed {
                store: self.describe.clone(),
                op,
                name: name.to_string(),
                reason: e.to_string(),
            },
        }
    }
}

#[cfg(feature = "s3")]
impl ObjectStore for S3Store {
    fn put_if_absent(&self, name: &str, bytes: Vec<u8>) -> Result<bool, StoreError> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let path = self.path(name);
        let put = self.s3.put_opts(&path, PutPayload::from(bytes), opts);
        match self.runtime.block_on(put) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(self.failed("create", name, e)),
        }
    }

    fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let path = self.path(name);
        let put = self.s3.put(&path, PutPayload::from(bytes));
        self.runtime
            .block_on(put)
            .map(|_| ())
            .map_err(|e| self.failed("put", name, e))
    }

    fn get(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.path(name);
        self.runtime
            .block_on(async {
                let got = self.s3.get(&path).await?;
                got.bytes().await
            })
            .map(|b: Bytes| b.to_vec())
            .map_err(|e| self.failed("get", name, e))
    }

    fn get_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>, StoreError> {
        let path = self.path(name);
        let opts = GetOptions {
            range: Some(range.into()),
            ..Default::default()
        };
        self.runtime
            .block_on(async {
                let got = self.s3.get_opts(&path, opts).await?;
                got.bytes().await
            })
            .map(|b: Bytes| b.to_vec())
            .map_err(|e| self.failed("get", name, e))
    }

    fn list(&self, folder: &str) -> Result<Vec<String>, StoreError> {
        use futures::TryStreamExt;
        let dir = self.path(folder);
        let strip = format!("{dir}/");
        let mut names: Vec<String> = self
            .runtime
            .block_on(async { self.s3.list(Some(&dir)).try_collect::<Vec<_>>().await })
            .map_err(|e| self.failed("list", folder, e))?
            .into_iter()
            .filter_map(|meta| {
                meta.location
                    .as_ref()
                    .strip_prefix(&strip)
                    .map(|rest| format!("{folder}/{rest}"))
            })
            .collect();
        names.sort();
        Ok(names)
    }

    fn delete(&self, name: &str) -> Result<(), StoreError> {
        let path = self.path(name);
        match self.runtime.block_on(self.s3.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed("delete", name, e)),
        }
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}

/// A store in memory, standing in for the S3 server in tests and the simulation: a map of
/// names to bytes, with put-if-absent's semantics (the objects are public for tests that lose
/// or damage them behind the array's back).
#[derive(Default)]
pub struct MemStore(pub Mutex<BTreeMap<String, Vec<u8>>>);

impl ObjectStore for MemStore {
    fn put_if_absent(&self, name: &str, bytes: Vec<u8>) -> Result<bool, StoreError> {
        let mut m = self.0.lock().unwrap();
        if m.contains_key(name) {
            return Ok(false);
        }
        m.insert(name.to_string(), bytes);
        Ok(true)
    }
    fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.0.lock().unwrap().insert(name.to_string(), bytes);
        Ok(())
    }
    fn get(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::NotFound {
                store: "memory".into(),
                name: name.to_string(),
            })
    }
    fn get_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>, StoreError> {
        let all = self.get(name)?;
        let end = (range.end as usize).min(all.len());
        Ok(all[(range.start as usize).min(end)..end].to_vec())
    }
    fn list(&self, folder: &str) -> Result<Vec<String>, StoreError> {
        let prefix = format!("{folder}/");
        Ok(self
            .0
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect())
    }
    fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.0.lock().unwrap().remove(name);
        Ok(())
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_are_checked_before_anything_connects() {
        assert_eq!(
            parse_s3_url("s3://sliver-pool/site-a/").unwrap(),
            ("sliver-pool".into(), "site-a".into())
        );
        assert_eq!(
            parse_s3_url("s3://pool").unwrap(),
            ("pool".into(), String::new())
        );
        for bad in [
            "http://pool/x",
            "s3://",
            "s3://ab/x",
            "s3://Upper/x",
            "s3://pool/a/../b",
            "s3://pool/a//b",
        ] {
            let e = parse_s3_url(bad).unwrap_err().to_string();
            assert!(e.contains("is not an s3://BUCKET/PREFIX URL"), "{bad}: {e}");
        }
    }

    /// The credential decision for a store at `endpoint` with `env` as the environment.
    fn source(
        endpoint: Option<&str>,
        keys: bool,
        env: &[(&str, &str)],
    ) -> Result<CredentialSource, String> {
        let config = S3Config {
            url: "s3://pool/site-a".into(),
            endpoint: endpoint.map(str::to_string),
            access_key_id: keys.then(|| "sliver".to_string()),
            secret_access_key: keys.then(|| "s3cr3t".to_string()),
            ..S3Config::default()
        };
        let lookup = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        credential_source(&config, &lookup).map_err(|e| e.to_string())
    }

    #[test]
    fn instance_metadata_only_on_aws_itself_or_when_asked_for() {
        use CredentialSource::*;
        let seaweed = Some("http://127.0.0.1:8333");
        // An endpoint and nothing else: one sentence that says how to give credentials.
        for env in [
            &[][..],
            &[("AWS_REGION", "us-east-1")],
            &[("AWS_ROLE_ARN", "arn:aws:iam::1:role/r")],
            &[("AWS_SKIP_SIGNATURE", "false")],
        ] {
            let e = source(seaweed, false, env).unwrap_err();
            assert_eq!(
                e,
                "no credentials are configured for s3://pool/site-a at http://127.0.0.1:8333: \
                 set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in sliver's environment (or, \
                 for `sliver serve`, access_key_id and secret_access_key_file under \
                 [replication]), or SLIVER_S3_CREDENTIALS=instance-metadata to take them from \
                 the cloud's instance metadata",
                "{env:?}"
            );
        }
        // An endpoint in the environment is an endpoint too.
        for var in ["AWS_ENDPOINT", "AWS_ENDPOINT_URL"] {
            let e = source(None, false, &[(var, "http://127.0.0.1:8333")]).unwrap_err();
            assert!(
                e.starts_with("no credentials are configured for s3://pool/site-a:"),
                "{e}"
            );
        }
        // Without an endpoint (AWS itself) the instance metadata is the last source, as in
        // every AWS client; with one, only when asked for.
        assert_eq!(source(None, false, &[]), Ok(InstanceMetadata));
        let asked = [(CREDENTIALS_VAR, "instance-metadata")];
        assert_eq!(source(seaweed, false, &asked), Ok(InstanceMetadata));
        let e = source(seaweed, false, &[(CREDENTIALS_VAR, "imds")]).unwrap_err();
        assert!(
            e.contains("the one value it takes is instance-metadata"),
            "{e}"
        );
        // Keys, from the configuration or the environment, come first, asked or not.
        assert_eq!(source(seaweed, true, &[]), Ok(AccessKey));
        assert_eq!(source(seaweed, true, &asked), Ok(AccessKey));
        let env_keys = [("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")];
        assert_eq!(source(seaweed, false, &env_keys), Ok(AccessKey));
        assert_eq!(source(None, false, &env_keys), Ok(AccessKey));
        // Half a key is an error, never a reason to look elsewhere.
        for half in [&env_keys[..1], &env_keys[1..]] {
            let e = source(None, false, half).unwrap_err();
            assert!(e.contains("give both"), "{e}");
        }
        // What the platform names in the environment, and unsigned requests.
        for env in [
            &[
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"),
                ("AWS_ROLE_ARN", "arn"),
            ][..],
            &[("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/c")],
            &[
                ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:1/c"),
                ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "/t"),
            ],
        ] {
            assert_eq!(source(seaweed, false, env), Ok(Platform), "{env:?}");
        }
        assert_eq!(
            source(seaweed, false, &[("AWS_SKIP_SIGNATURE", "true")]),
            Ok(Unsigned)
        );
    }
}
