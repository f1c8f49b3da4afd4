#!/usr/bin/env python3
"""The real `promtool`, built from Go modules at one pinned Prometheus release, cached.

    scripts/install-promtool          # build once (a later call finds the binary and returns at once)
    scripts/install-promtool --force  # rebuild
    scripts/install-promtool --path   # print where the binary is (or will be)

Built like the control plane of scripts/k8s_local.py: never a downloaded binary, only the Go module
proxy. A small wrapper module requires `github.com/prometheus/prometheus` at the pinned release (the
module proxy names Prometheus 3.x.y `v0.3xx.y`) and blank-imports `cmd/promtool`; `go mod tidy` then
`go build` writes the binary to ~/.cache/agentserve-promtool/<release>/bin/promtool. The Go build cache
makes a rebuild cheap. The release's version is stamped as `make` would, so `promtool --version` names it.

Only the standard library: this runs before any virtualenv exists. Tests import it (tests/ops).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROMETHEUS_VERSION = "3.16.0"  # github.com/prometheus/prometheus; on the module proxy as v0.316.0
MODULE = "github.com/prometheus/prometheus"
GO_MIN = (1, 26)

CACHE = Path(os.environ.get("AGENTSERVE_PROMTOOL_CACHE", Path.home() / ".cache" / "agentserve-promtool"))


def module_version(release: str = PROMETHEUS_VERSION) -> str:
    """Prometheus 3.16.0 → v0.316.0: the module path has no /v3, so its tags are v0.<major><minor>.<patch>."""
    major, minor, patch = (int(p) for p in release.split("."))
    return f"v0.{major}{minor:02d}.{patch}"


BUILD = CACHE / f"prometheus-{PROMETHEUS_VERSION}"
BIN = BUILD / "bin"
PROMTOOL = BIN / "promtool"


def log(message: str) -> None:
    print(f"install-promtool: {message}", file=sys.stderr, flush=True)


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise SystemExit("install-promtool: Go is not installed (it builds promtool from the module proxy)")
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()
    major, minor = (int(p) for p in out.removeprefix("go").split(".")[:2])
    if (major, minor) < GO_MIN:
        raise SystemExit(f"install-promtool: Go {out} is too old; need go{GO_MIN[0]}.{GO_MIN[1]}")
    return go


def _run_go(go: str, args: list[str], cwd: Path) -> None:
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    started = time.monotonic()
    log(f"go {' '.join(args[:2])} …  (in {cwd})")
    proc = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"install-promtool: go {args[0]} failed in {cwd} (exit {proc.returncode})")
    log(f"  done in {time.monotonic() - started:.0f} s")


def _ldflags() -> str:
    """What Prometheus's Makefile (promu) stamps, so `promtool --version` names the pinned release."""
    pkg = "github.com/prometheus/common/version"
    values = {
        "Version": PROMETHEUS_VERSION,
        "Revision": f"{module_version()}-module-proxy",
        "Branch": "release",
        "BuildUser": "agentserve",
        "BuildDate": "19700101-00:00:00",
    }
    return "-s -w " + " ".join(f"-X {pkg}.{k}={v}" for k, v in values.items())


def build(force: bool = False) -> Path:
    """Build promtool once; later calls find it in the cache and return at once."""
    if not force and PROMTOOL.exists():
        log(f"promtool {PROMETHEUS_VERSION} cached at {PROMTOOL}")
        return PROMTOOL
    go = _go()
    src = BUILD / "src"
    src.mkdir(parents=True, exist_ok=True)
    BIN.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(
        f"module agentserve.local/promtool\n\ngo 1.26.0\n\nrequire {MODULE} {module_version()}\n",
        encoding="utf-8",
    )
    (src / "tools.go").write_text(
        "//go:build tools\n\n// Pins what install-promtool builds.\npackage tools\n\n"
        f'import _ "{MODULE}/cmd/promtool"\n',
        encoding="utf-8",
    )
    started = time.monotonic()
    _run_go(go, ["mod", "tidy"], src)
    tmp = BIN / "promtool.tmp"
    _run_go(go, ["build", "-trimpath", f"-ldflags={_ldflags()}", "-o", str(tmp), f"{MODULE}/cmd/promtool"], src)
    tmp.replace(PROMTOOL)
    log(f"built promtool {PROMETHEUS_VERSION} in {time.monotonic() - started:.0f} s → {PROMTOOL}")
    return PROMTOOL


def main(argv: list[str]) -> int:
    if "--path" in argv:
        print(PROMTOOL)
        return 0
    build(force="--force" in argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
