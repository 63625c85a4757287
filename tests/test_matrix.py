"""Driver/CUDA/GPU compatibility, with expected versions derived from templates/compat, not from the code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from conftest import MutatedConfig, StackWriter, compat_data, stack_document
from triarch.catalog import Image, catalog
from triarch.cli import main
from triarch.config import from_pulumi_config
from triarch.errors import ConfigError, MatrixError
from triarch.matrix import Node, check_image_on_node, check_stack, require_compatible

CUDA = compat_data("cuda")
GPUS = compat_data("gpus")["gpus"]
INSTANCES = compat_data("instances")
IMAGES = compat_data("images")["images"]
AMI_TYPES = compat_data("amis")["amiTypes"]
AMIS = AMI_TYPES["AL2023_x86_64_NVIDIA"]


def vt(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def node(gpu: str, driver: str, name: str = "pool") -> Node:
    return Node(name, catalog().gpus[gpu], driver, "declares existing nodes")


def image(ref: str) -> Image:
    found = catalog().image(ref)
    assert found is not None, ref
    return found


def image_with_cuda(cuda: str) -> str:
    tags = IMAGES["vllm/vllm-openai"]
    return next(f"vllm/vllm-openai:{tag}" for tag, i in tags.items() if i["cuda"] == cuda)


NEW_VLLM = "vllm/vllm-openai:v0.33.0"
NEW_VLLM_CUDA = str(IMAGES["vllm/vllm-openai"]["v0.33.0"]["cuda"])
NEW_VLLM_DRIVER = str(CUDA["minimumDriver"][NEW_VLLM_CUDA])


def old_driver_release() -> tuple[str, str, str]:
    """An AMI release shipping a 570.x driver: (release, its driver, the newest Kubernetes minor it has)."""
    candidates = [(vt(k8s), release, str(a["nvidiaDriver"]), k8s) for release, a in AMIS.items()
                  if str(a["nvidiaDriver"]).startswith("570.") for k8s in a.get("releaseVersions") or {}]
    assert candidates, "amis.yaml has no release with a 570 driver"
    _, release, driver, k8s = max(candidates)
    return release, driver, k8s


def pin_old_driver(config: dict[str, Any]) -> None:
    """The prod stack with its first node group ('l4') on an AMI release that ships a 570 driver."""
    release, _, k8s = old_driver_release()
    config["triarch:cluster"]["kubernetesVersion"] = k8s
    config["triarch:nodeGroups"][0]["amiRelease"] = release
    for group in config["triarch:nodeGroups"][1:]:
        assert k8s in AMIS[group["amiRelease"]]["releaseVersions"]


# --- single pairs ----------------------------------------------------------------------------------------

def test_compatible_pair() -> None:
    release = AMIS["v20260714"]
    assert vt(release["nvidiaDriver"]) >= vt(NEW_VLLM_DRIVER)
    verdict = check_image_on_node(image(NEW_VLLM), node("l4", release["nvidiaDriver"], "l4"), catalog())
    assert verdict.level == "ok", verdict.message
    assert (verdict.node_group, verdict.image) == ("l4", NEW_VLLM)
    assert NEW_VLLM_DRIVER in verdict.message


def test_too_old_driver_is_an_error_naming_both_versions(mutated_config: MutatedConfig) -> None:
    release, driver, _ = old_driver_release()
    assert vt(driver) < vt(CUDA["minorVersionCompatibility"][NEW_VLLM_CUDA.split(".")[0]])
    stack = from_pulumi_config(mutated_config("prod", pin_old_driver))
    verdicts = {(v.image, v.node_group): v for v in check_stack(stack, catalog())}
    verdict = verdicts[(NEW_VLLM, "l4")]
    assert verdict.level == "error"
    for needed in (NEW_VLLM_DRIVER, driver, "'l4'", release, NEW_VLLM, NEW_VLLM_CUDA):
        assert needed in verdict.message, needed
    with pytest.raises(MatrixError) as info:
        require_compatible(stack, catalog())
    assert NEW_VLLM_DRIVER in str(info.value) and driver in str(info.value)


def test_gpu_newer_than_the_image_cuda() -> None:
    b200 = GPUS["b200"]
    older = [f"{repo}:{tag}" for repo, tags in IMAGES.items() for tag, i in tags.items()
             if vt(str(i["cuda"])) < vt(b200["minCuda"])]
    old_image = image(older[0]) if older else Image("vllm/vllm-openai", "v0.8.5", "12.4", "0.8.5", None)
    assert vt(old_image.cuda) < vt(b200["minCuda"])
    newest_driver = max((str(d) for d in CUDA["minimumDriver"].values()), key=vt)
    verdict = check_image_on_node(old_image, node("b200", newest_driver, "blackwell"), catalog())
    assert verdict.level == "error"
    for needed in (old_image.cuda, b200["minCuda"], b200["product"], "'blackwell'"):
        assert needed in verdict.message, needed


def test_minor_version_compatibility_is_a_warning() -> None:
    """A driver at or above its CUDA major's floor but below the image CUDA's own minimum runs it, limited."""
    pairs = [(f"{repo}:{tag}", cuda, release, driver)
             for repo, tags in IMAGES.items() for tag, i in tags.items() if i.get("verified", True)
             for cuda in [str(i["cuda"])]
             for release, a in AMIS.items() for driver in [str(a["nvidiaDriver"])]
             if vt(CUDA["minorVersionCompatibility"][cuda.split(".")[0]]) <= vt(driver)
             < vt(CUDA["minimumDriver"][cuda])]
    assert pairs, "the catalog has no image/AMI pair in a minor-version-compatibility range"
    for ref, _, _, driver in pairs:
        verdict = check_image_on_node(image(ref), node("l4", driver), catalog())
        assert verdict.level == "warning", (ref, driver, verdict.message)
        assert driver in verdict.message


def test_minor_version_compatibility_declared_driver_passes_require_compatible(
        mutated_config: MutatedConfig) -> None:
    vllm_129 = image_with_cuda("12.9")
    floor, needed = CUDA["minorVersionCompatibility"]["12"], CUDA["minimumDriver"]["12.9"]
    driver = "570.172.08"
    assert vt(floor) <= vt(driver) < vt(needed)

    def mutate(config: dict[str, Any]) -> None:
        config["triarch:nodeGroups"][0]["driverVersion"] = driver
        config["triarch:images"] = {"vllm": vllm_129}

    verdicts = require_compatible(from_pulumi_config(mutated_config("local", mutate)), catalog())
    assert [v.level for v in verdicts] == ["warning"]


def test_below_the_major_floor_is_an_error() -> None:
    ref = image_with_cuda("12.9")
    floor = vt(CUDA["minorVersionCompatibility"]["12"])
    driver = f"{floor[0] - 1}.0.0"
    verdict = check_image_on_node(image(ref), node("l4", driver), catalog())
    assert verdict.level == "error"
    assert driver in verdict.message and CUDA["minimumDriver"]["12.9"] in verdict.message


def test_unknown_cuda_version_is_an_error() -> None:
    unknown = "12.7"
    assert unknown not in CUDA["minimumDriver"]
    made_up = Image("vllm/vllm-openai", "v0.0.0-cu127", unknown, None, None)
    newest_driver = max((str(d) for d in CUDA["minimumDriver"].values()), key=vt)
    verdict = check_image_on_node(made_up, node("l4", newest_driver), catalog())
    assert verdict.level == "error"
    assert unknown in verdict.message


@pytest.mark.parametrize(("mutate", "path"), [
    (lambda c: c.update({"triarch:images": {"rayLlm": "rayproject/ray-llm:9.9.9-py312-cu130"}}),
     "triarch:images.rayLlm"),
    (lambda c: c["triarch:nodeGroups"][1].update(amiRelease="v20300101"), "triarch:nodeGroups[1].amiRelease"),
])
def test_unknown_image_or_ami_release_is_a_config_error(mutated_config: MutatedConfig, mutate: Any,
                                                        path: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_pulumi_config(mutated_config("prod", mutate))
    assert str(info.value).startswith(f"{path}: ")
    assert "; allowed: " in str(info.value)


def test_cli_plan_refuses_a_too_old_driver(write_stack: StackWriter, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    release, driver, _ = old_driver_release()
    config = stack_document("prod")
    pin_old_driver(config)
    out = tmp_path / "out"
    code = main(["plan", "--stack-file", str(write_stack(config)), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ")
    assert NEW_VLLM_DRIVER in lines[0] and driver in lines[0] and release in lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert not (out / "plan.json").exists()


# --- the catalog data itself ----------------------------------------------------------------------------

def test_every_image_cuda_has_a_minimum_driver() -> None:
    for repository, tags in IMAGES.items():
        for tag, entry in tags.items():
            assert str(entry["cuda"]) in CUDA["minimumDriver"], f"{repository}:{tag}"


def test_minimum_drivers_rise_with_cuda_and_sit_above_their_major_floor() -> None:
    rows = sorted(((vt(c), vt(d)) for c, d in CUDA["minimumDriver"].items()))
    drivers = [d for _, d in rows]
    assert drivers == sorted(drivers)
    for cuda, driver in rows:
        floor = CUDA["minorVersionCompatibility"].get(str(cuda[0]))
        assert floor is not None, cuda
        assert vt(floor) <= driver, cuda


def test_every_gpu_instance_names_a_known_gpu() -> None:
    for name, instance in INSTANCES["instances"].items():
        assert instance["gpu"] in GPUS, name
        assert instance["gpus"] >= 1, name
    for name, instance in INSTANCES["cpuInstances"].items():
        assert "gpu" not in instance, name


def test_ami_release_versions_match_their_kubernetes_minor() -> None:
    shape = re.compile(r"^(\d+\.\d+)\.\d+-\d{8}$")
    for ami_type, releases in AMI_TYPES.items():
        for release, entry in releases.items():
            assert re.fullmatch(r"\d{3}\.\d{1,3}(\.\d{1,3})?", str(entry["nvidiaDriver"])), release
            for minor, version in (entry.get("releaseVersions") or {}).items():
                match = shape.match(str(version))
                assert match, f"{ami_type} {release} {minor}: {version}"
                assert match.group(1) == minor, f"{ami_type} {release} {minor}: {version}"


def test_every_entry_has_a_source() -> None:
    entries = {f"image {repo}:{tag}": i for repo, tags in IMAGES.items() for tag, i in tags.items()}
    entries |= {f"gpu {key}": g for key, g in GPUS.items()}
    entries |= {f"ami {t} {r}": a for t, releases in AMI_TYPES.items() for r, a in releases.items()}
    missing = [name for name, entry in entries.items() if not str(entry.get("source") or "").strip()]
    assert not missing


# --- boundaries -------------------------------------------------------------------------------------------------

def _patch_below(version: str) -> str:
    """The driver one release below `version` (580.65.06 -> 580.65.05, 580.65.00 -> 580.64.99)."""
    parts = [int(p) for p in version.split(".")]
    while len(parts) < 3:
        parts.append(0)
    if parts[2] > 0:
        parts[2] -= 1
    else:
        parts[1], parts[2] = parts[1] - 1, 99
    return ".".join(f"{p:02d}" if i == 2 else str(p) for i, p in enumerate(parts))


def test_the_minimum_driver_itself_is_enough_and_one_below_is_not() -> None:
    minimum = NEW_VLLM_DRIVER
    assert check_image_on_node(image(NEW_VLLM), node("l4", minimum), catalog()).level == "ok"
    below = _patch_below(minimum)
    assert vt(below) < vt(minimum)
    assert check_image_on_node(image(NEW_VLLM), node("l4", below), catalog()).level != "ok"


def test_the_major_floor_itself_runs_through_minor_version_compatibility_and_below_it_fails() -> None:
    """An image whose CUDA minor needs more than its major's floor: the floor itself is a warning, a patch below
    it an error."""
    floors = {str(k): str(v) for k, v in CUDA["minorVersionCompatibility"].items()}
    cudas = sorted({str(i["cuda"]) for i in IMAGES["vllm/vllm-openai"].values()}, key=vt)
    cuda = next(c for c in cudas if vt(str(CUDA["minimumDriver"][c])) > vt(floors[c.split(".")[0]]))
    floor = floors[cuda.split(".")[0]]
    ref = image_with_cuda(cuda)
    assert check_image_on_node(image(ref), node("l4", floor), catalog()).level == "warning"
    assert check_image_on_node(image(ref), node("l4", _patch_below(floor)), catalog()).level == "error"


def test_an_image_exactly_at_the_gpu_minimum_cuda_runs() -> None:
    gpu = next(k for k, g in GPUS.items() if any(str(i["cuda"]) == str(g["minCuda"])
                                                for i in IMAGES["vllm/vllm-openai"].values()))
    ref = image_with_cuda(str(GPUS[gpu]["minCuda"]))
    driver = str(CUDA["minimumDriver"][str(GPUS[gpu]["minCuda"])])
    assert check_image_on_node(image(ref), node(gpu, driver), catalog()).level in ("ok", "warning")
