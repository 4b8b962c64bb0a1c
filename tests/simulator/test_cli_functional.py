"""The ``simulate`` subcommand and ``start_simulator``: argument parsing, a real process, signals."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from simulator.cli import register, run, start_simulator

MAIN = (
    "import argparse, sys\n"
    "from simulator.cli import register\n"
    "parser = argparse.ArgumentParser(prog='tokenstamp')\n"
    "register(parser.add_subparsers())\n"
    "args = parser.parse_args(sys.argv[1:])\n"
    "sys.exit(args.func(args))\n"
)
ROOT = Path(__file__).parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tokenstamp")
    register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_arguments():
    args = parse("simulate")
    assert args.func is run
    assert args.listen == ("127.0.0.1", 8000)
    assert args.profile == "seed"
    assert args.chunk_size is ...
    assert args.prefix_cache is False
    args = parse(
        "simulate", "--listen", "[::1]:9000", "--chunk-size", "none", "--max-num-seqs", "8",
        "--output-tokens", "4", "--prefix-cache", "--ground-truth", "gt.jsonl", "--profile", "fast",
    )  # fmt: skip
    assert args.listen == ("::1", 9000)
    assert args.chunk_size is None
    assert args.max_num_seqs == 8
    assert args.output_tokens == 4
    assert args.prefix_cache is True
    assert args.ground_truth == Path("gt.jsonl")
    assert parse("simulate", "--chunk-size", "512").chunk_size == 512
    for bad in (["--listen", "8000"], ["--chunk-size", "0"], ["--max-num-seqs", "-1"]):
        with pytest.raises(SystemExit):
            parse("simulate", *bad)


def test_bad_profile_exits_2_naming_the_key(tmp_path: Path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"decode_base_s": 0.01, "decode_per_seq_s": 0.0}))
    assert run(parse("simulate", "--profile", str(path))) == 2
    assert "prefill_s_per_token" in capsys.readouterr().err


def test_port_in_use_exits_2(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run(parse("simulate", "--listen", f"127.0.0.1:{port}", "--profile", "fast")) == 2
    assert "--listen" in capsys.readouterr().err


async def test_start_simulator_in_process(tmp_path: Path):
    truth = tmp_path / "truth.jsonl"
    sim = await start_simulator("fast", chunk_size=512, output_tokens=3, ground_truth_path=truth)
    try:
        assert sim.engine.profile.cost.chunk_size == 512
        async with AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0) as client:
            reply = await client.completions.create(model="m", prompt="hi")
        assert reply.choices[0].text == " tok0 tok1 tok2"
        assert reply.choices[0].finish_reason == "stop"
    finally:
        await sim.close()
    kinds = [json.loads(line)["type"] for line in truth.read_text().splitlines()]
    assert kinds.count("token") == 3
    assert kinds.count("finish") == 1


async def test_process_serves_until_sigterm(tmp_path: Path):
    truth = tmp_path / "truth.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", MAIN, "simulate", "--listen", "127.0.0.1:0", "--profile", "fast",
        "--ground-truth", str(truth),
        cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(20):
            line = (await proc.stderr.readline()).decode()
        assert "profile=fast" in line
        url = line.split()[2]
        body = {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": True}
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/completions", json=body) as resp:
                raw = await resp.read()
        assert raw.endswith(b"data: [DONE]\n\n")
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert sum('"type":"token"' in line for line in truth.read_text().splitlines()) == 2
