"""The nginx target's generated configuration, and nginx itself started the way the bench does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.children import Children, free_ports
from bench.nginx import find_program, host_port, nginx_config

NGINX = find_program("nginx")
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx not installed (Debian: nginx-light)")


def test_config_is_one_unbuffered_process_with_a_keepalive_upstream(tmp_path):
    text = nginx_config("http://127.0.0.1:8000", "127.0.0.1:9001", tmp_path)
    for directive in (
        "master_process off;",
        "daemon off;",
        "worker_processes 1;",
        "error_log stderr warn;",
        "access_log off;",
        "proxy_buffering off;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "server 127.0.0.1:8000;",
        "listen 127.0.0.1:9001;",
        "proxy_pass http://backend;",
    ):
        assert directive in text, directive
    assert "keepalive 1024;" in text
    assert f"pid {tmp_path / 'nginx.pid'};" in text
    # Every path nginx writes is inside the bench's folder.
    paths = [line.split()[-1].rstrip(";") for line in text.splitlines() if "_path " in line]
    assert len(paths) == 5
    assert all(p.startswith(str(tmp_path)) for p in paths)


def test_host_port_takes_urls_and_addresses():
    assert host_port("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert host_port("http://localhost:81/v1") == ("localhost", 81)
    assert host_port("127.0.0.1:9") == ("127.0.0.1", 9)
    with pytest.raises(ValueError, match="HOST:PORT"):
        host_port("127.0.0.1")


def test_find_program_looks_on_path_and_in_sbin():
    assert find_program("sh") is not None
    assert find_program("no-such-program-tokenstamp") is None


@needs_nginx
def test_generated_config_passes_nginx_t(tmp_path):
    (tmp_path / "tmp").mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(nginx_config("http://127.0.0.1:8000", "127.0.0.1:9001", tmp_path))
    done = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-e", "stderr", "-c", str(conf)],
                          capture_output=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


@needs_nginx
def test_started_nginx_is_the_process_and_its_folder_goes_away():
    upstream, listen = free_ports(2)
    with Children() as children:
        workdir = children.workdir("nginx")
        child = children.start("nginx", [
            sys.executable, "-m", "bench.nginx", "--upstream", f"http://127.0.0.1:{upstream}",
            "--listen", f"127.0.0.1:{listen}", "--dir", str(workdir),
        ])  # fmt: skip
        child.wait_listening(listen)
        # exec'd: the pid the bench started is nginx itself, the one doing the work.
        assert (workdir / "nginx.pid").read_text().strip() == str(child.pid)
        assert "nginx" in Path(f"/proc/{child.pid}/comm").read_text()
        assert (workdir / "nginx.conf").is_file()
    assert not workdir.exists()
