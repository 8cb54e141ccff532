"""The memory of a fresh `kwker serve` process (SmolLM2-135M, the default model): RSS and peak RSS
after loading, then after a burst of 32 concurrent 64-token chat requests.

    python scripts/serve_rss.py [--max-batch 8] [--cache-slots 4]
"""

import argparse
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--cache-slots", type=int, default=4)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "kwker.cli", "serve", "--port", str(port)]
    cmd += ["--max-batch", str(args.max_batch), "--cache-slots", str(args.cache_slots)]
    server = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def rss() -> tuple[float, float]:
        status = dict(line.split(":", 1) for line in open(f"/proc/{server.pid}/status"))
        return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024

    def ask(i: int) -> int:
        body = {"messages": [{"role": "user", "content": f"Tell me about the number {i}."}],
                "max_tokens": 64, "temperature": 0}  # fmt: skip
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).status_code

    try:
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        time.sleep(1)
        now, peak = rss()
        print(f"after loading: RSS {now:.0f} MB, peak {peak:.0f} MB")
        with ThreadPoolExecutor(args.requests) as pool:
            codes = set(pool.map(ask, range(args.requests)))
        time.sleep(1)
        now, peak = rss()
        print(f"after {args.requests} requests {codes}: RSS {now:.0f} MB, peak {peak:.0f} MB")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
