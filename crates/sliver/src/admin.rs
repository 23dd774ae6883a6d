//! `sliver volume|host|array ...`: administration through the HTTP API.

use crate::client::{segment, ApiArgs, Client};
use clap::Subcommand;
use serde_json::{json, Value};
use sliver_api_types::units::{human_bytes, parse_size};
use sliver_api_types::{ArrayInfo, ConnectionInfo, HostInfo, VolumeInfo, WriteCache};

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create a thin volume.
    Create {
        name: String,
        /// Provisioned size, e.g. 10G (GiB), 500GB (decimal), 1T.
        #[arg(long)]
        size: String,
        /// Logical block size: 512 or 4096.
        #[arg(long, default_value_t = 512)]
        block_size: u32,
        /// Store data byte for byte in a sparse file instead of the engine.
        #[arg(long)]
        passthrough: bool,
        /// write-through (every write durable before it is answered; for every host, ESXi
        /// included) or write-back (for hosts that flush: Linux, QEMU/Proxmox, Windows).
        #[arg(long, default_value = "write-through")]
        write_cache: WriteCache,
    },
    /// List volumes and snapshots.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show one volume: space, data reduction, connections, VAAI counters.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Grow a volume (connected hosts are told the capacity changed).
    Resize {
        name: String,
        #[arg(long)]
        size: String,
    },
    /// Set a volume's write cache: write-through or write-back (connected hosts are told).
    WriteCache { name: String, setting: WriteCache },
    /// Rename a volume (hosts keep seeing the same disk).
    Rename { name: String, new_name: String },
    /// Delete a volume or snapshot (it must be disconnected first).
    Delete { name: String },
    /// Take a read-only snapshot.
    Snapshot { name: String, snapshot: String },
    /// Create a writable clone of a volume or snapshot.
    Clone { source: String, new: String },
    /// Connect a volume to a host ('*' for every initiator).
    Connect {
        name: String,
        #[arg(long)]
        host: String,
        #[arg(long)]
        lun: Option<u64>,
    },
    /// Disconnect a volume from a host.
    Disconnect {
        name: String,
        #[arg(long)]
        host: String,
    },
    /// Print the iSCSI URL of a connected volume (for scripts, QEMU and libiscsi tools).
    Url {
        name: String,
        /// The host whose connection to print (default: the first).
        #[arg(long)]
        host: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum HostCommand {
    /// Create a host from initiator names (repeat --iqn), with optional CHAP.
    Create {
        name: String,
        #[arg(long = "iqn", required = true)]
        iqns: Vec<String>,
        #[arg(long, requires = "chap_secret")]
        chap_user: Option<String>,
        /// CHAP secret, 12 to 255 bytes (env SLIVER_CHAP_SECRET keeps it out of shell history).
        #[arg(
            long,
            env = "SLIVER_CHAP_SECRET",
            hide_env_values = true,
            requires = "chap_user"
        )]
        chap_secret: Option<String>,
    },
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete a host (its volumes must be disconnected first).
    Delete { name: String },
}

#[derive(Subcommand)]
pub enum ArrayCommand {
    /// Capacity, space used, reclaimable space, data reduction, GC state.
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Change settings (kept across restarts).
    Set {
        /// Percent of capacity in use that raises the thin-provisioning soft threshold
        /// (hosts get a unit attention; 100 disables it).
        #[arg(long, value_name = "PERCENT")]
        soft_threshold: Option<f64>,
        /// Background garbage collection: off, low, medium, high or a rate such as 100MB/s.
        #[arg(long)]
        gc_priority: Option<String>,
    },
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| format!("bad size '{s}': {e}"))
}

fn print_json(v: &impl serde::Serialize) -> Result<(), String> {
    outln!(
        "{}",
        serde_json::to_string_pretty(v).map_err(|e| e.to_string())?
    );
    Ok(())
}

pub fn volume(api: &ApiArgs, cmd: VolumeCommand) -> Result<(), String> {
    let c = Client::new(api)?;
    match cmd {
        VolumeCommand::Create {
            name,
            size,
            block_size,
            passthrough,
            write_cache,
        } => {
            let body = json!({
                "name": name,
                "size_bytes": size_arg(&size)?,
                "block_size": block_size,
                "kind": if passthrough { "passthrough" } else { "engine" },
                "write_cache": write_cache,
            });
            let v: VolumeInfo = c.post("/api/v1/volumes", &body)?;
            outln!(
                "created volume '{}' ({}, {})",
                v.name,
                human_bytes(v.provisioned_bytes),
                v.write_cache
            );
        }
        VolumeCommand::WriteCache { name, setting } => {
            let v: VolumeInfo = c.patch(
                &format!("/api/v1/volumes/{}", segment(&name)),
                &json!({ "write_cache": setting }),
            )?;
            outln!("volume '{}' is now {}", v.name, v.write_cache);
        }
        VolumeCommand::List { json } => {
            let list: Vec<VolumeInfo> = c.get("/api/v1/volumes")?;
            if json {
                return print_json(&list);
            }
            outln!(
                "{:<24} {:<11} {:>10} {:>10} {:>6} {:>10} {:>9}  HOSTS",
                "NAME",
                "KIND",
                "SIZE",
                "MAPPED",
                "THIN",
                "PHYSICAL",
                "REDUCTION"
            );
            for v in list {
                let hosts: Vec<String> = v
                    .connections
                    .iter()
                    .map(|c| format!("{}:{}", c.host, c.lun))
                    .collect();
                outln!(
                    "{:<24} {:<11} {:>10} {:>10} {:>5.0}% {:>10} {:>8.2}x  {}",
                    v.name,
                    v.kind,
                    human_bytes(v.provisioned_bytes),
                    human_bytes(v.mapped_bytes),
                    v.thin_provisioning * 100.0,
                    human_bytes(v.physical_bytes),
                    v.data_reduction,
                    hosts.join(",")
                );
            }
        }
        VolumeCommand::Show { name, json } => {
            let v: VolumeInfo = c.get(&format!("/api/v1/volumes/{}", segment(&name)))?;
            if json {
                return print_json(&v);
            }
            print_volume(&v);
        }
        VolumeCommand::Resize { name, size } => {
            let v: VolumeInfo = c.patch(
                &format!("/api/v1/volumes/{}", segment(&name)),
                &json!({ "size_bytes": size_arg(&size)? }),
            )?;
            outln!(
                "volume '{}' is now {}",
                v.name,
                human_bytes(v.provisioned_bytes)
            );
        }
        VolumeCommand::Rename { name, new_name } => {
            let v: VolumeInfo = c.patch(
                &format!("/api/v1/volumes/{}", segment(&name)),
                &json!({ "name": new_name }),
            )?;
            outln!("volume '{name}' is now '{}'", v.name);
        }
        VolumeCommand::Delete { name } => {
            c.delete(&format!("/api/v1/volumes/{}", segment(&name)))?;
            outln!("deleted volume '{name}'");
        }
        VolumeCommand::Snapshot { name, snapshot } => {
            create_from(&c, &name, "snapshots", &snapshot)?;
            outln!("snapshot '{snapshot}' of '{name}' created");
        }
        VolumeCommand::Clone { source, new } => {
            create_from(&c, &source, "clones", &new)?;
            outln!("clone '{new}' of '{source}' created");
        }
        VolumeCommand::Connect { name, host, lun } => {
            let conn: ConnectionInfo = c.post(
                &format!("/api/v1/volumes/{}/connections", segment(&name)),
                &json!({ "host": host, "lun": lun }),
            )?;
            outln!(
                "volume '{name}' connected to host '{}' at LUN {}: {}",
                conn.host,
                conn.lun,
                conn.url
            );
        }
        VolumeCommand::Disconnect { name, host } => {
            c.delete(&format!(
                "/api/v1/volumes/{}/connections/{}",
                segment(&name),
                segment(&host)
            ))?;
            outln!("volume '{name}' disconnected from host '{host}'");
        }
        VolumeCommand::Url { name, host } => {
            let v: VolumeInfo = c.get(&format!("/api/v1/volumes/{}", segment(&name)))?;
            let conn = v
                .connections
                .iter()
                .find(|c| host.as_deref().is_none_or(|h| h == c.host))
                .ok_or_else(|| match &host {
                    Some(h) => format!("volume '{name}' is not connected to host '{h}'"),
                    None => format!("volume '{name}' is not connected to any host"),
                })?;
            outln!("{}", conn.url);
        }
    }
    Ok(())
}

/// Creates volume `new` from `source` by naming it to one of `source`'s collections of derived
/// volumes, `kind` ("snapshots" or "clones"). The API answers with the new volume, which the
/// commands do not show.
fn create_from(c: &Client, source: &str, kind: &str, new: &str) -> Result<(), String> {
    let _: VolumeInfo = c.post(
        &format!("/api/v1/volumes/{}/{kind}", segment(source)),
        &json!({ "name": new }),
    )?;
    Ok(())
}

/// The setting in effect, and the saved one where a host changed it until restart.
fn write_cache_text(v: &VolumeInfo) -> String {
    if v.write_cache == v.write_cache_saved {
        v.write_cache.to_string()
    } else {
        format!(
            "{} (set by a host until restart; saved: {})",
            v.write_cache, v.write_cache_saved
        )
    }
}

fn print_volume(v: &VolumeInfo) {
    let row = |k: &str, val: String| outln!("{k:<20} {val}");
    row("name", v.name.clone());
    row("kind", v.kind.clone());
    row("id", v.id.clone());
    row("block size", v.block_size.to_string());
    row("write cache", write_cache_text(v));
    row("provisioned", human_bytes(v.provisioned_bytes));
    row(
        "mapped",
        format!(
            "{} (thin provisioning {:.1}%)",
            human_bytes(v.mapped_bytes),
            v.thin_provisioning * 100.0
        ),
    );
    row("physical (unique)", human_bytes(v.physical_bytes));
    row("physical (shared)", human_bytes(v.shared_bytes));
    row("data reduction", format!("{:.2}:1", v.data_reduction));
    for c in &v.connections {
        row(
            "connection",
            format!("host {} LUN {}  {}", c.host, c.lun, c.url),
        );
    }
    let a = &v.vaai;
    row(
        "VAAI",
        format!(
            "ATS {} (failed {})  CLONE_RD {}  CLONE_WR {} (failed {})  ZERO {} (failed {})  DELETE {} (failed {}, {} deleted)",
            a.ats,
            a.ats_failed,
            a.clone_read,
            a.clone_write,
            a.clone_failed,
            a.zero,
            a.zero_failed,
            a.delete,
            a.delete_failed,
            human_bytes(a.deleted_bytes)
        ),
    );
}

pub fn host(api: &ApiArgs, cmd: HostCommand) -> Result<(), String> {
    let c = Client::new(api)?;
    match cmd {
        HostCommand::Create {
            name,
            iqns,
            chap_user,
            chap_secret,
        } => {
            let h: HostInfo = c.post(
                "/api/v1/hosts",
                &json!({ "name": name, "iqns": iqns, "chap_user": chap_user, "chap_secret": chap_secret }),
            )?;
            outln!(
                "created host '{}' ({}{})",
                h.name,
                h.iqns.join(", "),
                if h.chap_user.is_some() { ", CHAP" } else { "" }
            );
        }
        HostCommand::List { json } => {
            let hosts: Vec<HostInfo> = c.get("/api/v1/hosts")?;
            if json {
                return print_json(&hosts);
            }
            outln!("{:<24} {:<6} {:<50} VOLUMES", "NAME", "CHAP", "IQNS");
            for h in hosts {
                outln!(
                    "{:<24} {:<6} {:<50} {}",
                    h.name,
                    if h.chap_user.is_some() { "yes" } else { "no" },
                    h.iqns.join(","),
                    h.volumes.join(",")
                );
            }
        }
        HostCommand::Delete { name } => {
            c.delete(&format!("/api/v1/hosts/{}", segment(&name)))?;
            outln!("deleted host '{name}'");
        }
    }
    Ok(())
}

pub fn array(api: &ApiArgs, cmd: ArrayCommand) -> Result<(), String> {
    let c = Client::new(api)?;
    match cmd {
        ArrayCommand::Set {
            soft_threshold,
            gc_priority,
        } => {
            if soft_threshold.is_none() && gc_priority.is_none() {
                return Err("nothing to set: give --soft-threshold and/or --gc-priority".into());
            }
            let a: ArrayInfo = c.patch(
                "/api/v1/array",
                &json!({
                    "soft_threshold": soft_threshold.map(|p| p / 100.0),
                    "gc_priority": gc_priority,
                }),
            )?;
            outln!(
                "soft threshold {:.0}%, GC priority {}",
                a.soft_threshold * 100.0,
                a.gc.priority
            );
        }
        ArrayCommand::Show { json } => {
            if json {
                let v: Value = c.get("/api/v1/array")?;
                return print_json(&v);
            }
            let a: ArrayInfo = c.get("/api/v1/array")?;
            let row = |k: &str, val: String| outln!("{k:<22} {val}");
            let pct = |n: u64| {
                if a.capacity_bytes == 0 {
                    0.0
                } else {
                    n as f64 * 100.0 / a.capacity_bytes as f64
                }
            };
            row("target", a.target_name.clone());
            row("portals", a.portals.join(", "));
            row("capacity", human_bytes(a.capacity_bytes));
            row(
                "physical used",
                format!(
                    "{} ({:.1}%)",
                    human_bytes(a.physical_used_bytes),
                    pct(a.physical_used_bytes)
                ),
            );
            row("reclaimable", human_bytes(a.reclaimable_bytes));
            row("provisioned", human_bytes(a.provisioned_bytes));
            row("mapped", human_bytes(a.mapped_bytes));
            row("data reduction", format!("{:.2}:1", a.data_reduction));
            row("total reduction", format!("{:.2}:1", a.total_reduction));
            row(
                "soft threshold",
                format!(
                    "{:.0}%{}",
                    a.soft_threshold * 100.0,
                    if a.soft_threshold_exceeded {
                        " (EXCEEDED)"
                    } else {
                        ""
                    }
                ),
            );
            row("GC priority", a.gc.priority.clone());
            row(
                "write amplification",
                format!(
                    "{:.2} ({} relocated)",
                    a.gc.write_amplification,
                    human_bytes(a.gc.relocated_bytes)
                ),
            );
            row("volumes / hosts", format!("{} / {}", a.volumes, a.hosts));
        }
    }
    Ok(())
}

/// `sliver replication ...`: the off-site copy and its restore points.
#[derive(Subcommand, Debug)]
pub enum ReplicationCommand {
    /// The copy's state, backlog, lag and newest restore point.
    Show {
        #[arg(long)]
        json: bool,
    },
    /// The restore points in the store, oldest first.
    Points {
        #[arg(long)]
        json: bool,
    },
    /// Take a named restore point holding every write acknowledged before now (kept until
    /// deleted; waits until the store holds it).
    Point { name: String },
    /// Delete a restore point; the objects only it needed are deleted after it.
    DeletePoint { name: String },
}

fn point_line(p: &Value) -> String {
    format!(
        "{:<32} {:<21} {:<9} objects {}..{}",
        p["name"].as_str().unwrap_or("?"),
        p["time"].as_str().unwrap_or("?"),
        if p["scheduled"].as_bool() == Some(true) {
            "scheduled"
        } else {
            "named"
        },
        p["base"],
        p["through"]
    )
}

pub fn replication(api: &ApiArgs, cmd: ReplicationCommand) -> Result<(), String> {
    let c = Client::new(api)?;
    match cmd {
        ReplicationCommand::Show { json } => {
            let r: Value = c.get("/api/v1/replication")?;
            if json {
                return print_json(&r);
            }
            if r["configured"].as_bool() != Some(true) {
                outln!("no off-site copy (start the array with --replicate-to or [replication])");
                return Ok(());
            }
            let row = |k: &str, val: String| outln!("{k:<22} {val}");
            row("target", r["target"].as_str().unwrap_or("").into());
            row("state", r["state"].as_str().unwrap_or("").into());
            if let Some(e) = r["error"].as_str() {
                row("error", e.into());
            }
            row(
                "shipped",
                format!(
                    "{} objects, {} (through object {})",
                    r["shipped_objects"],
                    human_bytes(r["shipped_bytes"].as_u64().unwrap_or(0)),
                    r["shipped_through"]
                ),
            );
            row(
                "backlog",
                human_bytes(r["backlog_bytes"].as_u64().unwrap_or(0)),
            );
            row(
                "lag",
                format!("{:.1} s", r["lag_seconds"].as_f64().unwrap_or(0.0)),
            );
            row("restarts", r["resyncs"].to_string());
            row("deleted by retention", r["deleted_objects"].to_string());
            let newest = &r["newest_point"];
            row(
                "newest restore point",
                if newest.is_null() {
                    "none yet".into()
                } else {
                    format!(
                        "{} at {}",
                        newest["name"].as_str().unwrap_or("?"),
                        newest["time"].as_str().unwrap_or("?")
                    )
                },
            );
        }
        ReplicationCommand::Points { json } => {
            let points: Value = c.get("/api/v1/replication/points")?;
            if json {
                return print_json(&points);
            }
            for p in points.as_array().into_iter().flatten() {
                outln!("{}", point_line(p));
            }
        }
        ReplicationCommand::Point { name } => {
            let p: Value = c.post("/api/v1/replication/points", &json!({ "name": name }))?;
            outln!("{}", point_line(&p));
        }
        ReplicationCommand::DeletePoint { name } => {
            c.delete(&format!("/api/v1/replication/points/{}", segment(&name)))?;
            outln!("restore point {name} deleted");
        }
    }
    Ok(())
}
