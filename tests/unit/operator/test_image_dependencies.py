"""images/constraints.txt and the CPU Dockerfiles' `pip uninstall` lines against dependency metadata, with
no image built: a dependency added to pyproject.toml (or one only some Python needs, as redis needs
async-timeout below 3.11.3 and bookworm runs 3.11.2) fails here before tests/images' hygiene check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from image_deps import (
    CUT,
    ROOT,
    Closure,
    closure,
    environments,
    installed_extras,
    normalize,
    own_requirements,
    pins,
    pruned,
)

CPU_IMAGES = ("agentserve", "operator")
# The venv's own tools, not requirements of anything: removed too.
SEEDED = {"pip", "setuptools"}


@pytest.mark.parametrize("image", CPU_IMAGES)
def test_constraints_pin_every_distribution_the_image_installs(image: str) -> None:
    pinned = pins()
    for env in environments(image):
        found = closure(installed_extras(image), env)
        missing = found.names - set(pinned)
        assert not missing, (
            f"{image} on Python {env['python_full_version']} {env['platform_machine']} installs "
            f"{sorted(missing)}, which images/constraints.txt does not pin (regenerate it: see its header)"
        )
        for name, edges in found.specifiers.items():
            for parent, spec in edges:
                assert spec.contains(pinned[name], prereleases=True), (
                    f"{parent} requires {name}{spec}, images/constraints.txt pins {name}=={pinned[name]}"
                )


def test_constraints_pin_nothing_the_images_do_not_install() -> None:
    needed: set[str] = set()
    for image in CPU_IMAGES:
        for env in environments(image):
            needed |= _exact(closure(installed_extras(image), env)).names
    assert set(pins()) - needed == set()


def _exact(found: Closure) -> Closure:
    """found, when every dependency's metadata was read at its pinned version (the whole closure)."""
    if found.drifted:
        pytest.skip(f"this venv holds other versions than images/constraints.txt pins: {found.drifted}")
    return found


@pytest.mark.parametrize("image", CPU_IMAGES)
def test_pruned_distributions_are_exactly_what_only_unused_code_needs(image: str) -> None:
    """The Dockerfile's `pip uninstall` list is what the cut edges alone lead to: nothing still needed is
    removed, and nothing left behind is unreachable."""
    only_cut: set[str] = set()
    for env in environments(image):
        full = _exact(closure(installed_extras(image), env))
        kept = _exact(closure(installed_extras(image), env, CUT))
        only_cut |= full.names - kept.names
    assert pruned(image) - SEEDED == only_cut
    assert pruned(image) >= SEEDED
    assert "/kubernetes/aio" in (ROOT / "images" / image / "Dockerfile").read_text()


def test_the_cut_code_is_where_the_comments_say() -> None:
    """The facts CUT relies on, read from the pinned distributions installed here: aiohttp is imported only
    under kubernetes/aio, huggingface_hub is named by tokenizers only for from_pretrained (its Rust module
    calls hf_hub_download), and agentserve imports neither."""
    import importlib.metadata

    def sources(dist: str) -> dict[str, str]:
        files = importlib.metadata.distribution(dist).files or []
        return {str(f): Path(str(f.locate())).read_text(errors="replace") for f in files if f.suffix == ".py"}

    assert importlib.metadata.version("kubernetes") == pins()["kubernetes"]
    imports_aiohttp = re.compile(r"^\s*(import|from) aiohttp\b", re.M)
    importers = {path for path, text in sources("kubernetes").items() if imports_aiohttp.search(text)}
    assert importers and all(path.startswith("kubernetes/aio/") for path in importers)
    ours = {p.relative_to(ROOT / "src").as_posix(): p.read_text() for p in (ROOT / "src").rglob("*.py")}
    for module in ("huggingface_hub", "hf_xet", "fsspec", "tqdm", "aiohttp"):
        imports = re.compile(rf"^\s*(import|from) {module}\b", re.M)
        users = {path for path, text in ours.items() if imports.search(text)}
        # The operator's metrics server uses aiohttp: it runs in the operator image, where kopf keeps it.
        allowed = "agentserve/operator/" if module == "aiohttp" else None
        assert all(allowed and path.startswith(allowed) for path in users), f"{module}: {sorted(users)}"
    assert not any("from_pretrained" in text for text in ours.values())
    assert "aiohttp" not in pruned("operator")


def test_own_requirements_are_pinned_whatever_the_venv_holds() -> None:
    """agentserve's direct requirements (pyproject.toml, no metadata needed): CI's redis miss."""
    pinned = pins()
    for req in own_requirements(("kubernetes", "operator")):
        name = normalize(req.name)
        assert name in pinned, f"pyproject.toml requires {req}; pin it in images/constraints.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{req} vs {name}=={pinned[name]}"
