#!/usr/bin/env python3
"""Write the seed corpus of every fuzz target: valid inputs the fuzzer mutates from.

Run from the fuzz/ directory: python3 make_corpus.py. The files are checked in; this script
documents what they are and regenerates them.
"""
import os
import struct

TARGET = b"iqn.2026-11.dev.sliver:array"


def pad4(b):
    return b + b"\0" * (-len(b) % 4)


def bhs(opcode, flags, data_len, rest_24_48, lun=b"\0" * 8, itt=1):
    """48-byte BHS: opcode, flags, 2 bytes opcode-specific, AHS len 0, 3-byte data length,
    LUN / opcode-specific (8), ITT (4), then 28 opcode-specific bytes."""
    h = bytes([opcode, flags, 0, 0, 0]) + data_len.to_bytes(3, "big") + lun
    h += struct.pack(">I", itt) + rest_24_48
    assert len(h) == 48, len(h)
    return h


def keys(*pairs):
    return b"".join(k + b"=" + v + b"\0" for k, v in pairs)


def login(data, csg=1, nsg=3, transit=True, isid=b"\x40\0\0\x01\0\x01", cmdsn=0):
    flags = (0x80 if transit else 0) | (csg << 2) | nsg
    # version max/min in bytes 2-3 are 0 already; ISID, TSIH, ITT, CID, CmdSN, ExpStatSN
    h = bytes([0x43, flags, 0, 0, 0]) + len(data).to_bytes(3, "big")
    h += isid + b"\0\0"  # ISID + TSIH
    h += struct.pack(">IHHII", 1, 0, 0, cmdsn, 0) + b"\0" * 16
    assert len(h) == 48
    return h + pad4(data)


def scsi_cmd(cdb, edtl, read=True, write=False, itt=2, cmdsn=1, data=b""):
    flags = 0x80 | (0x40 if read else 0) | (0x20 if write else 0) | 0x01
    cdb = cdb + b"\0" * (16 - len(cdb))
    rest = struct.pack(">III", edtl, cmdsn, 1) + cdb
    h = bytes([0x01, flags, 0, 0, 0]) + len(data).to_bytes(3, "big") + b"\0" * 8
    h += struct.pack(">I", itt) + rest
    assert len(h) == 48
    return h + pad4(data)


def nop_out(cmdsn, data=b"ping"):
    h = bytes([0x40 | 0x00, 0x80, 0, 0, 0]) + len(data).to_bytes(3, "big") + b"\0" * 8
    h += struct.pack(">IIII", 3, 0xFFFFFFFF, cmdsn, 1) + b"\0" * 16
    return h + pad4(data)


def logout(cmdsn):
    h = bytes([0x46, 0x80, 0, 0, 0, 0, 0, 0]) + b"\0" * 8
    h += struct.pack(">IHHII", 4, 0, 0, cmdsn, 1) + b"\0" * 16
    return h


normal_login = keys(
    (b"InitiatorName", b"iqn.2026-11.test:fuzz"),
    (b"SessionType", b"Normal"),
    (b"TargetName", TARGET),
    (b"HeaderDigest", b"None"),
    (b"DataDigest", b"None"),
    (b"MaxRecvDataSegmentLength", b"262144"),
    (b"ImmediateData", b"Yes"),
    (b"InitialR2T", b"No"),
    (b"FirstBurstLength", b"65536"),
    (b"MaxBurstLength", b"262144"),
    (b"ErrorRecoveryLevel", b"0"),
)
discovery_login = keys(
    (b"InitiatorName", b"iqn.2026-11.test:fuzz"),
    (b"SessionType", b"Discovery"),
)
security_login = keys(
    (b"InitiatorName", b"iqn.2026-11.test:fuzz"),
    (b"TargetName", TARGET),
    (b"AuthMethod", b"CHAP,None"),
)

inquiry = bytes([0x12, 0, 0, 0, 96, 0])
read10 = bytes([0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0])
write10 = bytes([0x2A, 0, 0, 0, 0, 16, 0, 0, 1, 0])

corpus = {
    "pdu_stream": {
        "login_inquiry": login(normal_login) + scsi_cmd(inquiry, 96),
        "login_write_read": login(normal_login)
        + scsi_cmd(write10, 512, read=False, write=True, data=b"\xab" * 512)
        + scsi_cmd(read10, 4096, itt=3, cmdsn=2),
        "login_nop_logout": login(normal_login) + nop_out(1) + logout(1),
        "discovery": login(discovery_login)
        + bytes([0x04, 0x80, 0, 0, 0, 0, 0, 16]) + b"\0" * 8
        + struct.pack(">IIII", 5, 0xFFFFFFFF, 0, 1) + b"\0" * 16
        + pad4(b"SendTargets=All\0"),
        "security_stage": login(security_login, csg=0, nsg=1),
    },
    "text_keys": {
        "normal": normal_login,
        "discovery": discovery_login,
        "chap": keys((b"CHAP_A", b"5"), (b"CHAP_N", b"alice"),
                     (b"CHAP_R", b"0x" + b"ab" * 16), (b"CHAP_I", b"7"),
                     (b"CHAP_C", b"0b" + b"QUJDREVGR0hJSktMTU5PUA==")),
        "odd": b"X-vendor.key=Irrelevant\0MaxConnections=1\0OFMarker=No\0Reject=\0",
    },
    "cdb": {
        # first byte: CDB length, then the CDB, then Data-Out
        "inquiry": bytes([6]) + inquiry,
        "inquiry_vpd_b0": bytes([6, 0x12, 1, 0xB0, 0, 255, 0]),
        "read10": bytes([10]) + read10,
        "write10": bytes([10]) + write10 + b"\x5a" * 512,
        "read_capacity16": bytes([16, 0x9E, 0x10] + [0] * 10 + [32, 0, 0]),
        "compare_and_write": bytes([16, 0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0])
        + b"\0" * 1024,
        "write_same16_unmap": bytes([16, 0x93, 0x08] + [0] * 8 + [0, 0, 0, 64, 0, 0])
        + b"\0" * 512,
        "get_lba_status": bytes([16, 0x9E, 0x12] + [0] * 8 + [0, 0, 0, 32, 0, 0]),
        "report_opcodes": bytes([12, 0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0]),
        "sync_cache16": bytes([16, 0x91] + [0] * 15),
    },
    "parameter_lists": {
        # first byte selects the command (mod 7): 0 UNMAP, 1 PR OUT, 2 MODE SELECT(6),
        # 3 MODE SELECT(10), 4 EXTENDED COPY, 5 POPULATE TOKEN, 6 WRITE USING TOKEN
        "unmap": bytes([0]) + struct.pack(">HH4x", 22, 16) + struct.pack(">QI4x", 8, 16),
        "pr_register": bytes([1 << 3 | 1]) + b"\0" * 8 + struct.pack(">Q", 0x1234) + b"\0" * 8,
        "mode_select6_caching": bytes([2]) + bytes([0, 0, 0, 0, 0x08, 18, 0x04] + [0] * 17),
        "mode_select10_control": bytes([3]) + bytes([0] * 8 + [0x0A, 10, 0x02] + [0] * 9),
        "xcopy_one_segment": bytes([4])
        + struct.pack(">BBHHxxI", 0, 0x18, 64, 28, 0) + b"\0" * 4
        + bytes([0xE4, 0, 0, 0, 0x01, 0x03, 0, 0x10]) + b"\x60" + b"\0" * 15 + b"\0" * 8
        + bytes([0xE4, 0, 0, 0, 0x01, 0x03, 0, 0x10]) + b"\x60" + b"\0" * 15 + b"\0" * 8
        + bytes([0x02, 0, 0, 0x18, 0, 0, 0, 1, 0, 8, 0, 0])
        + struct.pack(">QQ", 0, 64),
        "populate_token_two_ranges": bytes([5])
        + struct.pack(">HxxIIxxH", 46, 0, 0, 32)
        + struct.pack(">QI4x", 0, 8) + struct.pack(">QI4x", 64, 8),
        # The well-known zero token, written over one range.
        "write_using_token_zero": bytes([6])
        + struct.pack(">H6xQ", 550, 0)
        + struct.pack(">I2xH", 0xFFFF0001, 0x1F8) + b"\0" * 504
        + b"\0" * 6 + struct.pack(">H", 16) + struct.pack(">QI4x", 8, 8),
    },
}


def rec(kind, payload):
    """An engine record for the engine_log harness: kind, length, payload (it adds the CRC)."""
    assert len(payload) < 256
    return bytes([kind, len(payload)]) + payload


chunk = struct.pack("<IB3x", 1, 0) + b"\x11" * 16 + b"data" * 8
corpus["engine_log"] = {
    "chunk_map_unmap": rec(2, chunk)
    + rec(3, struct.pack("<IIQ", 1, 0, 3) + struct.pack("<III", 1, 0, 1))
    + rec(4, struct.pack("<IIQQ", 1, 0, 0, 4)),
    "clone_copy_delete": rec(2, chunk)
    + rec(3, struct.pack("<IIQ", 1, 0, 0) + struct.pack("<I", 1))
    + rec(9, struct.pack("<II", 1, 2))
    + rec(5, struct.pack("<IIQQQ", 1, 2, 0, 10, 1))
    + rec(8, struct.pack("<IIQ", 2, 0, 8192))
    + rec(7, struct.pack("<I", 1)),
}
corpus["checkpoint"] = {"magic_only": b"SLVRCKP1" + struct.pack("<II", 1, 0)}
# engine_ops: each operation is [op, start block, count] and its own bytes (fuzz_ops.rs):
# op 0-2 write (seed u16), 3 unmap, 4 flush, 5 checkpoint, 6 collect, 7 fail the next sync,
# 8 crash (mode, seed u16), 9 read.
corpus["engine_ops"] = {
    "write_flush_crash_read": bytes([0, 0, 3, 7, 0, 4, 0, 0, 8, 0, 0, 0, 0, 0, 9, 2, 0]),
    "failed_sync_then_crash": bytes(
        [0, 5, 7, 1, 2, 7, 0, 0, 4, 0, 0, 3, 6, 1, 6, 0, 0, 8, 0, 0, 3, 0x33, 0, 9, 5, 0]
    ),
}


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli), bitwise: the checksum of every engine record."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def page_loc(slot, table, index, body):
    """A PageLoc: the slot and CRC-32C of (table, index, body)."""
    crc = crc32c(bytes([table]) + struct.pack("<Q", index) + body)
    return struct.pack("<QI", slot, crc)


def root_with_one_page():
    """engine_page input: u16 root length, a format 3 root naming one chunk table page
    (through one directory page in slot 0, the page in slot 1), then the metadata area."""
    data = b"".join(
        b"\x22" * 16 + struct.pack("<IIII", 0, 36 + 40 * i, 40, 1) for i in range(128)
    )
    directory = page_loc(1, 1, 0, data).ljust(4096, b"\0")
    body = struct.pack("<III", 4096, 4 << 20, 16) + b"\x07" * 32
    body += struct.pack("<IQI", 0, 1, 36)  # replay position
    body += struct.pack("<QQIQQQ", 0, 0, 2, 1, 0, 0)  # counters
    body += struct.pack("<BQQ", 4, 0, 0)  # hook table shape
    body += struct.pack("<BBQQI", 1, 1, 1, 0, 1) + page_loc(0, 129, 0, directory)
    body += struct.pack("<I", 1) + struct.pack("<IQQB", 1, 64 << 20, 0, 2)
    body += struct.pack("<I", 0)  # nothing awaiting release
    root = b"SLVRROOT" + struct.pack("<III", 3, crc32c(body), len(body)) + body
    return struct.pack("<H", len(root)) + root + directory + data


def page_loc4(slot, table, index, body, gen):
    """A format 4 PageLoc: the slot, CRC-32C of (table, index, body), the generation."""
    return page_loc(slot, table, index, body) + struct.pack("<Q", gen)


def root_with_a_journal():
    """engine_page input: a format 4 root naming, through a top directory page and a
    directory page each, one chunk table page (written by checkpoint 1: slots 0-2) and one
    journal page (checkpoint 2: slots 3-5) that sets word 2 of that chunk page to 0x5555."""
    data = b"".join(
        b"\x22" * 16 + struct.pack("<IIII", 0, 36 + 40 * i, 40, 1) for i in range(128)
    )
    groups = struct.pack("<BQB", 1, 0, 1) + struct.pack("<HQ", 2, 0x5555)
    journal = (struct.pack("<QH", 2, len(groups)) + b"\0" * 6 + groups).ljust(4096, b"\0")
    chunk_dir = page_loc4(2, 1, 0, data, 1).ljust(4096, b"\0")
    chunk_top = page_loc4(1, 129, 0, chunk_dir, 1).ljust(4096, b"\0")
    journal_dir = page_loc4(5, 7, 0, journal, 2).ljust(4096, b"\0")
    journal_top = page_loc4(4, 135, 0, journal_dir, 2).ljust(4096, b"\0")
    body = struct.pack("<III", 4096, 4 << 20, 16) + b"\x07" * 32
    body += struct.pack("<IQI", 0, 1, 36)  # replay position
    body += struct.pack("<QQIQQQ", 0, 0, 2, 2, 0, 0)  # counters (generation 2)
    body += struct.pack("<BQQ", 4, 0, 0)  # hook table shape
    body += struct.pack("<B", 2)
    body += struct.pack("<BQQI", 1, 1, 0, 1) + page_loc4(0, 65, 0, chunk_top, 1)
    body += struct.pack("<BQQI", 7, 1, 0, 1) + page_loc4(3, 71, 0, journal_top, 2)
    body += struct.pack("<I", 1) + struct.pack("<IQQB", 1, 64 << 20, 0, 2)
    body += struct.pack("<I", 0)  # nothing awaiting release
    root = b"SLVRROOT" + struct.pack("<III", 4, crc32c(body), len(body)) + body
    return (struct.pack("<H", len(root)) + root + chunk_top + chunk_dir + data
            + journal_top + journal_dir + journal)


corpus["engine_page"] = {
    "root_one_page": root_with_one_page(),
    "format4_root_with_a_journal": root_with_a_journal(),
}
corpus["engine_log"]["format3_chunk_map_copy_release"] = (
    rec(13, struct.pack("<Q", 1) + b"\x11" * 16 + b"data" * 8)
    + rec(14, struct.pack("<IIQ", 1, 0, 0) + struct.pack("<QQ", 1, 1))
    + rec(5, struct.pack("<IIQQQ", 1, 1, 0, 512, 2))
    + rec(4, struct.pack("<IIQQ", 1, 0, 0, 1024))
    + rec(16, struct.pack("<II", 1, 0))
)



def replica_object(kind, array, epoch, number, body, table_len=0):
    """RFC 0003's object: the 64-byte header (CRC-32C over it with its own field zero), then
    the body; stream objects carry their table's length in the last four header bytes."""
    h = b"SLVROBJ1" + bytes([kind, 0, 0, 0]) + b"\0" * 4 + array
    h += struct.pack("<QQQII", epoch, number, len(body), crc32c(body), table_len)
    assert len(h) == 64, len(h)
    h = h[:12] + struct.pack("<I", crc32c(h)) + h[16:]
    return h + body


corpus["replica_object"] = {
    "segment": replica_object(2, b"pool-a-uuid-0001", 1, 0x10, bytes(range(256)) * 4),
    "manifest_empty_body": replica_object(1, b"pool-a-uuid-0001", 7, 1, b""),
    "name_head": b"head/0000000000000009-00001000",
    "name_manifest": b"manifest/00000000000000000007",
    # catalog.rs: a named restore point (version 1, through 33, base 1) and a base index entry.
    "point_named": replica_object(10, b"pool-a-uuid-0001", 0, 1,
        bytes([1, 0]) + struct.pack("<HIQQQ", 11, 0, 1795742638738, 33, 1) + b"before-hang"),
    "base_index": replica_object(11, b"pool-a-uuid-0001", 0, 1,
        bytes([1, 0, 0, 0]) + struct.pack("<IQQQ", 0, 1, 3, 20 << 20)),
    "name_point": b"points/0000000000000001",
    # catalog.rs: a pin of stream objects 3..=9 by a restore in progress, expiring in 2027.
    "pin": replica_object(12, b"pool-a-uuid-0001", 0, 0x5eed,
        bytes([1]) + b"\0" * 7 + struct.pack("<QQQ", 1800000000000, 3, 9)),
}

def stream_record(area, offset, payload=b"", length=None):
    """A record of a stream object's body: area, flags, two zero bytes, length, offset,
    payload."""
    n = len(payload) if length is None else length
    return bytes([area, 0, 0, 0]) + struct.pack("<IQ", n, offset) + payload


corpus["replica_stream"] = {
    "base_then_writes": stream_record(5, 1 << 30)
    + stream_record(0x11, 0, b"\x5a" * 64)
    + stream_record(1, 4096, b"log")
    + stream_record(2, 8192, b"\x07" * 32)
    + stream_record(4, 1 << 20, length=4 << 20)
    + stream_record(3, 0, b"root")
    + stream_record(6, 0),
}


def indexed(records):
    """An indexed stream body: every record's 16-byte header and its payload's CRC-32C, the
    table's own CRC-32C, then the payloads. Returns (body, table length)."""
    table = b"".join(r[:16] + struct.pack("<I", crc32c(r[16:])) for r in records)
    table += struct.pack("<I", crc32c(table))
    return table + b"".join(r[16:] for r in records), len(table)


_records = [
    stream_record(5, 1 << 30),
    stream_record(0x11, 0, b"\x5a" * 64),
    stream_record(1, 4096, b"log"),
    stream_record(2, 8192, b"\x07" * 32),
    stream_record(4, 1 << 20, length=4 << 20),
    stream_record(3, 0, b"root"),
    stream_record(6, 0),
]
_body, _table_len = indexed(_records)
# The fuzz target reads the first four bytes as the table's length.
corpus["replica_stream"]["indexed"] = struct.pack("<I", _table_len) + _body
corpus["replica_object"]["stream_indexed"] = replica_object(
    9, b"pool-a-uuid-0001", 0, 3, _body, _table_len)


def hydrate_map(entries, tables):
    """A restored array's hydration map: magic, count, 40-byte entries (area, pad, start,
    length, object, position in its body), the tables' count and 32-byte entries (object,
    offset in the tables file, table length, pad, body length), CRC-32C of it all."""
    body = b"SLVRHYD1" + struct.pack("<Q", len(entries))
    for area, start, length, obj, at in entries:
        body += bytes([area]) + b"\0" * 7 + struct.pack("<QQQQ", start, length, obj, at)
    body += struct.pack("<Q", len(tables))
    for obj, offset, tlen, body_len in tables:
        body += struct.pack("<QQII", obj, offset, tlen, 0) + struct.pack("<Q", body_len)
    return body + struct.pack("<I", crc32c(body))


def journal_entry(area, start, length):
    rest = bytes([area, 0, 0, 0]) + struct.pack("<QQ", start, length)
    return struct.pack("<I", crc32c(rest)) + rest


_map = hydrate_map([
    (0, 0, 65536, 1, 120),
    (0, 1 << 20, 4096, 2, 65656),
    (1, 8192, 4096, 1, 65656),
], [(1, 0, 64, 1 << 20), (2, 64, 84, 1 << 20)])
_journal = journal_entry(0, 4096, 8192) + journal_entry(1, 8192, 4096)
corpus["hydrate_map"] = {
    # The fuzz target's first two bytes: where the map ends.
    "map_and_journal": struct.pack("<H", len(_map)) + _map + _journal,
}

for target, files in corpus.items():
    os.makedirs(os.path.join("corpus", target), exist_ok=True)
    for name, data in files.items():
        with open(os.path.join("corpus", target, name), "wb") as f:
            f.write(data)
print("corpus written")
