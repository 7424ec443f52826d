#!/usr/bin/env python3
"""A TCP proxy that adds a fixed delay to every byte each way, to measure
against a local server as if it were a remote one (an S3 region about
2 x DELAY of round trip away). Bytes keep their pace: each chunk is
forwarded DELAY after it arrived, not DELAY after the previous one.

    latency-proxy.py LISTEN_PORT TARGET_HOST:TARGET_PORT DELAY_MS
"""
import asyncio
import sys
import time


async def pump(reader, writer, delay):
    queue = asyncio.Queue()

    async def forward():
        while True:
            due, chunk = await queue.get()
            if chunk is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(forward())
    try:
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            queue.put_nowait((time.monotonic() + delay, chunk))
    except ConnectionError:
        pass
    queue.put_nowait((0, None))
    try:
        await sender
    except ConnectionError:
        pass


async def main():
    port, target, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]) / 1000
    host, target_port = target.rsplit(":", 1)

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(host, int(target_port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pump(client_reader, server_writer, delay), pump(server_reader, client_writer, delay)
        )

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


asyncio.run(main())
