//! Two hosts on one array, for tests of what an initiator may reach of another host's volumes.

use sliver_api_types::IscsiName;
use sliver_server::Array;

/// The initiator of host `host-a`.
pub const HOST_A: &str = "iqn.2026-11.test:host-a";
/// The initiator of host `host-b`.
pub const HOST_B: &str = "iqn.2026-11.test:host-b";

/// `name` as an initiator name; a test's own constants are names, so a bad one is a bug here.
pub fn iqn(name: &str) -> IscsiName {
    IscsiName::new(name).unwrap_or_else(|e| panic!("{e}"))
}

/// On `array`: the `volumes` (name, bytes; 512-byte blocks), hosts `host-a` ([`HOST_A`]) and
/// `host-b` ([`HOST_B`]), and the `connections` (volume, host, LUN), in that order.
pub fn two_hosts(array: &Array, volumes: &[(&str, u64)], connections: &[(&str, &str, u64)]) {
    for &(name, bytes) in volumes {
        array
            .create_volume(name, bytes, 512)
            .unwrap_or_else(|e| panic!("volume {name}: {e}"));
    }
    for (host, iqn) in [("host-a", HOST_A), ("host-b", HOST_B)] {
        array
            .create_host(host, vec![self::iqn(iqn)], None)
            .unwrap_or_else(|e| panic!("host {host}: {e}"));
    }
    for &(volume, host, lun) in connections {
        array
            .connect(volume, host, Some(lun))
            .unwrap_or_else(|e| panic!("{volume} to {host} at LUN {lun}: {e}"));
    }
}
