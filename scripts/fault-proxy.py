#!/usr/bin/env python3
"""A TCP proxy that injects the faults of a network between sliver and its object store.

Usage: fault-proxy.py LISTEN_PORT TARGET_HOST:TARGET_PORT MODE_FILE

The first word of MODE_FILE (read for every chunk and every new connection; missing = pass):
  pass            forward both ways
  delay MS        forward each chunk MS milliseconds late (a slow, far store)
  blackhole       swallow what the client sends and answer nothing (a partition); when the
                  mode leaves blackhole, the connections it held are reset, as a healed path
                  whose peers timed out would be
  reset           reset new connections and any connection that sends (a store that is down
                  or a middlebox that drops the flows)
Runs until killed; the test that started it ends it by its PID.
"""
import asyncio
import socket
import struct
import sys


def mode(path):
    try:
        with open(path) as f:
            words = f.read().split()
    except FileNotFoundError:
        return ["pass"]
    return words or ["pass"]


def reset(writer):
    """Close with RST (SO_LINGER 0), not FIN: the peer sees 'connection reset'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def pipe(reader, writer, other, path):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            m = mode(path)
            if m[0] == "blackhole":
                while mode(path)[0] == "blackhole":
                    await asyncio.sleep(0.1)
                reset(writer)
                reset(other)
                return
            if m[0] == "reset":
                reset(writer)
                reset(other)
                return
            if m[0] == "delay" and len(m) > 1:
                await asyncio.sleep(int(m[1]) / 1000)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    listen, target, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    host, port = target.rsplit(":", 1)

    async def accept(client_r, client_w):
        if mode(path)[0] == "reset":
            reset(client_w)
            return
        try:
            store_r, store_w = await asyncio.open_connection(host, int(port))
        except OSError:
            reset(client_w)
            return
        await asyncio.gather(
            pipe(client_r, store_w, client_w, path), pipe(store_r, client_w, store_w, path)
        )

    server = await asyncio.start_server(accept, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
