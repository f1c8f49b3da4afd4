"""What the CPU images install, derived from dependency metadata without building them.

The closure of `agentserve[<extra>]` (pyproject.toml, then each dependency's own metadata as installed in
this venv) under the marker environments the images run in. A dependency's metadata is read only where
this venv holds the version images/constraints.txt pins (otherwise it could list other requirements than
the pinned one); such dependencies are reported (unexpanded; drifted when this venv holds another
version) rather than guessed.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement  # pytest's own dependency
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "images" / "constraints.txt"
# Debian bookworm's python3 (the debootstrapped base of scripts/build-images; tests/images checks the built
# image runs it). The Dockerfiles' public default base names its own version in its tag.
BOOKWORM_PYTHON = "3.11.2"
MACHINES = ("x86_64", "aarch64")
# Edges whose code the images never run, cut before the closure: tokenizers calls huggingface_hub only in
# Tokenizer.from_pretrained (agentserve reads tokenizer files), and the kubernetes client needs aiohttp
# and aiohttp-retry only in kubernetes.aio, which both Dockerfiles delete. What only these edges lead to
# is what the Dockerfiles `pip uninstall` (tests/unit/operator/test_image_dependencies.py).
CUT = frozenset(
    {("tokenizers", "huggingface-hub"), ("kubernetes", "aiohttp"), ("kubernetes", "aiohttp-retry")}
)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    result = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            result[normalize(name)] = version
    return result


def dockerfile_text(image: str) -> str:
    """The Dockerfile with continuation lines joined."""
    return re.sub(r"\\\n\s*", " ", (ROOT / "images" / image / "Dockerfile").read_text())


def installed_extras(image: str) -> tuple[str, ...]:
    """The extras of `pip install ... ".[a,b]"` in the image's Dockerfile."""
    pattern = r'pip install [^\n]*--constraint constraints\.txt "\.\[([\w,-]+)\]"'
    (extras,) = re.findall(pattern, dockerfile_text(image))
    return tuple(extras.split(","))


def pruned(image: str) -> set[str]:
    """Distributions the Dockerfile removes with `pip uninstall` after installing."""
    names: set[str] = set()
    for args in re.findall(r"pip uninstall --yes --quiet ([^&\n]+)", dockerfile_text(image)):
        names |= {normalize(word) for word in args.split()}
    return names


def pythons(image: str) -> tuple[str, ...]:
    """BOOKWORM_PYTHON and the version in the tag of the Dockerfile's default BASE_IMAGE."""
    (default,) = re.findall(r"ARG BASE_IMAGE=python:(\d+\.\d+\.\d+)", dockerfile_text(image))
    return (BOOKWORM_PYTHON, default)


def environment(python: str, machine: str) -> dict[str, str]:
    """The PEP 508 marker environment of CPython `python` on Linux `machine`."""
    return {
        "python_version": ".".join(python.split(".")[:2]),
        "python_full_version": python,
        "implementation_version": python,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_machine": machine,
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
        "platform_release": "",
        "platform_version": "",
    }


def environments(image: str) -> Iterator[dict[str, str]]:
    """The image's marker environments: each of its Pythons on each machine."""
    for python in pythons(image):
        for machine in MACHINES:
            yield environment(python, machine)


def own_requirements(extras: Iterable[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


@dataclass
class Closure:
    """Distributions reached from agentserve, and the specifier of every edge into each."""

    specifiers: dict[str, list[tuple[str, SpecifierSet]]] = field(default_factory=dict)
    unexpanded: set[str] = field(default_factory=set)
    drifted: dict[str, str] = field(default_factory=dict)  # name: the version this venv holds instead

    @property
    def names(self) -> set[str]:
        return set(self.specifiers)


def _installed(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def closure(
    extras: Iterable[str], env: dict[str, str], cut: frozenset[tuple[str, str]] = frozenset()
) -> Closure:
    """The distributions `pip install ".[extras]"` installs in env, leaving out the edges in cut
    (parent, child) and whatever only they lead to."""
    pinned = pins()
    result = Closure()
    queue: list[tuple[str, list[Requirement], frozenset[str]]] = [
        ("agentserve", own_requirements(extras), frozenset())
    ]
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        parent, requirements, parent_extras = queue.pop()
        for req in requirements:
            wanted = {"", *parent_extras}
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in wanted):
                continue
            child = normalize(req.name)
            if (parent, child) in cut or child == "agentserve":
                continue
            result.specifiers.setdefault(child, []).append((parent, req.specifier))
            key = (child, frozenset(req.extras))
            if key in seen:
                continue
            seen.add(key)
            dist = _installed(child)
            if dist is None or dist.version != pinned.get(child):
                result.unexpanded.add(child)
                if dist is not None:
                    result.drifted[child] = dist.version
            else:
                deps = [Requirement(line) for line in dist.requires or []]
                queue.append((child, deps, frozenset(req.extras)))
    return result
