"""The measured workloads. Each function takes a started target (Sliver or Tgt) and returns a
dict of figures, or raises StepError; nothing here invents a figure for a step that failed."""

import json
import math
import os
import re
import signal
import subprocess
import time

from targets import GIB, MIB, BUDGET, StepError, log, run

LOAD = None  # path of the compiled iscsi-load client, set by the driver
SLIVER_BIN = None  # sliver binary (its `reclaim --lun` is the UNMAP client), set by the driver


def load(url, op, *, pattern="seq", depth=1, size=4096, count=None, seconds=None, offset=0,
         length=None, data="unique", seed=1, verify=False, readback=0, timeout=120):
    """Run iscsi-load once; returns its JSON. Fails on a command error or a data mismatch."""
    cmd = [LOAD, "-u", url, "-o", op, "-p", pattern, "-q", str(depth), "-s", str(size),
           "-O", str(offset), "-d", data, "-S", str(seed)]
    if count:
        cmd += ["-n", str(count)]
    if seconds:
        cmd += ["-t", str(seconds)]
    if length:
        cmd += ["-L", str(length)]
    if verify:
        cmd.append("-V")
    if readback:
        cmd += ["-R", str(readback)]
    _, out, err = run(cmd, timeout=timeout, check=False)
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as e:
        raise StepError(f"iscsi-load {op} printed no result: {err.strip()[-300:]}") from e
    if res["mismatches"] and op != "caw":
        raise StepError(f"DATA MISMATCH: {res['first_error']} ({res['mismatches']} of "
                        f"{res['verified']} checked)")
    if res["errors"]:
        raise StepError(f"iscsi-load {op}: {res['first_error']}")
    res["tool"] = "iscsi-load (libiscsi)"
    return res


def ceilings(work, p):
    """Loopback TCP (iperf3, one stream) and the disk's O_DIRECT sequential rates (dd)."""
    out = {}
    port = _free_port()
    server = subprocess.Popen(["iperf3", "-s", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        text, err = "", ""
        for _ in range(20):  # no connect probe: iperf3 counts it as a test
            time.sleep(0.25)
            _, text, err = run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t",
                                str(p["iperf_seconds"]), "-J"], timeout=30, check=False)
            if '"sum_received"' in text:
                break
        else:
            raise StepError(f"iperf3 gave no result: {(text + err).strip()[-300:]}")
        out["tcp_bytes_per_s"] = json.loads(text)["end"]["sum_received"]["bits_per_second"] / 8
        out["tcp_command"] = f"iperf3 -c 127.0.0.1 -t {p['iperf_seconds']} (one stream)"
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
    path = os.path.join(work, "dd.bin")
    count = p["dd_mib"]
    secs, _, _ = run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}",
                      "oflag=direct"], timeout=120)
    out["disk_write_bytes_per_s"] = count * MIB / secs
    secs, _, _ = run(["dd", f"if={path}", "of=/dev/null", "bs=1M", "iflag=direct"], timeout=120)
    out["disk_read_bytes_per_s"] = count * MIB / secs
    out["disk_command"] = (f"dd if=/dev/zero of=F bs=1M count={count} oflag=direct; "
                           "dd if=F of=/dev/null bs=1M iflag=direct")
    os.unlink(path)
    return out


def _free_port():
    from targets import free_port
    return free_port()


def block_limits(url):
    """The Block Limits VPD page (B0h) as iscsi-inq prints it: UNMAP and WRITE SAME limits."""
    _, out, _ = run(["iscsi-inq", "-e", "1", "-c", "176", url], timeout=30, check=False)
    lim = {}
    for key, label in (("max_unmap_lba_count", "maximum unmap lba count"),
                       ("max_unmap_descriptors", "maximum unmap block descriptor count"),
                       ("max_write_same_length", "maximum write same length"),
                       ("max_compare_and_write_length", "maximum compare and write length"),
                       ("max_transfer_length", "maximum transfer length")):
        m = re.search(re.escape(label) + r":\s*(\d+)", out, re.I)
        if m:
            lim[key] = int(m.group(1))
    return lim


def iscsi_perf(url, depth, blocks, seconds):
    """libiscsi's iscsi-perf, random reads over the whole LUN, for `seconds`."""
    p = subprocess.Popen(["iscsi-perf", "-r", "-m", str(depth), "-b", str(blocks), url],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)
    try:
        out, _ = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    avg = re.findall(r"iops average (\d+)", out)
    if not avg:
        raise StepError(f"iscsi-perf printed no rate: {out.strip()[-300:]}")
    return {"iops": float(avg[-1]), "tool": "iscsi-perf (libiscsi)",
            "command": f"iscsi-perf -r -m {depth} -b {blocks} URL ({seconds} s)"}


def qemu_bench_read(url, size, depth, count):
    secs, out, err = run(["qemu-img", "bench", "-f", "raw", "-c", str(count), "-d", str(depth),
                          "-s", str(size), "-S", str(size), url], timeout=120)
    m = re.search(r"Run completed in ([0-9.]+) seconds", out + err)
    took = float(m.group(1)) if m else secs
    return {"seconds": took, "iops": count / took, "bytes_per_s": count * size / took,
            "tool": "qemu-img bench",
            "command": f"qemu-img bench -f raw -c {count} -d {depth} -s {size} -S {size} URL"}


def perf_phases(p, seed):
    """Sequential 1 MiB and random 4 KiB I/O with the same client, as phases the driver runs
    on both targets in turn (alternating which goes first), in an order that lets every read
    be checked: a sequential pass writes known data, the reads verify it, then random writes
    overwrite it and read back a sample of what they wrote. Returns (key, rounds, fn(t, url))."""
    region = p["region"]
    rounds = p.get("rounds", 1)

    def seq_write(t, url):
        log(f"{t.name}: 1 MiB sequential write, QD8, {region >> 20} MiB of unique data")
        return load(url, "write", pattern="seq", depth=8, size=MIB, length=region, seed=seed,
                    timeout=180)

    def seq_read(t, url):
        log(f"{t.name}: 1 MiB sequential read, QD8, checking every byte")
        return load(url, "read", pattern="seq", depth=8, size=MIB, length=region,
                    count=region // MIB, seed=seed, verify=True, timeout=180)

    def rand_read(qd, secs):
        def fn(t, url):
            log(f"{t.name}: 4 KiB random read QD{qd}, {secs} s, checking every byte")
            return load(url, "read", pattern="rand", depth=qd, size=4096, length=region,
                        seconds=secs, seed=seed, verify=True)
        return fn

    def qbench(t, url):
        log(f"{t.name}: qemu-img bench, 1 MiB reads QD8")
        return qemu_bench_read(url, MIB, 8, region // MIB)

    def iperf_(t, url):
        log(f"{t.name}: iscsi-perf, 4 KiB random reads QD32")
        return iscsi_perf(url, 32, 8, p["qd1_seconds"])

    def rand_write(qd, secs, data):
        counter = [0]

        def fn(t, url):
            counter[0] += 1
            log(f"{t.name}: 4 KiB random write QD{qd}, {data} data, {secs} s, then read-back "
                "check")
            return load(url, "write", pattern="rand", depth=qd, size=4096, length=region,
                        seconds=secs, data=data, seed=seed + 1000 * counter[0] + qd + len(data),
                        readback=2000)
        return fn

    return [
        ("seq_write_1m_qd8", 1, seq_write),
        ("seq_read_1m_qd8", 1, seq_read),
        ("rand_read_4k_qd32", rounds, rand_read(32, p["rand_seconds"])),
        ("rand_read_4k_qd1", rounds, rand_read(1, p["qd1_seconds"])),
        ("qemu_bench_read_1m_qd8", 1, qbench),
        ("iscsi_perf_read_4k_qd32", 1, iperf_),
        ("rand_write_4k_qd32", rounds, rand_write(32, p["rand_seconds"], "unique")),
        ("rand_write_4k_qd1", rounds, rand_write(1, p["qd1_seconds"], "unique")),
        ("rand_write_4k_qd32_mix", rounds, rand_write(32, p["rand_seconds"], "mix")),
    ]


def zero_and_unmap(t, p, url_name="perf"):
    """WRITE SAME zeroing through qemu-io, a check that zeros read back, then one UNMAP pass
    over the same range with `sliver reclaim --lun` (the largest blocks per command allowed)."""
    r = {}
    url = t.url(url_name)
    size = p["zero"]
    lim = block_limits(url)
    r["block_limits"] = lim
    # qemu-io refuses one request above 2 GiB, so the range goes as 1 GiB requests in one
    # qemu-io process. QEMU zeroes with WRITE SAME when the Block Limits VPD allows it
    # (maximum WRITE SAME length > 0) and otherwise writes buffers of zeros.
    offload = lim.get("max_write_same_length", 0) > 0
    size = size if offload else p["zero_fallback"]
    log(f"{t.name}: zero {size >> 30} GiB with qemu-io write -z "
        f"({'WRITE SAME' if offload else 'no WRITE SAME: qemu writes zero buffers'})")
    cmds = []
    for off in range(0, size, GIB):
        cmds += ["-c", f"write -z {off} {min(GIB, size - off)}"]
    secs, out, err = run(["qemu-io", "-f", "raw", *cmds, url], timeout=p["zero_timeout"])
    if "failed" in out + err:
        raise StepError(f"qemu-io write -z: {(out + err).strip()[-300:]}")
    r["zero"] = {"seconds": secs, "bytes": size, "bytes_per_s": size / secs, "offload": offload,
                 "tool": "qemu-io",
                 "command": f'qemu-io -f raw -c "write -z 0 1G" -c "write -z 1G 1G" ... '
                            f'({size >> 30} requests of 1 GiB) URL'}
    log(f"{t.name}: check that zeros read back (random 4 KiB reads, "
        f"{p['zero_check_seconds']} s)")
    chk = load(url, "read", pattern="rand", depth=16, size=4096, length=size,
               seconds=p["zero_check_seconds"],
               data="zero", verify=True)
    r["zero"]["verified_reads"] = chk["verified"]
    if hasattr(t, "show"):
        r["zero"]["vaai"] = t.show(url_name).get("vaai")
    p["zero_done"][t.name] = size
    t.check_alive()
    return r


def reclaim(sliver_bin, url, count, bpc, queue_depth=1, timeout=300):
    _, out, _ = run([sliver_bin, "reclaim", "--lun", url, "--lba", "0", "--count", str(count),
                     "--blocks-per-command", str(bpc), "--queue-depth", str(queue_depth),
                     "--rate", "unlimited", "--json"], timeout=timeout)
    rep = json.loads(out)["result"]
    if not rep.get("completed"):
        raise StepError(f"reclaim did not complete: {rep}")
    return rep


def unmap_whole(t, p, sliver_bin, url_name="perf"):
    url = t.url(url_name)
    size = p["zero_done"].get(t.name) or p["zero"]
    lim = block_limits(url)
    bs = 512
    count = size // bs
    cap = lim.get("max_unmap_lba_count") or 0
    bpc = count if cap in (0, 0xFFFFFFFF) or cap >= count else cap
    log(f"{t.name}: UNMAP {size >> 30} GiB, {bpc} blocks per command (sliver reclaim --lun)")
    rep = reclaim(sliver_bin, url, count, bpc, timeout=p["zero_timeout"])
    return {"seconds": rep["elapsed_seconds"], "bytes": rep["bytes_unmapped"],
            "blocks_per_command": bpc, "commands": rep["commands"],
            "tool": "sliver reclaim --lun (raw UNMAP)"}


def clone(t, p, seed, sliver=None):
    """Copy a written volume with copy offload requested (qemu-img convert -C: XCOPY) and
    with a host copy (qemu-img convert), then check both copies."""
    r = {}
    size = p["clone"]
    src, dst, dst2 = (t.volume(n, size) for n in ("clonesrc", "clonedst", "clonehost"))
    log(f"{t.name}: write {size >> 30} GiB of unique data to the clone source")
    load(src, "write", pattern="seq", depth=8, size=MIB, length=size, seed=seed,
         timeout=p["clone_timeout"])
    # qemu-img convert -C falls back to reading and writing, silently, when EXTENDED COPY is
    # refused; whether the copy was offloaded is read from the target: INQUIRY's 3PC bit
    # (both) and sliver's CLONE counters.
    _, inq, _ = run(["iscsi-inq", dst], timeout=30, check=False)
    third_party_copy = "3PC:1" in inq
    before = sliver.array() if sliver else None
    log(f"{t.name}: qemu-img convert -C (copy offload requested; 3PC={int(third_party_copy)})")
    secs, out, err = run(["qemu-img", "convert", "-C", "-n", "-f", "raw", "-O", "raw", src, dst],
                         timeout=p["clone_timeout"])
    r["offload"] = {"seconds": secs, "bytes": size, "third_party_copy": third_party_copy,
                    "offload_used": third_party_copy, "tool": "qemu-img convert -C"}
    if sliver:
        after = sliver.array()
        vaai = sliver.show("clonedst").get("vaai") or {}
        r["offload"]["physical_added_bytes"] = (after["physical_used_bytes"]
                                                - before["physical_used_bytes"])
        r["offload"]["vaai"] = vaai
        r["offload"]["offload_used"] = vaai.get("cloned_bytes", 0) >= size
    log(f"{t.name}: qemu-img convert (host copy)")
    secs, _, _ = run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, dst2],
                     timeout=p["clone_timeout"])
    r["host"] = {"seconds": secs, "bytes": size, "tool": "qemu-img convert"}
    for name, url in (("offload", dst), ("host", dst2)):
        if p["clone_verify_full"]:
            chk = load(url, "read", pattern="seq", depth=8, size=MIB, length=size,
                       count=size // MIB, seed=seed, verify=True, timeout=p["clone_timeout"])
        else:
            chk = load(url, "read", pattern="rand", depth=16, size=4096, length=size,
                       seconds=1.5, seed=seed, verify=True)
        r[name]["verified_reads"] = chk["verified"]
    # UNMAP of written data: the host copy, in one pass with the largest blocks per command.
    lim = block_limits(dst2)
    count = size // 512
    cap = lim.get("max_unmap_lba_count") or 0
    bpc = count if cap in (0, 0xFFFFFFFF) or cap >= count else cap
    log(f"{t.name}: UNMAP the {size >> 30} GiB host copy ({bpc} blocks per command)")
    rep = reclaim(SLIVER_BIN, dst2, count, bpc, timeout=p["clone_timeout"])
    r["unmap_written"] = {"seconds": rep["elapsed_seconds"], "bytes": rep["bytes_unmapped"],
                          "blocks_per_command": bpc, "commands": rep["commands"],
                          "tool": "sliver reclaim --lun (raw UNMAP)"}
    # Give the space of the other two volumes back too (not measured): tgt's files would
    # otherwise hold 2x the clone size of the scratch disk for the rest of the run.
    for url in (src, dst):
        reclaim(SLIVER_BIN, url, count, bpc, timeout=p["clone_timeout"])
    t.check_alive()
    return r


def caw(t, p):
    """COMPARE AND WRITE latency (QD1, one block, like an ATS heartbeat), alone and while
    another session writes unique data: 4 KiB random at QD16, then 1 MiB sequential at QD8."""
    r = {}
    url = t.url("perf")
    secs = p["caw_seconds"]
    off = p["region"] + 64 * MIB
    log(f"{t.name}: COMPARE AND WRITE alone, {secs} s")
    try:
        r["alone"] = load(url, "caw", offset=off, seconds=secs)
    except StepError as e:
        if "ILLEGAL" in str(e) or "INVALID" in str(e):
            return {"supported": False, "detail": str(e)}
        raise
    # Under load: a second session writes unique data meanwhile, 4 KiB random at QD16 (many
    # VMs' small writes), then 1 MiB sequential at QD8 (a host-side copy or a restore): the
    # stream also fills the log fastest, so the engine's checkpoints fall in this window.
    for key, bg_key, what, args in (
            ("under_load", "background", "a QD16 random write load",
             ["-p", "rand", "-q", "16", "-s", "4096", "-S", "77"]),
            ("under_stream", "background_stream", "a QD8 1 MiB sequential write stream",
             ["-p", "seq", "-q", "8", "-s", str(MIB), "-S", "78"])):
        log(f"{t.name}: COMPARE AND WRITE under {what}, {secs} s")
        bg = subprocess.Popen([LOAD, "-u", url, "-o", "write", *args, "-L", str(p["region"]),
                               "-t", str(secs + 2)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
        try:
            time.sleep(0.5)
            r[key] = load(url, "caw", offset=off, seconds=secs)
            out, _ = bg.communicate(timeout=BUDGET.timeout(secs + 30))
            r[bg_key] = json.loads(out.strip().splitlines()[-1])
        finally:
            if bg.poll() is None:
                bg.kill()
                bg.wait()
    r["supported"] = True
    return r


def dataset_image(work, p):
    """A realistic file-system image: ext4 populated from a directory of this machine."""
    path = os.path.join(work, "dataset.ext4")
    src = p["dataset_dir"]
    log(f"dataset: mke2fs -d {src} into a {p['dataset_size'] >> 20} MiB ext4 image")
    run(["mke2fs", "-q", "-F", "-t", "ext4", "-E", "nodiscard,lazy_itable_init=1",
         "-d", src, path, f"{p['dataset_size'] >> 20}M"], timeout=120)
    used = os.stat(path).st_blocks * 512
    return {"path": path, "source": src, "image_bytes": p["dataset_size"],
            "allocated_bytes": used}


def reduction(t, p, ds, seed, sliver=None):
    """Write the image into a base volume and N copies (host copies), then divergent writes
    into each copy; report physical space against the logical data written."""
    size = p["dataset_size"]
    urls = [t.volume(f"ds{i}", size) for i in range(p["dataset_copies"] + 1)]
    before = sliver.array() if sliver else None
    for i, url in enumerate(urls):
        log(f"{t.name}: dataset copy {i} (qemu-img convert image -> LUN)")
        run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", ds["path"], url],
            timeout=p["dataset_timeout"])
    div = p["divergent_bytes"]
    for i, url in enumerate(urls[1:], 1):
        load(url, "write", pattern="rand", depth=16, size=4096, count=div // 4096,
             data="mix", seed=seed + i, timeout=60)
    r = {"copies": len(urls), "image_bytes": size, "image_allocated_bytes": ds["allocated_bytes"],
         "divergent_bytes_per_copy": div}
    if sliver:
        time.sleep(1)
        after = sliver.array()
        r["physical_bytes"] = after["physical_used_bytes"] - before["physical_used_bytes"]
        r["live_bytes"] = after["live_bytes"] - before["live_bytes"]
        r["mapped_bytes"] = after["mapped_bytes"] - before["mapped_bytes"]
        r["engine_data_reduction"] = after["data_reduction"]
        r["engine_total_reduction"] = after.get("total_reduction")
    else:
        r["physical_bytes"] = sum(t.allocated(f"ds{i}") for i in range(len(urls)))
        r["mapped_bytes"] = r["physical_bytes"]
    r["logical_written_bytes"] = len(urls) * ds["allocated_bytes"] + (len(urls) - 1) * div
    t.check_alive()
    return r


def lambert_w0(x):
    """Principal branch of Lambert W for -1/e <= x < 0 (Halley iteration)."""
    if x <= -1 / math.e:
        return -1.0
    w = -0.5 if x < -0.25 else x
    for _ in range(100):
        e = math.exp(w)
        f = w * e - x
        wn = w - f / (e * (w + 1) - (w + 2) * f / (2 * w + 2))
        if abs(wn - w) < 1e-13:
            return wn
        w = wn
    return w


def greedy_wa(u):
    """Write amplification under uniform random overwrites at occupancy u (LRW/greedy with large
    segments): A = alpha / (alpha + W0(-alpha e^-alpha)), alpha = 1/u."""
    a = 1 / u
    return a / (a + lambert_w0(-a * math.exp(-a)))


def gc(binary, work, p, seed):
    """A nearly full sliver array under random overwrites, then after UNMAP of half the data."""
    from targets import Sliver
    cap = p["gc_capacity"]
    s = Sliver(binary, work, "gc", cap)
    try:
        s.cli("array", "set", "--soft-threshold", "100", "--gc-priority", "medium")
        info = s.array()
        usable = info["capacity_bytes"]
        vol = int(usable * p["gc_fill"]) // MIB * MIB
        url = s.volume("gc", vol)
        log(f"gc: fill {vol >> 20} MiB of a {usable >> 20} MiB array with unique data")
        load(url, "write", pattern="seq", depth=8, size=MIB, length=vol, seed=seed, timeout=120)
        phases = []

        def overwrite(label, start, length, amount):
            half = amount // 2 // p["gc_io"]
            samples = [s.array()]
            rates = []
            for k in range(2):
                log(f"gc: {label}: random {p['gc_io'] >> 10} KiB overwrites, "
                    f"{half * p['gc_io'] >> 20} MiB (part {k + 1}/2)")
                res = load(url, "write", pattern="rand", depth=16, size=p["gc_io"], offset=start,
                           length=length, count=half, seed=seed + 100 * len(phases) + k,
                           timeout=p["gc_timeout"])
                rates.append(res["bytes_per_s"])
                samples.append(s.array())
            a, b = samples[1], samples[2]
            host = b["gc"]["host_written_bytes"] - a["gc"]["host_written_bytes"]
            moved = b["gc"]["relocated_bytes"] - a["gc"]["relocated_bytes"]
            u = b["live_bytes"] / b["capacity_bytes"]
            phases.append({"label": label, "u": u, "live_bytes": b["live_bytes"],
                           "capacity_bytes": b["capacity_bytes"],
                           "write_amplification": (host + moved) / host if host else None,
                           "host_bytes": host, "relocated_bytes": moved,
                           "write_bytes_per_s": rates[1], "first_half_bytes_per_s": rates[0],
                           "theory_write_amplification": greedy_wa(u) if 0 < u < 1 else None,
                           "array_wa_cumulative": b["gc"]["write_amplification"]})

        overwrite("before UNMAP", 0, vol, p["gc_amount"])
        log("gc: UNMAP the first half of the volume")
        rep = reclaim(binary, url, (vol // 2) // 512, min((vol // 2) // 512, 1 << 24))
        time.sleep(1)
        overwrite("after UNMAP of half", vol // 2, vol - vol // 2, p["gc_amount"])
        return {"capacity_bytes": usable, "volume_bytes": vol, "io_size": p["gc_io"],
                "unmap_seconds": rep["elapsed_seconds"], "phases": phases,
                "gc_priority": "medium", "tool": "iscsi-load random writes, QD16"}
    finally:
        s.stop()
